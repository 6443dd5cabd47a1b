"""File input and output shared by every model: documents in, atomic writes out, digests.

Reading is bounded: an input path must be a regular file of at most MAX_INPUT_BYTES (a FIFO,
a device such as /dev/zero or a socket is refused before anything is read), and a parsed
document may hold at most MAX_DOCUMENT_NODES values (counted after YAML alias expansion) nested
at most MAX_DOCUMENT_DEPTH deep, with finite numbers only. Every refusal is one InputError line
naming the file, the field, the value and what was expected.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpuplan.errors import InputError, OutputError

MAX_INPUT_BYTES = 64 * 2**20
"""Largest input document read (bytes); a 100k-job OEF problem is about 2 MB."""
MAX_DOCUMENT_NODES = 5_000_000
"""Most values (mappings, lists, scalars; YAML aliases counted once per use) in one document."""
MAX_DOCUMENT_DEPTH = 64
"""Deepest nesting of mappings and lists in one document."""
STALE_TMP_S = 600.0
"""Age (seconds) after which a temporary file left by an interrupted atomic write is removed."""

_YAML_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster, just as safe


def _open_regular(path: str | os.PathLike[str], what: str) -> tuple[int, int]:
    """Open a regular file for reading without blocking; return (descriptor, size in bytes)."""
    p = str(os.fspath(path))
    if not p:
        raise InputError(f"(empty path): expected the path of a {what}", file=p)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang; regular files ignore it.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(f"{p}: no such file; expected a {what}", file=p) from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory; expected a {what}", file=p) from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}", file=p) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}", file=p) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise InputError(f"{p}: {kind}; expected a {what}", file=p)
    return fd, st.st_size


def input_file_size(path: str | os.PathLike[str], *, what: str = "file") -> int:
    """Return the size in bytes of a regular input file, without reading it.

    Raises InputError as read_input_bytes does (missing, a directory, not a regular file...).
    """
    fd, size = _open_regular(path, what)
    os.close(fd)
    return size


def read_input_bytes(path: str | os.PathLike[str], *, limit_bytes: int = MAX_INPUT_BYTES,
                     what: str = "file") -> bytes:
    """Return the bytes of a regular file of at most `limit_bytes` bytes.

    Raises InputError naming the file when it is missing, a directory, unreadable, not a regular
    file (FIFO, device, socket: refused without blocking or reading), or larger than the limit.
    """
    p = str(os.fspath(path))
    fd, size = _open_regular(path, what)
    try:
        if size > limit_bytes:
            raise InputError(f"{p}: {size:,} bytes; expected a {what} of at most {limit_bytes:,} bytes", file=p)
        chunks, total = [], 0
        while total <= limit_bytes:
            chunk = os.read(fd, min(1 << 20, limit_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit_bytes:  # grew while being read
            raise InputError(f"{p}: more than {limit_bytes:,} bytes; expected a {what} of at most "
                             f"{limit_bytes:,} bytes", file=p)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}", file=p) from None
    finally:
        os.close(fd)


def _path_text(path: tuple[Any, ...]) -> str:
    if len(path) > 10:
        return _path_text(path[:4]) + "..." + _path_text(path[-4:])
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(top level)"


def check_document(data: Any, file: str | None = None, *, max_nodes: int = MAX_DOCUMENT_NODES,
                   max_depth: int = MAX_DOCUMENT_DEPTH, allow_nonfinite: bool = False) -> int:
    """Walk a parsed document; return its number of values (shared objects counted once per use).

    Raises InputError naming the file and field when the document holds more than `max_nodes`
    values, nests deeper than `max_depth`, or (unless `allow_nonfinite`) holds a non-finite number
    (inf, NaN). The walk stops
    at the first limit, so an alias bomb or a self-referencing document costs at most `max_nodes` steps.
    """
    where = f"{file}: " if file else ""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    count = 0
    while stack:
        obj, path = stack.pop()
        count += 1
        if count > max_nodes:
            raise InputError(f"{where}more than {max_nodes:,} values (YAML aliases counted at each use), "
                             f"reached at field '{_path_text(path)}'; expected a smaller document",
                             file=file, field=_path_text(path), expected=f"at most {max_nodes} values")
        if isinstance(obj, float):
            if not allow_nonfinite and not math.isfinite(obj):
                raise InputError.at(file, _path_text(path), obj, "a finite number")
            continue
        if isinstance(obj, (dict, list)):
            if len(path) >= max_depth:
                raise InputError(f"{where}field '{_path_text(path)}': nested deeper than {max_depth} levels; "
                                 "expected a flatter document", file=file, field=_path_text(path),
                                 expected=f"at most {max_depth} levels")
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            for key, value in items:
                if isinstance(value, (dict, list)):
                    stack.append((value, path + (key,)))
                    continue
                count += 1
                if not allow_nonfinite and isinstance(value, float) and not math.isfinite(value):
                    raise InputError.at(file, _path_text(path + (key,)), value, "a finite number")
            if count > max_nodes:
                stack.append((None, path))
    return count


class _Loader(_YAML_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, with each distinct plain scalar's implicit tag resolved once per document (a
    100k-job input repeats a few dozen keys hundreds of thousands of times)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._plain_tags: dict[str, str] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        """Return the tag of a node (yaml.resolver.BaseResolver.resolve), cached for plain scalars."""
        if kind is not yaml.ScalarNode or not implicit[0] or self.yaml_path_resolvers:
            return super().resolve(kind, value, implicit)
        tag = self._plain_tags.get(value)
        if tag is None:
            tag = self._plain_tags[value] = super().resolve(kind, value, implicit)
        return tag


class _Unusual(Exception):
    """A node the fast constructor leaves to PyYAML's SafeConstructor (merge keys, timestamps, sets,
    binary, unknown or mismatched tags, unhashable keys)."""


_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_MAP, _SEQ = _TAG + "map", _TAG + "seq"
_KEY_TAGS = frozenset((_STR, _INT, _FLOAT, _BOOL, _NULL))
# Values whose SafeConstructor result is Python's own int() / float() of the text (no '_', no
# sexagesimal ':', no octal/hex/binary prefix, no .inf/.nan); others go through SafeConstructor.
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?")


class _Duplicate(Exception):
    """A mapping that names one key twice (PyYAML keeps the last silently): (key, line)."""


def _construct(loader: Any, root: Any) -> Any:
    """Return the Python value of the composed node graph `root`, as SafeConstructor builds it (an
    aliased node is one object, a recursive one refers to itself), without its per-node generators;
    raise _Unusual for anything but str/int/float/bool/null scalars, maps and sequences."""
    memo: dict[int, Any] = {}
    constructors = loader.yaml_constructors

    def build(node: Any) -> Any:
        tag, kind = node.tag, node.id
        if kind == "scalar":
            if tag == _STR:
                return node.value
            if tag == _FLOAT:
                return float(node.value) if _PLAIN_FLOAT.fullmatch(node.value) else loader.construct_yaml_float(node)
            if tag == _INT:
                return int(node.value) if _PLAIN_INT.fullmatch(node.value) else loader.construct_yaml_int(node)
            if tag == _BOOL or tag == _NULL:
                return constructors[tag](loader, node)
            raise _Unusual(tag)
        done = memo.get(id(node))
        if done is not None:
            return done
        if kind == "mapping" and tag == _MAP:
            mapping: dict[Any, Any] = {}
            memo[id(node)] = mapping
            for key, value in node.value:
                if key.id != "scalar" or key.tag not in _KEY_TAGS:
                    raise _Unusual(key.tag)
                k = build(key)
                if k in mapping and any(type(e) is type(k) for e in mapping if e == k):  # not 1 and true
                    raise _Duplicate(k, key.start_mark.line + 1)
                mapping[k] = build(value)
            return mapping
        if kind == "sequence" and tag == _SEQ:
            items: list[Any] = []
            memo[id(node)] = items
            for value in node.value:
                items.append(build(value))
            return items
        raise _Unusual(tag)

    return build(root)


def _refuse_duplicate_keys(loader: Any, root: Any) -> None:
    """Raise _Duplicate when a mapping of the composed node graph `root` names one plain key twice, for
    the documents PyYAML's SafeConstructor builds (merge keys, timestamps, sets, ...), which keeps the
    last value silently. Keys merged in with `<<` may be overridden (that is what merging is for), and
    keys of other kinds (sequences, mappings) are left to the constructor. Iterative: a document's
    nesting is bounded later by `check_document`, not by Python's recursion limit."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or node.id == "scalar":
            continue
        seen.add(id(node))
        if node.id == "sequence":
            stack.extend(node.value)
            continue
        keys: list[Any] = []
        for key, value in node.value:
            stack.append(value)
            if key.id != "scalar" or key.tag == _TAG + "merge":
                stack.append(key)
                continue
            if key.tag in (_STR, _TAG + "value"):  # SafeConstructor reads a `=` key as the string
                k = key.value
            elif key.tag in _KEY_TAGS:
                try:
                    k = loader.yaml_constructors[key.tag](loader, key)
                except Exception:  # a key the constructor refuses: it says so with its own message
                    continue
            else:  # timestamps, binary, unknown tags: left to the constructor
                continue
            if any(type(e) is type(k) and e == k for e in keys):  # 1 and true are not one written key
                raise _Duplicate(k, key.start_mark.line + 1)
            keys.append(k)


def _parse_yaml(text: str, file: str) -> Any:
    """Return the value of one YAML document (the safe schema: no tag runs code)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            try:
                return _construct(loader, node)
            except _Unusual:
                _refuse_duplicate_keys(loader, node)
                return loader.construct_document(node)
        except _Duplicate as dup:  # parse_document names the file
            key, line = dup.args
            raise ValueError(f"line {line}: key {key!r} appears twice in one mapping; expected each key once "
                             "(the later value would silently replace the first)") from None
    finally:
        loader.dispose()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a document's many containers are built (a parse
    allocates no garbage cycles worth collecting mid-way; each collection would walk every object
    the process holds); restore its state after. Yields None."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Return a JSON object's mapping; raise ValueError naming a key it holds twice (json keeps the last)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"key {key!r} appears twice in one object; expected each key once (the later value "
                         "would silently replace the first)")
    return out


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} (JSON holds finite numbers only)")


def parse_document(data: bytes | str, file: str, *, fmt: str = "yaml", allow_nonfinite: bool = False,
                   what: str | None = None) -> Any:
    """Return the value held by YAML or JSON text (`fmt` 'yaml' or 'json'), checked by check_document.

    Raises InputError naming the file when the text is not UTF-8, not valid, too large, too deep,
    or (unless `allow_nonfinite`: plans, whose check reports such figures) holds a non-finite number.
    `what` names the document in messages ('plan file': "not a JSON plan file: ...").
    """
    name = "JSON" if fmt == "json" else "YAML"
    invalid = f"not a {name} {what}" if what else f"not valid {name}"
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{file}: not UTF-8 text (byte {exc.start}); expected a {name} document",
                             file=file) from None
    else:
        text = data
    if "\x00" in text:
        raise InputError(f"{file}: holds NUL bytes; expected a {name} text document", file=file)
    with _gc_paused():
        try:
            if fmt == "json":
                value = (json.loads(text, object_pairs_hook=_unique_keys) if allow_nonfinite else
                         json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys))
            else:
                value = _parse_yaml(text, file)
        except (json.JSONDecodeError, yaml.YAMLError, ValueError) as exc:
            message = " ".join(str(exc).split())
            raise InputError(f"{file}: {invalid}: {message[:300]}", file=file) from None
        except RecursionError:
            raise InputError(f"{file}: nested too deeply; expected at most {MAX_DOCUMENT_DEPTH} levels",
                             file=file) from None
        check_document(value, file, allow_nonfinite=allow_nonfinite)
    return value


def read_json(path: str | os.PathLike[str], *, what: str = "JSON file", limit_bytes: int = MAX_INPUT_BYTES,
              allow_nonfinite: bool = False, invalid_as: str | None = None) -> Any:
    """Return the value of a JSON file, read with the bounds of read_input_bytes and parse_document.

    `what` names the file in messages; `invalid_as` (default `what`) in the not-JSON message.
    """
    return parse_document(read_input_bytes(path, limit_bytes=limit_bytes, what=what), str(os.fspath(path)),
                          fmt="json", allow_nonfinite=allow_nonfinite, what=invalid_as or what)


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the mapping held by a YAML or JSON file (chosen by suffix; YAML otherwise).

    Raises InputError naming the file when it is missing, not a regular file, over
    MAX_INPUT_BYTES, unparsable, over the document limits, or not a mapping.
    """
    if not os.fspath(path):
        raise InputError("(empty path): expected the path of a YAML or JSON document", file="")
    p = Path(path)
    fmt = "json" if p.suffix.lower() == ".json" else "yaml"
    data = parse_document(read_input_bytes(p, what=f"{fmt.upper()} document"), str(p), fmt=fmt)
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping at the top level, got {type(data).__name__}",
                         file=str(p))
    return data


def _remove_stale_temporaries(target: Path) -> None:
    """Remove this target's own temporary files (`.NAME.XXXXXXXX.tmp`) older than STALE_TMP_S."""
    own = re.compile(r"^\." + re.escape(target.name) + r"\.[A-Za-z0-9_]{8}\.tmp$")
    cutoff = time.time() - STALE_TMP_S
    try:
        names = [n for n in os.listdir(target.parent) if own.match(n)]
    except OSError:
        return
    for n in names:
        stale = target.parent / n
        try:
            st = stale.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                stale.unlink()
        except OSError:
            pass


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Return `path` as a Path when a file can be written there atomically; nothing is written.

    Raises OutputError naming the path when it is empty, a directory, an existing FIFO, device or
    socket (a rename would replace the node itself, e.g. /dev/null, with a regular file), or when a
    folder above it is a file or the nearest existing folder cannot be written. Commands call it
    before their work, so a bad output path is refused in a moment, not after a long solve.
    """
    if not os.fspath(path):
        raise OutputError("(empty path): expected an output file path")
    p = Path(path)
    try:
        st = os.stat(p)  # follows a symbolic link: /dev/stdout names a pipe or a terminal
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{p}: is a directory; expected an output file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{p}: not a regular file (a FIFO, device or socket); expected an output file path "
                          "(the file is replaced as a whole when written)")
    _check_folders(p, p.parents)
    return p


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Return `path` as a Path when a directory can be made (or written) there; nothing is made. Raises
    OutputError naming the path when it is empty, a file, below a file, or when the nearest existing
    folder cannot be written."""
    if not os.fspath(path):
        raise OutputError("(empty path): expected an output directory")
    p = Path(path)
    _check_folders(p, [p, *p.parents])
    return p


def _check_folders(p: Path, folders: Iterable[Path]) -> None:
    """Raise OutputError for `p` when one of `folders` (the path's own and those above it, nearest
    first) exists as something other than a folder, or the nearest existing folder is not writable."""
    folders = list(folders)
    blocker = next((a for a in folders if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise OutputError(f"{p}: cannot write: {blocker} is a file, not a folder")
    folder = next((a for a in folders if a.is_dir()), Path("."))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{p}: cannot write: folder {folder} is not writable")


def make_output_dir(path: str | os.PathLike[str], what: str = "output directory") -> Path:
    """Create directory `path` (and its parents) when missing; return it as a Path. Raises OutputError
    naming the path and `what` it was to hold when it cannot be created (a file in the way, no write
    permission)."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write the {what}: {exc.strerror or exc}") from None
    return p


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and a rename; return the path.

    Either the whole new content is there afterwards or the old file is untouched. Stale
    temporary files of the same target (from a killed write) are removed first. Raises
    OutputError naming the path when check_output_path refuses it or the write fails.
    """
    p = check_output_path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(p)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write: {exc.strerror or exc} (in {p.parent})") from None
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(f"{p}: cannot write: {exc.strerror or exc}") from None
        raise
    return p


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text atomically (see atomic_write_bytes); return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def canonical_json(data: Any) -> str:
    """Return JSON with sorted keys and no whitespace, the form digests are taken of."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def digest(data: Any) -> str:
    """Return 'sha256:<hex>' of the canonical JSON of `data`."""
    return "sha256:" + hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()


def atomic_write_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Render a matplotlib figure to PNG, write it atomically, close the figure; return the path."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
