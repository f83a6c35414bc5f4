"""Samples taken while a trial runs: vLLM's /metrics (scraped) and the GPU through NVML (sampled).

Neither runs on the load generator's event loop: /metrics is scraped and parsed by a child process, NVML is
read by a thread that spends its time in the driver. Both produce (t, source, name, value) rows, t in seconds since the load started, stored in `samples`.
"""
from __future__ import annotations

import os
import re
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


_SERIES = re.compile(  # a wanted series' line: its name, its labels if any, its value
    rb"^(" + b"|".join(re.escape(n.encode()) for n in (*SCRAPED, *ALIASES)) + rb")(?:\{[^\n]*\})?[ \t]+(\S+)",
    re.M)


def parse_metrics(text: str | bytes) -> dict[str, float]:
    """The SCRAPED series from a Prometheus exposition, summed over label sets (one engine, one model).

    One regular expression over the bytes, not prometheus_client's parser nor a loop over lines: it runs every
    `scrape_interval_s` while the load runs, and the histograms' bucket lines (most of vLLM's exposition) are
    passed over in C. Labels run to the line's last `}` (a label value may hold one)."""
    data = text.encode() if isinstance(text, str) else text
    out: dict[str, float] = {}
    for raw_name, raw_value in _SERIES.findall(data):
        try:
            value = float(raw_value)
        except ValueError:
            continue  # a malformed line: skipped, like a failed scrape
        name = raw_name.decode()
        name = ALIASES.get(name, name)
        out[name] = out.get(name, 0.0) + value
    return out


class MetricsFetch:
    """GETs one /metrics URL again and again on one kept-alive connection (http.client), as Prometheus does:
    no connection, no urllib request objects per scrape. A connection the server closed meanwhile (an idle
    timeout longer scrape intervals meet) is opened again once."""

    def __init__(self, url: str, headers: dict | None = None, timeout_s: float = 5.0):
        import http.client
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        self._new = lambda: (http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection)(
            parts.hostname, parts.port, timeout=timeout_s)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = headers or {}
        self._conn = None

    def get(self) -> dict[str, float] | None:
        """The parsed series; None when the server did not answer 200."""
        import http.client

        for fresh in (self._conn is None, True):
            try:
                if self._conn is None:
                    self._conn = self._new()
                self._conn.request("GET", self.path, headers=self.headers)
                resp = self._conn.getresponse()
                body = resp.read()
                if resp.will_close:
                    self.close()
                return parse_metrics(body) if resp.status == 200 else None
            except (OSError, http.client.HTTPException, ValueError):
                self.close()
                if fresh:
                    return None  # a new connection failed too: the server is not answering
        return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MetricsScraper:
    """Scrapes base_url/metrics every `interval_s` from a child process, never from the load's event loop.

    A child of its own (stdlib only, started before the load) so that fetching and parsing take no GIL and no
    event-loop time from the client that timestamps the streams; it sleeps between scrapes (bounded CPU) and
    appends (monotonic time, name, value) lines to a file read once the load is over. The time base is
    CLOCK_MONOTONIC, which `time.perf_counter()` reads too, in every process of the machine.
    Use: `with MetricsScraper(url, 1.0, t0) as s: ...load...`, then `s.samples` (t = perf_counter() - t0).
    """

    def __init__(self, base_url: str, interval_s: float, t0: float, headers: dict | None = None):
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s, self.t0, self.headers = interval_s, t0, headers or {}
        self.samples: list[tuple[float, str, str, float]] = []
        self.errors = 0
        self.cpu_s = 0.0  # CPU seconds the scraper's process spent, from its first scrape to its last
        self._proc = None
        self._out = None
        self._live: list[tuple[float, str, str, float]] = []
        self._live_pos = 0
        self._live_read_at = 0.0

    def so_far(self) -> list[tuple[float, str, str, float]]:
        """The samples scraped so far, during the load (a capacity point's saturation check reads them): new
        whole lines of the child's file, read at most once per scrape interval, so the loop pays a read a second."""
        now = time.perf_counter()
        if self._out is None or now - self._live_read_at < self.interval_s:
            return self._live
        self._live_read_at = now
        with open(self._out.name) as f:
            f.seek(self._live_pos)
            chunk = f.read()
        whole = chunk[:chunk.rfind("\n") + 1]  # a line the child is still writing waits for the next read
        self._live_pos += len(whole)
        for line in whole.splitlines():
            t, name, value = line.split("\t")
            if not name.startswith("!"):
                self._live.append((float(t) - self.t0, "vllm", name, float(value)))
        return self._live

    def start(self) -> "MetricsScraper":
        import json
        import subprocess
        import sys
        import tempfile

        self._out = tempfile.NamedTemporaryFile("w+", prefix="qwen3lab-scrape-", suffix=".tsv")
        # Headers (an API key) go through stdin, not argv: argv is visible to every user of the machine.
        # This very file as a script, isolated (-I): the stdlib alone, whatever sys.path the caller has.
        self._proc = subprocess.Popen([sys.executable, "-I", __file__, self.url,
                                       str(self.interval_s), self._out.name], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, text=True)
        self._proc.stdin.write(json.dumps(self.headers) + "\n")
        self._proc.stdin.flush()
        return self

    def stop(self) -> list[tuple[float, str, str, float]]:
        """Ask for a last scrape (the final counters), wait for it and read every sample."""
        if self._proc is None:
            return self.samples
        try:
            self._proc.stdin.close()  # EOF: scrape once more and exit
            self._proc.wait(timeout=self.interval_s + 15)
        except Exception:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        for line in open(self._out.name):
            t, name, value = line.rstrip("\n").split("\t")
            if name == "!error":
                self.errors += 1
            elif name == "!cpu":
                self.cpu_s = float(value)
            else:
                self.samples.append((float(t) - self.t0, "vllm", name, float(value)))
        self._out.close()
        return self.samples

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _scrape_loop(url: str, interval_s: float, out_path: str) -> None:
    """The child's loop: scrape, append, sleep; stdin's EOF asks for one last scrape, then exit."""
    import json
    import select
    import sys

    fetch = MetricsFetch(url, json.loads(sys.stdin.readline() or "{}"))
    # Its CPU from the first scrape on: the interpreter's start comes before the load, as vllm bench's imports
    # and dataset do, which its client CPU leaves out too
    cpu0 = time.process_time()
    last = False
    with open(out_path, "a") as out:
        while True:
            got, t = fetch.get(), time.perf_counter()
            out.write("".join(f"{t}\t{n}\t{v}\n" for n, v in got.items()) if got is not None else f"{t}\t!error\t0\n")
            out.flush()
            if last:  # its own CPU, counted as the client's (what measuring cost this machine)
                out.write(f"{t}\t!cpu\t{time.process_time() - cpu0}\n")
                return
            ready, _, _ = select.select([sys.stdin], [], [], interval_s)
            last = bool(ready) and not sys.stdin.readline()  # EOF: the load is over, take the final counters


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
        self.cpu_s = 0.0  # CPU seconds the sampling thread spent (NVML's driver calls included)

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
            reads = (  # one driver call each: utilization's two fields come from one read
                (("memory_used_mib",), lambda: (nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,)),
                (("utilization_pct", "memory_utilization_pct"),
                 lambda: (lambda u: (u.gpu, u.memory))(nv.nvmlDeviceGetUtilizationRates(h))),
                (("power_w",), lambda: (nv.nvmlDeviceGetPowerUsage(h) / 1000.0,)),
                (("sm_clock_mhz",), lambda: (nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),)),
                (("temperature_c",), lambda: (nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),)),
            )
            for names, read in reads:
                try:
                    self.samples += [(t, src, name, float(v)) for name, v in zip(names, read())]
                except Exception:
                    pass  # a field this GPU does not report

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)
        self.sample_once()
        self.cpu_s = time.thread_time() - cpu0  # the client's CPU includes it: the runs say how much

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


if __name__ == "__main__":  # the scraper's child process (see MetricsScraper)
    import sys

    _scrape_loop(sys.argv[1], float(sys.argv[2]), sys.argv[3])
