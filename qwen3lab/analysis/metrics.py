"""Statistics of a trial, with the definitions of `vllm bench serve`, plus goodput and bootstrap intervals.

TTFT: send -> first chunk with choices. E2EL: send -> last such chunk. TPOT: (E2EL - TTFT) / (output - 1),
only when output > 1. ITL: gaps between consecutive chunks, pooled over requests. Goodput: requests meeting
every per-request SLO that is set, over the duration. Percentiles are numpy's linear ones, as vLLM's.

Steady state: a closed loop opens with `concurrency` simultaneous arrivals on an idle server, whose TTFT is a
queue of prefills that the user's traffic never sees (430-530 ms against a 50 ms median on an H200). The
summary keeps every request's percentiles (vLLM's definition) and beside them `steady_*` TTFT percentiles
without that opening burst, with `opening_burst_requests` saying how many were left out.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from qwen3lab.experiment.spec import SLO

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestTable:
    """Measured requests (warmup excluded) as columns; built from records or from stored rows."""

    ok: np.ndarray
    ttft: np.ndarray  # seconds, NaN when failed
    e2el: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    chunk_times: list[np.ndarray]
    request_class: np.ndarray
    sent_at: np.ndarray | None = None  # seconds since the load started; None when not recorded

    @classmethod
    def from_records(cls, records: Iterable) -> "RequestTable":
        rows = [r for r in records if not r.warmup]
        return cls.from_columns(
            ok=[r.ok for r in rows], ttft=[r.ttft for r in rows], e2el=[r.e2el for r in rows],
            prompt_tokens=[r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_target for r in rows],
            output_tokens=[r.output_tokens if r.output_tokens is not None else len(r.chunk_times) for r in rows],
            chunk_times=[r.chunk_times for r in rows], request_class=[r.request_class for r in rows],
            sent_at=[r.sent_at for r in rows],
        )

    @classmethod
    def from_columns(cls, *, ok, ttft, e2el, prompt_tokens, output_tokens, chunk_times, request_class, sent_at=None):
        f = lambda xs: np.array([np.nan if x is None else x for x in xs], dtype=float)  # noqa: E731
        return cls(
            ok=np.asarray(list(ok), dtype=bool), ttft=f(ttft), e2el=f(e2el),
            prompt_tokens=np.nan_to_num(f(prompt_tokens)).astype(np.int64),
            output_tokens=np.nan_to_num(f(output_tokens)).astype(np.int64),
            chunk_times=[np.asarray(c if c is not None else [], dtype=float) for c in chunk_times],
            request_class=np.asarray(list(request_class), dtype=object),
            sent_at=None if sent_at is None else f(sent_at),
        )

    def __len__(self) -> int:
        return len(self.ok)

    def take(self, idx: np.ndarray) -> "RequestTable":
        return RequestTable(self.ok[idx], self.ttft[idx], self.e2el[idx], self.prompt_tokens[idx],
                            self.output_tokens[idx], [self.chunk_times[i] for i in idx], self.request_class[idx],
                            None if self.sent_at is None else self.sent_at[idx])

    def without_opening_burst(self, burst: int) -> "RequestTable":
        """The requests after the first `burst` sent (by send time; by order when times are unknown)."""
        order = np.arange(len(self)) if self.sent_at is None else np.argsort(self.sent_at, kind="stable")
        return self.take(np.sort(order[burst:]))

    def where_class(self, name: str) -> "RequestTable":
        return self.take(np.flatnonzero(self.request_class == name))

    # Per-request derived values, over successful requests only.
    def tpot(self, include_single: bool = False) -> np.ndarray:
        ok = self.ok
        out = self.output_tokens[ok]
        span = self.e2el[ok] - self.ttft[ok]
        many = out > 1
        tp = np.where(many, span / np.maximum(out - 1, 1), 0.0)
        return tp if include_single else tp[many]

    def itl(self) -> np.ndarray:
        gaps = [np.diff(c) for c, ok in zip(self.chunk_times, self.ok) if ok and len(c) > 1]
        return np.concatenate(gaps) if gaps else np.array([])

    def good(self, slo: SLO) -> np.ndarray:
        """Boolean per successful request: meets every per-request SLO (vLLM's goodput rule)."""
        ok = self.ok
        good = np.ones(int(ok.sum()), dtype=bool)
        if slo.ttft_ms is not None:
            good &= self.ttft[ok] * 1000 <= slo.ttft_ms
        if slo.tpot_ms is not None:
            good &= self.tpot(include_single=True) * 1000 <= slo.tpot_ms
        if slo.e2el_ms is not None:
            good &= self.e2el[ok] * 1000 <= slo.e2el_ms
        return good


def _stats(values: np.ndarray, name: str) -> dict[str, float]:
    v = values * 1000 if len(values) else np.array([0.0])
    out = {f"mean_{name}_ms": float(np.mean(v)), f"median_{name}_ms": float(np.median(v)),
           f"std_{name}_ms": float(np.std(v))}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(v, p))
    return out


def per_request_slo(slo: SLO) -> SLO:
    """Goodput counts a request good against the thresholds the user gave, per request or as percentiles."""
    return SLO(ttft_ms=slo.ttft_ms or slo.ttft_p95_ms, tpot_ms=slo.tpot_ms or slo.tpot_p95_ms,
               e2el_ms=slo.e2el_ms or slo.e2el_p99_ms)


def summarize(table: RequestTable, duration_s: float, slo: SLO | None = None,
              opening_burst: int = 0) -> dict[str, float]:
    """The vllm-bench-serve result fields, plus p90/p95, goodput and the SLO verdict; with `opening_burst`
    (a closed loop's concurrency) also the steady-state TTFT without the first that many requests."""
    ok = table.ok
    dur = max(duration_s, 1e-9)
    n_in = int(table.prompt_tokens[ok].sum())
    n_out = int(table.output_tokens[ok].sum())
    out: dict[str, float] = {
        "completed": int(ok.sum()), "failed": int((~ok).sum()), "duration": duration_s,
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": ok.sum() / dur, "output_throughput": n_out / dur,
        "total_token_throughput": (n_in + n_out) / dur,
    }
    out |= _stats(table.ttft[ok], "ttft") | _stats(table.tpot(), "tpot")
    out |= _stats(table.itl(), "itl") | _stats(table.e2el[ok], "e2el")
    if slo is not None:
        req_slo = per_request_slo(slo)
        if any(v is not None for v in (req_slo.ttft_ms, req_slo.tpot_ms, req_slo.e2el_ms)):
            out["request_goodput"] = float(table.good(req_slo).sum()) / dur
        out["slo_pass"] = meets_slo(out, slo)
    if 0 < opening_burst < len(table):
        out |= steady_state(table, opening_burst, slo)
    return out


def steady_state(table: RequestTable, opening_burst: int, slo: SLO | None = None) -> dict[str, float]:
    """TTFT percentiles without the opening burst (`steady_p95_ttft_ms`, ...), and the SLO judged on them."""
    rest = table.without_opening_burst(opening_burst)
    out: dict[str, float] = {"opening_burst_requests": opening_burst}
    out |= {f"steady_{k}": v for k, v in _stats(rest.ttft[rest.ok], "ttft").items()}
    if slo is not None:  # every percentile SLO judged on the requests after the burst
        out["steady_slo_pass"] = meets_slo(summarize(rest, 1.0), slo)
    return out


def meets_slo(summary: dict, slo: SLO) -> bool:
    checks = [("p95_ttft_ms", slo.ttft_p95_ms), ("p95_tpot_ms", slo.tpot_p95_ms), ("p99_e2el_ms", slo.e2el_p99_ms)]
    if summary.get("completed", 0) == 0:
        return False
    return all(limit is None or summary[key] <= limit for key, limit in checks)


def goodput(table: RequestTable, duration_s: float, slo: SLO) -> float:
    return float(table.good(per_request_slo(slo)).sum()) / max(duration_s, 1e-9)


@dataclass
class Interval:
    """A point estimate with a bootstrap confidence interval."""

    estimate: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap_two(xa: np.ndarray, xb: np.ndarray, fa: Callable[[np.ndarray], np.ndarray],
                  fb: Callable[[np.ndarray], np.ndarray], combine: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile bootstrap of combine(fa(A), fb(B)) for two independent samples of requests.

    xa, xb hold one row per request; each is resampled with replacement. fa/fb map resamples of shape
    (draws, n, columns) to one value per draw, so thousands of draws cost a few numpy calls.
    """
    rng = np.random.default_rng(seed)
    point = float(combine(fa(xa[None]), fb(xb[None]))[0])
    values = []
    chunk = max(1, 4_000_000 // max(xa.size + xb.size, 1))  # bound the memory of large runs
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        da = fa(xa[rng.integers(0, len(xa), size=(k, len(xa)))])
        db = fb(xb[rng.integers(0, len(xb), size=(k, len(xb)))])
        with np.errstate(divide="ignore", invalid="ignore"):
            values.append(combine(da, db))
    v = np.concatenate(values)
    lo = (1 - level) / 2
    return Interval(point, float(np.nanquantile(v, lo)), float(np.nanquantile(v, 1 - lo)))
