"""Pre-flight once, then the trial loop with resume: what `qwen3lab run`, `qwen3lab sweep` and the workbook's
chapters share.

    planned = executor.plan("experiments/cpu-tiny.yaml", only=["scheduler"])  # load, expand, judge; runs nothing
    planned.raise_errors()                                                     # every pre-flight error at once
    results = executor.execute(planned, store, runs_dir="runs", listener=...)  # resume, run, store

Which launches run, in which order and how often is the scheduler's (measure/schedule.py); execute places each
one here and runs it. The caller sees the loop through an events.Listener (the CLI's progress bar, a notebook's
printed lines), so execution imports no presentation.
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
from qwen3lab.measure.events import Listener
from qwen3lab.measure.runner import TrialResult
from qwen3lab.measure.schedule import Schedule
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


# --- repeats: auto (the rule the scheduler asks for one more launch) -----------------------------------------
def auto_launch(store: Store, trials: list[Trial]) -> Trial | None:
    """repeats: auto: the next launch of one chapter's trials, or None when its verdict stands.

    While the leading two trials under the chapter's SLOs cannot be told apart (their goodput interval holds
    zero) and both have fewer than max_repeats launches, the one with fewer launches gets one more. Once they
    separate, or the cap is reached, the verdict stands. The verdict reads the reliable ok launches, but every
    stored launch counts toward the cap (unreliable and failed ones too: each started a server), or on a busy
    machine that flags many launches max_repeats would be no cap.
    """
    from qwen3lab.analysis import comparable, compare

    auto = [t for t in trials if t.max_repeats]
    if len(auto) < 2:
        return None
    by_key = {t.key: t for t in auto}
    runs = [r for r in compare.chapter_trials(store, auto[0].experiment, auto[0].chapter) if r.trial_key in by_key]
    try:
        w = compare.pick_winner(runs, auto[0].slo, n_boot=1000)
    except comparable.NotComparable:
        return None  # the chapter's trials sent different requests: no pair to separate
    if w.winner_trial is None or w.runner_up_trial is None or not w.within_noise:
        return None
    launched = {t.key: _launched(store, t.key) for t in (w.winner_trial, w.runner_up_trial)}
    first = min(launched, key=launched.get)
    return by_key[first] if launched[first] < (by_key[first].max_repeats or 0) else None


def _launched(store: Store, trial_key: str) -> int:
    """Launches of a trial that started a server and ended: ok (reliable or not) and failed."""
    runs = store.trial_runs(trial_key)
    return int(runs.status.isin(selection.MEASURED + selection.FAILED).sum()) if not runs.empty else 0


def execute(planned: Plan, store: Store, runs_dir: str | Path = "runs", retry_failed: bool = False,
            fresh: bool = False, max_trials: int | None = None, notebook_path: str | None = None,
            listener: Listener | None = None) -> list[TrialResult]:
    """Every planned trial, with resume: a trial whose standing run is ok or skipped (failed too unless
    retry_failed) is not run again, unless `fresh`; a trial with `repeats: K` is launched until it has K ok
    launches, round by round across its chapter (A B C A B C); `repeats: auto` then adds launches to the
    leading two while they cannot be told apart. At most `max_trials` servers are launched; launches left out
    by it are not stored. A trial that cannot run here is stored as skipped. Ctrl-C stores the running trial as
    interrupted (its server stopped) and is raised."""
    planned.raise_errors()
    listener = listener or Listener()
    sched = Schedule(planned, store, auto_launch, retry_failed, fresh, max_trials, listener)
    while (launch := sched.next()) is not None:
        trial = launch.trial
        if launch.verdict.ok:
            cfg = trial.engine
            listener.launching(trial, "launching" + launch.label + " " + (cfg.to_shell() if cfg.kind == "vllm"
                                                                          else cfg.url), expected_requests(trial))
        result = runner.run_trial(trial, store, runs_dir, experiment_path=planned.path, notebook_path=notebook_path,
                                  machine=planned.machine, gpu_id=planned.experiment.gpu, verdict=launch.verdict,
                                  since=sched.looked, progress=lambda n, t=trial: listener.requests_done(t, n),
                                  log=listener.log)
        listener.finished(trial, result.status, told(result))
        sched.finished(launch, result)
    return sched.results


def told(result: TrialResult) -> str:
    """A launch's outcome as its line says it: the reason, then the run."""
    return (f"{result.reason} " if result.reason else "") + f"(run {result.run_id})"


def expected_requests(trial: Trial) -> int | None:
    """The measured requests a launch of `trial` will send (None: it runs for a time)."""
    return None if trial.workload.duration_s else trial.workload.num_requests
