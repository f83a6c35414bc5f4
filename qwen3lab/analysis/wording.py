"""The winner in words, for every reader (the dashboard's Winner card, the 99 report): the SLOs, the margin over
the runner-up with its 95% interval (launches, then request blocks), and whether it can be told: better or can't tell."""
from __future__ import annotations

from qwen3lab.analysis import comparable, compare
from qwen3lab.experiment.spec import SLO


def slo_text(slo: SLO) -> str:
    parts = [f"{name} ≤ {v:g} ms" for name, v in (
        ("P95 TTFT", slo.ttft_p95_ms), ("P95 TPOT", slo.tpot_p95_ms), ("P99 E2EL", slo.e2el_p99_ms),
        ("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2EL", slo.e2el_ms)) if v is not None]
    return ", ".join(parts) if parts else "none set (goodput = throughput)"


def margin_text(w: compare.Winner) -> str:
    """'+X req/s (95% CI a..b)' and what it means, in words."""
    if w.margin is None:
        return "the only trial that meets the SLOs" if w.winner else ""
    m = w.margin
    return f"{m.estimate:+.2f} req/s (95% CI {m.low:+.2f} .. {m.high:+.2f})"


def launches(t: compare.TrialData | None) -> str:
    n = len(t.launches) if t else 0
    return f"{n} launch" + ("" if n == 1 else "es")


def verdict_text(w: compare.Winner) -> str:
    """Better / can't tell, in a sentence; with one launch a side, that the launch-to-launch spread is unknown."""
    if w.winner is None:
        return "No trial meets the SLOs: loosen them, or measure other configurations."
    if w.runner_up is None:
        return "Only one trial meets the SLOs."
    spread = ("" if min(len(w.winner_trial.launches), len(w.runner_up_trial.launches)) > 1 else
              " One launch per trial: how much a fresh launch moves is unknown; set `repeats: 2` or more.")
    if w.within_noise:
        return (f"Can't tell: {w.winner.label} and {w.runner_up.label} cannot be told apart: the 95% interval of "
                f"the difference holds zero. Either is as good; measure longer or launch more repeats.{spread}")
    return f"Better: {w.winner.label} is ahead of {w.runner_up.label} (the 95% interval excludes zero).{spread}"


def _iv(iv, fmt: str = "{:+.2f}") -> str:
    return f"{fmt.format(iv.estimate)} (95% CI {fmt.format(iv.low)} .. {fmt.format(iv.high)})"


def winner_line(v) -> str:
    """One line: the winner, launches, margin over the runner-up and the baseline with intervals, the verdict, key."""
    w = v.winner
    chapters = ", ".join(v.chapters)
    if w.winner is None:
        why = w.ranking.why_not.iloc[0] if not w.ranking.empty else "no ok run with stored requests"
        closest = w.ranking.label.iloc[0] if not w.ranking.empty else "-"
        left = f"; {v.unreliable_out} unreliable launches left out" if v.unreliable_out else ""
        return f"no winner [{chapters}]: no trial meets the SLOs (closest: {closest}: {why}){left}"
    top = w.ranking.iloc[0]
    text = (f"winner [{chapters}]: {w.winner_trial.label} ({launches(w.winner_trial)}), "
            f"goodput {top.goodput:.2f} req/s")
    if w.runner_up_trial is not None and w.margin is not None:
        text += f"; over {w.runner_up_trial.label} ({launches(w.runner_up_trial)}): {_iv(w.margin)} req/s, {w.verdict}"

    else:
        text += "; the only trial that meets the SLOs"
    if v.baseline is not None and v.over_baseline is not None:
        text += f"; over baseline {v.baseline.label}: {_iv(v.over_baseline)} req/s"
    if v.unreliable_in:
        text += f"; {v.unreliable_in} of the launches ranked are marked unreliable (see `qwen3lab runs`)"
    if v.unreliable_out:
        text += f"; {v.unreliable_out} unreliable launches left out (--include-unreliable counts them)"
    return text + f"; comparability key {comparable.describe(w.winner.row)}"


def winner_json(v) -> dict:
    w = v.winner
    iv = lambda x: None if x is None else {"estimate": x.estimate, "low": x.low, "high": x.high, "p_value": x.p_value}  # noqa: E731
    return {
        "chapters": v.chapters, "winner": w.winner_trial.label if w.winner_trial else None,
        "winner_run_id": w.winner.run_id if w.winner else None,
        "launches": len(w.winner_trial.launches) if w.winner_trial else 0,
        "runner_up": w.runner_up_trial.label if w.runner_up_trial else None,
        "runner_up_launches": len(w.runner_up_trial.launches) if w.runner_up_trial else 0,
        "margin_goodput": iv(w.margin), "verdict": w.verdict or None,
        "baseline": v.baseline.label if v.baseline else None, "over_baseline_goodput": iv(v.over_baseline),
        "comparability_key": comparable.comparability_key(w.winner.row) if w.winner else w.key,
        "comparability": comparable.key_fields(w.winner.row) if w.winner else None,
        "unreliable_launches_ranked": v.unreliable_in, "unreliable_launches_left_out": v.unreliable_out,
        "ranking": w.ranking.to_dict("records"),
    }
