"""The one scheduler of launches: which (trial, round) runs next, for every executor.

    sched = Schedule(planned, store, executor.auto_launch, retry_failed, fresh, max_trials, listener)
    while (launch := sched.next()) is not None:   # the local executor: one launch at a time
        sched.finished(launch, runner.run_trial(launch.trial, ...))

What a launch is for is `kind`: a run of `repeats` (RUNS, the default), or a capacity search of
`capacity.launches` (capacity.SEARCHES): how many a trial wants and how many it still needs.

The Ray executor takes every launch next() gives, runs them at once, and tells each as it ends; next() gives
None while planned launches are in flight and none is left to start, then the extra ones of `repeats: auto`.
Executors only place and run a launch; what to launch, in which order and how often is decided here:
- resume: runs stored earlier stand for their trial (Store.recover first finishes those a killed qwen3lab
  left `running`); a trial with `repeats: K` and j ok launches needs K - j more;
- interleaving: round by round within each chapter (A B C A B C), so the machine's drift spreads evenly;
- `repeats: auto`: once the planned launches ended, `more(store, trials)` (executor.auto_launch) names one
  more launch of a chapter's leading pair while they cannot be told apart, up to their max_repeats;
- limits: at most `max_trials` servers are started; launches left out by it are told, not stored.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from qwen3lab.analysis import selection
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import Trial
from qwen3lab.measure.events import Listener
from qwen3lab.measure.runner import TrialResult
from qwen3lab.store import Store
from qwen3lab.store import now as store_now


@dataclass(frozen=True)
class Launch:
    """One server start of one trial: its `round` (0-based) of `of` launches, or None for an extra of auto."""

    trial: Trial
    verdict: preflight.Verdict
    round: int | None = 0
    of: int = 1

    @property
    def label(self) -> str:
        """' #2/3' for the second of three launches ('' for one launch, ' +1' for an extra one of auto)."""
        if self.round is None:
            return " +1"
        return f" #{self.round + 1}/{self.of}" if self.of > 1 else ""


@dataclass(frozen=True)
class Kind:
    """What a launch is for: `noun` names what one stores; `wanted(trial)` launches a trial asks for;
    `left(store, trial, retry_failed, runnable_here, fresh)` gives (launches it still needs, the stored
    (id, status) that stands for it)."""

    noun: str
    wanted: Callable[[Trial], int]
    left: Callable[..., tuple[int, tuple[str, str] | None]]


def recover(store: Store, listener: Listener) -> None:
    """What every executor does before resume looks: `running` rows whose owner is gone (a killed qwen3lab, or
    a Ray worker that went with its killed driver) get their spool ingested and are finished as it says, else
    marked `interrupted`, so resume runs them again (Store.recover)."""
    for run in store.recover():
        listener.recovered(run)


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


RUNS = Kind("run", lambda trial: trial.repeats, launches_left)


def interleave(trials: list[Trial], needed: list[int], wanted: Callable[[Trial], int] = RUNS.wanted,
               ) -> list[tuple[Trial, int]]:
    """(trial, round) launches, round by round within each chapter: A B C A B C, not A A B B C C.

    A trial with launches already stored resumes at its next round, so a resumed run first catches up the
    trials that are behind, and slow drift of the machine spreads evenly over the trials.
    """
    chapter_order = {c: i for i, c in enumerate(dict.fromkeys(t.chapter for t in trials))}
    launches = []
    for pos, (t, n) in enumerate(zip(trials, needed)):
        first = max(wanted(t) - n, 0)
        launches += [((chapter_order[t.chapter], first + i, pos), t) for i in range(n)]
    return [(t, key[1]) for key, t in sorted(launches, key=lambda x: x[0])]


class Schedule:
    """The launches of one plan (executor.Plan), in order, with resume, interleaving, repeats: auto and limits.
    Built, it has recovered what a killed qwen3lab left, told the listener what resumes, and holds `results`:
    the resumed trials' standing runs, then each finished launch's as it is told."""

    def __init__(self, planned, store: Store, more: Callable[[Store, list[Trial]], Trial | None],
                 retry_failed: bool = False, fresh: bool = False, max_trials: int | None = None,
                 listener: Listener | None = None, kind: Kind = RUNS):
        self.store, self.more, self.max_trials = store, more, max_trials
        self.listener = listener or Listener()
        recover(store, self.listener)
        self.looked = store_now()  # a launch another qwen3lab begins after this is one of ours: not run twice
        self.results: list[TrialResult] = []
        self.verdicts = {v.trial.key: v for v in planned.verdicts}
        needed = []
        for verdict in planned.verdicts:
            n, done = kind.left(store, verdict.trial, retry_failed, runnable_here=verdict.ok, fresh=fresh)
            needed.append(n)
            if n == 0 and done:
                self.results.append(TrialResult(verdict.trial, done[0], done[1], "already measured (resumed)"))
        self.queue = deque(Launch(t, self.verdicts[t.key], r, kind.wanted(t))
                           for t, r in interleave(planned.trials, needed, kind.wanted))
        # repeats: auto, chapter by chapter: at most the extra launches max_repeats allows, however the store
        # counts (a launch whose row DuckDB refused must not be asked for again and again)
        self.auto: deque[tuple[list[Trial], int]] = deque()
        for chapter in dict.fromkeys(t.chapter for t in planned.trials):
            mine = [v.trial for v in planned.verdicts if v.trial.chapter == chapter and v.ok]
            allowed = sum((t.max_repeats or t.repeats) - t.repeats for t in mine)
            if allowed > 0:
                self.auto.append((mine, allowed))
        self.started = self.in_flight = 0
        self.listener.started(planned.experiment.name, len(self.queue) + len(self.results))
        for r in self.results:
            self.listener.resumed(r.trial, f"{r.status} earlier ({kind.noun} {r.run_id}), not run again")

    def next(self) -> Launch | None:
        """The next launch to start now; None when none is left now (and, with none in flight, at all)."""
        while self.queue:
            launch = self.queue.popleft()
            if self._allowed(launch):
                return launch
        if self.in_flight:
            return None  # repeats: auto reads the ended launches only
        while self.auto:
            mine, allowed = self.auto[0]
            extra = self.more(self.store, mine) if allowed > 0 else None
            if extra is None:
                self.auto.popleft()  # the chapter's verdict stands, or its extra launches are spent
                continue
            self.auto[0] = (mine, allowed - 1)
            self.listener.extra_launch(extra, f"the leading two cannot be told apart yet; one more launch "
                                       f"(auto, at most {extra.max_repeats})")
            launch = Launch(extra, self.verdicts[extra.key], None)
            if self._allowed(launch):
                return launch
            self.auto.popleft()  # out of max_trials
        return None

    def _allowed(self, launch: Launch) -> bool:
        """Counted against max_trials when it starts a server (a skip only stores its row)."""
        if launch.verdict.ok:
            if self.max_trials is not None and self.started >= self.max_trials:
                self.listener.left_out(launch.trial, f"max_trials={self.max_trials}")
                return False
            self.started += 1
        self.in_flight += 1
        return True

    def finished(self, launch: Launch, result: TrialResult) -> None:
        """A launch ended with `result` (stored by its executor)."""
        self.in_flight -= 1
        self.results.append(result)
        if launch.round is None and result.status != "ok" and self.auto \
                and self.auto[0][0][0].chapter == launch.trial.chapter:
            self.auto.popleft()  # a failing extra launch would be asked for again and again
