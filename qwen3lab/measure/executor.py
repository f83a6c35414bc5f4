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
from qwen3lab.store import now as store_now


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

    def planned_launches(self, count: int) -> None:
        """How many launches the plan will make (repeats included), told right after `started`."""

    def repeat(self, trial: Trial, round_: int | None) -> None:
        """The next `launching` is this trial's round (0-based; None: an extra launch of repeats: auto)."""

    def resumed(self, trial: Trial, run_id: str, status: str) -> None:
        self.log(f"= {_label(trial)}: {status} earlier (run {run_id}), not run again")

    def left_out(self, trial: Trial, why: str) -> None:
        self.log(f"- {_label(trial)}: left out ({why})")

    def launching(self, trial: Trial, verdict: preflight.Verdict) -> None:
        """Before run_trial: a server starts (or, for a skip, only its row is stored)."""
        if verdict.ok:
            cfg = trial.engine
            self.log(f"> {_label(trial)}: launching " + (cfg.to_shell() if cfg.kind == "vllm" else cfg.url))

    def extra_launch(self, trial: Trial) -> None:
        """repeats: auto asks for one more launch of a leading trial."""
        self.log(f"+ {_label(trial)}: the leading two cannot be told apart yet; one more launch "
                 f"(auto, at most {trial.max_repeats})")

    def requests_done(self, trial: Trial, count: int) -> None:
        """`count` more measured requests of the running trial finished."""

    def finished(self, result: TrialResult) -> None:
        self.log(f"{result.status:>8} {_label(result.trial)}" + (f": {result.reason}" if result.reason else "")
                 + f" (run {result.run_id})")


def _label(trial: Trial) -> str:
    return f"{trial.chapter}/{trial.name}"


def repeat_label(trial: Trial, round_: int | None) -> str:
    """' #2/3' for the second of three launches ('' for one launch, ' +1' for an extra one of repeats: auto)."""
    if round_ is None:
        return " +1"
    return f" #{round_ + 1}/{trial.repeats}" if trial.repeats > 1 else ""


# --- repeats: launches per trial, interleaved; auto ---------------------------------------------------------
def launches_left(store: Store, trial: Trial, retry_failed: bool, runnable_here: bool = False,
                  fresh: bool = False) -> tuple[int, tuple[str, str] | None]:
    """(launches this trial still needs for its `repeats`, the earlier (run_id, status) that stands for it).

    Ok launches count toward `repeats`; a skipped trial (not runnable here) and a failed one (unless
    retry_failed) need none: a configuration that fails is not launched again and again. A skip is stored
    once, not once a repeat.
    """
    want = trial.repeats if runnable_here else 1
    if fresh:
        return want, None
    prev = selection.previous_run(store, trial.key, retry_failed, runnable_here)
    if prev is None:  # never finished (or to be retried, or skipped elsewhere and runnable here)
        return want, None
    if prev[1] not in selection.MEASURED:
        return 0, prev
    df = store.trial_runs(trial.key)
    return max(trial.repeats - int(df.status.isin(selection.MEASURED).sum()), 0), prev


def interleave(trials: list[Trial], needed: list[int]) -> list[tuple[Trial, int]]:
    """(trial, round) launches, round by round within each chapter: A B C A B C, not A A B B C C.

    A trial with launches already stored resumes at its next round, so a resumed run first catches up the
    trials that are behind, and slow drift of the machine spreads evenly over the trials.
    """
    chapter_order = {c: i for i, c in enumerate(dict.fromkeys(t.chapter for t in trials))}
    launches = []
    for pos, (t, n) in enumerate(zip(trials, needed)):
        first = max(t.repeats - n, 0)
        launches += [((chapter_order[t.chapter], first + i, pos), t) for i in range(n)]
    return [(t, key[1]) for key, t in sorted(launches, key=lambda x: x[0])]


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


def recover(store: Store, listener: Listener) -> None:
    """What every executor (local or Ray) does before resume looks: `running` rows whose owner is gone (a
    killed qwen3lab, or a Ray worker that went with its killed driver) get their spool ingested and are
    finished as it says, else marked `interrupted`, so resume runs them again (Store.recover)."""
    for run in store.recover():
        listener.recovered(run)


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
    recover(store, listener)
    results: list[TrialResult] = []
    needed, verdict_of = [], {}
    looked = store_now()  # a launch another qwen3lab begins after this is one of ours: not run twice
    for verdict in planned.verdicts:
        n, done = launches_left(store, verdict.trial, retry_failed, runnable_here=verdict.ok, fresh=fresh)
        needed.append(n)
        verdict_of[verdict.trial.key] = verdict
        if n == 0 and done:
            results.append(TrialResult(verdict.trial, done[0], done[1], "already measured (resumed)"))
    launches = interleave(planned.trials, needed)
    listener.started(planned)
    listener.planned_launches(len(launches))
    for r in results:
        listener.resumed(r.trial, r.run_id, r.status)
    launched = 0

    def launch(trial: Trial, round_: int | None) -> TrialResult | None:
        nonlocal launched
        verdict = verdict_of[trial.key]
        if verdict.ok:
            if max_trials is not None and launched >= max_trials:
                listener.left_out(trial, f"max_trials={max_trials}")
                return None
            launched += 1
        listener.repeat(trial, round_)
        listener.launching(trial, verdict)
        result = runner.run_trial(trial, store, runs_dir, experiment_path=planned.path, notebook_path=notebook_path,
                                  machine=planned.machine, gpu_id=planned.experiment.gpu, verdict=verdict, since=looked,
                                  progress=lambda n, t=trial: listener.requests_done(t, n), log=listener.log)
        listener.finished(result)
        results.append(result)
        return result

    for trial, round_ in launches:
        launch(trial, round_)
    for chapter in dict.fromkeys(t.chapter for t in planned.trials):  # repeats: auto, until the verdict stands
        mine = [v.trial for v in planned.verdicts if v.trial.chapter == chapter and v.ok]
        # at most the extra launches max_repeats allows, however the store counts: a launch whose row it
        # refused (DuckDB refusing writes) must not make auto_launch ask for the same launch forever
        allowed = sum((t.max_repeats or t.repeats) - t.repeats for t in mine)
        while allowed > 0 and (extra := auto_launch(store, mine)) is not None:
            allowed -= 1
            listener.extra_launch(extra)
            result = launch(extra, None)
            if result is None or result.status != "ok":
                break  # out of max_trials, or a failing launch that would be asked for again and again
    return results
