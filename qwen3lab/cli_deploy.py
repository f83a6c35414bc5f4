"""`qwen3lab export`, `k8s` and `schedule`: what takes a measured configuration, or the sweep, out of the lab."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from qwen3lab.cli_common import DB, err, fail
from qwen3lab.errors import Qwen3LabError

app = typer.Typer()  # its commands join the main app (cli.py)


@app.command("export")
def export_(
    ref: str = typer.Argument(..., metavar="RUN|TRIAL", help="A run id, or TRIAL / CHAPTER/TRIAL (its newest ok run)."),
    fmt: str = typer.Option("shell", "--format", help="shell, docker, compose or k8s."),
    model: Optional[str] = typer.Option(None, "--model", help="Checkpoint to deploy (default: the measured model's hub id)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the server listens on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", help="Port the server listens on."),
    db: str = DB,
):
    """A run's launch command as a deployment: the real checkpoint and the winner's flags, no measuring-kit switches."""
    from qwen3lab.analysis import export
    from qwen3lab.store import Store

    try:
        sys.stdout.write(export.export_run(export.find_run(Store(db), ref), host, port, model).get(fmt))
    except Qwen3LabError as exc:
        fail(exc)


@app.command()
def k8s(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    image: str = typer.Option(..., "--image", help="Container image with qwen3lab, vLLM and Ray installed (the same on every pod)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per worker pod (default: the most one trial needs)."),
    nodes: int = typer.Option(1, "--nodes", help="Worker pods."),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="Kubernetes namespace of every object."),
    storage: str = typer.Option("50Gi", "--storage", help="Size of the volume holding the DuckDB and server logs."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the manifest here (default: print it)."),
):
    """KubeRay manifests (RayCluster + RayJob, the experiment in a ConfigMap, a volume for the DuckDB) that run it."""
    from qwen3lab import kuberay

    shape = kuberay.Shape(image=image, nodes=nodes, gpus_per_node=gpus_per_node, storage=storage, namespace=namespace)
    try:
        text = kuberay.manifest_text(experiment, shape)
    except Qwen3LabError as exc:
        fail(exc)
    if out:
        out.write_text(text)
        err.print(f"wrote {out}: kubectl apply -f {out}")
    else:
        sys.stdout.write(text)


@app.command()
def schedule(
    experiment: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    every: str = typer.Option(..., "--every", help="1d, Nh, Nm, or five cron fields ('0 3 * * 1-5')."),
    at: Optional[str] = typer.Option(None, "--at", help="HH:MM: the time of a daily run (default 02:00), the minute of an hourly one."),
    target: str = typer.Option("systemd", "--target", help="systemd (service + timer), cron (a crontab line) or k8s (a CronJob)."),
    install: bool = typer.Option(False, "--install", help="Install it (systemctl enable, crontab, kubectl apply) instead of printing it."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the files into this folder (default: print them)."),
    only: Optional[list[str]] = typer.Option(None, "--only", help="Only these chapters (repeatable)."),
    log: Optional[Path] = typer.Option(None, "--log", help="Log file of the scheduled runs (default: beside the DuckDB)."),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="k8s: namespace of the objects."),
    db: str = DB,
):
    """Run the sweep on a timer, one at a time per database (a lock), logged to a file; each run resumes."""
    from qwen3lab import timer as sched

    try:
        files = sched.render(target, experiment, every, at, db, log, tuple(only or ()), namespace)
        if install:
            err.print(f"installed into {sched.install(target, files, next(iter(files)).rsplit('.', 1)[0])}")
    except Qwen3LabError as exc:
        fail(exc)
    for file, text in files.items():
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / file).write_text(text)
            err.print(f"wrote {out / file}")
        elif not install:
            sys.stdout.write(f"# --- {file}\n{text}")
