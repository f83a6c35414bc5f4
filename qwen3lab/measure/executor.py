"""Pre-flight once, then the trial loop with resume: what `qwen3lab run`, `qwen3lab sweep` and the workbook's
chapters share.

    planned = executor.plan("experiments/cpu-tiny.yaml", only=["scheduler"])  # load, expand, judge; runs nothing
    planned.raise_errors()                                                     # every pre-flight error at once
    results = executor.execute(planned, store, runs_dir="runs", listener=...)  # resume, run, store

The caller sees the loop through a Listener (the CLI's progress bar, a notebook's printed lines), so execution
imports no presentation.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qwen3lab.analysis import selection
from qwen3lab.errors import SpecErrors
from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import Trial
from qwen3lab.measure import runner
from qwen3lab.measure.runner import TrialResult
from qwen3lab.store import Store


@dataclass
class Plan:
    """An experiment's trials (or some chapters' trials), each with its pre-flight verdict for one machine."""

    experiment: xp.Experiment
    path: str | None
    machine: preflight.Machine
    verdicts: list[preflight.Verdict]

    @property
    def trials(self) -> list[Trial]:
        return [v.trial for v in self.verdicts]

    @property
    def errors(self) -> list:
        return [e for v in self.verdicts for e in v.errors]

    def raise_errors(self) -> None:
        """Every pre-flight error of every trial at once, before any server starts."""
        if self.errors:
            raise SpecErrors(self.errors)


def plan(experiment: str | os.PathLike | xp.Experiment, only: list[str] | None = None,
         machine: preflight.Machine | None = None, for_written_gpu: bool = False,
         adjust: Callable[[Trial], Trial] | None = None) -> Plan:
    """Load and expand the experiment, then judge every trial: for this machine (trials of an experiment
    written for a GPU this machine lacks are skipped with the reason), for `machine`, or with
    `for_written_gpu` for the experiment's own `gpu:` (a dry run). `adjust` rewrites each trial first (the
    notebooks' small-run overrides)."""
    exp = experiment if isinstance(experiment, xp.Experiment) else xp.load(experiment)
    path = exp.path if isinstance(experiment, xp.Experiment) else str(experiment)
    trials = xp.expand(exp, only)
    if adjust is not None:
        trials = [adjust(t) for t in trials]
    if machine is None:
        machine = preflight.Machine.for_gpu(exp.gpu) if for_written_gpu and exp.gpu else preflight.Machine.local()
    trials = preflight.skip_if_mismatched(trials, exp.gpu, machine)
    return Plan(exp, str(path) if path else None, machine, preflight.check_all(trials, machine, exp.gpu))


class Listener:
    """What `execute` tells its caller, as plain lines through `log`; a progress bar overrides what it shows."""

    def __init__(self, log: Callable[[str], None] | None = None):
        self.log = log or (lambda text: None)

    def started(self, planned: Plan) -> None:
        """Before the first trial."""

    def recovered(self, run: dict) -> None:
        """A run another qwen3lab left `running` when it stopped (killed, DuckDB refusing its last writes)."""
        self.log(f"! recovered run {run['run_id']}: its qwen3lab stopped without finishing it; "
                 f"{run['requests_recovered']} measured requests stored from its spool, status {run['status']}")

    def resumed(self, trial: Trial, run_id: str, status: str) -> None:
        self.log(f"= {_label(trial)}: {status} earlier (run {run_id}), not run again")

    def left_out(self, trial: Trial, why: str) -> None:
        self.log(f"- {_label(trial)}: left out ({why})")

    def launching(self, trial: Trial, verdict: preflight.Verdict) -> None:
        """Before run_trial: a server starts (or, for a skip, only its row is stored)."""
        if verdict.ok:
            cfg = trial.engine
            self.log(f"> {_label(trial)}: launching " + (cfg.to_shell() if cfg.kind == "vllm" else cfg.url))

    def requests_done(self, trial: Trial, count: int) -> None:
        """`count` more measured requests of the running trial finished."""

    def finished(self, result: TrialResult) -> None:
        self.log(f"{result.status:>8} {_label(result.trial)}" + (f": {result.reason}" if result.reason else "")
                 + f" (run {result.run_id})")


def _label(trial: Trial) -> str:
    return f"{trial.chapter}/{trial.name}"


def execute(planned: Plan, store: Store, runs_dir: str | Path = "runs", retry_failed: bool = False,
            fresh: bool = False, max_trials: int | None = None, notebook_path: str | None = None,
            listener: Listener | None = None) -> list[TrialResult]:
    """Every planned trial in order, with resume: a trial that already has a standing run (ok or skipped;
    failed too unless retry_failed) is not run again, unless `fresh`. At most `max_trials` servers are
    launched; trials left out by it are not stored. A trial that cannot run here is stored as skipped.
    Ctrl-C stores the running trial as interrupted (its server stopped) and is raised."""
    planned.raise_errors()
    listener = listener or Listener()
    for run in store.recover():  # before resume looks: an interrupted trial is run again
        listener.recovered(run)
    listener.started(planned)
    results: list[TrialResult] = []
    launched = 0
    for verdict in planned.verdicts:
        trial = verdict.trial
        done = None if fresh else selection.previous_run(store, trial.key, retry_failed, runnable_here=verdict.ok)
        if done:
            listener.resumed(trial, *done)
            results.append(TrialResult(trial, done[0], done[1], "already measured (resumed)"))
            continue
        if verdict.ok:
            if max_trials is not None and launched >= max_trials:
                listener.left_out(trial, f"max_trials={max_trials}")
                continue
            launched += 1
        listener.launching(trial, verdict)
        result = runner.run_trial(trial, store, runs_dir, experiment_path=planned.path, notebook_path=notebook_path,
                                  machine=planned.machine, gpu_id=planned.experiment.gpu, verdict=verdict,
                                  progress=lambda n, t=trial: listener.requests_done(t, n), log=listener.log)
        listener.finished(result)
        results.append(result)
    return results
