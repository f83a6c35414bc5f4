"""A suggestion of the search measured: here one at a time, or on a Ray cluster as many at once as it has
free slots; what the sampler is told of each. search.run_search asks optuna and stores the study; the
measurers below only place and run a suggestion (runner.run_trial or capacity.capacity_of, here or as a Ray
task through ray_executor.TrialPool) and read its result back from DuckDB.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from qwen3lab.analysis import selection
from qwen3lab.errors import SpecErrors
from qwen3lab.experiment.spec import SEARCH_OBJECTIVES, Search, Trial
from qwen3lab.measure import capacity as cap
from qwen3lab.measure import executor, runner
from qwen3lab.store import Store


@dataclass
class SearchTrial:
    number: int
    params: dict[str, Any]
    state: str  # complete | pruned | failed | interrupted
    value: float | None = None
    value2: float | None = None
    low: float | None = None
    high: float | None = None
    reason: str | None = None
    trial_key: str | None = None
    run_id: str | None = None
    search_id: str | None = None
    wall_s: float | None = None


def told(search: Search, t: SearchTrial) -> list[float] | None:
    """What the sampler is told of a measured trial: its values, the worst ones for a failure."""
    worst = [{"maximize": 0.0, "minimize": 1e9}[SEARCH_OBJECTIVES[o]] for o in search.objectives]
    if t.state == "failed" or t.value is None:
        return worst
    # a missing second value is told as the worst one of its direction (a maximized goodput too)
    return [t.value] + ([t.value2 if t.value2 is not None else worst[1]] if len(search.objectives) == 2 else [])


def _measure(search: Search, trial: Trial, verdict, store: Store, runs_dir, path, machine, gpu_id,
             progress) -> SearchTrial:
    """Measure one suggested configuration here for the search's objective; the state and values it earned."""
    t0 = time.monotonic()
    out = _already_measured(search, trial, store)
    if out is None and search.objectives[0] == "capacity":
        got = cap.capacity_of(trial, store, runs_dir, path, machine, gpu_id, progress=progress, verdict=verdict,
                              done=cap.finished_launches(store, trial))
        out = capacity_outcome(search, trial, got)
    elif out is None:
        got = runner.run_trial(trial, store, runs_dir, experiment_path=path, machine=machine, gpu_id=gpu_id,
                               verdict=verdict, progress=progress)
        out = goodput_outcome(search, trial, store, got.run_id, got.status, got.reason, got.summary)
    out.wall_s = time.monotonic() - t0
    return out


def _already_measured(search: Search, trial: Trial, store: Store) -> SearchTrial | None:
    """A configuration measured already (by qwen3lab capacity or run, another study): its stored result."""
    if search.objectives[0] == "capacity":
        stored = cap.stored_capacity(store, trial)
        return capacity_outcome(search, trial, stored) if stored else None
    done = selection.previous_run(store, trial.key, retry_failed=True, runnable_here=True)
    return goodput_outcome(search, trial, store, done[0]) if done else None


def capacity_outcome(search: Search, trial: Trial, got: cap.CapacityResult) -> SearchTrial:
    """A capacity search's result as what the sampler is told: its capacity, the second objective at it."""
    second = search.objectives[1] if len(search.objectives) == 2 else None
    out = SearchTrial(-1, {}, "failed", trial_key=trial.key, search_id=got.search_id, reason=got.reason)
    if got.status in cap.SEARCH_DONE:
        out.state, out.value, out.low, out.high = "complete", got.capacity, got.low, got.high
        at = [p for p in got.points if p.passed and p.load == got.low]
        if at:
            out.run_id = at[0].run_id
            out.value2 = (at[0].summary or {}).get(second) if second else None
    elif got.status == "interrupted":
        out.state = "interrupted"
    return out


def goodput_outcome(search: Search, trial: Trial, store: Store, run_id: str, status: str | None = None,
                    reason: str | None = None, summary: dict | None = None) -> SearchTrial:
    """A run's result as what the sampler is told: its goodput (and second objective); read back when only
    its id is given."""
    if status is None:
        row = store.run(run_id)
        status, reason, summary = row["status"], row.get("reason"), row.get("summary")
    summary = summary or {}
    second = search.objectives[1] if len(search.objectives) == 2 else None
    out = SearchTrial(-1, {}, "failed", trial_key=trial.key, run_id=run_id, reason=reason)
    if status == "ok":
        out.state, out.value = "complete", summary.get("request_goodput", 0.0)
        out.value2 = summary.get(second) if second else None
    elif status == "interrupted":
        out.state = "interrupted"
    return out


@dataclass
class Pending:
    """A suggestion pre-flight let through, on its way to be measured."""

    number: int
    params: dict
    asked: Any  # optuna's trial, told the result
    trial: Trial
    verdict: Any
    started: float = 0.0  # when it was handed to the cluster


def record(store: Store, study_id: str, pending: Pending, got: SearchTrial) -> SearchTrial:
    got.number, got.params = pending.number, pending.params
    store.finish_search_trial(study_id, pending.number, got.state, value=got.value, value2=got.value2, low=got.low,
                              high=got.high, reason=got.reason, run_id=got.run_id, search_id=got.search_id,
                              wall_s=got.wall_s)
    return got


class Here:
    """Measures each suggestion in this process, one at a time (the local executor)."""

    slots = 1

    def __init__(self, search, store, runs_dir, path, gpu_id, listener, study_id, machine):
        self.search, self.store, self.runs_dir, self.path, self.gpu_id = search, store, runs_dir, path, gpu_id
        self.listener, self.study_id, self.machine = listener, study_id, machine
        self.done: list[tuple[Pending, SearchTrial]] = []

    @property
    def ready(self) -> bool:
        return bool(self.done)

    def __len__(self) -> int:
        return 0  # measured as it is submitted: nothing is ever in flight

    def submit(self, pending: Pending) -> None:
        got = SearchTrial(pending.number, pending.params, "interrupted", reason="stopped by the user",
                          trial_key=pending.trial.key)
        trial = pending.trial
        self.listener.launching(trial, f"suggestion #{pending.number} here", executor.expected_requests(trial))
        try:
            got = _measure(self.search, trial, pending.verdict, self.store, self.runs_dir, self.path,
                           self.machine, self.gpu_id, lambda n: self.listener.requests_done(trial, n))
        finally:  # stored even when a signal stops the measurement
            self.done.append((pending, record(self.store, self.study_id, pending, got)))

    def finished(self) -> list[tuple[Pending, SearchTrial]]:
        out, self.done = self.done, []
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OnRay:
    """Measures suggestions on a Ray cluster, as many at once as it has free slots (ask/tell as they finish):
    each one is a task (a capacity search on one server, or one launch), its rows stored here."""

    ready = False

    def __init__(self, search, store, runs_dir, path, gpu_id, listener, study_id, address):
        from qwen3lab.measure import ray_executor

        self.rx, self.search, self.store, self.gpu_id, self.study_id = ray_executor, search, store, gpu_id, study_id
        self.ray = ray_executor.connect(address)
        self.kind = "capacity" if search.objectives[0] == "capacity" else "trial"
        self.pool = ray_executor.TrialPool(self.ray, store, ray_executor.job_for(gpu_id, runs_dir, path), listener)
        self.listener = listener
        self.slots = 1  # until the first suggestion says what a task needs
        self.sized = False
        self.reused: list[tuple[Pending, SearchTrial]] = []

    def __len__(self) -> int:
        return len(self.pool)

    def submit(self, pending: Pending) -> None:
        if not self.sized:
            errors = self.rx.cluster_errors([pending.trial], self.gpu_id, self.ray.nodes())
            if errors:
                raise SpecErrors(errors)
            self.slots, self.sized = max(self.rx.free_slots(self.ray, pending.trial, self.gpu_id), 1), True
        got = _already_measured(self.search, pending.trial, self.store)
        if got is not None:
            self.reused.append((pending, record(self.store, self.study_id, pending, got)))
            return
        pending.started = time.monotonic()
        self.listener.launching(pending.trial, f"suggestion #{pending.number} on the cluster",
                                None if self.kind == "capacity" else executor.expected_requests(pending.trial))
        self.pool.submit(pending.trial, tag=pending, kind=self.kind)

    def finished(self) -> list[tuple[Pending, SearchTrial]]:
        out, self.reused = self.reused, []
        if not len(self.pool):
            return out
        for pending, result in self.pool.step():
            if self.kind == "capacity":
                stored = cap.stored_capacity(self.store, pending.trial, "measured on the cluster", unfinished=True)
                got = capacity_outcome(self.search, pending.trial, stored) if stored else \
                    SearchTrial(-1, {}, "failed", reason=result.reason)
            else:
                got = goodput_outcome(self.search, pending.trial, self.store, result.run_id, result.status,
                                      result.reason, self.store.run(result.run_id).get("summary")
                                      if result.run_id else None)
            got.wall_s = time.monotonic() - pending.started
            out.append((pending, record(self.store, self.study_id, pending, got)))
        return out

    def __enter__(self):
        self.pool.__enter__()
        return self

    def __exit__(self, *exc):
        return self.pool.__exit__(*exc)
