"""The 99 report: every trial of an experiment side by side (selection.current), the winner under its SLOs,
and each knob's effect against its baseline."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from qwen3lab.analysis import selection, wording
from qwen3lab.experiment import files as xp
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store
from qwen3lab.workbook.chapter import RUN_COLUMNS, setup_plotly


# --- 99 report --------------------------------------------------------------------------------------------
@dataclass
class Report:
    experiment: xp.Experiment
    store: Store
    runs: pd.DataFrame  # newest run per (chapter, trial)
    winner: Any
    claims: pd.DataFrame

    def table(self) -> pd.DataFrame:
        cols = [c for c in RUN_COLUMNS if c in self.runs]
        return self.runs[cols] if not self.runs.empty else self.runs

    def ranking(self) -> pd.DataFrame:
        return self.winner.ranking if self.winner is not None else pd.DataFrame()

    def verdict(self):
        from IPython.display import Markdown

        w = self.winner
        if self.runs.empty:
            return Markdown("No runs of this experiment in this database yet: run the chapters first.")
        slo = wording.slo_text(SLO(**self.experiment.slo))
        if w is None or w.winner is None:
            return Markdown(f"**No winner** under the SLOs ({slo}). No ok run meets every one: relax them, "
                            "measure other configurations, or look at the ranking below.")
        row = self.runs[self.runs.run_id == w.winner.run_id].iloc[0]
        margin = f" Margin over `{w.runner_up.label}`: {wording.margin_text(w)} goodput." if w.runner_up else ""
        return Markdown(f"**Winner under the SLOs** ({slo}): `{w.winner.label}`.{margin} {wording.verdict_text(w)}"
                        f"\n\nLaunch command:\n\n```\n{row.launch_command}\n```")


def report(experiment: str | os.PathLike, db: str, n_boot: int = 1000) -> Report:
    """All trials of an experiment side by side, the winner under its SLOs, and each knob's effect."""
    from qwen3lab.analysis import compare

    setup_plotly()
    exp = xp.load(experiment)
    store = Store(db)
    slo = SLO(**exp.slo)
    runs = store.runs(experiment=exp.name)
    if not runs.empty:
        runs = selection.current(runs)
        order = {c: i for i, c in enumerate(exp.all_chapters())}
        runs = runs.sort_values(["chapter", "trial"], key=lambda s: s.map(order) if s.name == "chapter" else s)
        runs = runs.reset_index(drop=True)
    ok_ids = list(runs[runs.status.isin(selection.MEASURED)].run_id) if not runs.empty else []
    data = compare.load_runs(store, ok_ids) if ok_ids else []
    winner = compare.pick_winner(data, slo, n_boot=n_boot) if data else None
    claims = compare.claims(store, exp.name, slo, n_boot=n_boot) if ok_ids else pd.DataFrame()
    return Report(exp, store, runs, winner, claims)
