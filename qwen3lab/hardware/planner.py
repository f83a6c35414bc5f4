"""Pre-flight's plan of a trial and the CLI's plan table: memory fit and KV capacity (hardware/memory.py) with
roofline ceilings at the workload's batch and lengths (hardware/roofline.py)."""
from __future__ import annotations

from typing import Any

from qwen3lab.hardware.catalogue import GiB, get_gpu
from qwen3lab.hardware.memory import config_field, gib_text, plan_memory, with_engine_dtype
from qwen3lab.hardware.roofline import decode_ceiling, prefill_ceiling
from qwen3lab.models import ModelInfo, model_info


def _mean_lengths(workload: Any) -> tuple[float, float] | None:
    """Mean prompt and output tokens of a workload's mix."""
    if workload is None:
        return None
    from qwen3lab.measure import workload as wl

    classes = wl.resolve_mix(workload)
    total = sum(c.weight for c in classes)
    mid = lambda v: float(v) if isinstance(v, int) else (v[0] + v[1]) / 2  # noqa: E731
    return (sum(c.weight * mid(c.prompt_tokens) for c in classes) / total,
            sum(c.weight * mid(c.output_tokens) for c in classes) / total)


def plan_trial(cfg: Any, info: ModelInfo, gpu_id: str, workload: Any = None, env: dict | None = None) -> dict:
    """Pre-flight's plan of one trial: memory fit and KV capacity (always), decode and prefill ceilings at the
    workload's batch and lengths (on a GPU). Keys: kv_capacity_tokens, does_not_fit, summary, memory, ..."""
    info = with_engine_dtype(info, cfg)
    plan = plan_memory(cfg, info, gpu_id, env=env)
    out: dict[str, Any] = {"device": plan.device, "kv_capacity_tokens": plan.kv_capacity_tokens,
                           "does_not_fit": plan.does_not_fit, "memory": plan.to_dict()}
    if emulate := config_field(cfg, "emulate"):
        out["emulated"] = {"gpu": emulate, "figures": "memory: vLLM's budget capped to this card's "
                           "gpu_memory_utilization x total (fit, KV capacity); ceilings are this card's",
                           "not_emulated": "measured speed (bandwidth, compute, kernels) is the host GPU's; memory "
                           "outside the budget (CUDA graphs, context) is not capped"}
    free = f"KV {gib_text(max(plan.kv_bytes, 0))} = {plan.kv_capacity_tokens:,} tokens ({plan.max_concurrency:.1f}x {plan.max_model_len:,})"
    if gpu_id == "cpu":
        out["summary"] = f"{free}; {plan.basis['kv']}"
        return out
    out["summary"] = (f"emulating {plan.device_name}: " if emulate else "") + \
        f"weights {gib_text(plan.weights.total)} {plan.weights.dtype}, {free}"
    lengths = _mean_lengths(workload)
    if lengths and not plan.does_not_fit:
        prompt, output = lengths
        batch = min(getattr(workload, "concurrency", None) or plan.max_num_seqs, plan.max_num_seqs)
        q, kv = config_field(cfg, "quantization"), plan.kv_cache_dtype
        dec = decode_ceiling(info, gpu_id, batch, prompt + output / 2, q, kv)
        pre = prefill_ceiling(info, gpu_id, max(int(prompt), 1), q, kv)
        out |= {"decode_ceiling": dec, "prefill_ceiling": pre}
        out["summary"] += (f"; ceiling at batch {batch}: {dec['tokens_per_s']:,.0f} tok/s "
                           f"({dec['per_stream_tokens_per_s']:.0f}/stream), TTFT >= {pre['ms']:.0f} ms")
    return out


QWEN3_14B_VARIANTS = {"bf16": "builtin:qwen3-14b", "fp8": "builtin:qwen3-14b-fp8", "awq": "builtin:qwen3-14b-awq"}
TABLE_LENS = (8192, 32768, 40960, 131072)


class _Cfg:
    """The few EngineConfig fields a plan reads, for tables that need no pydantic."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def plan_table(gpu_id: str, model: str = "qwen3-14b", context: int = 2048, lens: tuple[int, ...] = TABLE_LENS,
               batches: tuple[int, ...] = (1, 64), concurrency_context: int = 8192) -> list[dict]:
    """One row per quantization x KV dtype x max_model_len: fits or not, KV capacity, most sequences of
    `concurrency_context` tokens at once, and decode ceilings at `batches` with `context` tokens each."""
    from qwen3lab.errors import SpecError

    gpu = get_gpu(gpu_id)
    variants = QWEN3_14B_VARIANTS if model in ("qwen3-14b", "Qwen/Qwen3-14B") else {"checkpoint": model}
    rows = []
    for quant, source in variants.items():
        info = model_info(source)
        if info is None:
            raise SpecError("model", model, "qwen3-14b, a builtin:NAME, a local folder or a cached hub id",
                            "download the model's config.json, or pass its folder")
        for kv in ("auto", "fp8"):
            for max_len in lens:
                plan = plan_memory(_Cfg(kv_cache_dtype=kv, max_model_len=max_len), info, gpu)
                conc, limit = plan.concurrency_at(concurrency_context)
                row = {"gpu": gpu.id, "model": source, "quantization": quant, "weights": plan.weights.dtype,
                       "kv_cache_dtype": "fp8" if kv == "fp8" else "fp16" if info.torch_dtype in ("float16", "half") else "bf16",
                       "max_model_len": max_len, "needs_yarn": max_len > info.max_position_embeddings, "fits": plan.does_not_fit is None,
                       "does_not_fit": plan.does_not_fit, "weights_gib": plan.weights.total / GiB,
                       "kv_gib": max(plan.kv_bytes, 0) / GiB, "kv_capacity_tokens": plan.kv_capacity_tokens,
                       f"concurrency_at_{concurrency_context}": conc, "concurrency_limited_by": limit,
                       "context": context}
                for b in batches:
                    dec = decode_ceiling(info, gpu, b, context, None, kv)
                    row[f"decode_tok_s_b{b}"] = dec["tokens_per_s"]
                    row[f"decode_fits_b{b}"] = plan.concurrency_at(context)[0] >= b
                rows.append(row)
    return rows


