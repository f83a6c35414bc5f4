"""The `qwen3lab` command: a thin shell over the library. Every command is a few lines calling one function.

Shared options and helpers: cli_common; traffic: cli_traffic; export, k8s, schedule: cli_deploy; builds: cli_builds; campaigns,
history, regress: campaign_cli.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from qwen3lab.cli_common import (ADDRESS, DB, DRY_RUN, EXECUTOR, RETRY_FAILED, check_executor, console, err,
                                 experiment_name, fail, print_result)
from qwen3lab.errors import Qwen3LabError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Measure vLLM launch configurations, store every request, pick the winner under SLOs.")
@app.command()
def run(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    db: str = DB,
    only: Optional[list[str]] = typer.Option(None, "--only", help="Run only these chapters (repeatable)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where server logs and notebooks are kept."),
    dry_run: bool = DRY_RUN,
    retry_failed: bool = RETRY_FAILED,
    fresh: bool = typer.Option(False, "--fresh", help="Run every trial again, even those already finished."),
    executor_kind: str = EXECUTOR,
    address: Optional[str] = ADDRESS,
):
    """Run an experiment's trials directly (no notebooks): launch, load, store, print the table."""
    from qwen3lab import campaign, terminal
    from qwen3lab.measure import executor
    from qwen3lab.store import Store

    check_executor(executor_kind, address)
    try:
        on_ray = executor_kind == "ray"
        # On a cluster the trials are judged for the GPU the experiment names; each node judges its own again.
        planned = executor.plan(experiment, only, for_written_gpu=dry_run or on_ray)
        if dry_run:
            terminal.print_dry_run(planned, console)
            planned.raise_errors()
            return
        planned.raise_errors()
        opts = {"only": only, "retry_failed": retry_failed, "fresh": fresh, "executor": executor_kind}
        with campaign.opened(Store(db), "run", experiment, opts), terminal.Progress(console) as progress:
            if on_ray:
                from qwen3lab.measure import ray_executor

                results = ray_executor.execute(planned, Store(db), address, runs_dir, retry_failed, fresh,
                                               listener=progress)
            else:
                results = executor.execute(planned, Store(db), runs_dir, retry_failed, fresh, listener=progress)
    except Qwen3LabError as exc:
        fail(exc)
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
    executor_kind: str = EXECUTOR,
    address: Optional[str] = ADDRESS,
):
    """Run the workbook: each chapter's notebook executed with papermill and saved under runs/; resumes.

    With --executor ray every trial is measured on the cluster first, in parallel; the notebooks then find
    them stored (resume) and analyse them."""
    from qwen3lab import sweep as sw
    from qwen3lab import terminal

    chapters = [c for item in only or [] for c in item.split(",") if c] or None
    params = sw.parse_params(param)
    check_executor(executor_kind, address)
    small = sorted(set(params) & {"num_requests", "warmup_requests", "duration_s"})
    if executor_kind == "ray" and small:
        fail(Qwen3LabError(f"-p {', '.join(small)} changes the trials the notebooks run, so the cluster's "
                            "runs would not stand for them: drop it, or sweep without --executor ray"))
    try:
        if dry_run:
            result = sw.dry_run(experiment, chapters)
            terminal.print_dry_run(result.planned, console)
        else:
            from contextlib import nullcontext

            from qwen3lab import campaign
            from qwen3lab.store import Store

            planned = None
            if executor_kind == "ray":
                from qwen3lab.measure import executor, ray_executor

                planned = executor.plan(experiment, chapters, for_written_gpu=True)
                planned.raise_errors()
            # with ray, the cluster's runs and the notebooks are one campaign; else sweep.sweep opens it
            with campaign.opened(Store(db), "sweep", experiment, params) if planned else nullcontext():
                if planned:
                    with terminal.Progress(console) as progress:
                        ray_executor.execute(planned, Store(db), address, runs_dir, retry_failed, listener=progress)
                with terminal.Progress(console) as progress:
                    result = sw.sweep(experiment, db, chapters, str(runs_dir), retry_failed, params, listener=progress)
            console.print(terminal.sweep_table(result, db))
    except Qwen3LabError as exc:
        fail(exc)
    raise typer.Exit(result.exit_code)


SLO_OPT = typer.Option(None, "--slo", help="An SLO NAME=VALUE over the stored ones, repeatable: ttft_p95_ms=500, "
                       "tpot_p95_ms=50, e2el_p99_ms, ttft_ms, tpot_ms, e2el_ms, max_failed_fraction=0.01.")


@app.command()
def capacity(
    experiment: Path = typer.Argument(..., help="Experiment YAML; each workload may set capacity: {axis, min_attainment, ...}."),
    db: str = DB,
    only: Optional[list[str]] = typer.Option(None, "--only", help="Only these chapters (repeatable or comma-separated)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where server logs are kept."),
    fresh: bool = typer.Option(False, "--fresh", help="Measure again configurations whose capacity is stored."),
    as_json: bool = typer.Option(False, "--json", help="Print per trial: axis, capacity, interval, points measured."),
    executor_kind: str = EXECUTOR,
    address: Optional[str] = ADDRESS,
):
    """Capacity of each trial: one server per configuration, load doubled to the first SLO failure, then bisected.
    With --executor ray each configuration's search is a Ray task (its server on one node, searches in parallel)."""
    from qwen3lab import campaign, terminal
    from qwen3lab.measure import capacity as cap
    from qwen3lab.store import Store

    chapters = [c for item in only or [] for c in item.split(",") if c] or None
    check_executor(executor_kind, address)
    try:
        with terminal.Progress(err) as listener:
            if executor_kind == "ray":  # the local search opens its campaign itself, once its plan holds
                from qwen3lab.measure import ray_executor

                with campaign.opened(Store(db), "capacity", experiment, {"only": chapters, "fresh": fresh,
                                                                         "executor": "ray"}):
                    results = ray_executor.run_capacities(experiment, db, chapters, runs_dir, fresh, listener, address)
            else:
                results = cap.run_capacities(experiment, db, chapters, runs_dir, fresh, listener)
    except Qwen3LabError as exc:
        fail(exc)
    print_result([r.as_dict() for r in results], as_json, lambda: terminal.capacity_table(results))


@app.command()
def soak(
    experiment: Path = typer.Argument(..., help="Experiment YAML; its soak chapter's first trial unless --trial."),
    duration: str = typer.Option("10m", "--duration", help="Time under load (server starts not counted): 72h, 90m, 1h30m, 45s or seconds."),
    trial: Optional[str] = typer.Option(None, "--trial", help="The trial to soak: NAME or CHAPTER/NAME."),
    window: Optional[str] = typer.Option(None, "--window", help="Width of a window (one run each); default: a "
                                         "twelfth of the duration, 10 s to 10 min."),
    max_restarts: int = typer.Option(3, "--max-restarts", help="Start a dead server again at most this many times."),
    db: str = DB,
    runs_dir: Path = typer.Option(Path("runs"), help="Where server logs are kept."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts, the windows and the drift as JSON."),
):
    """Keep one configuration under the experiment's traffic for a set time: restarts, crashes and OOMs counted,
    every window stored, the last window's latency and throughput set against the first's (drift)."""
    import signal

    from qwen3lab import terminal
    from qwen3lab.measure import soak as sk

    # SIGTERM stops like Ctrl-C: the window in flight is stored as interrupted, the server torn down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with terminal.Progress(err) as listener:
            result = sk.run_soak(experiment, db, trial, duration, window, max_restarts, runs_dir, listener)
    except Qwen3LabError as exc:
        fail(exc)
    print_result(result.as_dict(), as_json, lambda: terminal.soak_table(result))
    if result.status != "ok":
        raise typer.Exit(1)


@app.command()
def search(
    experiment: Path = typer.Argument(..., help="Experiment YAML with a search: {space, objective, budget, sampler}."),
    db: str = DB,
    budget_trials: Optional[int] = typer.Option(None, "--budget-trials", help="Most configurations measured in all (resumed ones count)."),
    budget_s: Optional[float] = typer.Option(None, "--budget-s", help="Start no new configuration after this many seconds."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where server logs are kept."),
    fresh: bool = typer.Option(False, "--fresh", help="Start a new study instead of resuming the stored one."),
    as_json: bool = typer.Option(False, "--json", help="Print the best configuration, its objective with interval, the history."),
    executor_kind: str = EXECUTOR,
    address: Optional[str] = ADDRESS,
):
    """Adaptive search over launch flags (optuna): pre-flight prunes infeasible points, resumes from the DB.
    With --executor ray, as many suggestions are measured at once as the cluster has free slots."""
    import signal

    from qwen3lab import terminal
    from qwen3lab.measure import search as se

    check_executor(executor_kind, address)
    # SIGTERM stops like Ctrl-C: the running server is torn down and the trial stored as interrupted.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with terminal.Progress(err) as listener:
            result = se.run_search(str(experiment), db, str(runs_dir), budget_trials, budget_s, fresh, listener,
                                   executor_kind, address)
    except Qwen3LabError as exc:
        fail(exc)
    print_result(result.as_dict(), as_json, lambda: terminal.search_table(result))


@app.command()
def runs(
    db: str = DB,
    experiment: Optional[str] = typer.Option(None, help="Only this experiment."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    slo: Optional[list[str]] = SLO_OPT,
):
    """List stored runs, newest first; with --slo, each run's slo_pass and request_goodput under those SLOs."""
    from qwen3lab import terminal
    from qwen3lab.analysis import compare
    from qwen3lab.store import Store

    store = Store(db)
    df = store.runs(experiment=experiment)
    if slo:
        try:
            df = compare.runs_under(store, df, compare.parse_slo(slo))
        except Qwen3LabError as exc:
            fail(exc)
    if as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso", indent=2, double_precision=15) + "\n")
    else:
        console.print(terminal.runs_table(df))


@app.command()
def winner(
    experiment: str = typer.Argument(..., help="Experiment name (as stored) or its YAML file."),
    chapter: Optional[str] = typer.Option(None, "--chapter", help="Only this chapter."),
    slo: Optional[list[str]] = SLO_OPT,
    db: str = DB,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the winner line."),
    include_unreliable: bool = typer.Option(False, "--include-unreliable", help="Let runs marked unreliable win."),
):
    """The winner under SLOs, re-scored from stored requests: margin over the runner-up and the baseline, verdict."""
    from qwen3lab.analysis import compare, wording
    from qwen3lab.store import Store

    store = Store(db)
    try:
        name = experiment_name(experiment)
        verdicts = compare.winners(store, name, compare.parse_slo(slo, compare.stored_slo(store, name)), chapter,
                                   include_unreliable)
    except Qwen3LabError as exc:
        fail(exc)
    if not verdicts:
        fail(Qwen3LabError(f"no ok runs of {name!r}{' chapter ' + chapter if chapter else ''} in {db}: "
                            "run it first, or list what is stored with `qwen3lab runs`"))
    if as_json:
        sys.stdout.write(json.dumps([wording.winner_json(v) for v in verdicts], indent=2, default=str) + "\n")
    else:
        for v in verdicts:  # one unwrapped line each: the demo's last line, read by people and by grep
            sys.stdout.write(wording.winner_line(v) + "\n")


@app.command("compare")
def compare_(
    a: str = typer.Argument(..., help="A run id, a trial key, or CHAPTER/TRIAL."),
    b: str = typer.Argument(..., help="The same, for the other side."),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="Where CHAPTER/TRIAL is looked up."),
    slo: Optional[list[str]] = SLO_OPT,
    db: str = DB,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """A against B (runs or trials, all their launches): each metric's difference with its 95% interval."""
    from qwen3lab import terminal
    from qwen3lab.analysis import compare, wording
    from qwen3lab.store import Store

    store = Store(db)
    try:
        name = experiment_name(experiment) if experiment else None
        ta, tb = compare.resolve(store, a, name), compare.resolve(store, b, name)
        base = compare.stored_slo(store, str(ta.newest.row.get("experiment")))
        df = compare.compare_two(ta, tb, compare.parse_slo(slo, base))
    except Qwen3LabError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps({"a": ta.label, "b": tb.label, "a_launches": len(ta.launches),
                                     "b_launches": len(tb.launches), "metrics": df.to_dict("records")},
                                    indent=2, default=str) + "\n")
    else:
        console.print(terminal.compare_table(df, f"{ta.label} ({wording.launches(ta)})", f"{tb.label} ({wording.launches(tb)})"))


@app.command()
def show(run_id: str, db: str = DB):
    """Everything stored about one run: provenance, launch command, summary."""
    from qwen3lab.store import Store

    try:
        row = Store(db).run(run_id)
    except Qwen3LabError as exc:
        fail(exc)
    keep = {k: v for k, v in row.items() if not k.endswith("_json")}
    sys.stdout.write(json.dumps(keep, indent=2, default=str) + "\n")


@app.command()
def schema(section: str = typer.Argument("engine", help="engine, endpoint, workload, slo, experiment, chapter, capacity, search, range or source.")):
    """Every field of an experiment file, with its description."""
    from qwen3lab import terminal

    try:
        console.print(terminal.schema_table(section))
    except Qwen3LabError as exc:
        fail(exc)


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
        fail(exc)


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
        fail(exc)
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
        fail(exc)


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
        fail(exc)
    console.print(f"{len(ids)} run(s) in {db}: " + ", ".join(ids))


@app.command()
def router(
    route: list[str] = typer.Option(..., "--route", help="NAME=URL of a backend, e.g. short=http://127.0.0.1:8001 (repeat: short and long)."),
    threshold_tokens: int = typer.Option(..., "--threshold-tokens", help="Prompts of at most this many tokens go to short, longer ones to long."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="The served model's tokenizer: a folder, builtin:NAME or hub id (default: the folder a backend serves)."),
    policy: str = typer.Option("length", "--policy", help="length (by prompt tokens) or round-robin (each route in turn, for comparison)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(9000, "--port", help="Port to listen on."),
    max_connections: int = typer.Option(256, "--max-connections", help="Connection pool size per backend; more requests wait."),
    connect_timeout_s: float = typer.Option(5.0, "--connect-timeout", help="Seconds to connect to a backend."),
    read_timeout_s: float = typer.Option(600.0, "--read-timeout", help="Longest silence, in seconds, from a backend: before its response starts (then 504) and between two chunks of its stream (then an SSE error event ends it)."),
):
    """An OpenAI-compatible streaming proxy that sends short prompts to one vLLM server and long ones to another."""
    from qwen3lab.measure import router as rt

    try:
        config = rt.RouterConfig(rt.parse_routes(route), threshold_tokens, tokenizer, policy, host, port,
                                 max_connections, connect_timeout_s, read_timeout_s)
        rt.serve(config, ready=lambda line: console.print(line, markup=False, highlight=False))
    except Qwen3LabError as exc:
        fail(exc)


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


from qwen3lab import cli_builds, cli_deploy, cli_traffic  # noqa: E402 - command groups in their own modules

app.registered_commands += cli_traffic.app.registered_commands + cli_deploy.app.registered_commands

app.add_typer(cli_builds.app, name="builds")

from qwen3lab import campaign_cli  # noqa: E402 - campaigns, history, regress, given the helpers above

campaign_cli.register(app, fail, print_result, experiment_name)

if __name__ == "__main__":  # python -m qwen3lab.cli
    app()

