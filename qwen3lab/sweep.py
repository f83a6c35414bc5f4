"""A sweep: every chapter of an experiment executed as its workbook notebook with papermill, saved under runs/.

    qwen3lab sweep experiments/cpu-tiny.yaml [--only CHAPTER ...] [--db PATH] [--dry-run] [-p num_requests=8]

One papermill execution per chapter (plus 00_environment first and 99_report last). Each executed notebook is
saved as runs/<experiment>/<sweep-stamp>/<notebook>.ipynb, and that path is stored with every run it produced.
Resume is the notebooks' own: a trial that already has a finished run is not run again (a failed one only with
--retry-failed), so a sweep that was stopped picks up where it was.

Stopping (Ctrl-C or SIGTERM): nbclient interrupts the kernel, so the trial in flight ends as `interrupted` and
its vLLM server is stopped before the kernel shuts down; the sweep then stops and exits 130.
"""
from __future__ import annotations

import difflib
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab import workbook
from qwen3lab.errors import Qwen3LabError, SpecError, SpecErrors

# How long a kernel that was asked to stop may take to finish its trial (stop vLLM, write the run row).
KERNEL_SHUTDOWN_WAIT_S = 90.0
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def notebooks_dir() -> Path:
    """notebooks/ of the repository this qwen3lab is imported from."""
    return PACKAGE_ROOT / "notebooks"


@dataclass
class Execution:
    """One papermill execution: a notebook, the chapter it runs, where its output goes, its parameters."""

    notebook: str  # stem, e.g. 30_block_size
    chapter: str | None
    input_path: Path
    output_path: Path
    parameters: dict[str, Any]
    trials: list = field(default_factory=list)
    status: str = "pending"  # pending, ok, failed, interrupted
    error: str | None = None
    seconds: float | None = None


@dataclass
class SweepResult:
    experiment: str
    executions: list[Execution]
    dry_run: bool = False
    verdicts: list = field(default_factory=list)
    stopped: bool = False

    @property
    def exit_code(self) -> int:
        if self.dry_run:
            return 2 if any(v.errors for v in self.verdicts) else 0
        if self.stopped or any(e.status == "interrupted" for e in self.executions):
            return 130
        return 1 if any(e.status == "failed" for e in self.executions) else 0


def plan(experiment_path: str | os.PathLike, db: str, only: list[str] | None = None, runs_dir: str = "runs",
         params: dict[str, Any] | None = None, stamp: str | None = None,
         with_environment: bool = True, with_report: bool = True) -> tuple[xp.Experiment, list[Execution]]:
    """The executions of a sweep, in workbook order, without running anything."""
    exp = xp.load(experiment_path)
    chapters = exp.all_chapters()
    if only:
        xp.expand(exp, only)  # names unknown chapters, with the allowed ones
    stamp = stamp or datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(runs_dir).resolve() / exp.name / stamp
    base = {"experiment": str(Path(experiment_path).resolve()), "db": str(Path(db).resolve())}
    extra = dict(params or {})
    nb_dir = notebooks_dir()
    execs: list[Execution] = []

    def add(stem: str, chapter: str | None, parameters: dict[str, Any]) -> None:
        src = nb_dir / f"{stem}.ipynb"
        if not src.is_file():
            raise Qwen3LabError(f"notebook {src} does not exist: the chapter {chapter!r} needs it. Fix: name an "
                                "existing notebook with `notebook:` in the chapter, or add the notebook")
        out = out_dir / f"{stem}.ipynb"
        execs.append(Execution(stem, chapter, src, out, parameters | {"notebook_path": str(out)}
                               if chapter else parameters))

    if with_environment:
        add("00_environment", None, {"experiment": base["experiment"]})
    order = list(workbook.NOTEBOOKS)
    picked = [(c, ch) for c, ch in chapters.items() if not only or c in only]
    picked.sort(key=lambda item: order.index(workbook.notebook_for(*item)) if workbook.notebook_for(*item) in order
                else len(order))
    for name, chapter in picked:
        stem = workbook.notebook_for(name, chapter)
        if stem is None:
            raise Qwen3LabError(f"chapter {name!r} of {experiment_path} has no notebook. Fix: add "
                                f"`notebook: NN_name.ipynb` to it (known: {', '.join(workbook.CHAPTER_NOTEBOOK)})")
        add(stem, name, base | {"chapter": name, "runs_dir": str(Path(runs_dir).resolve())} | extra)
    if with_report:
        add("99_report", None, {"experiment": base["experiment"], "db": base["db"]})
    _check_params(extra, [ex for ex in execs if ex.chapter])
    return exp, execs


# What each `-p` parameter of the chapter notebooks takes. papermill infers no type from a `None` default, so
# without this a `-p num_requests=lots` would reach the kernel and fail there, after servers had started.
NOTEBOOK_PARAMS: dict[str, tuple[tuple[type, ...], str]] = {
    "num_requests": ((int, type(None)), "a whole number >= 1, or null for the experiment's own"),
    "warmup_requests": ((int, type(None)), "a whole number >= 0, or null"),
    "max_trials": ((int, type(None)), "a whole number >= 1, or null for all"),
    "retry_failed": ((bool,), "true or false"),
    "duration_s": ((int, float, type(None)), "seconds (a number > 0), or null"),
    "window_s": ((int, float), "seconds (a number > 0)"),
}


def _check_params(params: dict[str, Any], execs: list[Execution]) -> None:
    """Every `-p` parameter names a parameter of the notebooks it goes to, with a value of its type."""
    import papermill as pm

    errors = []
    known = set().union(*(pm.inspect_notebook(str(ex.input_path)) for ex in execs)) if execs and params else set()
    for name, value in params.items():
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            errors.append(SpecError(f"-p {name}", value, "parameters of the chapter notebooks: " + ", ".join(sorted(known)),
                                    f"did you mean {close[0]!r}?" if close else "remove it"))
            continue
        types, allowed = NOTEBOOK_PARAMS.get(name, ((object,), "any value"))
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if not wrong and isinstance(value, (int, float)) and not isinstance(value, bool):
            wrong = value < (0 if name == "warmup_requests" else 1e-9 if float in types else 1)
        if wrong:
            errors.append(SpecError(f"-p {name}", value, allowed, f"write e.g. -p {name}="
                                    f"{'true' if bool in types else 10 if int in types else 'PATH'}"))
    if errors:
        raise SpecErrors(errors)


def dry_run(experiment_path: str | os.PathLike, only: list[str] | None = None, console=None) -> SweepResult:
    """Print every trial's exact launch command and pre-flight verdict for the experiment's GPU; launch nothing.

    Trials that pre-flight rejects are printed with the error (the exit code is then 2); trials tagged
    `expect: error` that are rejected are the expected result (shown as `rejected`, exit code unaffected).
    """
    from rich.console import Console

    from qwen3lab import report

    console = console or Console()
    exp = xp.load(experiment_path)
    trials = xp.expand(exp, only)
    machine = preflight.Machine.for_gpu(exp.gpu) if exp.gpu else preflight.Machine.local()
    verdicts = preflight.check_all(trials, machine, exp.gpu)
    console.print(report.dry_run_table(verdicts, machine))
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.label] = counts.get(v.label, 0) + 1
    console.print(f"{len(verdicts)} trials: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    errors = [e for v in verdicts for e in v.errors]
    if errors:
        console.print(f"[bold red]{len(errors)} pre-flight error(s)[/]: a sweep of this file would launch nothing "
                      "until they are fixed.")
    return SweepResult(exp.name, [], dry_run=True, verdicts=verdicts)


def _check_before_launch(exp: xp.Experiment, path, only) -> None:
    """All pre-flight errors of the whole sweep, before the first notebook starts."""
    machine = preflight.Machine.local()
    trials = xp.expand(exp, only)
    trials = preflight.skip_if_mismatched(trials, exp.gpu, machine)
    errors = [e for v in preflight.check_all(trials, machine, exp.gpu) for e in v.errors]
    if errors:
        raise SpecErrors(errors)


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Float

    class PatientKernelManager(AsyncKernelManager):
        """Gives an interrupted kernel time to stop its vLLM server and write its run row."""

        shutdown_wait_time = Float(KERNEL_SHUTDOWN_WAIT_S, config=True)

    return PatientKernelManager


class _ConsoleWriter:
    """The kernel's stdout (the workbook's per-trial lines), printed above the progress bar, prefixed."""

    def __init__(self, console, prefix: str):
        self.console, self.prefix, self.buffer = console, prefix, ""

    def write(self, text: str) -> None:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if line.strip():
                self.console.print(f"[dim]{self.prefix}[/] {line}", markup=True, highlight=False, soft_wrap=True)

    def flush(self) -> None:
        pass


def _interrupted(exc: BaseException) -> bool:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, PapermillExecutionError):
        return exc.ename == "KeyboardInterrupt"
    return type(exc).__name__ in ("DeadKernelError",)


def _raise_interrupt(signum, frame):  # SIGTERM between notebooks: stop like Ctrl-C
    raise KeyboardInterrupt


def sweep(experiment_path: str | os.PathLike, db: str = "qwen3lab.duckdb", only: list[str] | None = None,
          runs_dir: str = "runs", retry_failed: bool = False, params: dict[str, Any] | None = None,
          console=None, kernel_name: str = "python3", with_environment: bool = True,
          with_report: bool = True, execution_timeout: float | None = None) -> SweepResult:
    """Execute the experiment's chapters as notebooks, in order; a failed chapter does not stop the others."""
    import papermill as pm
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    params = dict(params or {})
    if retry_failed:
        params["retry_failed"] = True
    exp, execs = plan(experiment_path, db, only, runs_dir, params, with_environment=with_environment,
                      with_report=with_report)
    _check_before_launch(exp, experiment_path, only)
    # The kernel imports the same qwen3lab as this process, whatever is installed, and works from the
    # repository root (relative paths of the experiment, such as engine.python: .venv/bin/python).
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *([env_path] if env_path else [])])
    result = SweepResult(exp.name, execs)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as bar:
            overall = bar.add_task(f"[bold]sweep {exp.name}", total=len(execs))
            for ex in execs:
                writer = _ConsoleWriter(bar.console, ex.notebook)
                bar.update(overall, description=f"[bold]sweep {exp.name}[/]: {ex.notebook}")
                ex.output_path.parent.mkdir(parents=True, exist_ok=True)
                t0 = time.monotonic()
                signal.signal(signal.SIGTERM, _raise_interrupt)
                try:
                    pm.execute_notebook(str(ex.input_path), str(ex.output_path), parameters=ex.parameters,
                                        kernel_name=kernel_name, cwd=str(PACKAGE_ROOT), stdout_file=writer,
                                        progress_bar=False, request_save_on_cell_execute=True,
                                        execution_timeout=execution_timeout,
                                        kernel_manager_class=_kernel_manager_class())
                    ex.status = "ok"
                except BaseException as exc:  # noqa: BLE001 - every outcome is reported; interrupts stop the sweep
                    ex.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                    if _interrupted(exc):
                        ex.status = "interrupted"
                    else:
                        ex.status = "failed"
                finally:
                    ex.seconds = time.monotonic() - t0
                    signal.signal(signal.SIGTERM, _raise_interrupt)
                colour = {"ok": "green", "interrupted": "yellow"}.get(ex.status, "red")
                bar.console.print(f"[{colour}]{ex.status:>11}[/] {ex.notebook} ({ex.seconds:.0f} s) -> "
                                  f"{ex.output_path}" + (f"\n            {ex.error}" if ex.error else ""),
                                  highlight=False)
                bar.advance(overall)
                if ex.status == "interrupted":
                    bar.console.print("[yellow]sweep stopped; run the same command again to resume[/]")
                    break
    except KeyboardInterrupt:  # between two notebooks: nothing is running, nothing is lost
        result.stopped = True
        console.print("[yellow]sweep stopped; run the same command again to resume[/]")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ["PYTHONPATH"] = env_path
        if not env_path:
            os.environ.pop("PYTHONPATH", None)
    return result


def summary_table(result: SweepResult, db: str):
    """One row per executed notebook: status, seconds, and the runs it stored, by status."""
    from rich.table import Table

    from qwen3lab.store import Store

    runs = Store(db).runs(experiment=result.experiment)
    t = Table(title=f"sweep {result.experiment}")
    for col in ("notebook", "status", "seconds", "runs stored (this notebook)", "output"):
        t.add_column(col, overflow="fold")
    for ex in result.executions:
        mine = runs[runs.notebook_path == str(ex.output_path)] if not runs.empty else runs
        counts = mine.status.value_counts().to_dict() if not mine.empty else {}
        t.add_row(ex.notebook, ex.status, f"{ex.seconds:.0f}" if ex.seconds is not None else "-",
                  ", ".join(f"{n} {k}" for k, n in counts.items()) or "-", str(ex.output_path))
    return t


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """`-p name=value` pairs; values are read as YAML (4 -> int, true -> bool, null -> None)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise Qwen3LabError(f"-p {item!r}: write name=value, e.g. -p num_requests=8")
        out[name.strip()] = yaml.safe_load(value)
    return out
