"""Which stored run stands for a trial: one key, one tie rule, one status vocabulary for everybody.

Runs are grouped by `trial_key` (the trial's full definition: the same name with other settings is another
trial); a capacity search's load points and a soak's windows stand for no trial. Of a trial's runs, the one that
stands is the newest ok run; without one, the newest run that ended
(failed, oom, timeout, crashed, skipped); without one, the newest run (running or interrupted). Equal start
times are broken by run_id. A run without a trial_key (none so far) stands for itself.

Where trials are shown by name (the report, claims, the dashboard's default selection), a name edited in the
experiment file has several trial_keys: the current one is the definition run most recently (`current`).
Resume, the workbook, claims, the report and the dashboard all read this module.
"""
from __future__ import annotations

import pandas as pd

MEASURED = ("ok",)  # runs with figures: the ones compared, ranked and exported
FAILED = ("failed", "oom", "timeout", "crashed")  # run again only when asked (--retry-failed)
SKIPPED = ("skipped",)  # could not run where it was judged: judged again where it can
FINISHED = MEASURED + SKIPPED  # done: resume does not run these again
ENDED = FINISHED + FAILED  # the run has an outcome (not running, not interrupted)
# A capacity search's load point or a soak's window is a piece of a larger measurement, with a workload of its
# own: it stands for no trial (its own pages show it), so no comparison, ranking or resume counts it.
PIECE_OF = ("search_id", "soak_id")


def standalone(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that each measure a trial on their own (see PIECE_OF)."""
    if runs is None or runs.empty:
        return runs
    piece = pd.Series(False, index=runs.index)
    for col in PIECE_OF:
        if col in runs:
            piece |= runs[col].notna()
    return runs[~piece]


def standing(runs: pd.DataFrame, trial_keys: list[str] | None = None) -> pd.DataFrame:
    """One row per trial_key, the run that stands for it (see the module's rule), in the order of
    `trial_keys` when given (only those trials), else oldest first."""
    if runs is None or runs.empty:
        return pd.DataFrame() if runs is None else runs
    runs = standalone(runs)
    df = runs if trial_keys is None else runs[runs.trial_key.isin(trial_keys)]
    if df.empty:
        return df.reset_index(drop=True)
    rank = pd.DataFrame({"ok": df.status.isin(MEASURED), "ended": df.status.isin(ENDED),
                         "started": df.started_at, "run": df.run_id}, index=df.index)
    key = _key(df)
    best = rank.sort_values(["ok", "ended", "started", "run"]).groupby(key, sort=False).tail(1).index
    out = df.loc[best]
    if trial_keys is not None:
        order = {k: i for i, k in enumerate(trial_keys)}
        return out.sort_values("trial_key", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    return out.sort_values(["started_at", "run_id"]).reset_index(drop=True)


def current(runs: pd.DataFrame, measured_only: bool = False) -> pd.DataFrame:
    """One row per (experiment, chapter, trial) name: the standing run of the name's current definition (the
    trial_key run most recently); with `measured_only`, only those that are ok. Oldest first."""
    df = standing(runs)
    if df.empty:
        return df
    latest = runs.groupby(_key(runs)).started_at.max()
    df = df.assign(_latest=_key(df).map(latest)).sort_values(["_latest", "run_id"])
    names = [c for c in ("experiment", "chapter", "trial") if c in df]
    df = df.drop_duplicates(names, keep="last").drop(columns="_latest")
    df = df.sort_values(["started_at", "run_id"]).reset_index(drop=True)
    return df[df.status.isin(MEASURED)].reset_index(drop=True) if measured_only else df


def _key(df: pd.DataFrame) -> pd.Series:
    return df.trial_key.fillna(df.run_id) if "trial_key" in df else df.run_id


def measured(runs: pd.DataFrame, trial_keys: list[str] | None = None) -> pd.DataFrame:
    """The standing runs that are ok: one per trial, the ones with figures."""
    df = standing(runs, trial_keys)
    return df[df.status.isin(MEASURED)].reset_index(drop=True) if not df.empty else df


def previous_run(store, trial_key: str, retry_failed: bool, runnable_here: bool = False) -> tuple[str, str] | None:
    """(run_id, status) of the standing run when it makes the trial done; None when the trial must run (again).

    Done: ok; skipped, unless the trial is `runnable_here` (it could not run where it was judged before);
    failed, unless `retry_failed`. A trial that is running or was interrupted runs again.
    """
    df = standing(store.trial_runs(trial_key))
    if df.empty:
        return None
    run_id, status = str(df.run_id.iloc[0]), str(df.status.iloc[0])
    if status in MEASURED or (status in SKIPPED and not runnable_here) or (status in FAILED and not retry_failed):
        return run_id, status
    return None
