"""Whether a run's measurement can be trusted: four signs that the client, not the server, set the numbers.

- client CPU share: the load generator's CPU seconds / the load's duration. Past about half a core on a small
  machine, client and server starve each other and tokens arrive in bursts.
- near-zero inter-chunk gaps: chunks read < 0.1 ms apart were queued in the socket while the client was busy;
  past half of all gaps, ITL and TPOT are the client's reading rhythm, not the server's (a median TPOT of
  0.00 ms was seen on the 2-core machine).
- schedule lag: with an arrival rate, how far (P95) sends fell behind their planned times.
- warm-up: an early quarter's median TTFT far above a late quarter's (two launches of one configuration
  gave 517 ms and 115 ms under `vllm bench serve` itself): the engine was still compiling or warming caches.
  Under a concurrency cap the first `concurrency` requests arrive together and queue, and the last ones run
  with the batch draining: both are left out (the ramp), so only a slower engine reads as warm-up.

Thresholds are stated here, one comment each; a run past any of them is "unreliable: <reason>" and winners skip
it unless asked.
"""
from __future__ import annotations

import numpy as np

from qwen3lab.analysis.metrics import RequestTable

MAX_CLIENT_CPU_SHARE = 0.5  # of one core, over the load's duration
NEAR_ZERO_GAP_S = 1e-4  # a gap shorter than this is a burst read, not a decode step
MAX_NEAR_ZERO_GAP_FRACTION = 0.5  # of all inter-chunk gaps
MAX_SCHEDULE_LAG_S = 0.1  # P95 of (actual send - planned send), rate-driven arrivals only
MAX_WARMUP_TTFT_RATIO = 2.0  # median TTFT of the first quarter / of the last quarter, ramp left out
MIN_REQUESTS_FOR_WARMUP = 16  # fewer than that: quarters too small to judge


def assess(table: RequestTable, duration_s: float, client_cpu_s: float | None,
           sent_at: np.ndarray | None = None, planned_s: np.ndarray | None = None, ramp: int = 0) -> dict:
    """The four figures, and `reasons`: one phrase for each threshold passed (empty: trustworthy)."""
    gaps = table.itl()
    out: dict = {
        "client_cpu_share": (float(client_cpu_s) / duration_s)
        if client_cpu_s is not None and np.isfinite(client_cpu_s) and duration_s > 0 else None,
        "near_zero_gap_fraction": float((gaps < NEAR_ZERO_GAP_S).mean()) if len(gaps) else None,
        "schedule_lag_p95_s": None, "warmup_ttft_ratio": None,
    }
    if sent_at is not None and planned_s is not None and len(planned_s) == len(sent_at) and len(sent_at):
        out["schedule_lag_p95_s"] = float(np.percentile(np.asarray(sent_at) - np.asarray(planned_s), 95))
    ttft = table.ttft[table.ok & np.isfinite(table.ttft)]
    steady = ttft[ramp:len(ttft) - ramp] if len(ttft) > 2 * ramp else ttft[:0]
    if len(steady) >= MIN_REQUESTS_FOR_WARMUP:
        q = len(steady) // 4
        out["warmup_ttft_ratio"] = float(np.median(steady[:q]) / max(np.median(steady[-q:]), 1e-9))
    reasons = []
    if (v := out["client_cpu_share"]) is not None and v > MAX_CLIENT_CPU_SHARE:
        reasons.append(f"client used {v:.0%} of a core (> {MAX_CLIENT_CPU_SHARE:.0%})")
    if (v := out["near_zero_gap_fraction"]) is not None and v > MAX_NEAR_ZERO_GAP_FRACTION:
        reasons.append(f"{v:.0%} of inter-chunk gaps under {NEAR_ZERO_GAP_S * 1000:g} ms: tokens read in bursts "
                       f"(> {MAX_NEAR_ZERO_GAP_FRACTION:.0%})")
    if (v := out["schedule_lag_p95_s"]) is not None and v > MAX_SCHEDULE_LAG_S:
        reasons.append(f"sends fell {v * 1000:.0f} ms (P95) behind the arrival schedule "
                       f"(> {MAX_SCHEDULE_LAG_S * 1000:.0f} ms)")
    if (v := out["warmup_ttft_ratio"]) is not None and v > MAX_WARMUP_TTFT_RATIO:
        reasons.append(f"engine still warming up: early median TTFT {v:.1f}x the late one "
                       f"(> {MAX_WARMUP_TTFT_RATIO:g}x)")
    out["reasons"] = reasons
    return out


def label(assessment: dict) -> str | None:
    """'unreliable: <reasons>' or None: the runs table's `validity` column."""
    return "unreliable: " + "; ".join(assessment["reasons"]) if assessment["reasons"] else None
