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
    runs: pd.DataFrame  # the current run of each (chapter, trial)
    winners: list  # compare.Verdict, one per group of comparable runs
    claims: pd.DataFrame

    @property
    def winner(self) -> Any:
        """The winner of the first comparable group (most reports have one group per workload)."""
        return self.winners[0].winner if self.winners else None

    def table(self) -> pd.DataFrame:
        cols = [c for c in RUN_COLUMNS if c in self.runs]
        return wording.rounded(self.runs[cols]) if not self.runs.empty else self.runs

    def ranking(self) -> pd.DataFrame:
        """Each comparable group's ranking, one after the other, the group's chapters in the first column."""
        parts = [v.winner.ranking.assign(group=", ".join(v.chapters)) for v in self.winners if not v.winner.ranking.empty]
        if not parts:
            return pd.DataFrame()
        df = pd.concat(parts, ignore_index=True)
        return wording.rounded(df[["group", *[c for c in df if c != "group"]]])

    def verdict(self):
        from IPython.display import Markdown

        if self.runs.empty:
            return Markdown("No runs of this experiment in this database yet: run the chapters first.")
        if not self.winners:
            return Markdown("No ok run of this experiment has stored requests to rank.")
        lines = [f"**Under the SLOs** ({wording.slo_text(SLO(**self.experiment.slo))}), only runs of one workload, tokenizer, "
                 "machine and vLLM build are ranked together:"]
        for v in self.winners:
            lines.append(f"- {wording.winner_line(v)}")
            if v.winner.winner is not None and v.winner.winner.row.get("launch_command"):
                lines.append(f"\n  ```\n  {v.winner.winner.row['launch_command']}\n  ```")
        return Markdown("\n".join(lines))


def report(experiment: str | os.PathLike, db: str, n_boot: int = 400) -> Report:
    """All trials of an experiment side by side, the winner of each comparable group, and each knob's effect."""
    from qwen3lab.analysis import compare
    from qwen3lab.analysis.claims import claims as claims_of

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
    ok = not runs.empty and runs.status.isin(selection.MEASURED).any()
    winners = compare.winners(store, exp.name, slo, n_boot=n_boot) if ok else []
    baselines = {n: c.baseline or (c.trials[0]["name"] if c.trials else None) for n, c in exp.all_chapters().items()}
    claims = claims_of(store, exp.name, slo, n_boot=n_boot,
                            baselines={n: b for n, b in baselines.items() if b}) if ok else pd.DataFrame()
    return Report(exp, store, runs, winners, claims)
