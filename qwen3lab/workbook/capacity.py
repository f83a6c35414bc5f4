"""The capacity chapter: the capacity of an experiment's baseline and its leading candidates (by goodput under
the SLOs in their stored runs), each on one server per launch (capacity.capacity_of, with resume), and their load
curves. The notebook is 95_capacity; `qwen3lab capacity` measures the same for every trial."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.analysis import selection, stats, wording
from qwen3lab.errors import SpecError
from qwen3lab.experiment.spec import Capacity
from qwen3lab.measure import capacity as cap
from qwen3lab.measure import executor
from qwen3lab.store import Store
from qwen3lab.workbook.chapter import setup_plotly

SLO_OF_METRIC = {"p95_ttft_ms": ("ttft_p95_ms", "ttft_ms"), "p95_tpot_ms": ("tpot_p95_ms", "tpot_ms"),
                 "p99_e2el_ms": ("e2el_p99_ms", "e2el_ms")}


@dataclass
class CapacityChapter:
    store: Store
    picked: pd.DataFrame  # chapter, trial, why (baseline or rank by goodput)
    results: list[cap.CapacityResult]
    slo: dict

    def table(self) -> pd.DataFrame:
        """One row per configuration, ranked by capacity (the largest load within the SLOs), each against the top
        one: capacity launches are launches, so the same verdicts as goodput (see `against_top`)."""
        rows = [{"chapter": r.trial.chapter, "trial": r.trial.name, "why": w, "status": r.status, "axis": r.axis,
                 "capacity": r.capacity, "last pass": r.low, "first fail": r.high, "points": len(r.points),
                 "launches": len(r.launches or [r]), "start_s": r.start_s, "search_id": r.search_id}
                for r, w in zip(self.results, self.picked.why)]
        df = pd.DataFrame(rows)
        if not rows:
            return df
        order = df.sort_values("capacity", ascending=False, na_position="last").index
        df = df.loc[order].reset_index(drop=True)
        df["against the top"] = against_top([self.results[i] for i in order])
        return df

    def searches(self) -> pd.DataFrame:
        df = self.store.capacities()
        return df[df.search_id.isin([r.search_id for r in self.results])] if not df.empty else df

    def points(self) -> pd.DataFrame:
        return self.store.capacity_points([r.search_id for r in self.results])

    def point_table(self) -> pd.DataFrame:
        """Every point of every configuration as `qwen3lab capacity --json` shows it (why it passed or failed)."""
        rows = [{"chapter": r.trial.chapter, "trial": r.trial.name} | p.row() for r in self.results for p in r.points]
        return wording.rounded(pd.DataFrame(rows).drop(columns=["run_id"], errors="ignore"))

    def limit(self, metric: str) -> float | None:
        """The SLO line of a load-curve metric (the attainment floor for attainment)."""
        if metric == "attainment":
            specs = [r.trial.workload.capacity or Capacity() for r in self.results]
            return specs[0].min_attainment if specs else None
        return next((self.slo[k] for k in SLO_OF_METRIC.get(metric, ()) if self.slo.get(k)), None)


def capacity_figures(r: cap.CapacityResult) -> stats.Figures:
    """A configuration's capacity per launch (search), each with its own noise: the capacity lies somewhere in
    its bracket (last pass .. first fail), uniformly for all the search knows: standard error width / sqrt(12)."""
    done = [x for x in (r.launches or [r]) if x.capacity is not None]
    width = [(x.high - x.low) if x.high is not None and x.low is not None else 0.0 for x in done]
    return stats.Figures(np.array([x.capacity for x in done], float), np.array(width) / np.sqrt(12))


def against_top(ranked: list[cap.CapacityResult]) -> list[str]:
    """The top capacity against every other one: Welch's t over launches, Holm-corrected as the best of N; a
    configuration with one launch (or the top with one) gets no verdict."""
    figs = [capacity_figures(r) for r in ranked]
    if not ranked or not figs[0].n:
        return [""] * len(ranked)
    measured = [i for i in range(1, len(ranked)) if figs[i].n]
    ivs, ahead = stats.best_of(figs[0], [figs[i] for i in measured])
    out = ["top"] + ["no capacity"] * (len(ranked) - 1)
    for i, iv, sure in zip(measured, ivs, ahead):
        out[i] = stats.verdict(iv, False, sure)  # the top minus this one: positive means this one is worse
    return out


def pick(planned: executor.Plan, store: Store, top: int, trials: list[str] | None,
         chapter: str | None = None) -> list[tuple[object, str]]:
    """(verdict, why) of the baseline and the `top` trials with the highest stored goodput; or `trials` by name;
    or, with `chapter`, that chapter's trials (the experiment's capacity chapter, as `qwen3lab sweep` runs it)."""
    verdicts = [v for v in planned.verdicts if v.ok]
    if chapter:
        mine = [(v, "capacity chapter") for v in verdicts if v.trial.chapter == chapter]
        if not mine:
            raise SpecError("chapter", chapter, ", ".join(sorted({v.trial.chapter for v in verdicts})),
                            "name a chapter of this experiment with trials that can run here, or chapter = None")
        return mine
    if trials:
        by_name = {v.trial.name: v for v in verdicts}
        missing = [t for t in trials if t not in by_name]
        if missing:
            raise SpecError("trials", missing, ", ".join(by_name), "name trials of this experiment that can run here")
        return [(by_name[t], "asked for") for t in trials]
    base = next((v for v in verdicts if v.trial.chapter == "baseline"), verdicts[0] if verdicts else None)
    out = [(base, "baseline")] if base else []
    runs = store.runs(experiment=planned.experiment.name, status="ok")
    if not runs.empty:
        runs = selection.current(runs[runs.search_id.isna()]) if "search_id" in runs else selection.current(runs)
        ranked = runs.sort_values("request_goodput", ascending=False)
        keys = {v.trial.key: v for v in verdicts}
        for key in ranked.trial_key:
            v = keys.get(key)
            if v is not None and all(v is not chosen for chosen, _ in out) and len(out) < top + 1:
                out.append((v, f"goodput rank {len(out)}"))
    return out


def capacity_chapter(experiment: str | os.PathLike, db: str, runs_dir: str = "runs", top: int = 2,
                     trials: list[str] | None = None, requests_per_point: int | None = None,
                     max_points: int | None = None, log=print, chapter: str | None = None) -> CapacityChapter:
    """Measure (or resume) the capacity of the baseline and the leading candidates; see the module docstring."""
    setup_plotly()
    planned = executor.plan(experiment)
    planned.raise_errors()
    store = Store(db)
    chosen = pick(planned, store, top, trials, chapter)
    results, whys = [], []
    for verdict, why in chosen:
        trial = verdict.trial
        spec = trial.workload.capacity or Capacity()
        update = {k: v for k, v in (("requests_per_point", requests_per_point), ("max_points", max_points)) if v}
        if update:
            spec = spec.model_copy(update=update)
        trial = trial.model_copy(update={"workload": trial.workload.model_copy(update={"capacity": spec})})
        verdict = dataclasses.replace(verdict, trial=trial)
        result = cap.stored_capacity(store, trial)
        if result is None:
            log(f"> {trial.chapter}/{trial.name} ({why}): measuring its capacity")
            result = cap.capacity_of(trial, store, runs_dir, str(experiment), planned.machine,
                                     planned.experiment.gpu, verdict=verdict, done=cap.finished_launches(store, trial))
        log(f"{result.status:>10} {trial.chapter}/{trial.name}: capacity {result.capacity} {result.axis}")
        results.append(result)
        whys.append(why)
    picked = pd.DataFrame({"chapter": [r.trial.chapter for r in results], "trial": [r.trial.name for r in results],
                           "why": whys})
    return CapacityChapter(store, picked, results, json.loads(json.dumps(planned.experiment.slo)))
