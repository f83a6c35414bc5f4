"""The `qwen3lab` command: a thin shell over the library. Every command is a few lines calling one function."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from qwen3lab.errors import Qwen3LabError, SpecError, SpecErrors
from qwen3lab.store import DEFAULT_DB

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Measure vLLM launch configurations, store every request, pick the winner under SLOs.")
console = Console()
if not console.is_terminal:  # a pipe or a log file gets tables and launch commands whole, not cut at 80 columns
    console = Console(width=220)
err = Console(stderr=True)
DB = typer.Option(DEFAULT_DB, "--db", help="DuckDB file holding runs, requests and samples.")
DRY_RUN = typer.Option(False, "--dry-run", help="Print each trial's launch command and pre-flight verdict; launch nothing.")
RETRY_FAILED = typer.Option(False, "--retry-failed", help="Run again trials that failed, ran out of memory or crashed.")


def _fail(exc: Exception) -> None:
    if isinstance(exc, SpecErrors):
        err.print(f"[bold red]{len(exc.errors)} problem(s); nothing was launched:[/]")
        for e in exc.errors:
            err.print(f" - {e}", markup=False, highlight=False)
    elif isinstance(exc, SpecError):
        err.print("[bold red]1 problem; nothing was launched:[/]")
        err.print(f" - {exc}", markup=False, highlight=False)
    else:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)


@app.command()
def run(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    db: str = DB,
    only: Optional[list[str]] = typer.Option(None, "--only", help="Run only these chapters (repeatable)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where server logs and notebooks are kept."),
    dry_run: bool = DRY_RUN,
    retry_failed: bool = RETRY_FAILED,
    fresh: bool = typer.Option(False, "--fresh", help="Run every trial again, even those already finished."),
):
    """Run an experiment's trials directly (no notebooks): launch, load, store, print the table."""
    from qwen3lab import terminal
    from qwen3lab.measure import executor
    from qwen3lab.store import Store

    try:
        planned = executor.plan(experiment, only, for_written_gpu=dry_run)
        if dry_run:
            terminal.print_dry_run(planned, console)
            planned.raise_errors()
            return
        planned.raise_errors()
        with terminal.TrialProgress(console) as progress:
            results = executor.execute(planned, Store(db), runs_dir, retry_failed, fresh, listener=progress)
    except Qwen3LabError as exc:
        _fail(exc)
    try:
        console.print(terminal.results_table(results, db))
    except Qwen3LabError as exc:  # the file is held elsewhere: what was measured is in the spool, say so
        err.print(f"[yellow]cannot read the results table now ({exc}); `qwen3lab runs --db {db}` shows them later[/]",
                  highlight=False)
        raise typer.Exit(1)


@app.command()
def sweep(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    db: str = DB,
    only: Optional[list[str]] = typer.Option(None, "--only", help="Only these chapters (repeatable or comma-separated)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where executed notebooks and server logs are kept."),
    dry_run: bool = DRY_RUN,
    retry_failed: bool = RETRY_FAILED,
    param: Optional[list[str]] = typer.Option(None, "-p", "--param", help="Notebook parameter NAME=VALUE, e.g. -p num_requests=8."),
):
    """Run the workbook: each chapter's notebook executed with papermill and saved under runs/; resumes."""
    from qwen3lab import sweep as sw
    from qwen3lab import terminal

    chapters = [c for item in only or [] for c in item.split(",") if c] or None
    try:
        if dry_run:
            result = sw.dry_run(experiment, chapters)
            terminal.print_dry_run(result.planned, console)
        else:
            with terminal.SweepProgress(console) as progress:
                result = sw.sweep(experiment, db, chapters, str(runs_dir), retry_failed, sw.parse_params(param),
                                  listener=progress)
            console.print(terminal.sweep_table(result, db))
    except Qwen3LabError as exc:
        _fail(exc)
    raise typer.Exit(result.exit_code)


@app.command()
def runs(
    db: str = DB,
    experiment: Optional[str] = typer.Option(None, help="Only this experiment."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """List stored runs, newest first."""
    from qwen3lab import terminal
    from qwen3lab.store import Store

    df = Store(db).runs(experiment=experiment)
    if as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso", indent=2) + "\n")
    else:
        console.print(terminal.runs_table(df))


@app.command()
def show(run_id: str, db: str = DB):
    """Everything stored about one run: provenance, launch command, summary."""
    from qwen3lab.store import Store

    try:
        row = Store(db).run(run_id)
    except Qwen3LabError as exc:
        _fail(exc)
    keep = {k: v for k, v in row.items() if not k.endswith("_json")}
    sys.stdout.write(json.dumps(keep, indent=2, default=str) + "\n")


@app.command()
def schema(section: str = typer.Argument("engine", help="engine, endpoint, workload, slo, experiment or chapter.")):
    """Every field of an experiment file, with its description."""
    from qwen3lab import terminal

    try:
        console.print(terminal.schema_table(section))
    except Qwen3LabError as exc:
        _fail(exc)


@app.command()
def dashboard(
    db: str = DB,
    port: int = typer.Option(8501, "--port", help="Port of the dashboard."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
):
    """Open the dashboard: compare runs, pick the winner under SLOs, export its launch command."""
    from qwen3lab.dashboard_launch import run_dashboard

    try:
        raise typer.Exit(run_dashboard(db, host=host, port=port))
    except Qwen3LabError as exc:
        _fail(exc)


@app.command()
def plan(
    gpu: str = typer.Option(..., "--gpu", help="Catalogue GPU: a100-80g, a100-40g, rtx4090, l40s, h100-sxm, h100-pcie, h200, ..."),
    model: str = typer.Option("qwen3-14b", "--model", help="qwen3-14b (its BF16, FP8 and AWQ checkpoints), a builtin:NAME or a folder."),
    context: int = typer.Option(2048, help="Tokens of context per sequence for the decode ceilings."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Before launching: what fits on a GPU (quantization x KV dtype x max_model_len), KV capacity, ceilings."""
    from qwen3lab import terminal
    from qwen3lab.hardware import planner

    try:
        rows = planner.plan_table(gpu, model, context=context)
    except Qwen3LabError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        console.print(terminal.plan_table(rows))


@app.command()
def calibrate(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    context: int = typer.Option(1024, help="Cached tokens per sequence in the decode step."),
    batch_sizes: str = typer.Option("1,2,4,8,16,32,64,128,256,512", help="Comma-separated decode batch sizes."),
    out: Optional[Path] = typer.Option(None, help="Where to write the profile (default: this machine's profile folder)."),
):
    """Measure this GPU (copy bandwidth, BF16 matrix rate, a Qwen3-14B decode step) against the roofline."""
    from qwen3lab.hardware import calibrate as cal

    args = ["--context", str(context), "--batch-sizes", batch_sizes] + (["--json"] if as_json else [])
    try:
        raise typer.Exit(cal.main(args + (["--out", str(out)] if out else [])))
    except Qwen3LabError as exc:
        _fail(exc)


@app.command("import")
def import_(
    files: list[Path] = typer.Argument(..., help="vllm bench serve --save-result JSON or GuideLLM benchmark JSON."),
    db: str = DB,
    experiment: str = typer.Option("imported", help="Experiment name the imported runs are filed under."),
):
    """Import results of `vllm bench serve` and GuideLLM, to compare them beside qwen3lab's own runs."""
    from qwen3lab.analysis.importers import import_files
    from qwen3lab.store import Store

    try:
        ids = import_files(Store(db), files, experiment=experiment)
    except Qwen3LabError as exc:
        _fail(exc)
    console.print(f"{len(ids)} run(s) in {db}: " + ", ".join(ids))


@app.command()
def probe(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")):
    """This machine: CPU and NUMA topology, GPUs through NVML (or why there are none)."""
    from qwen3lab.hardware import catalogue as hardware
    from qwen3lab import terminal

    found = hardware.probe()
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        console.print(terminal.probe_table(found))


if __name__ == "__main__":  # python -m qwen3lab.cli
    app()

