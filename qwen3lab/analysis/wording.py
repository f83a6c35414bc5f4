"""The winner in words, for every reader (the dashboard's Winner card, the 99 report, `qwen3lab winner`): the
SLOs, the margin over the runner-up with its interval (Welch's t over launches, at the level Holm's correction
for the best of N gives it), whether it can be told (better, can't tell, one launch), and what it would take."""
from __future__ import annotations

from qwen3lab.analysis import comparable, compare, stats
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
    return f"{m.estimate:+.2f} req/s ({m.ci} {m.low:+.2f} .. {m.high:+.2f})"


def launches(t: compare.TrialData | None) -> str:
    n = len(t.launches) if t else 0
    return f"{n} launch" + ("" if n == 1 else "es")


def would_take(w: compare.Winner) -> str:
    """For a winner that cannot be told from the runner-up: what more launches would show ('' when told)."""
    if w.margin is None or w.confident:
        return ""
    return stats.would_take(w.margin, "req/s")


def verdict_text(w: compare.Winner) -> str:
    """Better / can't tell / one launch, in a sentence, with what it would take to tell."""
    if w.winner is None:
        return "No trial meets the SLOs: loosen them, or measure other configurations."
    if w.runner_up is None:
        return "Only one trial meets the SLOs."
    best_of = f" (tested against {w.rivals} trials, Holm-corrected: it was picked as the best)" if w.rivals > 1 else ""
    if w.margin.one_launch:
        return (f"One launch per trial: {w.winner.label} leads {w.runner_up.label}, but how much a fresh launch moves "
                "is unknown, so no verdict; set `repeats: 2` or more.")
    if w.within_noise:
        return (f"Can't tell: {w.winner.label} and the others cannot be told apart{best_of}. Either is as good as "
                f"measured; {would_take(w)}.")
    return f"Better: {w.winner.label} is ahead of {w.runner_up.label} and every other trial{best_of}."


def _iv(iv, fmt: str = "{:+.2f}") -> str:
    return f"{fmt.format(iv.estimate)} ({iv.ci} {fmt.format(iv.low)} .. {fmt.format(iv.high)})"


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
        if w.rivals > 1:
            text += f" (best of {w.rivals + 1}, Holm)"
        if would_take(w):
            text += f" ({would_take(w)})"

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
    iv = lambda x: None if x is None else {"estimate": x.estimate, "low": x.low, "high": x.high, "p_value": x.p_value, "df": x.df}  # noqa: E731
    return {
        "chapters": v.chapters, "winner": w.winner_trial.label if w.winner_trial else None,
        "winner_run_id": w.winner.run_id if w.winner else None,
        "launches": len(w.winner_trial.launches) if w.winner_trial else 0,
        "runner_up": w.runner_up_trial.label if w.runner_up_trial else None,
        "runner_up_launches": len(w.runner_up_trial.launches) if w.runner_up_trial else 0,
        "margin_goodput": iv(w.margin), "verdict": w.verdict or None, "confident": w.confident,
        "tested_against": w.rivals, "detectable_goodput": w.margin.detectable if w.margin else None,
        "launches_needed": w.margin.needed if w.margin else None, "would_take": would_take(w) or None,
        "baseline": v.baseline.label if v.baseline else None, "over_baseline_goodput": iv(v.over_baseline),
        "comparability_key": comparable.comparability_key(w.winner.row) if w.winner else w.key,
        "comparability": comparable.key_fields(w.winner.row) if w.winner else None,
        "unreliable_launches_ranked": v.unreliable_in, "unreliable_launches_left_out": v.unreliable_out,
        "ranking": w.ranking.to_dict("records"),
    }


# --- claims and chapters in words --------------------------------------------------------------------------
METRIC_NAMES = {"goodput": "goodput (req/s)", "output_throughput": "output throughput (tok/s)",
                "p95_ttft_ms": "P95 TTFT (ms, lower is better)", "all": ""}


def claims_table(claims):
    """Claims for reading (the dashboard's Claims page, every chapter notebook): the verdict first, the change and
    its interval rounded to what the launches can tell (one decimal of a percent), `why` for a trial not compared."""
    import pandas as pd

    cols = ["verdict", "chapter", "trial", "baseline", "metric", "change (%)", "95% interval (%)", "launches",
            "baseline launches", "why not compared"]
    if claims is None or claims.empty:
        return pd.DataFrame(columns=cols)
    why = claims.verdict.where(claims.verdict.str.startswith("not compared: "), "")
    return pd.DataFrame({
        "verdict": claims.verdict.where(why == "", "not compared"),
        "chapter": claims.chapter.fillna(""), "trial": claims.trial.fillna(""), "baseline": claims.baseline.fillna(""),
        "metric": claims.metric.map(METRIC_NAMES).fillna(claims.metric),
        "change (%)": [f"{c:+.1f}" if c == c else "" for c in claims.change_pct],
        "95% interval (%)": [f"{lo:+.1f} .. {hi:+.1f}" if lo == lo and hi == hi else "" for lo, hi in
                             zip(claims.low_pct, claims.high_pct)],
        "launches": claims.launches.astype(int),
        "baseline launches": [str(int(n)) if n else "" for n in claims.baseline_launches.fillna(0)],
        "why not compared": why.str.removeprefix("not compared: "),
    }, columns=cols).reset_index(drop=True)


def chapter_verdict(verdicts: list, claims, slo: SLO) -> str:
    """A chapter's answer in sentences (markdown), the end of every chapter notebook: each comparable group's
    winner as the winner card says it (verdict_text, margin_text), then each claim that holds, then what could
    not be compared and why."""
    lines = [f"### Verdict\n\nUnder the SLOs ({slo_text(slo)}):"]
    if not verdicts:
        lines.append("\nNo ok run of this chapter has stored requests to rank: nothing to conclude yet.")
    for v in verdicts:
        w = v.winner
        chapters = ", ".join(v.chapters)
        if w.winner is None:
            lines.append(f"\n- **{chapters}**: {verdict_text(w)}")
            continue
        top = w.ranking.iloc[0]
        margin = f" Margin over {w.runner_up.label}: {margin_text(w)} goodput." if w.runner_up is not None else ""
        lines.append(f"\n- **Winner: {w.winner.label}** ({launches(w.winner_trial)}), goodput {top.goodput:.2f} req/s."
                     f"{margin} {verdict_text(w)}")
    if claims is not None and not claims.empty:
        told = claims[claims.verdict.isin(["better", "worse"])]
        for r in told.itertuples():
            lines.append(f"\n- {r.trial} against {r.baseline}: {METRIC_NAMES.get(r.metric, r.metric)} "
                         f"{r.change_pct:+.1f}% (95% CI {r.low_pct:+.1f} .. {r.high_pct:+.1f}), **{r.verdict}**.")
        short = {"goodput": "goodput", "output_throughput": "output throughput", "p95_ttft_ms": "P95 TTFT"}
        for word, what in (("can't tell", "Can't tell (within the launches' noise)"),
                           ("one launch", "One launch a side, so no verdict (the launch-to-launch spread is unknown)")):
            mine = claims[claims.verdict.str.startswith(word)]
            if not mine.empty:
                each = [f"{t} ({', '.join(f'{short.get(m, m)} {c:+.1f}%' for m, c in zip(g.metric, g.change_pct))})"
                        for t, g in mine.groupby("trial", sort=False)]
                lines.append(f"\n- {what}: {'; '.join(each)}.")
        for r in claims[claims.verdict.str.startswith("not compared: ")].itertuples():
            lines.append(f"\n- {r.trial}: {r.verdict}.")
    return "".join(lines)


# Decimals a figure is read to: what a launch-to-launch spread of a few percent leaves meaningful
DECIMALS = {"output_throughput": 0, "total_token_throughput": 0, "request_throughput": 2, "request_goodput": 2,
            "goodput": 2, "attainment": 3, "capacity": 3, "change_pct": 1, "low_pct": 1, "high_pct": 1}


def rounded(df):
    """A table of figures for reading: latencies (…_ms) to 0.1 ms, token rates to 1 tok/s, request rates to
    0.01 req/s, other floats to 3 significant digits; ids, names and counts untouched."""
    import numpy as np
    import pandas as pd

    if df is None or df.empty:
        return df
    out = df.copy()
    for col in out.columns:
        if not pd.api.types.is_float_dtype(out[col]):
            continue
        if col in DECIMALS:
            out[col] = out[col].round(DECIMALS[col])
        elif str(col).endswith("_ms") or str(col).endswith("_s"):
            out[col] = out[col].round(1)
        else:
            v = out[col].to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                digits = np.where(np.isfinite(v) & (v != 0), 2 - np.floor(np.log10(np.abs(v))), 0).astype(int)
            out[col] = [round(x, int(d)) if np.isfinite(x) else x for x, d in zip(v, digits)]
    return out
