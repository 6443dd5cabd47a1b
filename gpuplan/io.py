"""File input and output shared by every model: documents in, atomic writes out, digests."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gpuplan.errors import InputError


def read_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the mapping held by a YAML or JSON file (chosen by suffix; YAML otherwise).

    Raises InputError naming the file when it is missing, unparsable or not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{p}: no such file", file=str(p)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read: {exc}", file=str(p)) from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {exc}",
                         file=str(p)) from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping at the top level, got {type(data).__name__}",
                         file=str(p))
    return data


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and a rename; return the path.

    Either the whole new content is there afterwards or the old file is untouched.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
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
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
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
