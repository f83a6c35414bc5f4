"""Statistics of a trial, with the definitions of `vllm bench serve`, plus goodput and bootstrap intervals.

Every figure is computed from request rows as the store holds them (`summarize_rows`): the summary written at
the end of a run, every comparison, ranking and import read the same rows through the same function.

A request succeeded when it has no error and a first token (`succeeded`). TTFT: send -> first chunk with
choices. E2EL: send -> last such chunk. TPOT: (E2EL - TTFT) / (output - 1), only when output > 1 (`tpot`).
ITL: gaps between consecutive chunks, pooled over requests (`itl`). Output tokens: the server's usage count,
else the number of chunks (vllm bench re-tokenizes the text; vLLM streams about one token a chunk). Goodput:
requests meeting every per-request SLO that is set, over the duration. Duration: first measured send to the
end of the load, failed requests included (vllm bench's). Percentiles are numpy's linear ones, as vLLM's.

Failures count: a failed, timed-out or unfinished request is never good, and a trial meets its SLOs only when
its failed fraction is within `slo.max_failed_fraction` (default 0) besides its latency percentiles, which,
as vllm bench's, are over the requests that succeeded.

Steady state: a closed loop opens with `concurrency` simultaneous arrivals on an idle server, whose TTFT is a
queue of prefills that the user's traffic never sees (353-961 ms against a 43-48 ms median on an H200). The
summary keeps every request's percentiles (vLLM's definition) and beside them `steady_*` TTFT percentiles
without that opening burst (by send time), with `opening_burst_requests` saying how many were left out.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.experiment.spec import SLO

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")
ROW_FIELDS = ("request_class", "warmup", "prompt_tokens_target", "prompt_tokens", "output_tokens", "ttft", "e2el",
              "chunk_times", "error", "sent_at")


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
    if "chunk_times" in requests:
        counted = pd.Series([len(c) if c is not None else 0 for c in requests.chunk_times], index=requests.index,
                            dtype=float)
    else:  # rows read without their chunk times carry the store's chunk_count
        counted = requests.get("chunk_count", pd.Series(0, index=requests.index)).astype(float)
    return requests.output_tokens.astype(float).fillna(counted)


def rows_from_records(records: Iterable) -> pd.DataFrame:
    """Request records of a load as the rows the store writes (for a load that was not stored)."""
    return pd.DataFrame([{f: getattr(r, f) for f in ROW_FIELDS} for r in records], columns=list(ROW_FIELDS))


def summarize_rows(requests: pd.DataFrame, duration_s: float, slo: SLO | None = None,
                   opening_burst: int = 0) -> dict[str, float]:
    """The summary of a run from its measured request rows (warmup excluded): see `summarize`."""
    return summarize(request_table(requests), duration_s, slo, opening_burst)


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
        """The measured requests (warmup excluded) of in-memory records, as `request_table` reads rows."""
        return request_table(rows_from_records(r for r in records if not r.warmup))

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
        known = self.sent_at is not None and not np.isnan(self.sent_at).any()
        order = np.argsort(self.sent_at, kind="stable") if known else np.arange(len(self))
        return self.take(np.sort(order[burst:]))

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


def summarize(table: RequestTable, duration_s: float, slo: SLO | None = None,
              opening_burst: int = 0) -> dict[str, float]:
    """The vllm-bench-serve result fields, plus p90/p95, goodput and the SLO verdict; with `opening_burst`
    (a closed loop's concurrency) also the steady-state TTFT without the first that many requests."""
    ok = table.ok
    dur = max(duration_s, 1e-9)
    n_in = int(table.prompt_tokens[ok].sum())
    n_out = int(table.output_tokens[ok].sum())
    out: dict[str, float] = {
        "completed": int(ok.sum()), "failed": int((~ok).sum()), "failed_fraction": failed_fraction(table),
        "duration": duration_s,
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


def failed_fraction(table: RequestTable) -> float:
    return float((~table.ok).mean()) if len(table) else 1.0


def slo_violations(summary: dict, slo: SLO) -> list[str]:
    """Why a trial misses its SLOs, one phrase each (empty: it meets them). Failures count first."""
    done, failed = summary.get("completed", 0) or 0, summary.get("failed", 0) or 0
    if done == 0:
        return ["no request completed"]
    why = []
    frac = failed / (done + failed)
    if frac > slo.max_failed_fraction:
        why.append(f"{failed} of {done + failed} requests failed ({frac:.1%} > max_failed_fraction "
                   f"{slo.max_failed_fraction:g})")
    for key, limit, name in (("p95_ttft_ms", slo.ttft_p95_ms, "P95 TTFT"), ("p95_tpot_ms", slo.tpot_p95_ms, "P95 TPOT"),
                             ("p99_e2el_ms", slo.e2el_p99_ms, "P99 E2EL")):
        if limit is not None and not summary[key] <= limit:
            why.append(f"{name} {summary[key]:.1f} ms > {limit:g} ms")
    return why


def meets_slo(summary: dict, slo: SLO) -> bool:
    return not slo_violations(summary, slo)


def goodput(table: RequestTable, duration_s: float, slo: SLO) -> float:
    return float(table.good(per_request_slo(slo)).sum()) / max(duration_s, 1e-9)


def request_table(requests: pd.DataFrame) -> RequestTable:
    """A RequestTable from request rows (measured ones; the store drops warmup by default). Column-wise: a
    dashboard page builds one for every run it ranks, so no per-row Python here (rows read without their chunk
    times share one empty array)."""
    n = len(requests)
    num = lambda col: pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)  # noqa: E731
    empty = np.empty(0)
    chunks = ([np.asarray(c if c is not None else [], dtype=float) for c in requests.chunk_times]
              if "chunk_times" in requests else [empty] * n)
    prompt = requests.prompt_tokens.fillna(requests.prompt_tokens_target)
    return RequestTable(
        ok=succeeded(requests.error, requests.ttft).to_numpy(dtype=bool), ttft=num(requests.ttft),
        e2el=num(requests.e2el), prompt_tokens=np.nan_to_num(num(prompt)).astype(np.int64),
        output_tokens=np.nan_to_num(num(output_tokens(requests))).astype(np.int64), chunk_times=chunks,
        request_class=requests.request_class.to_numpy(dtype=object),
        sent_at=num(requests.sent_at) if "sent_at" in requests else None,
    )
