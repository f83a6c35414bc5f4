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
from qwen3lab import campaign, workbook
from qwen3lab.errors import Qwen3LabError, SpecError, SpecErrors
from qwen3lab.measure import executor
from qwen3lab.measure.events import Listener
from qwen3lab.store import Store

# How long a kernel that was asked to stop may take to finish its trial (stop vLLM, write the run row).
KERNEL_SHUTDOWN_WAIT_S = 90.0
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
STOPPED = "sweep stopped; run the same command again to resume"


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
    planned: executor.Plan | None = None  # a dry run's plan

    @property
    def exit_code(self) -> int:
        if self.dry_run:
            return 2 if any(v.errors for v in self.verdicts) else 0
        if self.stopped or any(e.status == "interrupted" for e in self.executions):
            return 130
        return 1 if any(e.status == "failed" for e in self.executions) else 0


def starting_vs_measuring(runs) -> tuple[float, float] | None:
    """Seconds spent starting servers (process start to /health) and measuring load, over stored run rows;
    None when no run stored a start. Each server counts once: every load point of a capacity search (and every
    window of a soak) stores the start of the one server that served it, and that server's log. A restarted
    server keeps the log but not the start time, so (log, start) names one server."""
    if runs.empty or "start_s" not in runs or runs.start_s.isna().all():
        return None
    started = runs.dropna(subset=["start_s"])
    log = started.log_path.fillna("")
    servers = started.assign(server=log.where(log != "", started.run_id)).drop_duplicates(["server", "start_s"])
    return float(servers.start_s.sum()), float(runs.duration.sum())


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
        # Two chapters on one notebook (the H200 emulation chapter reads as 20_quantization): one file each.
        taken = any(e.output_path.stem == stem for e in execs)
        out = out_dir / (f"{stem}-{chapter}.ipynb" if taken else f"{stem}.ipynb")
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


def dry_run(experiment_path: str | os.PathLike, only: list[str] | None = None) -> SweepResult:
    """Every trial judged for the experiment's GPU, nothing launched (the CLI prints each launch command and
    verdict). Trials that pre-flight rejects make the exit code 2; trials tagged `expect: error` that are
    rejected are the expected result (shown as `rejected`, exit code unaffected)."""
    planned = executor.plan(experiment_path, only, for_written_gpu=True)
    return SweepResult(planned.experiment.name, [], dry_run=True, verdicts=planned.verdicts, planned=planned)


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Float

    class PatientKernelManager(AsyncKernelManager):
        """Gives an interrupted kernel time to stop its vLLM server and write its run row."""

        shutdown_wait_time = Float(KERNEL_SHUTDOWN_WAIT_S, config=True)

    return PatientKernelManager


class _KernelLines:
    """The kernel's stdout, handed to the listener line by line."""

    def __init__(self, listener: Listener, ex: Execution):
        self.listener, self.ex, self.buffer = listener, ex, ""

    def write(self, text: str) -> None:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if line.strip():
                self.listener.point(self.ex.notebook, line)

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
          listener: Listener | None = None, kernel_name: str = "python3", with_environment: bool = True,
          with_report: bool = True, execution_timeout: float | None = None) -> SweepResult:
    """Execute the experiment's chapters as notebooks, in order; a failed chapter does not stop the others.
    The listener hears of each notebook as a unit (launching, its kernel's lines as points, finished)."""
    import papermill as pm

    listener = listener or Listener()
    params = dict(params or {})
    if retry_failed:
        params["retry_failed"] = True
    exp, execs = plan(experiment_path, db, only, runs_dir, params, with_environment=with_environment,
                      with_report=with_report)
    executor.plan(exp, only).raise_errors()  # every pre-flight error of the sweep, before the first notebook
    # The kernel imports the same qwen3lab as this process, whatever is installed, and works from the
    # repository root (relative paths of the experiment, such as engine.python: .venv/bin/python).
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *([env_path] if env_path else [])])
    result = SweepResult(exp.name, execs)
    # the sweep is one campaign; its kernels inherit its id (QWEN3LAB_CAMPAIGN), so their runs name it
    with campaign.opened(Store(db), "sweep", experiment_path, params,
                         notebooks_dir=execs[0].output_path.parent if execs else None) as camp:
        try:
            listener.started(f"sweep {exp.name}", len(execs))
            for ex in execs:
                listener.launching(ex.notebook, "executing")
                ex.output_path.parent.mkdir(parents=True, exist_ok=True)
                t0 = time.monotonic()
                signal.signal(signal.SIGTERM, _raise_interrupt)
                try:
                    pm.execute_notebook(str(ex.input_path), str(ex.output_path), parameters=ex.parameters,
                                        kernel_name=kernel_name, cwd=str(PACKAGE_ROOT), stdout_file=_KernelLines(listener, ex),
                                        progress_bar=False, request_save_on_cell_execute=True,
                                        execution_timeout=execution_timeout,
                                        kernel_manager_class=_kernel_manager_class())
                    ex.status = "ok"
                except BaseException as exc:  # noqa: BLE001 - every outcome is reported; interrupts stop the sweep
                    ex.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                    ex.status = "interrupted" if _interrupted(exc) else "failed"
                finally:
                    ex.seconds = time.monotonic() - t0
                    signal.signal(signal.SIGTERM, _raise_interrupt)
                listener.finished(ex.notebook, ex.status, f"({ex.seconds:.0f} s) -> {ex.output_path}"
                                  + (f"; {ex.error}" if ex.error else ""))
                camp.notebooks.append({"notebook": ex.notebook, "chapter": ex.chapter, "path": str(ex.output_path),
                                       "status": ex.status, "seconds": round(ex.seconds, 1)})
                if ex.status == "interrupted":
                    listener.log(STOPPED)
                    break
        except KeyboardInterrupt:  # between two notebooks: nothing is running, nothing is lost
            result.stopped = True
            listener.log(STOPPED)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ["PYTHONPATH"] = env_path
            if not env_path:
                os.environ.pop("PYTHONPATH", None)
        camp.status = {0: "ok", 130: "interrupted"}.get(result.exit_code, "failed")
        camp.reason = "; ".join(f"{e.notebook}: {e.error}" for e in execs if e.error) or None
    return result


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
