"""Samples taken while a trial runs: vLLM's /metrics (scraped) and the GPU through NVML (sampled).

Both produce (t, source, name, value) rows, t in seconds since the load started, stored in `samples`.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import aiohttp

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

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
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
        async with aiohttp.ClientSession(headers=self.headers) as session:
            while not stop.is_set():
                await self.scrape_once(session)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
                except asyncio.TimeoutError:
                    pass
            await self.scrape_once(session)  # the final counters, after the last request


class NvmlSampler:
    """Samples every visible GPU in a background thread: memory, utilization, power, SM clock, temperature.

    On a machine without an NVIDIA GPU (or without NVML) it records nothing and says why once, in `why_not`.
    """

    def __init__(self, interval_s: float = 0.5, t0: float | None = None, log: Callable[[str], None] | None = None):
        self.interval_s = interval_s
        self.t0 = t0 if t0 is not None else time.perf_counter()
        self.samples: list[tuple[float, str, str, float]] = []
        self.why_not: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = log
        self._nvml = None
        self._handles: list = []

    def _open(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as exc:  # no driver, no library, no device
            self.why_not = f"no GPU telemetry: NVML is not available here ({type(exc).__name__}: {exc})"
            return False
        if not self._handles:
            self.why_not = "no GPU telemetry: NVML sees no GPU"
            return False
        return True

    def sample_once(self) -> None:
        nv = self._nvml
        t = time.perf_counter() - self.t0
        for i, h in enumerate(self._handles):
            src = f"gpu{i}"
            for name, read in (
                ("memory_used_mib", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
                ("utilization_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                ("memory_utilization_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).memory),
                ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ):
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
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._nvml:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def peak_memory_mib(self) -> float | None:
        used = [v for _, _, name, v in self.samples if name == "memory_used_mib"]
        return max(used) if used else None
