"""GPU catalogue and probes of the local machine (GPUs through NVML, CPU and NUMA from the OS)."""
from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecError


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    memory_gib: float
    bandwidth_gbs: float  # HBM/GDDR bandwidth, GB/s
    bf16_tflops: float  # dense
    fp8_tflops: float | None  # dense; None = no FP8 tensor cores
    int8_tops: float
    compute_capability: tuple[int, int]
    interconnect: str
    source: str


CATALOGUE: dict[str, GpuSpec] = {g.id: g for g in (
    GpuSpec("a100-80g", "NVIDIA A100 80GB SXM", 80, 2039, 312, None, 624, (8, 0), "NVLink 600 GB/s, PCIe 4.0 x16",
            "NVIDIA A100 datasheet (2021)"),
    GpuSpec("rtx4090", "NVIDIA GeForce RTX 4090", 24, 1008, 165.2, 330.3, 660.6, (8, 9), "PCIe 4.0 x16",
            "NVIDIA Ada Lovelace GPU architecture whitepaper v1.01, Table 2 (dense, FP32 accumulate)"),
    GpuSpec("h200", "NVIDIA H200 SXM", 141, 4800, 989, 1979, 1979, (9, 0), "NVLink 900 GB/s, PCIe 5.0 x16",
            "NVIDIA H200 datasheet (dense figures: half the sparsity numbers)"),
)}
ALIASES = {"a100": "a100-80g", "a100-80gb": "a100-80g", "4090": "rtx4090", "rtx-4090": "rtx4090"}


def get_gpu(gpu_id: str) -> GpuSpec:
    key = ALIASES.get(gpu_id.lower(), gpu_id.lower())
    if key not in CATALOGUE:
        raise SpecError("gpu", gpu_id, ", ".join(CATALOGUE), "use a catalogue id (qwen3lab plan --help lists them)")
    return CATALOGUE[key]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numa_nodes() -> list[dict]:
    base = Path("/sys/devices/system/node")
    nodes = []
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = (node / "cpulist").read_text().strip() if (node / "cpulist").exists() else ""
        nodes.append({"node": int(node.name[4:]), "cpus": cpus})
    return nodes or [{"node": 0, "cpus": f"0-{(os.cpu_count() or 1) - 1}"}]


def _gpu_numa_node(pci_bus_id: str) -> int | None:
    path = Path("/sys/bus/pci/devices") / pci_bus_id.lower()[-12:] / "numa_node"
    try:
        node = int(path.read_text().strip())
        return node if node >= 0 else None
    except (OSError, ValueError):
        return None


def probe_gpus() -> tuple[list[dict], str | None]:
    """GPUs seen through NVML, and why none were seen (None when NVML answered)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"no NVIDIA GPU: NVML is not available ({type(exc).__name__}: {exc})"
    try:
        out = []
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
            gpu = {"index": i, "name": pynvml.nvmlDeviceGetName(h), "memory_total_mib": mem.total / 2**20,
                   "compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                   "driver": driver, "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "pci_bus_id": bus,
                   "numa_node": _gpu_numa_node(bus)}
            for key, read in (("sm_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                              ("mem_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                              ("pcie_gen", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                              ("pcie_width", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h))):
                try:
                    gpu[key] = read()
                except Exception:
                    gpu[key] = None
            out.append(gpu)
        return out, None if out else "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()


def probe() -> dict:
    """This machine: host, CPU, memory, NUMA nodes, GPUs (or why there are none)."""
    gpus, why = probe_gpus()
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = None
    nodes = numa_nodes()
    return {"host": socket.gethostname(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
            "memory_gib": mem_gib, "numa_nodes": len(nodes), "numa": nodes, "gpus": gpus, "no_gpu_reason": why}


def gpu_summary(probe_result: dict) -> str:
    gpus = probe_result.get("gpus") or []
    if not gpus:
        return "none (CPU)"
    names = [g["name"] for g in gpus]
    return f"{len(names)}x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
