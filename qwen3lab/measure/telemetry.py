"""Samples taken while a trial runs: vLLM's /metrics (scraped) and the GPU through NVML (sampled).

Both produce (t, source, name, value) rows, t in seconds since the load started, stored in `samples`.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

# Gauges and counters worth a time series; counters are stored raw (rates are differences).
SCRAPED = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
)
# Older vLLM names, read under the current name.
ALIASES = {"vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc", "vllm:num_preemptions": "vllm:num_preemptions_total"}


def parse_metrics(text: str) -> dict[str, float]:
    """The SCRAPED series from a Prometheus exposition, summed over label sets (one engine, one model)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = [line for line in text.splitlines() if line.startswith(("vllm:", "# TYPE vllm:"))]
    out: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
        for sample in family.samples:
            name = ALIASES.get(sample.name, sample.name)
            if name in SCRAPED:
                out[name] = out.get(name, 0.0) + float(sample.value)
    return out


class MetricsScraper:
    """Scrapes base_url/metrics every `interval_s` inside the load generator's event loop."""

    def __init__(self, base_url: str, interval_s: float, t0: float, headers: dict | None = None):
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s, self.t0, self.headers = interval_s, t0, headers or {}
        self.samples: list[tuple[float, str, str, float]] = []
        self.errors = 0

    async def scrape_once(self, session: "aiohttp.ClientSession") -> None:
        import aiohttp

        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    self.errors += 1
                    return
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            self.errors += 1
            return
        t = time.perf_counter() - self.t0
        self.samples += [(t, "vllm", name, value) for name, value in parse_metrics(text).items()]

    async def run(self, stop: asyncio.Event) -> None:
        import aiohttp

        async with aiohttp.ClientSession(headers=self.headers) as session:
            while not stop.is_set():
                await self.scrape_once(session)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
                except asyncio.TimeoutError:
                    pass
            await self.scrape_once(session)  # the final counters, after the last request


GPU_FIELDS = ("memory_used_mib", "utilization_pct", "memory_utilization_pct", "power_w", "sm_clock_mhz", "temperature_c")


def visible_nvml_indices(visible: str | None, uuids: list[str]) -> list[int] | None:
    """NVML indices of the GPUs a CUDA_VISIBLE_DEVICES value names (indices or UUIDs); None = all of them.

    NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES, so without this the sampler would
    watch (and take the peak memory of) GPUs the server does not use. Integers are read as NVML indices: CUDA
    orders GPUs fastest first, which is PCI order on a host of identical GPUs. Like CUDA, an entry that names
    no GPU ends the list."""
    if visible is None:
        return None
    out: list[int] = []
    for item in (v.strip() for v in visible.split(",")):
        if item.isdigit() and int(item) < len(uuids):
            out.append(int(item))
            continue
        match = [i for i, u in enumerate(uuids) if item and (u.startswith(item) or u.startswith("GPU-" + item))]
        if not match:
            break
        out.append(match[0])
    return out


class NvmlSampler:
    """Samples the server's GPUs in a background thread: memory, utilization, power, SM clock, temperature.

    `visible_devices` is the server's CUDA_VISIBLE_DEVICES (None: this process's, else every GPU). On a
    machine without an NVIDIA GPU (or without NVML) it records nothing and says why once, in `why_not`.
    """

    def __init__(self, interval_s: float = 0.5, t0: float | None = None, log: Callable[[str], None] | None = None,
                 visible_devices: str | None = None):
        self.interval_s = interval_s
        self.t0 = t0 if t0 is not None else time.perf_counter()
        self.samples: list[tuple[float, str, str, float]] = []
        self.why_not: str | None = None
        self.visible_devices = visible_devices if visible_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = log
        self._nvml = None
        self._handles: list[tuple[int, object]] = []

    def _open(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no driver, no library, no device
            self.why_not = f"no GPU telemetry: NVML is not available here ({type(exc).__name__}: {exc})"
            return False
        self._nvml = pynvml
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        except Exception as exc:
            self.why_not = f"no GPU telemetry: NVML could not list the GPUs ({type(exc).__name__}: {exc})"
            self._close()
            return False
        wanted = visible_nvml_indices(self.visible_devices, uuids)
        self._handles = [(i, h) for i, h in enumerate(handles) if wanted is None or i in wanted]
        if not self._handles:
            self.why_not = ("no GPU telemetry: NVML sees no GPU" if not handles else
                            f"no GPU telemetry: CUDA_VISIBLE_DEVICES={self.visible_devices!r} names none of the "
                            f"{len(handles)} GPUs NVML sees")
            self._close()
            return False
        return True

    def _close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def sample_once(self) -> None:
        nv = self._nvml
        if nv is None:
            return
        t = time.perf_counter() - self.t0
        for i, h in self._handles:
            src = f"gpu{i}"  # NVML's index (PCI order), the same as nvidia-smi's
            reads = (
                lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
                lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            )
            for name, read in zip(GPU_FIELDS, reads):
                try:
                    self.samples.append((t, src, name, float(read())))
                except Exception:
                    pass  # a field this GPU does not report

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)
        self.sample_once()

    def start(self) -> "NvmlSampler":
        if self._open():
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
            self._thread.start()
        elif self._log:
            self._log(self.why_not)
        return self

    def stop(self) -> None:
        """Stop sampling (a last sample is taken) and release NVML; safe to call more than once."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
            self._thread = None
        self._close()

    def peak_memory_mib(self) -> float | None:
        """Highest memory in use on any sampled GPU (every process's, as nvidia-smi shows it)."""
        used = [v for _, _, name, v in self.samples if name == "memory_used_mib"]
        return max(used) if used else None

    def summary(self) -> dict[str, float | None]:
        """What the run summary keeps: peak memory, mean utilization and power, highest temperature."""
        def pick(name, fn):
            values = [v for _, _, n, v in self.samples if n == name]
            return fn(values) if values else None

        mean = lambda v: sum(v) / len(v)  # noqa: E731
        return {"peak_gpu_memory_mib": self.peak_memory_mib(), "mean_gpu_utilization_pct": pick("utilization_pct", mean),
                "mean_gpu_power_w": pick("power_w", mean), "max_gpu_temperature_c": pick("temperature_c", max),
                "gpu_samples": len({t for t, _, n, _ in self.samples if n == "memory_used_mib"})}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
