"""The winner in words, for every reader (the dashboard's Winner card, the 99 report): the SLOs, the margin over
the runner-up with its 95% interval, and whether that margin is beyond noise."""
from __future__ import annotations

from qwen3lab.analysis import compare
from qwen3lab.experiment.spec import SLO


def slo_text(slo: SLO) -> str:
    parts = [f"{name} ≤ {v:g} ms" for name, v in (
        ("P95 TTFT", slo.ttft_p95_ms), ("P95 TPOT", slo.tpot_p95_ms), ("P99 E2EL", slo.e2el_p99_ms),
        ("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2EL", slo.e2el_ms)) if v is not None]
    return ", ".join(parts) if parts else "none set (goodput = throughput)"


def margin_text(w: compare.Winner) -> str:
    """'+X req/s (95% CI a..b)' and what it means, in words."""
    if w.margin is None:
        return "the only run that meets the SLOs" if w.winner else ""
    m = w.margin
    return f"{m.estimate:+.2f} req/s (95% CI {m.low:+.2f} .. {m.high:+.2f})"


def verdict_text(w: compare.Winner) -> str:
    if w.winner is None:
        return "No run meets the SLOs: loosen them, or measure other configurations."
    if w.runner_up is None:
        return "Only one run meets the SLOs."
    if w.within_noise:
        return (f"Within noise: {w.winner.label} and {w.runner_up.label} cannot be told apart: the 95% interval of "
                "the difference holds zero. Either is as good; measure longer or repeat to separate them.")
    return f"{w.winner.label} is ahead of {w.runner_up.label} beyond noise (the 95% interval excludes zero)."
