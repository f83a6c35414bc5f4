"""Drift over a soak: its windows side by side, and its last window against its first, with intervals.

A soak's window is a run of its own (measure/soak.py), so every figure of a window is the run's stored summary.
Windows are the soak's units as launches are a trial's: the first-to-last change is read off a straight line
through every ok window's figure (stats.trend: t with windows - 2 df, the scatter about the line floored by each
window's own noise), not from two windows alone, which cannot tell a trend from one window's luck. Long-running
vLLM servers have been seen to lose throughput and gain tail latency after an hour: a change whose interval
excludes zero in the worse direction is drift, Holm-corrected over the metrics; with fewer than three ok
windows the window-to-window spread is unknown and nothing is called drift.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from qwen3lab.analysis import compare, stats
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store

# metric -> higher is better (compare.STATISTICS names)
DRIFT_METRICS = {"output_throughput": True, "goodput": True, "p95_ttft_ms": False}
WINDOW_COLUMNS = ["soak_window", "run_id", "status", "start_s", "duration", "completed", "failed",
                  "output_throughput", "request_goodput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                  "p99_tpot_ms", "server_rss_mib", "peak_gpu_memory_mib", "kv_cache_usage", "preemptions"]


def windows(store: Store, soak_id: str) -> pd.DataFrame:
    """One row per window of a soak, in order: its status, when it started (seconds since the soak's first
    window), its latency and throughput, the server's RSS at its end, GPU memory, mean KV cache usage and the
    preemptions during it (from vLLM's /metrics samples)."""
    df = store.soak_windows([soak_id])
    if df.empty:
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    df = df.sort_values("soak_window").reset_index(drop=True)
    t0 = pd.to_datetime(df.started_at).min()
    df["start_s"] = (pd.to_datetime(df.started_at) - t0).dt.total_seconds()
    samples = store.samples(list(df.run_id), source="vllm")
    kv, pre = {}, {}
    if samples is not None and not samples.empty:
        for run_id, g in samples.groupby("run_id"):
            usage = g[g.name == "vllm:kv_cache_usage_perc"].value
            kv[run_id] = float(usage.mean()) if len(usage) else np.nan
            count = g[g.name == "vllm:num_preemptions_total"].value
            pre[run_id] = float(count.max() - count.min()) if len(count) else np.nan
    df["kv_cache_usage"] = df.run_id.map(kv)
    df["preemptions"] = df.run_id.map(pre)
    for col in WINDOW_COLUMNS:
        if col not in df:
            df[col] = np.nan
    return df[WINDOW_COLUMNS]


def first_last(store: Store, soak_id: str, slo: SLO, n_boot: int = 400) -> dict:
    """The last ok window against the first: per metric the two values and the change (percent) along the line
    through every ok window, with its 95% interval; `drift` names the metrics that changed for the worse
    (Holm-corrected over the metrics; none with fewer than three ok windows)."""
    w = windows(store, soak_id)
    ok = w[w.status == "ok"]
    if len(ok) < 2:
        return {"windows": int(len(ok)), "metrics": {}, "drift": [],
                "note": "fewer than two ok windows: nothing to compare"}
    runs = compare.load_runs(store, list(ok.run_id))
    at = ok.set_index("run_id").start_s.reindex([r.run_id for r in runs]).to_numpy()
    trial = compare.TrialData("soak", soak_id, runs)
    first, last = runs[0], runs[-1]
    out: dict = {"windows": int(len(ok)), "first": first.run_id, "last": last.run_id, "metrics": {}, "drift": []}
    was, now = first.summary(slo), last.summary(slo)
    ivs = {}
    for metric in DRIFT_METRICS:
        ivs[metric] = iv = stats.trend(at, compare.figures(trial, slo, metric, n_boot))
        key = compare.SUMMARY_OF[metric] if compare.SUMMARY_OF[metric] in was else "request_throughput"  # no SLO
        a, b = float(was[key]), float(now[key])
        out["metrics"][metric] = {"first": a, "last": b, "change_pct": iv.estimate, "low": iv.low, "high": iv.high,
                                  "p_value": iv.p_value, "detectable_pct": iv.detectable}
    if len(runs) < 3:
        out["note"] = "two ok windows: the window-to-window spread is unknown, so no change is called drift"
        return out
    sure = stats.holm([iv.p_value for iv in ivs.values()])
    for (metric, higher_better), confident in zip(DRIFT_METRICS.items(), sure):
        iv = ivs[metric]
        if confident and (iv.estimate < 0 if higher_better else iv.estimate > 0):
            out["drift"].append(metric)
    return out


def trend(values: pd.Series, at_s: pd.Series) -> dict[str, float]:
    """Linear trend of a per-window figure: change per hour, first and last value, first-to-last in percent."""
    ok = values.notna() & at_s.notna()
    v, t = values[ok].astype(float), at_s[ok].astype(float)
    if len(v) < 2:
        return {"per_hour": float("nan"), "first": float("nan"), "last": float("nan"), "change_pct": float("nan"),
                "windows": int(len(v))}
    slope = float(np.polyfit(t, v, 1)[0]) * 3600
    first, last = float(v.iloc[0]), float(v.iloc[-1])
    return {"per_hour": slope, "first": first, "last": last,
            "change_pct": (last / first - 1) * 100 if first else float("nan"), "windows": int(len(v))}
