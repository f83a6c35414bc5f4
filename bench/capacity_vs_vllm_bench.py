"""Capacity against vLLM's own client: does the server sustain qwen3lab's capacity C, and not its first failing load F?

One vLLM server started by hand (the embedded default: the tiny Qwen3, vLLM's defaults; bench/fidelity_bench's
HandServer). `qwen3lab capacity` of a `kind: endpoint` experiment on it (the real CLI, a fresh DuckDB) gives C
and F (the bracket's first failure). Then `vllm bench serve` (its module, bench/vllm_bench_serve.py) sends Poisson
arrivals of the same lengths, greedy with --ignore-eos, for at least --seconds at C and at F, with the same
per-request SLO as --goodput. Its attainment (requests meeting every SLO, failures as misses) must reach
min_attainment at C and fall short of it at F. Prints a table and writes JSON under bench/results/ with the
machine's load average (a shared machine moves the figures: say so beside them).

    PYTHONPATH=$PWD .venv/bin/python bench/capacity_vs_vllm_bench.py [--seconds 60] [--min-arrival-s 60]
        [--f-seconds S] [--tokens 128] [--output-tokens 128] [--range-ratio 0] [--ttft-ms 1500] [--tpot-ms 50]
        [--min-attainment 0.95]
        [--before DIR]   # DIR: `git archive COMMIT | tar -x -C DIR` of an older checkout, timed on the same server

On a GPU host (the gpu-kit; tools/h200_device.sh's `check` stage): --model FOLDER --max-model-len 4096 --gpu h200
--serve-arg=--quantization --serve-arg=fp8 --tokens 272 --output-tokens 160 --range-ratio 0.6 --start 16
--ttft-ms 500 --tpot-ms 40 (lengths uniform in 108-435 and 64-256, as vLLM's random dataset draws them).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fidelity_bench as fb  # noqa: E402


def experiment_yaml(args, engine: dict, before: bool = False) -> str:
    """The experiment; `before`: as the code before steady-state points took it (200 requests a point, the
    embedded default's num_requests; no arrival settings), to time the old search on the same server."""
    import yaml

    steady = {"requests_per_point": 200} if before else {"min_arrival_s": args.min_arrival_s}
    lengths = {"prompt_tokens": spread(args.tokens, args.range_ratio),
               "output_tokens": spread(args.output_tokens, args.range_ratio)}
    return yaml.safe_dump({
        "name": "capacity-vs-vllm", "gpu": args.gpu, "engine": engine,
        "workload": {"mix": [{"name": "random", **lengths}],
                     "num_requests": 24, "warmup_requests": 8, "seed": 0,
                     "capacity": {"axis": "request_rate", "start": args.start, "min_attainment": args.min_attainment,
                                  "max_points": args.max_points, **steady}},
        "slo": {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms},
        "trials": [{"name": "vllm-defaults"}],
    })


def spread(length: int, ratio: float) -> int | list[int]:
    """vLLM's random dataset draws a length uniformly in [floor(L (1 - r)), ceil(L (1 + r))]: the same range."""
    return length if not ratio else [math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))]


def qwen3lab_capacity(engine: dict, args, work: Path, repo: Path = REPO, tag: str = "capacity") -> tuple[dict, float]:
    """`qwen3lab capacity --json` of the checkout `repo` (the real CLI, a fresh DuckDB): its row, its wall seconds."""
    exp, db = work / f"{tag}.yaml", work / f"{tag}.duckdb"
    exp.write_text(experiment_yaml(args, engine, before=repo != REPO))
    t = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "qwen3lab", "capacity", str(exp), "--db", str(db), "--runs-dir",
                          str(work / "runs"), "--json"], check=True, env=fb._env(repo), capture_output=True, text=True,
                         cwd=work)
    (row,) = json.loads(got.stdout)
    return row, time.monotonic() - t


def vllm_bench_at(url: str, rate: float, args, work: Path, tag: str, seconds: float) -> dict:
    """`vllm bench serve` at `rate` for at least `seconds` of Poisson arrivals; attainment from its per-request
    detail (TTFT, and TPOT = (E2EL - TTFT) / (output - 1) as vLLM defines it; a failed request is a miss)."""
    model = str(fb.resolve_model_path(fb.MODEL))
    n = math.ceil(rate * seconds)
    argv = [sys.executable, str(REPO / "bench" / "vllm_bench_serve.py"), "--backend", "vllm", "--base-url", url,
            "--model", model, "--tokenizer", model, "--dataset-name", "random", "--random-input-len",
            str(args.tokens), "--random-output-len", str(args.output_tokens), "--random-range-ratio",
            f"{args.range_ratio:g}",
            "--num-prompts", str(n), "--request-rate", f"{rate:g}", "--burstiness", "1", "--num-warmups", "8",
            "--ignore-eos", "--seed", "0", "--temperature", "0", "--goodput", f"ttft:{args.ttft_ms:g}",
            f"tpot:{args.tpot_ms:g}", "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,95",
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(work),
            "--result-filename", f"{tag}.json"]
    subprocess.run(argv, check=True, env=fb._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = json.loads((work / f"{tag}.json").read_text())
    # vLLM 0.26's detailed result has no "latencies" (0.32's has): E2EL is then TTFT plus the inter-token gaps
    latencies = out.get("latencies") or [t + sum(gaps) for t, gaps in zip(out["ttfts"], out["itls"])]
    good = 0
    for ttft, latency, n_out, error in zip(out["ttfts"], latencies, out["output_lens"], out["errors"]):
        if error or not ttft or not n_out:
            continue  # failed: a miss
        tpot = (latency - ttft) / (n_out - 1) if n_out > 1 else 0.0
        good += ttft * 1000 <= args.ttft_ms and tpot * 1000 <= args.tpot_ms
    return {"rate": rate, "requests": n, "completed": out["completed"], "failed": out.get("failed", 0),
            "duration_s": out["duration"], "served_rate": out["request_throughput"],
            "goodput_rate": out.get("request_goodput"), "attainment": good / n,
            "median_ttft_ms": out["median_ttft_ms"], "p95_ttft_ms": out.get("p95_ttft_ms"),
            "median_tpot_ms": out["median_tpot_ms"]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="vllm bench serve's arrivals at C and at F (>= 60)")
    p.add_argument("--f-seconds", type=float, help="arrivals at F (default: --seconds); longer shows whether a "
                   "queue qwen3lab saw growing there turns into missed SLOs")
    p.add_argument("--min-arrival-s", type=float, default=60.0, help="qwen3lab's capacity.min_arrival_s")
    p.add_argument("--start", type=float, default=2.0, help="qwen3lab's first load point, req/s")
    p.add_argument("--max-points", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--ttft-ms", type=float, default=1500.0)
    p.add_argument("--tpot-ms", type=float, default=50.0)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in L (1 -+ r), both tools")
    p.add_argument("--min-attainment", type=float, default=0.95)
    p.add_argument("--gpu", default="cpu")
    p.add_argument("--model", default=fb.MODEL, help="builtin:qwen3-tiny or a local model folder (dummy weights)")
    p.add_argument("--max-model-len", type=int, default=fb.MAX_MODEL_LEN)
    p.add_argument("--serve-arg", action="append", default=[], help="one more `vllm serve` argument (repeat)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--before", help="a checkout of qwen3lab before steady-state points (git archive COMMIT): its "
                   "capacity search is timed first on the same server")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    fb.MODEL, fb.MAX_MODEL_LEN = args.model, args.max_model_len
    started = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with fb.HandServer(work / "server.log", serve_args=tuple(args.serve_arg)) as server:
            result = {}
            if args.before:  # the old search first, on the same server: its wall time and its capacity
                old, old_wall = qwen3lab_capacity(fb.endpoint_engine(server), args, work, Path(args.before), "before")
                result["before"] = {"capacity": old["capacity"], "interval": old["interval"], "wall_s": old_wall,
                                    "points": len(old["points"]), "status": old["status"]}
                print("before:", json.dumps(result["before"]), flush=True)  # a run cut short keeps what it measured
            row, wall = qwen3lab_capacity(fb.endpoint_engine(server), args, work)
            c, f = row["interval"]
            result |= {"qwen3lab": {"capacity": row["capacity"], "first_fail": f, "status": row["status"],
                                    "wall_s": wall, "points": row["points"]}, "vllm_bench": {}}
            print("qwen3lab:", json.dumps(result["qwen3lab"]), flush=True)
            for name, rate, seconds in (("at C", c, args.seconds), ("at F", f, args.f_seconds or args.seconds)):
                if rate:
                    result["vllm_bench"][name] = vllm_bench_at(server.url, rate, args, work, name.replace(" ", "_"),
                                                               seconds)
                    print(f"vllm bench {name}:", json.dumps(result["vllm_bench"][name]), flush=True)
    holds = {"at C": lambda a: a >= args.min_attainment, "at F": lambda a: a < args.min_attainment}
    if "before" in result:
        b = result["before"]
        print(f"before (200-request points): capacity {b['capacity']} in {b['interval']}, {b['points']} points, "
              f"{b['wall_s']:.0f} s")
    print(f"qwen3lab capacity: C = {c} req/s, first failing load F = {f} ({row['status']}, "
          f"{len(row['points'])} points, {wall:.0f} s)")
    print(f"{'':6} {'rate':>7} {'served':>7} {'goodput':>8} {'attain':>7} {'p95 TTFT ms':>12} "
          f"{'TPOT p50 ms':>12}  verdict")
    for name, r in result["vllm_bench"].items():
        r["as_expected"] = bool(holds[name](r["attainment"]))
        print(f"{name:6} {r['rate']:7.3g} {r['served_rate']:7.3g} {r['goodput_rate'] or 0:8.3g} "
              f"{r['attainment']:7.3f} {r['p95_ttft_ms'] or 0:12.0f} {r['median_tpot_ms']:12.1f}  "
              f"{'as expected' if r['as_expected'] else 'NOT as expected'} "
              f"({'meets' if r['attainment'] >= args.min_attainment else 'misses'} {args.min_attainment:g})")
    result |= {"args": vars(args), "load_average": os.getloadavg(), "cpus": os.cpu_count()}
    out = Path(args.out) / f"capacity_vs_vllm_{started}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
