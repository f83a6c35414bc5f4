"""Statistics of a trial, with the definitions of `vllm bench serve`, plus goodput and bootstrap intervals.

Every figure is computed from request rows as the store holds them (`summarize_rows`): the summary written at
the end of a run, every comparison, ranking and import read the same rows through the same function.

A request succeeded when it has no error and a first token (`succeeded`). TTFT: send -> first chunk with
choices. E2EL: send -> last such chunk. TPOT: (E2EL - TTFT) / (output - 1), only when output > 1 (`tpot`).
ITL: gaps between consecutive chunks, pooled over requests (`itl`). Output tokens: the server's usage count,
else the number of chunks. Goodput: requests meeting every per-request SLO that is set, over the duration.
Percentiles are numpy's linear ones, as vLLM's.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.experiment.spec import SLO

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")
ROW_FIELDS = ("request_class", "warmup", "prompt_tokens_target", "prompt_tokens", "output_tokens", "ttft", "e2el",
              "chunk_times", "error")


def succeeded(error, ttft):
    """The one "request ok" rule: no error and a first token. Scalars, or columns (a boolean Series)."""
    return pd.isna(error) & pd.notna(ttft)


def tpot(output_tokens, ttft, e2el):
    """Seconds per output token after the first, (E2EL - TTFT) / (output - 1); NaN with one token or none."""
    out = np.asarray(output_tokens, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(out > 1, (np.asarray(e2el, dtype=float) - np.asarray(ttft, dtype=float)) / (out - 1), np.nan)


def itl(chunk_times: Iterable) -> np.ndarray:
    """Inter-token latencies: the gaps between consecutive chunks of each request, pooled (seconds)."""
    gaps = [np.diff(np.asarray(c, dtype=float)) for c in chunk_times if c is not None and len(c) > 1]
    return np.concatenate(gaps) if gaps else np.array([])


def output_tokens(requests: pd.DataFrame) -> pd.Series:
    """Output tokens of each request row: the server's usage count, else the number of chunks received."""
    chunks = requests.chunk_times if "chunk_times" in requests else pd.Series([None] * len(requests), index=requests.index)
    counted = pd.Series([len(c) if c is not None else 0 for c in chunks], index=requests.index, dtype=float)
    return requests.output_tokens.astype(float).fillna(counted)


def rows_from_records(records: Iterable) -> pd.DataFrame:
    """Request records of a load as the rows the store writes (for a load that was not stored)."""
    return pd.DataFrame([{f: getattr(r, f) for f in ROW_FIELDS} for r in records], columns=list(ROW_FIELDS))


def summarize_rows(requests: pd.DataFrame, duration_s: float, slo: SLO | None = None) -> dict[str, float]:
    """The summary of a run from its measured request rows (warmup excluded): see `summarize`."""
    return summarize(request_table(requests), duration_s, slo)


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

    @classmethod
    def from_records(cls, records: Iterable) -> "RequestTable":
        """The measured requests (warmup excluded) of in-memory records, as `request_table` reads rows."""
        return request_table(rows_from_records(r for r in records if not r.warmup))

    @classmethod
    def from_columns(cls, *, ok, ttft, e2el, prompt_tokens, output_tokens, chunk_times, request_class):
        f = lambda xs: np.array([np.nan if x is None else x for x in xs], dtype=float)  # noqa: E731
        return cls(
            ok=np.asarray(list(ok), dtype=bool), ttft=f(ttft), e2el=f(e2el),
            prompt_tokens=np.nan_to_num(f(prompt_tokens)).astype(np.int64),
            output_tokens=np.nan_to_num(f(output_tokens)).astype(np.int64),
            chunk_times=[np.asarray(c if c is not None else [], dtype=float) for c in chunk_times],
            request_class=np.asarray(list(request_class), dtype=object),
        )

    def __len__(self) -> int:
        return len(self.ok)

    def take(self, idx: np.ndarray) -> "RequestTable":
        return RequestTable(self.ok[idx], self.ttft[idx], self.e2el[idx], self.prompt_tokens[idx],
                            self.output_tokens[idx], [self.chunk_times[i] for i in idx], self.request_class[idx])

    def where_class(self, name: str) -> "RequestTable":
        return self.take(np.flatnonzero(self.request_class == name))

    # Per-request derived values, over successful requests only.
    def tpot(self, include_single: bool = False) -> np.ndarray:
        """TPOT of each successful request; with `include_single`, 0 for those of one token (the goodput rule
        counts them, as vLLM's does)."""
        out = self.output_tokens[self.ok]
        tp = tpot(out, self.ttft[self.ok], self.e2el[self.ok])
        return np.where(out > 1, tp, 0.0) if include_single else tp[out > 1]

    def itl(self) -> np.ndarray:
        return itl(c for c, ok in zip(self.chunk_times, self.ok) if ok)

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


def summarize(table: RequestTable, duration_s: float, slo: SLO | None = None) -> dict[str, float]:
    """The vllm-bench-serve result fields, plus p90/p95, goodput and the SLO verdict."""
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
    return out


def meets_slo(summary: dict, slo: SLO) -> bool:
    checks = [("p95_ttft_ms", slo.ttft_p95_ms), ("p95_tpot_ms", slo.tpot_p95_ms), ("p99_e2el_ms", slo.e2el_p99_ms)]
    if summary.get("completed", 0) == 0:
        return False
    return all(limit is None or summary[key] <= limit for key, limit in checks)


def goodput(table: RequestTable, duration_s: float, slo: SLO) -> float:
    return float(table.good(per_request_slo(slo)).sum()) / max(duration_s, 1e-9)


def request_table(requests: pd.DataFrame) -> RequestTable:
    """A RequestTable from request rows (measured ones; the store drops warmup by default)."""
    chunks = requests.chunk_times.tolist() if "chunk_times" in requests else [None] * len(requests)
    return RequestTable.from_columns(
        ok=succeeded(requests.error, requests.ttft), ttft=requests.ttft.tolist(), e2el=requests.e2el.tolist(),
        prompt_tokens=requests.prompt_tokens.fillna(requests.prompt_tokens_target).tolist(),
        output_tokens=output_tokens(requests).tolist(),
        chunk_times=chunks, request_class=requests.request_class.tolist(),
    )


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
