"""Claims: for each chapter, every trial against its baseline, the relative change with its 95% interval and a
Holm-corrected verdict; a trial no claim can be made about gets a row saying why (analysis/uncompared.py).

A trial is paired with the baseline trial of its chapter that has its comparability key (same requests,
tokenizer, machine, build), not merely its name: a smoke run with fewer requests has no baseline to meet.
`baselines` (chapter -> trial, from the experiment file) stands in for runs that stored none.

Each trial's figures (per metric) are computed once, a baseline's serving every trial of its chapter, and the
resampling of different trials runs on the machine's cores (numpy releases the GIL; each trial's resampling has
its own seeded generator, so the figures do not depend on the order they are computed in).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from qwen3lab.analysis import comparable, stats, uncompared
from qwen3lab.analysis.compare import METRICS, _row, chapter_trials, figures, trials_of
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store


def claims(store: Store, experiment: str, slo: SLO, n_boot: int = 400,
           baselines: dict[str, str] | None = None) -> pd.DataFrame:
    baselines = baselines or {}
    everything = store.runs(experiment=experiment)
    data = chapter_trials(store, experiment, runs=everything)
    recs, pairs = [], []  # pairs: (chapter, trial, its baseline, the baseline's name)
    for chapter in dict.fromkeys(r.row.get("chapter") for r in data):
        trials = trials_of([r for r in data if r.row.get("chapter") == chapter])
        for t in trials:
            base_name = t.newest.row.get("baseline")
            base_name = base_name if isinstance(base_name, str) else baselines.get(chapter)
            if not isinstance(base_name, str) or t.newest.row.get("trial") == base_name:
                continue
            key = comparable.comparability_key(t.newest.row)
            bases = [b for b in trials if b.newest.row.get("trial") == base_name
                     and comparable.comparability_key(b.newest.row) == key]
            if not bases:
                others = [b for b in trials if b.newest.row.get("trial") == base_name]
                why = ("; ".join(comparable.differences(t.newest.row, others[0].newest.row)) if others
                       else "no finished baseline run")
                recs.append(uncompared.row(chapter, t.newest.row.get("trial"), base_name, why, len(t.launches),
                                           t.newest.run_id))
                continue
            pairs.append((chapter, t, max(bases, key=lambda b: str(b.newest.row.get("started_at") or "")), base_name))

    needed = {(x.key, metric): x for _, t, base, _ in pairs for x in (t, base) for metric in METRICS}
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        done = pool.map(lambda km: figures(needed[km], slo, km[1], n_boot), list(needed))
        memo: dict[tuple[str, str], stats.Figures] = dict(zip(list(needed), done))

    for chapter in dict.fromkeys(c for c, *_ in pairs):
        mine = []
        for _, t, base, base_name in (p for p in pairs if p[0] == chapter):
            for metric, higher in METRICS.items():
                fa, fb = memo[t.key, metric], memo[base.key, metric]
                iv, rel = stats.welch(fa, fb), stats.welch(fa, fb, relative=True)
                mine.append(({"chapter": chapter, "trial": t.newest.row.get("trial"), "baseline": base_name,
                              "metric": metric, **_row(iv, rel), "launches": len(t.launches),
                              "baseline_launches": len(base.launches), "run_id": t.newest.run_id,
                              "baseline_run_id": base.newest.run_id}, iv, higher))
        # Holm across the chapter's trials x metrics: a family of comparisons, one error rate
        confident = stats.holm([np.nan if iv.one_launch else iv.p_value for _, iv, _ in mine])
        for (rec, iv, higher), sure in zip(mine, confident):
            rec["verdict"] = stats.verdict(iv, higher, bool(sure))
            recs.append(rec)
    done_trials = {(r["chapter"], r["trial"]) for r in recs}  # the rest get a row saying why they have no claim
    recs += uncompared.rows(experiment, everything, done_trials, {r.run_id for r in data}, baselines)
    return pd.DataFrame(recs)
