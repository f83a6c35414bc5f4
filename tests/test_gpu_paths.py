"""One short real run per GPU path (`make test-gpu`; CI has no GPU and skips them all).

Each test serves Qwen3-14B's architecture with dummy weights through upstream vLLM (the tokenizer is made
locally, no hub), runs a few requests of exact lengths and checks what the run stored: every request
completed, the planner's KV capacity within 1% of vLLM's, NVML telemetry joined to the run. About a minute a
test on an H200 once torch.compile's cache is warm (two to three minutes the first time).
"""
from __future__ import annotations

import pytest

from qwen3lab.experiment.spec import EngineConfig, Trial, Workload

pytestmark = pytest.mark.gpu


def _gpu_or_skip() -> str:
    from qwen3lab.hardware import catalogue
    from qwen3lab.measure import engine

    gpus, why = catalogue.probe_gpus()
    if not gpus:
        pytest.skip(why or "no NVIDIA GPU")
    if engine.probe_build().distribution != "vllm":
        pytest.skip("upstream vLLM (the GPU build) is not installed in this python")
    spec = catalogue.match_gpu(gpus[0]["name"])
    if spec is None:
        pytest.skip(f"{gpus[0]['name']} is not in the GPU catalogue: the planner has no total for it")
    return spec.id


ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}  # builds without FlashInfer (the gpu-kit's) need it; harmless else
PATHS = {
    "bf16": dict(model="builtin:qwen3-14b"),
    "fp8-online": dict(model="builtin:qwen3-14b", quantization="fp8"),
    "fp8-checkpoint": dict(model="builtin:qwen3-14b-fp8"),
    "awq": dict(model="builtin:qwen3-14b-awq"),
    "kv-fp8": dict(model="builtin:qwen3-14b", kv_cache_dtype="fp8"),
    "eager": dict(model="builtin:qwen3-14b", enforce_eager=True),
    "block-32": dict(model="builtin:qwen3-14b", block_size=32),
    "emulate-rtx4090-awq": dict(model="builtin:qwen3-14b-awq", emulate="rtx4090", max_model_len=32768),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_short_real_run_per_gpu_path(path, tmp_path):
    gpu = _gpu_or_skip()
    from qwen3lab.measure import runner
    from qwen3lab.store import Store

    engine = EngineConfig(load_format="dummy", env=ENV, **PATHS[path])
    workload = Workload(mix="fixed-128", num_requests=24, concurrency=8, warmup_requests=2, seed=0)
    trial = Trial(experiment="gpu-paths", chapter="gpu", name=path, engine=engine, workload=workload)
    store = Store(tmp_path / "gpu.duckdb")
    result = runner.run_trial(trial, store, tmp_path / "runs", gpu_id=gpu, log=lambda *_: None)
    assert result.status == "ok", result.reason
    run = store.run(result.run_id)
    s = run["summary"]
    assert s["completed"] == 24 and s["failed"] == 0
    assert s["total_output_tokens"] == 24 * 128  # exact lengths: ignore_eos with max_tokens
    assert run["vllm_kv_tokens"] and run["planner_kv_tokens"]
    assert run["planner_kv_tokens"] == pytest.approx(run["vllm_kv_tokens"], rel=0.01), run["info"]["plan"]["memory"]
    assert run["peak_gpu_memory_mib"] and run["peak_gpu_memory_mib"] > 0  # NVML joined to the run
    assert s["opening_burst_requests"] == 8 and "steady_p95_ttft_ms" in s
    if engine.emulate:
        emu = run["info"]["emulation"]
        assert emu["target"] == "rtx4090" and emu["gpu_memory_utilization"] < 0.92
        assert f"{emu['gpu_memory_utilization']}" in " ".join(run["exec_argv"])
