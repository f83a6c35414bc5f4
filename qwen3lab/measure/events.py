"""What every long execution tells its caller: one Listener for run, capacity, search and soak.

Executions call these methods and import no presentation; the base class turns each event into one plain line
through `log` (a notebook's printed lines), and terminal.Progress draws the same events as bars. Every event
that concerns a trial names it, so executors that run several at once (Ray) are told apart per trial.

    run       started, recovered, resumed, left_out, launching, requests_done, extra_launch, finished
    capacity  started, resumed, launching, requests_done, point (each load point), finished (the search)
    search    started, launching, requests_done, finished (each suggestion, trial None when pruned unbuilt)
    soak      started, launching (each server start), requests_done, point (each window), finished
    sweep     started, launching (each notebook, named), point (each line its kernel printed), finished
"""
from __future__ import annotations

from collections.abc import Callable

from qwen3lab.experiment.spec import Trial


def label(trial: Trial | str | None) -> str:
    """CHAPTER/NAME of a trial; a unit that is no trial (a sweep's notebook) is named by its caller."""
    if isinstance(trial, str):
        return trial
    return f"{trial.chapter}/{trial.name}" if trial is not None else "-"


class Listener:
    """The events; each default writes one line through `log` (nothing, without one)."""

    def __init__(self, log: Callable[[str], None] | None = None):
        self.log = log or (lambda text: None)

    def started(self, title: str, count: int | None) -> None:
        """Before the first unit: `count` launches, configurations or suggestions (None: not known)."""

    def recovered(self, run: dict) -> None:
        """A run another qwen3lab left `running` when it stopped (killed, DuckDB refusing its last writes)."""
        self.log(f"! recovered run {run['run_id']}: its qwen3lab stopped without finishing it; "
                 f"{run['requests_recovered']} measured requests stored from its spool, status {run['status']}")

    def resumed(self, trial: Trial, text: str) -> None:
        """Stored already; `text` says what stands for it."""
        self.log(f"= {label(trial)}: {text}")

    def left_out(self, trial: Trial, why: str) -> None:
        """A launch that was planned but is not made (a limit)."""
        self.log(f"- {label(trial)}: left out ({why})")

    def extra_launch(self, trial: Trial, why: str) -> None:
        """One more launch than planned (repeats: auto); its `launching` follows."""
        self.log(f"+ {label(trial)}: {why}")

    def launching(self, trial: Trial, text: str, total: int | None = None) -> None:
        """A server (or a task) starts for `trial`; `text` says what, `total` the requests it will measure."""
        self.log(f"> {label(trial)}: {text}")

    def requests_done(self, trial: Trial, count: int) -> None:
        """`count` more measured requests of `trial`'s running launch finished."""

    def point(self, trial: Trial, text: str) -> None:
        """A step within one launch ended: a capacity load point, a soak window."""
        self.log(f"    {label(trial)} {text}")

    def finished(self, trial: Trial | None, status: str, text: str) -> None:
        """A unit ended (a launch, a capacity search, a suggestion, a soak) with `status`; `text` says more."""
        self.log(f"{status:>9} {label(trial)}" + (f": {text}" if text else ""))
