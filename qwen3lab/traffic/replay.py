"""When a traffic file's requests are sent: at the trace's times (open loop), or as a mix's arrivals."""
from __future__ import annotations

import numpy as np


def is_sessions(requests) -> bool:
    return any(getattr(r, "session", None) is not None for r in requests)


def offsets(workload, requests) -> np.ndarray | None:
    """Send offsets in seconds of the measured `requests`: the trace's own times (time_scale applied, from the
    first measured request) when they carry them, else the mix's arrivals (measure.workload.arrival_offsets)."""
    from qwen3lab.measure.workload import arrival_offsets

    times = [getattr(r, "at", None) for r in requests]
    if requests and all(t is not None for t in times):
        return np.asarray(times, dtype=float) - times[0]
    return arrival_offsets(workload, len(requests))


def session_starts(workload, sessions: list[list]) -> np.ndarray | None:
    """Start offsets of sessions: their first turns' trace times, else Poisson at `session_rate`; None: closed,
    workload.concurrency sessions at a time."""
    firsts = [s[0].at for s in sessions]
    if sessions and all(t is not None for t in firsts):
        return np.asarray(firsts, dtype=float) - firsts[0]
    rate = workload.source.session_rate
    if rate is None:
        return None
    gaps = np.random.default_rng(workload.seed + 1).exponential(1.0 / rate, size=len(sessions))
    gaps[0] = 0.0
    return np.cumsum(gaps)


def lap_s(workload, offsets: np.ndarray) -> float:
    """A soak's or capacity point's next lap of the same requests starts this long after the previous one: one
    mean gap after its last send (1 / request_rate for a mix)."""
    if workload.request_rate:
        return float(offsets[-1]) + 1.0 / workload.request_rate
    return float(offsets[-1]) + (float(offsets[-1]) / (len(offsets) - 1) if len(offsets) > 1 else 1.0)
