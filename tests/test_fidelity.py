"""Fidelity: what `qwen3lab run` stores matches `vllm bench serve` on the same server (issue 16).

A regression guard, not a speed target (bench/fidelity_bench.py holds the 5% target): rounds alternate the
two tools on the shared tiny server and the best round of each is compared, so that a burst of load from
whatever else runs on the machine spoils one round, not the verdict; a slow measured path spoils them all.
A path that stalls the event loop (storage, telemetry or rendering on it) shows as a TTFT several times
vLLM's, or a TPOT near zero (every token of a request stamped by one late read); both fail here.
"""
from __future__ import annotations

from bench.fidelity_bench import parse_args, qwen3lab_run, vllm_bench, with_server_view

MAX_ROUNDS = 3  # two at least; a third only when a burst of load spoiled one of the first two
# vllm bench with its own random prompts, as this guard has always compared (the bench sends ours to both by default)
LOAD = parse_args(["--requests", "64", "--concurrency", "8", "--tokens", "128", "--warmup", "4", "--no-same-prompts"])


def _best(rows: dict) -> dict:
    # Each client's TTFT is also divided by the server's own mean TTFT over the same round (its /metrics
    # histogram): the server's speed, which swings with the machine's load, cancels out of that ratio.
    return {tool: {"median_ttft_ms": min(x["median_ttft_ms"] for x in runs),
                   "median_tpot_ms": min(x["median_tpot_ms"] for x in runs),
                   "ttft_over_server": min(x["mean_ttft_ms"] / x["server_mean_ttft_ms"] for x in runs)}
            for tool, runs in rows.items()}


def _faithful(best: dict) -> bool:
    # TTFT: within 1.5x of vLLM's, either directly or against the server's view (robust to load swings
    # between rounds). TPOT's bound is loose on purpose: on a loaded 2-core machine vLLM's heavier client
    # (JSON per token) reports up to about 2.5x the TPOT of ours (seen at load 20-40); the regression is ~0.
    ours, theirs = best["qwen3lab"], best["vllm"]
    ttft_ok = (ours["median_ttft_ms"] <= 1.5 * theirs["median_ttft_ms"]
               or ours["ttft_over_server"] <= 1.5 * theirs["ttft_over_server"])
    return ttft_ok and ours["median_tpot_ms"] >= 0.25 * theirs["median_tpot_ms"]


def test_endpoint_run_times_streams_like_vllm_bench_serve(tiny_server, tmp_path):
    engine = {"kind": "endpoint", "url": tiny_server.base_url, "model": tiny_server.model_name,
              "tokenizer": tiny_server.model_name}
    url, rows = tiny_server.base_url, {"vllm": [], "qwen3lab": []}
    for r in range(MAX_ROUNDS):
        rows["vllm"].append(with_server_view(url, lambda: vllm_bench(url, LOAD, tmp_path, f"vllm-{r}")))
        rows["qwen3lab"].append(with_server_view(url, lambda: qwen3lab_run(engine, LOAD, tmp_path, f"q-{r}")))
        if r >= 1 and _faithful(_best(rows)):
            break
    for got in rows["vllm"] + rows["qwen3lab"]:
        assert got["completed"] == LOAD.requests
    for got in rows["qwen3lab"]:  # each run stores its client's own stalls
        assert 0 <= got["loop_lag_p99_ms"] <= got["loop_lag_max_ms"]
    assert _faithful(_best(rows)), (_best(rows), rows)


def test_flusher_keeps_storage_and_progress_off_the_loop(store, tmp_path):
    """The loop only appends; progress comes from the flusher's thread; DuckDB is written after the load (or
    every FLUSH_EVERY_S in a long one), everything stored exactly once."""
    import threading
    import time

    from qwen3lab.measure import runner
    from qwen3lab.measure.loadgen import RequestRecord
    from qwen3lab.spool import Spool

    spool = Spool(tmp_path / "spool.jsonl")
    run_id = store.begin_run(experiment="e", chapter="c", trial="t", config_json={})
    shown, threads = [], set()

    def progress(n):
        shown.append(n)
        threads.add(threading.current_thread().name)

    def rec(i):
        r = RequestRecord(i, "fixed", 8, 4, False, warmup=i < 2)
        r.ttft, r.e2el, r.chunk_times, r.prompt_tokens, r.output_tokens = 0.01, 0.04, [0.01, 0.02, 0.04], 8, 4
        return r

    with runner._Flusher(store, spool, run_id, progress) as flusher:
        for i in range(10):
            flusher.add(rec(i))
        time.sleep(runner.PROGRESS_EVERY_S * 2.5)
        assert sum(shown) == 8 and threads == {"qwen3lab-flush"}  # the 2 warm-ups are not progress
        assert store.requests([run_id], measured_only=False).empty  # nothing written during the load
        flusher.flush()  # what run_trial does right after the load; the exit must not write them twice
        flusher.add(rec(10))
    stored = store.requests([run_id], measured_only=False)
    assert sorted(stored.idx) == list(range(11)) and sum(shown) == 9
    assert sorted(r["idx"] for r in spool.read().requests) == list(range(11))  # the spool has each one once
