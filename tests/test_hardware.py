"""GPU catalogue, machine probe and NVML sampler. Tests marked gpu need an NVIDIA GPU with NVML; elsewhere they
skip, saying how to run them. Nothing here imports pydantic, so it runs on a bare GPU machine too."""
from __future__ import annotations

import time

import pytest

from qwen3lab.hardware import catalogue as hardware
from qwen3lab.errors import SpecError
from qwen3lab.measure.telemetry import GPU_FIELDS, NvmlSampler, visible_nvml_indices

HOW_TO_RUN_GPU = "needs an NVIDIA GPU with NVML: run `python -m pytest -m gpu tests/test_hardware.py` on a GPU machine"


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


HAS_GPU = _nvml_gpus() > 0
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason=HOW_TO_RUN_GPU)


# --- catalogue --------------------------------------------------------------------------------------------

ISSUE_GPUS = ("a100-40g-sxm", "a100-40g-pcie", "a100-80g-sxm", "a100-80g-pcie", "rtx4090", "l40s", "h100-sxm",
              "h100-pcie", "h200")


def test_catalogue_holds_the_issue_gpus_each_with_a_source():
    assert set(ISSUE_GPUS) <= set(hardware.CATALOGUE)
    for gpu_id, g in hardware.CATALOGUE.items():
        assert g.id == gpu_id and g.source and g.interconnect and g.fp8
        assert g.memory_gib > 0 and g.bandwidth_gbs > 0 and g.bf16_tflops > 0 and g.sm_count > 0
        if g.cuda_total_gib is not None:  # CUDA reports a little under the marketed size, never more
            assert 0.9 * g.memory_gib < g.cuda_total_gib <= g.memory_gib


def test_dense_rates_follow_each_architecture():
    for g in hardware.CATALOGUE.values():
        # GeForce cards run BF16 with FP32 accumulate at half the rate, so INT8 is 4x there, 2x elsewhere.
        assert g.int8_tops == pytest.approx((4 if "GeForce" in g.name else 2) * g.bf16_tflops, rel=0.03)
        if g.compute_capability >= (8, 9):
            assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.03) and "W8A8" in g.fp8
        else:  # Ampere: no FP8 tensor cores; vLLM runs FP8 weights through Marlin
            assert g.fp8_tflops is None and "Marlin" in g.fp8
            assert g.matmul_tflops("fp8") == g.bf16_tflops
    # Datasheet figures the planner's headline numbers rest on.
    assert hardware.get_gpu("a100-80g").bandwidth_gbs == 2039 and hardware.get_gpu("a100-80g-pcie").bandwidth_gbs == 1935
    assert hardware.get_gpu("rtx4090").memory_gib == 24 and hardware.get_gpu("h200").bandwidth_gbs == 4800


def test_get_gpu_takes_aliases_and_names_the_allowed_ones():
    assert hardware.get_gpu("A100").id == "a100-80g-sxm"
    assert hardware.get_gpu("4090").id == "rtx4090"
    with pytest.raises(SpecError) as exc:
        hardware.get_gpu("v100")
    assert "rtx4090" in exc.value.allowed and "v100" in str(exc.value)


@pytest.mark.parametrize("name, gpu_id", [
    ("NVIDIA A100-SXM4-80GB", "a100-80g-sxm"), ("NVIDIA A100 80GB PCIe", "a100-80g-pcie"),
    ("NVIDIA A100-PCIE-40GB", "a100-40g-pcie"), ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", None), ("Tesla V100-SXM2-16GB", None),
])
def test_match_gpu_reads_nvml_names(name, gpu_id):
    got = hardware.match_gpu(name)
    assert (got.id if got else None) == gpu_id


# --- probes -----------------------------------------------------------------------------------------------

def test_parse_cpulist():
    assert hardware.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert hardware.parse_cpulist("") == []


def test_numa_nodes_read_a_sysfs_tree(tmp_path):
    for node, cpus, kb in ((0, "0-3", 8 * 2**20), (1, "4-7", 4 * 2**20)):
        d = tmp_path / f"node{node}"
        d.mkdir()
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {node} MemTotal:       {kb} kB\nNode {node} MemFree: 1 kB\n")
    nodes = hardware.numa_nodes(tmp_path)
    assert [(n["node"], n["cpu_count"], n["memory_gib"]) for n in nodes] == [(0, 4, 8.0), (1, 4, 4.0)]


def test_probe_without_nvml_says_so_and_still_reports_the_cpu(monkeypatch):
    import pynvml

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    got = hardware.probe()
    assert got["gpus"] == [] and "NVML" in got["no_gpu_reason"]
    topo = got["cpu_topology"]
    assert got["cpu"] and topo["logical_cpus"] >= 1 and topo["allowed_cpus"] >= 1 and got["numa_nodes"] >= 1
    assert hardware.gpu_summary(got) == "none (CPU)"


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU; the no-GPU probe is tested on machines without one")
def test_probe_on_this_machine_without_a_gpu():
    got = hardware.probe()
    assert got["gpus"] == [] and got["no_gpu_reason"].startswith("no NVIDIA GPU")
    assert got["cpu_count"] >= 1 and got["numa"][0]["cpus"]


def test_sampler_without_nvml_records_nothing_and_says_why_once(monkeypatch):
    import pynvml

    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    said = []
    sampler = NvmlSampler(interval_s=0.01, log=said.append).start()
    time.sleep(0.05)
    sampler.stop()
    sampler.stop()
    assert sampler.samples == [] and sampler.peak_memory_mib() is None
    assert len(said) == 1 and said[0] == sampler.why_not and "NVML" in said[0]


def test_visible_devices_pick_nvml_indices_like_cuda():
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert visible_nvml_indices(None, uuids) is None
    assert visible_nvml_indices("", uuids) == []
    assert visible_nvml_indices("2,0", uuids) == [2, 0]
    assert visible_nvml_indices("GPU-bbb", uuids) == [1] and visible_nvml_indices("ccc", uuids) == [2]
    assert visible_nvml_indices("0,-1,2", uuids) == [0]  # CUDA stops at the first entry that names no GPU


# --- on a GPU ---------------------------------------------------------------------------------------------

@gpu
@needs_gpu
def test_probe_reads_every_gpu():
    got = hardware.probe()
    assert got["no_gpu_reason"] is None and len(got["gpus"]) == _nvml_gpus()
    for g in got["gpus"]:
        assert g["name"] and g["memory_total_mib"] > 1000 and g["driver"] and "." in g["cuda_driver"]
        assert len(g["compute_capability"]) == 2 and g["uuid"].startswith("GPU-")
        assert g["sm_clock_max_mhz"] and g["sm_clock_max_mhz"] >= (g["sm_clock_mhz"] or 0)
        assert "numa_node" in g and "pcie_gen" in g and "pcie_width_max" in g
        spec = hardware.match_gpu(g["name"])
        assert g["catalogue_id"] == (spec.id if spec else None)


@gpu
@needs_gpu
def test_nvml_sampler_records_each_field_of_each_gpu_and_the_peak():
    torch = pytest.importorskip("torch", reason="torch allocates the memory the sampler must see")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here; " + HOW_TO_RUN_GPU)
    sampler = NvmlSampler(interval_s=0.05, visible_devices="0")
    sampler.start()
    time.sleep(0.3)
    before = max(v for _, s, n, v in sampler.samples if n == "memory_used_mib")
    block = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda:0")  # 2 GiB
    block.fill_(1)
    a = torch.randn(4096, 4096, device="cuda:0")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    time.sleep(0.3)
    sampler.stop()
    sampler.stop()  # a second stop is harmless
    assert sampler.why_not is None
    assert {s for _, s, _, _ in sampler.samples} == {"gpu0"}
    names = {n for _, _, n, _ in sampler.samples}
    assert {"memory_used_mib", "utilization_pct", "power_w", "sm_clock_mhz", "temperature_c"} <= names <= set(GPU_FIELDS)
    times = sorted({t for t, _, _, _ in sampler.samples})
    assert len(times) >= 10 and all(b > a for a, b in zip(times, times[1:]))
    assert sampler.peak_memory_mib() >= before + 1900  # the 2 GiB block was seen
    util = [v for _, _, n, v in sampler.samples if n == "utilization_pct"]
    assert max(util) > 0 and all(0 <= u <= 100 for u in util)
    summary = sampler.summary()
    assert summary["peak_gpu_memory_mib"] == sampler.peak_memory_mib() and summary["gpu_samples"] == len(times)
    del block, a


@gpu
@needs_gpu
def test_nvml_sampler_watches_only_the_visible_gpus():
    sampler = NvmlSampler(interval_s=0.01, visible_devices="99").start()
    sampler.stop()
    assert sampler.samples == [] and "CUDA_VISIBLE_DEVICES" in sampler.why_not


def test_cpu_topology_names_the_vector_extensions_vllm_picks_kernels_by(monkeypatch):
    cpuinfo = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx avx2 avx512f amx_tile\n"
    monkeypatch.setattr(hardware, "_read", lambda path: cpuinfo if str(path) == "/proc/cpuinfo" else None)
    topo = hardware.cpu_topology()
    assert topo["model"] == "Some CPU" and topo["vector_isa"] == ["avx2", "avx512f"]
