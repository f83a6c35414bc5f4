"""What the router adds: TTFT through `qwen3lab router` minus TTFT straight to the backend, and the router's CPU.

The backend is a fast stand-in on loopback (an aiohttp server that streams vLLM-shaped SSE completions, one
token every --token-interval-ms), because a CPU vLLM's own TTFT jitter (milliseconds) would drown the sub-millisecond
effect being measured. The same Poisson load (qwen3lab's load generator, --rate requests/s) goes straight to the
backend and through the router in alternating rounds, so machine drift hits both. Targets (issue 14): added
TTFT p50 under 1 ms and p99 under 3 ms at 200 requests/s; router CPU seconds per 1,000 streamed tokens is reported.
Prints a table and writes JSON to bench/results/.

    python bench/router_bench.py [--rate 200] [--requests 2000] [--rounds 2] [--output-tokens 32]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_CHUNK = ('data: {{"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench","choices":[{{"index":0,'
          '"text":" tok","logprobs":null,"finish_reason":{finish}}}]}}\n\n')


def serve_backend(port: int, interval_s: float) -> None:
    """The fast backend: /health, /v1/models, and streamed /v1/completions of exactly max_tokens chunks."""
    import uvloop
    from aiohttp import web

    async def completions(request):
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for i in range(n):
            await resp.write(_CHUNK.format(finish='"length"' if i == n - 1 else "null").encode())
            if interval_s:
                await asyncio.sleep(interval_s)
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        await resp.write(f'data: {json.dumps({"choices": [], "usage": usage})}\n\ndata: [DONE]\n\n'.encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", lambda r: web.Response())
    app.router.add_get("/v1/models", lambda r: web.json_response({"data": [{"id": "bench", "max_model_len": 4096}]}))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=uvloop.new_event_loop())


def percentiles_ms(records) -> dict:
    ttft = np.array([r.ttft for r in records if r.ok]) * 1000
    return {"p50": float(np.percentile(ttft, 50)), "p99": float(np.percentile(ttft, 99)), "ok": int(ttft.size),
            "failed": sum(not r.ok for r in records)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second (Poisson)")
    ap.add_argument("--requests", type=int, default=2000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (direct, through), alternating order")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--token-interval-ms", type=float, default=5.0, help="the backend's gap between tokens")
    ap.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/results/router_bench.json")
    args = ap.parse_args()
    if args.serve_backend:
        return serve_backend(args.serve_backend, args.token_interval_ms / 1000)

    import psutil
    from rich.console import Console
    from rich.table import Table

    from qwen3lab.experiment.spec import RequestClass, Workload
    from qwen3lab.measure import engine, router, workload as wl
    from qwen3lab.measure.loadgen import run_load, run_sync
    from qwen3lab.hardware.catalogue import cpu_topology

    port = engine.free_port()
    backend = subprocess.Popen([sys.executable, __file__, "--serve-backend", str(port),
                                "--token-interval-ms", str(args.token_interval_ms)])
    backend_url = f"http://127.0.0.1:{port}"
    w = Workload(num_requests=args.requests, concurrency=None, request_rate=args.rate, seed=0,
                 mix=[RequestClass(name="short", prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens)])
    tokenizer = wl.load_tokenizer(router.tokenizer_path("builtin:qwen3-tiny"))
    requests = wl.build_requests(w, tokenizer, None)
    load0 = os.getloadavg()
    cfg = router.RouterConfig({"short": backend_url, "long": backend_url}, threshold_tokens=4096,
                              tokenizer="builtin:qwen3-tiny", port=engine.free_port())
    rows: list[dict] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if engine.http_get(backend_url + "/health", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        with router.launch(cfg, Path(tempfile.mkdtemp()) / "router.log") as running:
            proc = psutil.Process(running.process.pid)
            for url in (backend_url, running.url):  # a whole unrecorded round each way: the first was a cold start
                run_sync(run_load(url, "bench", requests, w))
            for i in range(args.rounds):
                order = [("direct", backend_url), ("router", running.url)]
                for how, url in order if i % 2 == 0 else order[::-1]:
                    cpu0 = sum(proc.cpu_times()[:2])
                    result = run_sync(run_load(url, "bench", requests, w))
                    cpu = sum(proc.cpu_times()[:2]) - cpu0
                    tokens = sum(r.output_tokens or 0 for r in result.records)
                    row = {"round": i, "path": how, **percentiles_ms(result.records),
                           "achieved_rate": len(result.records) / result.duration_s, "tokens": tokens}
                    if how == "router":
                        row["router_cpu_s_per_1k_tokens"] = 1000 * cpu / max(tokens, 1)
                    rows.append(row)
            metrics_text = engine.http_get(running.url + "/metrics")[1].decode()
    finally:
        backend.terminate()
        backend.wait(10)

    def pooled(path, q):
        return float(np.median([r[q] for r in rows if r["path"] == path]))

    added = {q: pooled("router", q) - pooled("direct", q) for q in ("p50", "p99")}
    own = {line.split()[0]: float(line.split()[1]) for line in metrics_text.splitlines()
           if line.startswith("qwen3lab_router_added_latency_seconds_") and "bucket" not in line}
    own_mean_ms = 1000 * sum(v for k, v in own.items() if "_sum" in k) / max(1, sum(v for k, v in own.items() if "_count" in k))
    cpu_per_1k = float(np.median([r["router_cpu_s_per_1k_tokens"] for r in rows if r["path"] == "router"]))
    summary = {"added_ttft_p50_ms": added["p50"], "added_ttft_p99_ms": added["p99"],
               "target_p50_ms": 1.0, "target_p99_ms": 3.0,
               "meets_targets": added["p50"] < 1.0 and added["p99"] < 3.0,
               "router_own_added_mean_ms": own_mean_ms, "router_cpu_s_per_1k_tokens": cpu_per_1k}
    table = Table(title=f"router vs direct, {args.rate:g} req/s Poisson, {args.output_tokens} tokens each, "
                        f"load average at start {load0[0]:.1f}")
    for col in ("round", "path", "TTFT p50 ms", "TTFT p99 ms", "ok", "failed", "req/s", "router CPU s/1k tok"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["round"]), r["path"], f"{r['p50']:.3f}", f"{r['p99']:.3f}", str(r["ok"]), str(r["failed"]),
                      f"{r['achieved_rate']:.0f}", f"{r['router_cpu_s_per_1k_tokens']:.4f}" if "router_cpu_s_per_1k_tokens" in r else "")
    console = Console()
    console.print(table)
    console.print(f"added TTFT (median of rounds): p50 {added['p50']:.3f} ms (target < 1), p99 {added['p99']:.3f} ms "
                  f"(target < 3); router's own first-token-path time, mean {own_mean_ms:.3f} ms; router CPU "
                  f"{cpu_per_1k:.4f} s per 1,000 streamed tokens")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "host": platform.node(), "cpus": os.cpu_count(),
                               "cpu": cpu_topology(),
                               "load_average_at_start": load0, "load_average_at_end": os.getloadavg(),
                               "summary": summary, "rounds": rows}, indent=2))
    console.print(f"written to {out}")


if __name__ == "__main__":
    main()
