"""Claims' rows for the trials no claim can be made about, each with why: a claim left out silently hides the
reasoning (the H200 file's enforce-eager, -66% output throughput against defaults, measured before a chapter's
slice stored its baseline, was simply absent).

Why a trial has no claim: it never finished a run (interrupted, failed, skipped: the newest reason); every ok
launch is marked unreliable; it is the only trial of its chapter; or no run of its chapter names a baseline
(then `qwen3lab compare` sets it against another trial by hand). Baselines themselves get no row: they are
what the others are compared against.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from qwen3lab.analysis import selection


def row(chapter, trial, baseline, why: str, launches: int = 0, run_id=None) -> dict:
    """A claims row without figures: `verdict` says why ("not compared: ...")."""
    return {"chapter": chapter, "trial": trial, "baseline": baseline, "metric": "all", "change_pct": np.nan,
            "low_pct": np.nan, "high_pct": np.nan, "p_value": np.nan, "verdict": f"not compared: {why}",
            "launches": launches, "baseline_launches": 0, "run_id": run_id, "baseline_run_id": None}


def rows(experiment: str, runs: pd.DataFrame, done: set[tuple[str, str]], compared_ok: set[str],
         baselines: dict[str, str] | None = None) -> list[dict]:
    """Rows for every (chapter, trial) of `runs` (all runs of the experiment, any status) not in `done`.

    `compared_ok`: run ids of the launches claims looked at (ok and reliable); an ok run outside it was left
    out as unreliable."""
    runs = selection.standalone(runs)
    if runs is None or runs.empty:
        return []
    out = []
    for chapter, mine in runs.groupby("chapter", sort=False, dropna=False):
        named = set(mine.baseline.dropna().astype(str)) | {(baselines or {}).get(chapter)}
        names = list(dict.fromkeys(mine.sort_values("started_at").trial.astype(str)))
        for trial in names:
            if (chapter, trial) in done or trial in named:
                continue
            own = mine[mine.trial.astype(str) == trial].sort_values("started_at", ascending=False)
            ok = own[own.status.isin(selection.MEASURED)]
            newest = own.iloc[0]
            base = newest.baseline if isinstance(newest.baseline, str) else (baselines or {}).get(chapter)
            if ok.empty:
                reason = newest.get("reason")
                why = f"no finished run ({newest.status}" + (f": {_short(reason)})" if isinstance(reason, str) and reason else ")")
            elif not ok.run_id.isin(compared_ok).any():
                why = f"every ok launch ({len(ok)}) is marked unreliable (see `qwen3lab runs`)"
            elif base is not None:
                why = f"no finished run of its baseline {base}"
            else:
                others = [n for n in names if n != trial and mine[(mine.trial == n)].status.isin(selection.MEASURED).any()]
                if not others:
                    why = "the only measured trial of its chapter: nothing to compare against"
                else:
                    why = (f"no run of its chapter names a baseline (the runs store none); compare it by hand: "
                           f"`qwen3lab compare {chapter}/{trial} {chapter}/{others[0]} --experiment {experiment}`")
            out.append(row(chapter, trial, base, why, len(ok), (ok if not ok.empty else own).run_id.iloc[0]))
    return out


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
