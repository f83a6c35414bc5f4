"""Scheduling overhead per trial, as users meet it: `qwen3lab run EXPERIMENT` against `qwen3lab run EXPERIMENT
--executor ray --address ADDRESS` on a cluster of one and of two nodes, the same N endpoint trials of one server.

One real vLLM server (the tiny Qwen3 on the CPU) is started once; N `kind: endpoint` trials measure it, so no
trial launches a server and what is left beside the load itself is the tool's own cost as a user pays it: the
command's start (imports), joining the cluster, pre-flight, run rows, task scheduling, the relay of rows to the
driver, DuckDB writes, the results table. Each way is the real CLI in a subprocess, timed from its start to its
exit, with a DuckDB of its own. The cluster (ray.cluster_utils.Cluster: a head that takes no trial, then one or two
nodes of one CPU, each an endpoint trial's load generator) is up before the timer starts, as a user's cluster is
before they type the command; the CLI joins it by its address (`--address HOST:PORT`).

Overhead per trial = (wall time - sum of the trials' load durations) / N, for the ways that run one trial after
another (local; Ray with one node). Ray with two nodes runs two trials at once, so the sum of their durations is
not time spent: it gets its wall time per trial only. Target: Ray's overhead per trial under 2 s.
Prints a table and writes JSON to bench/results/ray_overhead.json.

    PYTHONPATH=$PWD .venv/bin/python bench/ray_overhead_bench.py [--trials 8] [--requests 8]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from qwen3lab.hardware.catalogue import cpu_topology  # noqa: E402
from qwen3lab.experiment.spec import EngineConfig  # noqa: E402
from qwen3lab.measure import engine  # noqa: E402
from qwen3lab.models import resolve_model_path  # noqa: E402
from qwen3lab.store import Store  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGET_S = 2.0  # Ray's scheduling overhead per trial (issue 13)


def experiment_file(folder: Path, server, trials: int, requests: int) -> Path:
    tokenizer = resolve_model_path("builtin:qwen3-tiny")
    names = "\n".join(f"      - {{name: t{i}, workload.seed: {i}}}" for i in range(trials))
    path = folder / "endpoint-trials.yaml"
    path.write_text(f"name: ray-overhead\ngpu: cpu\n"
                    f"engine: {{kind: endpoint, url: '{server.base_url}', model: '{server.model_name}', "
                    f"tokenizer: '{tokenizer}'}}\n"
                    f"workload: {{num_requests: {requests}, mix: fixed-128, concurrency: 2}}\n"
                    f"chapters:\n  main:\n    trials:\n{names}\n")
    return path


def qwen3lab_command() -> list[str]:
    """The `qwen3lab` a user types: the console script beside this python, else its module."""
    script = Path(sys.executable).with_name("qwen3lab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "qwen3lab"]


def cli(args: list[str]) -> float:
    """Run one qwen3lab command to its end; its wall time in seconds."""
    argv = qwen3lab_command() + args
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall


def measure(label: str, path: Path, folder: Path, sequential: bool, *extra: str) -> dict:
    db = folder / f"{label.replace(' ', '-').replace(',', '')}.duckdb"
    wall = cli(["run", str(path), "--db", str(db), "--runs-dir", str(folder / "runs"), *extra])
    runs = Store(str(db)).runs()
    n, load = len(runs), float(runs.duration.sum())
    return {"way": label, "trials": n, "ok": int((runs.status == "ok").sum()), "wall_s": wall, "load_s": load,
            "wall_per_trial_s": wall / n,
            # parallel trials overlap: wall minus the sum of their durations is not their overhead
            "overhead_per_trial_s": (wall - load) / n if sequential else None}


def on_cluster(nodes: int, path: Path, folder: Path) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        # The head takes no trial (no CPU to give an endpoint trial's load generator); a patient wait for its
        # dashboard agent on a loaded machine.
        cluster.add_node(num_cpus=0, include_dashboard=False,
                         _system_config={"agent_register_timeout_ms": 120_000})
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        return measure(f"ray, {nodes} node{'s' * (nodes > 1)}", path, folder, nodes == 1,
                       "--executor", "ray", "--address", cluster.address)
    finally:
        cluster.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args()
    # The CLI and the cluster's workers import this checkout's qwen3lab.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    rows = []
    with tempfile.TemporaryDirectory() as tmp, engine.launch(
            EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=1024, enforce_eager=True,
                         env={"VLLM_CPU_KVCACHE_SPACE": "1"}), Path(tmp) / "server.log", ready_timeout_s=900) as server:
        folder = Path(tmp)
        path = experiment_file(folder, server, args.trials, args.requests)
        cli(["run", str(path), "--dry-run"])  # untimed: the first command alone would pay for a cold file cache
        rows.append(measure("local", path, folder, True))
        rows += [on_cluster(nodes, path, folder) for nodes in (1, 2)]

    table = Table(title=f"`qwen3lab run` per trial: {args.trials} endpoint trials x {args.requests} requests, "
                        "one server")
    for col in ("way", "ok", "wall s", "load s", "wall / trial s", "overhead / trial s"):
        table.add_column(col, justify="right")
    for r in rows:
        over = r["overhead_per_trial_s"]
        table.add_row(r["way"], f"{r['ok']}/{r['trials']}", f"{r['wall_s']:.1f}", f"{r['load_s']:.1f}",
                      f"{r['wall_per_trial_s']:.2f}", "-" if over is None else f"{over:.2f}")
    console = Console()
    console.print(table)
    local, ray1 = rows[0], rows[1]
    # Two readings of the target, both reported: Ray's whole overhead per trial (the tool's own costs included,
    # which the local executor pays too), and what Ray adds against local (the scheduling itself).
    added = ray1["overhead_per_trial_s"] - local["overhead_per_trial_s"]
    met, added_met = ray1["overhead_per_trial_s"] < TARGET_S, added < TARGET_S
    console.print(f"Ray overhead per trial (1 node): {ray1['overhead_per_trial_s']:.2f} s, under {TARGET_S:g} s: "
                  f"{'met' if met else 'NOT met'}; added against local: {added:+.2f} s, under {TARGET_S:g} s: "
                  f"{'met' if added_met else 'NOT met'}. Two nodes: "
                  f"{rows[2]['wall_per_trial_s']:.2f} s of wall time per trial (trials in parallel: no overhead "
                  "figure).", highlight=False)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "ray_overhead.json"
    out.write_text(json.dumps({"host": platform.node(), "cpu": cpu_topology(), "args": vars(args), "target_s": TARGET_S,
                               "target_met": met, "added_against_local_s": added,
                               "added_target_met": added_met, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
