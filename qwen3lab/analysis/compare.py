"""Comparing stored runs: ranking under SLOs, the winner's margin, and each knob's effect against its baseline.

Everything is recomputed from the stored per-request rows, so changing an SLO never needs a re-run, and
every difference comes with a bootstrap 95% interval: "within noise" when that interval holds zero.

Rates (goodput, throughput) are not bootstrapped by resampling single requests against the fixed duration: with
fixed output lengths that leaves a throughput unchanged and its interval would have zero width. By Little's
law a run's rate is (work of its requests) / (their summed latency) x (its mean concurrency, summed latency /
duration), which is exactly work / duration; resampling blocks of consecutive requests (latency and work
together, so a slow stretch stays slow) lets the summed latency vary, and that is the interval. It sees the
noise within one run; repeats of a trial show the noise between launches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.analysis import selection
from qwen3lab.analysis.metrics import (Interval, RequestTable, bootstrap_two, meets_slo, per_request_slo,
                                       request_table, summarize)
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store


@dataclass
class RunData:
    run_id: str
    label: str
    duration: float
    table: RequestTable
    row: dict

    def per_request(self, slo: SLO) -> np.ndarray:
        """Columns per request for the vectorised bootstrap: good?, output tokens, TTFT (NaN if failed)."""
        t = self.table
        good = np.zeros(len(t), dtype=float)
        good[t.ok] = t.good(per_request_slo(slo))
        out = np.where(t.ok, t.output_tokens, 0).astype(float)
        return np.column_stack([good, out, t.ttft])

    def per_block(self, slo: SLO, block: int | None = None) -> np.ndarray:
        """Blocks of consecutive requests (send order): good requests, output tokens, summed latency (s)."""
        x = self.per_request(slo)
        e2el = np.where(self.table.ok, np.nan_to_num(self.table.e2el), 0.0)
        b = block or int(np.clip(round(np.sqrt(len(x))), 1, 50))
        slot = np.arange(len(x)) // b
        out = np.zeros((int(slot[-1]) + 1 if len(x) else 0, 3))
        np.add.at(out, slot, np.column_stack([x[:, :2], e2el]))
        return out

    def concurrency(self) -> float:
        """Mean requests in flight: summed latency / duration (Little's law)."""
        ok = self.table.ok
        return float(np.nansum(self.table.e2el[ok])) / max(self.duration, 1e-9)


def load_runs(store: Store, run_ids: list[str], with_chunks: bool = False) -> list[RunData]:
    rows = store.runs(run_ids=run_ids)
    if rows.empty:
        return []
    reqs = store.requests(run_ids, with_chunks=with_chunks)
    out = []
    for row in rows.to_dict("records"):
        mine = reqs[reqs.run_id == row["run_id"]] if reqs is not None else pd.DataFrame()
        if mine.empty or not row.get("duration"):
            continue
        out.append(RunData(row["run_id"], run_label(row), float(row["duration"]), request_table(mine), row))
    order = {rid: i for i, rid in enumerate(run_ids)}
    return sorted(out, key=lambda r: order.get(r.run_id, 0))


def run_label(row: dict) -> str:
    return f"{row.get('chapter')}/{row.get('trial')}" if row.get("trial") else row["run_id"]


def rank(runs: list[RunData], slo: SLO) -> pd.DataFrame:
    """Runs ranked by goodput under `slo` (ties broken by output throughput); SLO failures rank last."""
    recs = []
    for r in runs:
        s = summarize(r.table, r.duration, slo)
        recs.append({"run_id": r.run_id, "label": r.label, "goodput": s.get("request_goodput", s["request_throughput"]),
                     "output_throughput": s["output_throughput"], "request_throughput": s["request_throughput"],
                     "p95_ttft_ms": s["p95_ttft_ms"], "p95_tpot_ms": s["p95_tpot_ms"], "p99_e2el_ms": s["p99_e2el_ms"],
                     "completed": s["completed"], "failed": s["failed"], "slo_pass": meets_slo(s, slo)})
    df = pd.DataFrame(recs)
    if df.empty:
        return df
    df = df.sort_values(["slo_pass", "goodput", "output_throughput"], ascending=False).reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def _rate(column: int, run: RunData):
    """Over blocks [good, tokens, latency]: work / summed latency x mean concurrency (= work / duration)."""
    conc = run.concurrency()
    return lambda x: x[..., column].sum(axis=-1) / np.maximum(x[..., 2].sum(axis=-1), 1e-12) * conc


def _p95_ttft(x: np.ndarray) -> np.ndarray:
    return np.percentile(x[..., 0], 95, axis=-1) * 1000


def difference(a: RunData, b: RunData, slo: SLO, metric: str = "goodput", n_boot: int = 2000,
               relative: bool = False) -> Interval:
    """Bootstrap interval of metric(a) - metric(b), or of metric(a)/metric(b) - 1 in percent when `relative`.

    metric: goodput (requests/s meeting the SLOs), output_throughput (tokens/s) or p95_ttft_ms. Rates resample
    blocks of consecutive requests of each run (see the module doc), P95 TTFT resamples requests.
    """
    stats = {"goodput": (_rate(0, a), _rate(0, b)),
             "output_throughput": (_rate(1, a), _rate(1, b)),
             "p95_ttft_ms": (_p95_ttft, _p95_ttft)}
    if metric not in stats:
        raise ValueError(f"metric {metric!r}: use one of {', '.join(stats)}")
    combine = (lambda da, db: (da / db - 1) * 100) if relative else (lambda da, db: da - db)
    if metric == "p95_ttft_ms":
        # Like vllm bench, P95 TTFT is over the requests that succeeded; resampling only those keeps the
        # percentile vectorised (nanpercentile falls back to one slow call per draw).
        xa, xb = (r.table.ttft[r.table.ok & np.isfinite(r.table.ttft)][:, None] for r in (a, b))
        if not (len(xa) and len(xb)):
            return Interval(float("nan"), float("nan"), float("nan"))
    else:
        xa, xb = a.per_block(slo), b.per_block(slo)
    return bootstrap_two(xa, xb, *stats[metric], combine, n_boot)


@dataclass
class Winner:
    ranking: pd.DataFrame
    winner: RunData | None
    runner_up: RunData | None
    margin: Interval | None  # winner goodput - runner-up goodput, requests/s

    @property
    def within_noise(self) -> bool:
        return self.margin is not None and not self.margin.excludes_zero


def pick_winner(runs: list[RunData], slo: SLO, n_boot: int = 2000) -> Winner:
    ranking = rank(runs, slo)
    if ranking.empty:
        return Winner(ranking, None, None, None)
    by_id = {r.run_id: r for r in runs}
    first = by_id[ranking.run_id[0]]
    if not ranking.slo_pass[0]:
        return Winner(ranking, None, None, None)  # nothing meets the SLOs: no winner, say so
    second = by_id[ranking.run_id[1]] if len(ranking) > 1 else None
    margin = difference(first, second, slo, "goodput", n_boot) if second else None
    return Winner(ranking, first, second, margin)


def claims(store: Store, experiment: str, slo: SLO, n_boot: int = 1000) -> pd.DataFrame:
    """For each chapter: every ok trial against its baseline, relative change with a 95% interval."""
    runs = selection.current(store.runs(experiment=experiment), measured_only=True)
    if runs.empty:
        return pd.DataFrame()
    data = {r.run_id: r for r in load_runs(store, list(runs.run_id))}
    run_of = {(c, t): rid for c, t, rid in zip(runs.chapter, runs.trial, runs.run_id)}
    recs = []
    for row in runs.to_dict("records"):
        base_name = row.get("baseline")
        base_id = run_of.get((row["chapter"], base_name))
        if row["run_id"] not in data or base_id not in data:  # no baseline named, or none finished
            continue
        a, b = data[row["run_id"]], data[base_id]
        for metric, better in (("goodput", "higher"), ("output_throughput", "higher"), ("p95_ttft_ms", "lower")):
            iv = difference(a, b, slo, metric, n_boot, relative=True)
            if not iv.excludes_zero:
                verdict = "within noise"
            else:
                verdict = "better" if (iv.estimate > 0) == (better == "higher") else "worse"
            recs.append({"chapter": row["chapter"], "trial": row["trial"], "baseline": base_name, "metric": metric,
                         "change_pct": iv.estimate, "low_pct": iv.low, "high_pct": iv.high, "verdict": verdict,
                         "run_id": a.run_id, "baseline_run_id": b.run_id})
    return pd.DataFrame(recs)
