"""The campaign commands of `qwen3lab`: campaigns, history, regress, registered on cli.app by `register`, which
also hands over cli's shared helpers (the error exit, JSON-or-table output, experiment names), so this module
does not import cli (no cycle). Each is a few lines over qwen3lab/campaign.py, analysis/history.py and
analysis/regress.py, and a table.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from qwen3lab.errors import Qwen3LabError
from qwen3lab.store import DEFAULT_DB

DB = typer.Option(DEFAULT_DB, "--db", help="DuckDB file holding runs and campaigns.")
METRIC = typer.Option(None, "--metric", help="goodput, output_throughput or p95_ttft_ms (repeatable; default all).")
SLO = typer.Option(None, "--slo", help="An SLO NAME=VALUE over the stored ones (goodput counts requests meeting "
                   "them), repeatable: ttft_p95_ms=500.")
UNRELIABLE = typer.Option(False, "--include-unreliable", help="Count launches marked unreliable (see `qwen3lab runs`).")


_fail = _print = _experiment_name = None  # cli's helpers, set by register


def _num(v, fmt: str = "{:.4g}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _pct(v) -> str:
    return _num(v, "{:+.1f}%")


def campaigns(db: str = DB, experiment: Optional[str] = typer.Option(None, "--experiment", help="Only this experiment."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")):
    """List campaigns (each run, sweep or capacity invocation): dates, status, builds met, runs, notebooks kept."""
    from qwen3lab import campaign
    from qwen3lab.store import Store

    df = campaign.listing(Store(db), experiment)
    if as_json:
        _print(json.loads(df.to_json(orient="records", date_format="iso")) if not df.empty else [], True, None)
        return
    t = Table(title=f"{len(df)} campaign(s) in {db}", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("campaign", "command", "experiment", "started", "ended", "status", "runs ok/all", "builds", "commit",
                 "notebooks"):
        t.add_column(name, overflow="fold")
    for r in df.to_dict("records") if not df.empty else []:
        t.add_row(r["campaign_id"], r["command"], str(r["experiment"]), str(r["started_at"])[:19],
                  str(r["ended_at"])[:19] if r["ended_at"] is not None else "-", str(r["status"]) +
                  (f": {r['reason']}" if isinstance(r["reason"], str) else ""), f"{r['ok']}/{r['runs']}", r["builds"],
                  str(r["qwen3lab_commit"])[:12], "\n".join(r["notebooks"]) or (r["notebooks_dir"] or "-"))
    _print(None, False, lambda: t)


def history_(experiment: str = typer.Argument(..., help="Experiment name (as stored) or its YAML file."),
             trial: Optional[str] = typer.Option(None, "--trial", help="Only this trial: CHAPTER/NAME or NAME."),
             metric: Optional[list[str]] = METRIC, slo: Optional[list[str]] = SLO, db: str = DB,
             include_unreliable: bool = UNRELIABLE,
             as_json: bool = typer.Option(False, "--json", help="Print one record per trial x metric x campaign.")):
    """Each trial's figures over campaigns, with each campaign's launch-to-launch interval; a change beyond noise
    from the campaign before is marked, with what changed between them (build, driver, config, commit)."""
    from qwen3lab.analysis import history
    from qwen3lab.store import Store

    try:
        df = history.history(Store(db), _experiment_name(experiment), trial, metric, slo, include_unreliable)
    except Qwen3LabError as exc:
        _fail(exc)
    records = json.loads(df.to_json(orient="records", date_format="iso"))

    def table() -> Table:
        t = Table(title=f"History of {_experiment_name(experiment)}", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("trial", "metric", "campaign", "started", "build", "n", "value (95% CI)", "change", "verdict",
                     "what changed"):
            t.add_column(name, overflow="fold")
        for r in records:
            mark = "[bold red]" if r["verdict"] == "worse" else "[bold green]" if r["verdict"] == "better" else ""
            t.add_row(r["trial"], r["metric"], r["campaign_id"], str(r["started_at"])[:16], r["build"], str(r["launches"]),
                      f"{_num(r['value'])} ({_num(r['value_low'])} .. {_num(r['value_high'])})",
                      _pct(r["change_pct"]) if r["previous"] else "",
                      f"{mark}{r['verdict']}" if r["previous"] else "first", r["changed"] if r["marked"] else "")
        return t

    _print(records, as_json, table)


def regress(base: str = typer.Argument(..., help="BASE: a campaign id (or a prefix of one), or build:VERSION."),
            new: str = typer.Argument(..., help="NEW: the same, for the side that must not be worse."),
            fail_on: str = typer.Option("worse", "--fail-on", help="worse: exit 1 when a trial's metric is worse "
                                        "beyond noise; never: always exit 0 (report only)."),
            metric: Optional[list[str]] = METRIC, slo: Optional[list[str]] = SLO,
            experiment: Optional[str] = typer.Option(None, "--experiment", help="Only this experiment's campaigns."),
            db: str = DB, include_unreliable: bool = UNRELIABLE,
            as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
            markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the report as Markdown here.")):
    """NEW against BASE trial by trial (two campaigns or two builds), with the verdict rules of `winner`; exits 1 on
    a regression beyond noise (can gate a CI job or an upgrade), 0 otherwise, 2 on bad input."""
    from qwen3lab.analysis import regress as rg
    from qwen3lab.store import Store

    if fail_on not in rg.FAIL_ON:
        _fail(Qwen3LabError(f"--fail-on {fail_on!r} is not one of {', '.join(rg.FAIL_ON)}: e.g. --fail-on worse"))
    try:
        report = rg.regress(Store(db), base, new, metric, slo, _experiment_name(experiment) if experiment else None,
                            include_unreliable)
    except Qwen3LabError as exc:
        _fail(exc)
    if markdown:
        markdown.write_text(report.markdown())

    def table() -> Table:
        t = Table(title=f"NEW {report.new} against BASE {report.base}: {len(report.regressions)} regression(s)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("trial", "metric", "BASE", "NEW", "change (95% CI)", "verdict", "launches", "what changed"):
            t.add_column(name, overflow="fold")
        for r in report.rows.to_dict("records"):
            mark = "[bold red]" if r["verdict"] == "worse" else ""
            t.add_row(r["trial"], r["metric"], _num(r["base"]), _num(r["new"]),
                      f"{_pct(r['change_pct'])} ({_pct(r['low_pct'])} .. {_pct(r['high_pct'])})",
                      mark + r["verdict"] + (f" ({r['would_take']})" if r["would_take"] else ""),
                      f"{r['base_launches']} / {r['new_launches']}", r["changed"] or "-")
        return t

    _print(report.as_dict(), as_json, table)
    raise typer.Exit(report.exit_code(fail_on))


def register(app: typer.Typer, fail, print_, experiment_name) -> None:
    """Add the commands to `app`, with cli's helpers: fail(exc) exits 2 with the message, print_(data, as_json,
    table) prints, experiment_name(arg) reads a stored name or a YAML file's."""
    global _fail, _print, _experiment_name
    _fail, _print, _experiment_name = fail, print_, experiment_name
    app.command()(campaigns)
    app.command("history")(history_)
    app.command()(regress)

