"""What every `qwen3lab` command module shares: the consoles, the common options, and how a command fails,
prints its result and names an experiment."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from qwen3lab.errors import Qwen3LabError, SpecError, SpecErrors
from qwen3lab.store import DEFAULT_DB

console = Console()
if not console.is_terminal:  # a pipe or a log file gets tables and launch commands whole, not cut at 80 columns
    console = Console(width=220)
err = Console(stderr=True)
DB = typer.Option(DEFAULT_DB, "--db", help="DuckDB file holding runs, requests and samples.")
DRY_RUN = typer.Option(False, "--dry-run", help="Print each trial's launch command and pre-flight verdict; launch nothing.")
RETRY_FAILED = typer.Option(False, "--retry-failed", help="Run again trials that failed, ran out of memory or crashed.")
EXECUTOR = typer.Option("local", "--executor", help="local: one trial at a time here; ray: each trial a Ray task on a cluster.")
ADDRESS = typer.Option(None, "--address", help="With --executor ray: auto (a cluster started with ray start), "
                       "ray://HOST:10001 or HOST:PORT; unset = a one-node Ray here.")


def fail(exc: Exception) -> None:
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


def check_executor(kind: str, address: str | None) -> None:
    if kind not in ("local", "ray"):
        fail(Qwen3LabError(f"--executor {kind!r} is not one of local, ray"))
    if address and kind != "ray":
        fail(Qwen3LabError("--address needs --executor ray"))


def print_result(data, as_json: bool, table) -> None:
    """A command's result: JSON on stdout, or the table `table()` builds."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        console.print(table())


def experiment_name(arg: str) -> str:
    """An experiment's stored name, from the name itself or from its YAML file."""
    if arg.endswith((".yaml", ".yml")) or Path(arg).is_file():
        from qwen3lab.experiment import files as xp

        return xp.load(arg).name
    return arg

