"""Catalog figures as their datasheets state them, and the multi-rail cluster schema."""

import pytest

from gpuplan.models.catalog import canonical_name, catalog_chip, catalog_entry, catalog_names
from gpuplan.models.cluster import Cluster, DeviceType, device_type
from gpuplan.units import GiB


@pytest.mark.parametrize("name, dtype, tflops", [
    ("K80", "fp32", 4.37),        # one GK210 die at boost (board: 8.73)
    ("P100", "fp16", 21.2), ("V100", "fp16", 125.0), ("T4", "fp16", 65.0),
    ("A100-80GB", "bf16", 312.0), ("H100", "bf16", 989.4), ("H100-PCIe", "bf16", 756.0),
    ("L4", "bf16", 121.0), ("L40S", "bf16", 362.0), ("GH200", "bf16", 989.4),
    ("B200", "bf16", 2250.0), ("B200", "fp8", 4500.0), ("B300", "fp8", 4500.0),   # DGX B200 / B300 datasheets
    ("GB200", "bf16", 2500.0), ("GB200", "fp8", 5000.0), ("GB300", "bf16", 2500.0),  # GB200 / GB300 NVL72
])
def test_dense_peaks_as_datasheets(name: str, dtype: str, tflops: float) -> None:
    assert device_type(name).peak(dtype) == pytest.approx(tflops)


@pytest.mark.parametrize("name", ["K80", "P100", "V100", "V100-32GB", "T4"])
def test_no_bf16_tensor_cores_means_fp32_rate(name: str) -> None:
    t = device_type(name)
    assert t.peak("bf16") == t.peak("fp32")
    assert t.peak("bf16") < t.peak("fp16") or name == "K80"


def test_gh200_is_not_h200() -> None:
    gh, h200 = device_type("GH200"), device_type("H200")
    assert gh.memory_bytes == 96 * GiB and h200.memory_bytes == 141 * GiB
    assert gh.memory_bandwidth_GBps == 4000 and h200.memory_bandwidth_GBps == 4800


def test_every_entry_has_arch_and_link_count() -> None:
    for name in catalog_names():
        e = catalog_entry(name)
        assert e is not None and e["arch"] in {"kepler", "pascal", "volta", "turing", "ampere", "ada", "hopper",
                                               "blackwell"}
        # NVLink line rate is 25 GB/s per link per direction from Volta on (20 on Pascal), 50 on NVLink 5
        if e["nvlinks"] and e["arch"] != "pascal":
            assert e["intra_node_GBps"] == (50 if e["arch"] == "blackwell" else 25) * e["nvlinks"]
        assert catalog_chip(name) is not None
    assert canonical_name("v100-16gb") == "V100" and canonical_name("nope") is None


def test_declared_type_without_dtype_falls_back_to_fp32_or_refuses() -> None:
    t = DeviceType(name="x", memory_bytes=1e9, memory_bandwidth_GBps=10, peak_tflops={"fp32": 2.0})
    assert t.peak("bf16") == 2.0
    u = DeviceType(name="y", memory_bytes=1e9, memory_bandwidth_GBps=10, peak_tflops={"fp16": 2.0})
    with pytest.raises(ValueError, match="fp32"):
        u.peak("bf16")


def test_multi_rail_presets_and_override() -> None:
    c = Cluster.model_validate({"preset": "dgx-a100x4"})
    assert c.nics("dgx0") == 8 and c.inter_node.bandwidth_GBps == pytest.approx(25.0)
    d = Cluster.model_validate({"nodes": [{"name": "a", "gpus": {"H100": 8}, "nics": 4},
                                          {"name": "b", "gpus": {"H100": 8}}],
                                "inter_node": {"bandwidth_GBps": "400 Gbps", "nics_per_node": 8}})
    assert d.nics("a") == 4 and d.nics("b") == 8
    assert Cluster.model_validate({"gpus": {"V100": 8}}).nics("V100-0") == 1


def test_blackwell_memory_and_chip_as_cited() -> None:
    """B200 180 GB, B300 and GB300 288 GB, GB200 186 GB, all at 8 TB/s; 148 SMs as a B200 reports them."""
    for name, gib in (("B200", 180), ("B300", 288), ("GB200", 186), ("GB300", 288)):
        t = device_type(name)
        assert t.memory_bytes == gib * GiB and t.memory_bandwidth_GBps == 8000 and t.arch == "blackwell"
        assert t.intra_node_GBps == 900 and catalog_chip(name) == (148, 126 * 10**6)
    assert canonical_name("hgx-b200") == "B200" and catalog_chip("nope") is None


def test_blackwell_presets() -> None:
    b = Cluster.model_validate({"preset": "dgx-b200x2"})
    assert b.nics("b0") == 8 and b.inter_node.bandwidth_GBps == pytest.approx(50.0)
    g = Cluster.model_validate({"preset": "gb200-nvl72x2"})
    assert len(g.nodes) == 2 and sum(g.nodes[0].gpus.values()) == 72 and g.nics("nvl72-0") == 72
