"""The 99 report: every trial of an experiment side by side (selection.current), the winner under its SLOs,
and each knob's effect against its baseline."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from qwen3lab.analysis import selection
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
        if w is None or w.winner is None:
            return Markdown("**No winner**: no ok run meets every SLO of the experiment "
                            f"({json.dumps(self.experiment.slo)}). Relax the SLO or look at the ranking below.")
        row = self.runs[self.runs.run_id == w.winner.run_id].iloc[0]
        margin = ""
        if w.margin is not None and w.runner_up is not None:
            margin = (f" Margin over `{w.runner_up.label}`: {w.margin.estimate:+.3f} req/s goodput "
                      f"(95% interval {w.margin.low:+.3f} to {w.margin.high:+.3f})"
                      + (", **within noise**." if w.within_noise else "."))
        return Markdown(f"**Winner under the SLOs** ({json.dumps(self.experiment.slo)}): `{w.winner.label}`."
                        f"{margin}\n\nLaunch command:\n\n```\n{row.launch_command}\n```")


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
    ok_ids = list(runs[runs.status == "ok"].run_id) if not runs.empty else []
    data = compare.load_runs(store, ok_ids) if ok_ids else []
    winner = compare.pick_winner(data, slo, n_boot=n_boot) if data else None
    claims = compare.claims(store, exp.name, slo, n_boot=n_boot) if ok_ids else pd.DataFrame()
    return Report(exp, store, runs, winner, claims)
