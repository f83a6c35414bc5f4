"""Scheduling overhead per trial: the Ray executor against the local one, on N endpoint trials of one server.

One real vLLM server (the tiny Qwen3 on the CPU) is started once; N `kind: endpoint` trials measure it, so
no trial launches a server and what is left beside the load itself is the executor's own cost: pre-flight,
run rows, task scheduling, the relay of rows to the driver, DuckDB writes. Three ways: the local executor,
Ray with one node (trials one after another) and Ray with two nodes (two trials at a time against the same
server). Overhead per trial = (wall time - sum of the trials' load durations) / N for the sequential ways;
for two nodes the wall time per trial is shown beside it. Target: under 2 s per trial on Ray.
Prints a table and writes JSON to bench/results/ray_overhead.json.

    python bench/ray_overhead_bench.py [--trials 8] [--requests 8]
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from qwen3lab.measure import engine, executor, ray_executor
from qwen3lab.models import resolve_model_path
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.store import Store

RESULTS = Path(__file__).parent / "results"


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


def measure(label: str, go, db: str) -> dict:
    t0 = time.perf_counter()
    results = go()
    wall = time.perf_counter() - t0
    runs = Store(db).runs(run_ids=[r.run_id for r in results])
    load = float(runs.duration.sum())
    n = len(results)
    return {"executor": label, "trials": n, "ok": int((runs.status == "ok").sum()), "wall_s": wall,
            "load_s": load, "wall_per_trial_s": wall / n, "overhead_per_trial_s": (wall - load) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--requests", type=int, default=8)
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    rows = []
    with tempfile.TemporaryDirectory() as tmp, engine.launch(
            EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=1024, enforce_eager=True,
                         env={"VLLM_CPU_KVCACHE_SPACE": "1"}), Path(tmp) / "server.log", ready_timeout_s=900) as server:
        folder = Path(tmp)
        path = experiment_file(folder, server, args.trials, args.requests)
        db = str(folder / "local.duckdb")
        rows.append(measure("local", lambda: executor.execute(executor.plan(path), Store(db), folder / "runs"), db))
        for nodes in (1, 2):
            cluster = Cluster()
            cluster.add_node(num_cpus=0, include_dashboard=False)  # the head runs the driver, no trial
            for _ in range(nodes):
                cluster.add_node(num_cpus=1)  # an endpoint trial reserves one CPU for its load generator
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                db = str(folder / f"ray{nodes}.duckdb")
                rows.append(measure(f"ray, {nodes} node(s)", lambda: ray_executor.execute(
                    executor.plan(path, for_written_gpu=True), Store(db), runs_dir=folder / "runs"), db))
            finally:
                ray.shutdown()
                cluster.shutdown()

    table = Table(title=f"Executor overhead: {args.trials} endpoint trials x {args.requests} requests, one server")
    for col in ("executor", "ok", "wall s", "load s", "wall / trial s", "overhead / trial s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["executor"], f"{r['ok']}/{r['trials']}", f"{r['wall_s']:.1f}", f"{r['load_s']:.1f}",
                      f"{r['wall_per_trial_s']:.2f}", f"{r['overhead_per_trial_s']:.2f}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "ray_overhead.json"
    out.write_text(json.dumps({"host": platform.node(), "args": vars(args), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
