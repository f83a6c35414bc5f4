"""Ceilings and efficiency of stored runs: a run's measured speed against the roofline of its GPU."""
from __future__ import annotations

from typing import Any

from qwen3lab.hardware.catalogue import GpuSpec, match_gpu
from qwen3lab.hardware.memory import with_engine_dtype
from qwen3lab.hardware.roofline import decode_ceiling, prefill_ceiling
from qwen3lab.models import model_info


def _run_gpu(run: dict) -> GpuSpec | None:
    """The catalogued GPU a stored run ran on (from its machine probe, else its `gpu` column)."""
    names = [g.get("name", "") for g in ((run.get("info") or {}).get("machine") or {}).get("gpus") or []]
    for name in [*names, run.get("gpu") or ""]:
        if name and (spec := match_gpu(name)):
            return spec
    return None


def run_ceiling(run: dict, samples: Any = None, profile: dict | None = None) -> dict:
    """Ceilings and efficiency (measured / ceiling) for one stored run, as `Store.run(run_id)` returns it.

    The batch is the mean of vllm:num_requests_running over the run's samples when given (a DataFrame of the
    run's `samples` rows), else the workload's concurrency. Context is the mean prompt plus half the mean
    output. Returns {"available": False, "why": ...} where a ceiling cannot be drawn (CPU runs, unknown GPUs).
    """
    gpu = _run_gpu(run)
    config = run.get("config") or {}
    if gpu is None:
        where = run.get("gpu") or ""
        why = ("the run does not record its GPU" if not where
               else "the run used vLLM's CPU engine, which has no roofline here" if "CPU" in where
               else f"{where} is not in the GPU catalogue (qwen3lab.hardware.catalogue.CATALOGUE)")
        return {"available": False, "why": why}
    info = model_info(config.get("model") or run.get("model") or "")
    summary = run.get("summary") or {}
    done = summary.get("completed") or 0
    if info is None or not done:
        return {"available": False, "why": "model architecture unknown here" if info is None else "no completed requests"}
    info = with_engine_dtype(info, config)
    prompt = summary["total_input_tokens"] / done
    output = summary["total_output_tokens"] / done
    batch, batch_source = None, "workload concurrency"
    if samples is not None and len(samples):
        running = samples[samples["name"] == "vllm:num_requests_running"]["value"]
        if len(running) and running.mean() > 0:
            batch, batch_source = float(running.mean()), "mean vllm:num_requests_running"
    if batch is None:
        batch = float((run.get("workload") or {}).get("concurrency") or 1)
    q, kv = config.get("quantization"), config.get("kv_cache_dtype")
    dec = decode_ceiling(info, gpu, max(round(batch), 1), prompt + output / 2, q, kv, profile)
    pre = prefill_ceiling(info, gpu, max(int(prompt), 1), q, kv, profile)
    out = {"available": True, "gpu": gpu.id, "batch": batch, "batch_source": batch_source, "context": prompt + output / 2,
           "limits": dec["limits"], "decode_step_ms_ceiling": dec["step_ms"],
           "output_tok_s_ceiling": batch / dec["seconds"], "ttft_ms_ceiling": pre["ms"], "bound": dec["bound"]}
    measured_tput = summary.get("output_throughput")
    tpot = summary.get("median_tpot_ms")
    ttft = summary.get("median_ttft_ms")
    out["output_tok_s"] = measured_tput
    out["output_efficiency"] = measured_tput / out["output_tok_s_ceiling"] if measured_tput else None
    out["tpot_efficiency"] = dec["step_ms"] / tpot if tpot else None
    out["ttft_efficiency"] = pre["ms"] / ttft if ttft else None
    return out
