"""GPU catalogue and probes of the local machine (GPUs through NVML, CPU and NUMA from the OS).

The catalogue holds each card's limits as its vendor publishes them (dense tensor rates: half the "with
sparsity" figures). `cuda_total_gib` is the total that CUDA reports (cudaMemGetInfo), which is what vLLM
multiplies by gpu_memory_utilization; it is a little under the marketed size. A machine's own measured
limits (from `qwen3lab calibrate`) are kept as a profile beside the catalogue, never mixed into it.
"""
from __future__ import annotations

import json
import os
import platform
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from qwen3lab.errors import SpecError

GiB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    memory_gib: float  # as marketed: NVIDIA's "GB" of GPU memory are GiB (the A100 80GB has 81920 MiB)
    cuda_total_gib: float | None  # total as CUDA reports it: what gpu_memory_utilization is a fraction of
    bandwidth_gbs: float  # memory bandwidth, GB/s (decimal)
    bf16_tflops: float  # dense BF16 tensor rate, FP32 accumulate
    fp8_tflops: float | None  # dense FP8 tensor rate; None = no FP8 tensor cores
    int8_tops: float  # dense INT8 tensor rate
    compute_capability: tuple[int, int]
    fp8: str  # how vLLM runs FP8 weights here
    sm_count: int
    interconnect: str
    source: str

    @property
    def memory_total_bytes(self) -> int:
        """What vLLM sees as the device's total memory."""
        gib = self.cuda_total_gib if self.cuda_total_gib is not None else self.memory_gib
        return int(gib * GiB)

    def matmul_tflops(self, weight_dtype: str) -> float:
        """Dense tensor rate a GEMM with these weights runs at: FP8 only where the card has FP8 tensor cores."""
        if weight_dtype == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops  # BF16/FP16, and weight-only kernels (Marlin W8A16, AWQ W4A16) dequantize to 16 bit

    def to_dict(self) -> dict:
        return asdict(self)


_NATIVE_FP8 = "W8A8 on FP8 tensor cores"
_MARLIN_FP8 = "weight-only W8A16 through Marlin (no FP8 tensor cores on sm80)"
# CUDA totals for cards not measured here are the total capacity PyTorch prints in its out-of-memory messages
# as users report them (approximate, +-0.1 GiB); `qwen3lab calibrate` measures the real one on your card.
_REPORTED_TOTAL = "cuda_total_gib: as PyTorch reports it in users' OOM messages (approximate, not measured here)"
CATALOGUE: dict[str, GpuSpec] = {g.id: g for g in (
    GpuSpec("a100-40g-sxm", "NVIDIA A100-SXM4-40GB", 40, 39.59, 1555, 312, None, 624, (8, 0), _MARLIN_FP8, 108,
            "NVLink 3 600 GB/s; PCIe 4.0 x16 64 GB/s",
            f"NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB SXM column; {_REPORTED_TOTAL}"),
    GpuSpec("a100-40g-pcie", "NVIDIA A100-PCIE-40GB", 40, 39.59, 1555, 312, None, 624, (8, 0), _MARLIN_FP8, 108,
            "PCIe 4.0 x16 64 GB/s; NVLink bridge 600 GB/s (2 GPUs)",
            f"NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB PCIe column; {_REPORTED_TOTAL}"),
    GpuSpec("a100-80g-sxm", "NVIDIA A100-SXM4-80GB", 80, 79.15, 2039, 312, None, 624, (8, 0), _MARLIN_FP8, 108,
            "NVLink 3 600 GB/s; PCIe 4.0 x16 64 GB/s",
            f"NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB SXM column; {_REPORTED_TOTAL}"),
    GpuSpec("a100-80g-pcie", "NVIDIA A100 80GB PCIe", 80, 79.15, 1935, 312, None, 624, (8, 0), _MARLIN_FP8, 108,
            "PCIe 4.0 x16 64 GB/s; NVLink bridge 600 GB/s (2 GPUs)",
            f"NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB PCIe column; {_REPORTED_TOTAL}"),
    GpuSpec("rtx4090", "NVIDIA GeForce RTX 4090", 24, 23.65, 1008, 165.2, 330.3, 660.6, (8, 9), _NATIVE_FP8, 128,
            "PCIe 4.0 x16 64 GB/s; no NVLink",
            "NVIDIA Ada Lovelace GPU architecture whitepaper v1.01, Table 2 (GeForce rates with FP32 accumulate, "
            f"dense); {_REPORTED_TOTAL}"),
    GpuSpec("l40s", "NVIDIA L40S", 48, 44.4, 864, 362.05, 733, 733, (8, 9), _NATIVE_FP8, 142,
            "PCIe 4.0 x16 64 GB/s; no NVLink",
            f"NVIDIA L40S datasheet (2023), dense figures; {_REPORTED_TOTAL}"),
    GpuSpec("h100-sxm", "NVIDIA H100 80GB HBM3", 80, 79.1, 3350, 989, 1979, 1979, (9, 0), _NATIVE_FP8, 132,
            "NVLink 4 900 GB/s; PCIe 5.0 x16 128 GB/s",
            f"NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (dense: half the sparsity figures); {_REPORTED_TOTAL}"),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", 80, 79.1, 2000, 756, 1513, 1513, (9, 0), _NATIVE_FP8, 114,
            "PCIe 5.0 x16 128 GB/s; NVLink bridge 600 GB/s (2 GPUs)",
            f"NVIDIA H100 Tensor Core GPU datasheet (2022), H100 PCIe column (dense); {_REPORTED_TOTAL}"),
    GpuSpec("h200", "NVIDIA H200", 141, 139.8, 4800, 989, 1979, 1979, (9, 0), _NATIVE_FP8, 132,
            "NVLink 4 900 GB/s; PCIe 5.0 x16 128 GB/s",
            "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (dense: half the sparsity figures); "
            "cuda_total_gib measured here (experiments/calibration/h200.json)"),
)}
ALIASES = {
    "a100": "a100-80g-sxm", "a100-80g": "a100-80g-sxm", "a100-80gb": "a100-80g-sxm", "a100-40g": "a100-40g-sxm",
    "a100-40gb": "a100-40g-sxm", "4090": "rtx4090", "rtx-4090": "rtx4090", "h100": "h100-sxm", "h200-sxm": "h200",
}
# How NVML names each card (nvmlDeviceGetName), most specific first.
_NVML_NAMES = (
    ("A100-SXM4-80GB", "a100-80g-sxm"), ("A100 80GB PCIe", "a100-80g-pcie"), ("A100-PCIE-80GB", "a100-80g-pcie"),
    ("A100-SXM4-40GB", "a100-40g-sxm"), ("A100-PCIE-40GB", "a100-40g-pcie"), ("RTX 4090", "rtx4090"),
    ("L40S", "l40s"), ("H100 80GB HBM3", "h100-sxm"), ("H100 SXM", "h100-sxm"), ("H100 PCIe", "h100-pcie"),
    ("H200 NVL", None), ("H200", "h200"),
)


def get_gpu(gpu_id: str) -> GpuSpec:
    key = ALIASES.get(gpu_id.lower(), gpu_id.lower())
    if key not in CATALOGUE:
        raise SpecError("gpu", gpu_id, ", ".join([*CATALOGUE, *ALIASES]),
                        "use a catalogue id (`qwen3lab plan --help` lists them)")
    return CATALOGUE[key]


def match_gpu(nvml_name: str) -> GpuSpec | None:
    """The catalogue entry for a name as NVML reports it, or None for a card the catalogue lacks."""
    for needle, gpu_id in _NVML_NAMES:
        if needle.lower() in nvml_name.lower():
            return CATALOGUE[gpu_id] if gpu_id else None
    return None


# --- measured profiles (written by `qwen3lab calibrate`) ---------------------------------------------------

def profiles_dir() -> Path:
    return Path(os.environ.get("QWEN3LAB_PROFILES") or Path.home() / ".cache" / "qwen3lab" / "profiles")


def save_profile(profile: dict, path: str | os.PathLike | None = None) -> Path:
    """Store a calibration as this machine's profile, named after its GPU."""
    path = Path(path) if path else profiles_dir() / f"{profile['gpu_id'] or 'unknown-gpu'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")
    return path


# --- the local machine ------------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpuinfo(key: str) -> str | None:
    """The first value of `key` in /proc/cpuinfo; None when it is not there."""
    for line in (_read(Path("/proc/cpuinfo")) or "").splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what vLLM's CPU kernels are chosen by


def cpu_flags() -> frozenset[str] | None:
    """/proc/cpuinfo's flags of this host; None = not known."""
    flags = _cpuinfo("flags")
    return None if flags is None else frozenset(flags.split())


def _vector_isa() -> list[str]:
    """The vector extensions of VECTOR_FLAGS this CPU has: two 2-core VMs ran vLLM ~8x apart, one without AVX-512."""
    flags = cpu_flags() or frozenset()
    return [f for f in VECTOR_FLAGS if f in flags]


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def numa_nodes(base: Path = Path("/sys/devices/system/node")) -> list[dict]:
    """NUMA nodes with their CPUs and memory; one node holding every CPU when the kernel exposes none."""
    nodes = []
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = _read(node / "cpulist") or ""
        mem_kb = None
        for line in (_read(node / "meminfo") or "").splitlines():
            if "MemTotal:" in line:
                mem_kb = int(line.split()[-2])
        nodes.append({"node": int(node.name[4:]), "cpus": cpus, "cpu_count": len(parse_cpulist(cpus)),
                      "memory_gib": round(mem_kb / 2**20, 2) if mem_kb else None})
    return nodes or [{"node": 0, "cpus": f"0-{(os.cpu_count() or 1) - 1}", "cpu_count": os.cpu_count(),
                      "memory_gib": None}]


def cpu_topology(base: Path = Path("/sys/devices/system/cpu")) -> dict:
    """Sockets, physical cores and hardware threads, from the kernel's topology files."""
    packages, cores = set(), set()
    cpus = parse_cpulist(_read(base / "online") or "") or list(range(os.cpu_count() or 1))
    for cpu in cpus:
        topo = base / f"cpu{cpu}" / "topology"
        pkg, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if pkg is not None and core is not None:
            packages.add(pkg)
            cores.add((pkg, core))
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = cpus
    return {"model": _cpu_model(), "vector_isa": _vector_isa(), "logical_cpus": len(cpus), "sockets": len(packages) or None,
            "physical_cores": len(cores) or None,
            "threads_per_core": round(len(cpus) / len(cores)) if cores else None,
            "allowed_cpus": len(allowed), "machine": platform.machine()}


def _gpu_numa_node(pci_bus_id: str) -> int | None:
    # NVML writes an 8-digit PCI domain (00000000:17:00.0); sysfs uses 4 (0000:17:00.0).
    node = _read(Path("/sys/bus/pci/devices") / pci_bus_id.lower()[-12:] / "numa_node")
    try:
        return int(node) if node is not None and int(node) >= 0 else None
    except ValueError:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus() -> tuple[list[dict], str | None]:
    """GPUs seen through NVML, and why none were seen (None when NVML answered with at least one)."""
    try:
        import pynvml
    except ImportError:
        return [], "no NVIDIA GPU telemetry: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: a machine without an NVIDIA GPU
        return [], f"no NVIDIA GPU: NVML is not available ({type(exc).__name__}: {exc})"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            spec = match_gpu(name)
            gpu = {"index": i, "name": name, "catalogue_id": spec.id if spec else None,
                   "memory_total_mib": mem.total / 2**20, "memory_used_mib": mem.used / 2**20,
                   "driver": driver, "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "pci_bus_id": bus,
                   "numa_node": _gpu_numa_node(bus)}
            reads = {
                "uuid": lambda: _text(pynvml.nvmlDeviceGetUUID(h)),
                "compute_capability": lambda: list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "pcie_gen": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                "pcie_gen_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                "pcie_width_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
                "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                "nvml_numa_node": lambda: pynvml.nvmlDeviceGetNumaNodeId(h),
            }
            for key, read in reads.items():
                try:
                    gpu[key] = read()
                except Exception:  # a field this card or driver does not report
                    gpu[key] = None
            if gpu["numa_node"] is None and isinstance(gpu["nvml_numa_node"], int) and gpu["nvml_numa_node"] >= 0:
                gpu["numa_node"] = gpu["nvml_numa_node"]
            out.append(gpu)
        return out, None if out else "NVML answered but sees no GPU"
    finally:
        pynvml.nvmlShutdown()


def probe() -> dict:
    """This machine: host, CPU and its topology, memory, NUMA nodes, GPUs (or why there are none)."""
    gpus, why = probe_gpus()
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    except (ValueError, OSError, AttributeError):
        mem_gib = None
    nodes = numa_nodes()
    topo = cpu_topology()
    return {"host": socket.gethostname(), "cpu": topo["model"], "cpu_count": os.cpu_count(), "cpu_topology": topo,
            "memory_gib": mem_gib, "numa_nodes": len(nodes), "numa": nodes, "gpus": gpus, "no_gpu_reason": why}


def gpu_summary(probe_result: dict) -> str:
    gpus = probe_result.get("gpus") or []
    if not gpus:
        return "none (CPU)"
    names = [g["name"] for g in gpus]
    return f"{len(names)}x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
