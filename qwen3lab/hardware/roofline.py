"""Roofline ceilings on decode and prefill speed of one configuration on one GPU.

The roofline bounds one decode step (or one prefill) op by op: each op must move its bytes through memory and
do its FLOPs on the tensor cores, so it takes at least max(bytes / bandwidth, FLOPs / rate); the ops run one
after another, so the step takes at least their sum. That sum is never below the whole-step bound
max(all bytes / bandwidth, all FLOPs / rate), which is also reported. Under `emulate` the ceilings stay the
target card's: only memory is emulated.

Imports stay light (no pydantic, no torch) so calibration runs on a bare GPU machine.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from qwen3lab.hardware.catalogue import GpuSpec, get_gpu
from qwen3lab.hardware.memory import (WeightBytes, activation_bytes, kv_dtype_bytes, linear_shapes, weight_bytes,
                                      weight_dtype)
from qwen3lab.models import ModelInfo


@dataclass(frozen=True)
class Op:
    """One kernel-sized piece of a forward pass: bytes it must move, FLOPs it must do, on which unit."""

    name: str
    bytes: float
    flops: float = 0.0
    unit: str = "memory"  # "gemm": tensor rate of the weights' dtype; "bf16": 16-bit tensor rate; "memory": none


@dataclass(frozen=True)
class Limits:
    """A device's ceilings: memory bandwidth and dense tensor rates, from a datasheet or measured."""

    bandwidth_gbs: float
    gemm_tflops: float  # for the linear layers, at the weights' compute dtype
    attention_tflops: float  # 16-bit
    source: str

    @classmethod
    def of(cls, gpu: GpuSpec, wdtype: str, profile: dict | None = None) -> "Limits":
        """Datasheet ceilings; with a calibration profile, the measured copy bandwidth and BF16 matrix rate."""
        if profile:
            bf16 = profile["matmul_bf16_tflops"]
            scale = gpu.matmul_tflops(wdtype) / gpu.bf16_tflops  # FP8 tensor rate relative to BF16, per datasheet
            return cls(profile["copy_bandwidth_gbs"], bf16 * scale, bf16, "measured (qwen3lab calibrate)")
        return cls(gpu.bandwidth_gbs, gpu.matmul_tflops(wdtype), gpu.bf16_tflops, "datasheet")


def _layer_ops(info: ModelInfo, tokens: int, wbytes: dict[str, float], kv_b: int, ctx: float,
               attn_flops: float, kv_read: float) -> list[Op]:
    """One decoder layer over `tokens` tokens; `kv_read` bytes of cached K/V read by attention."""
    a = activation_bytes(info)
    h, d, q_heads, kv_heads, inter = info.hidden_size, info.head_dim, info.num_heads, info.num_kv_heads, info.intermediate_size
    ops = [Op("input_layernorm", 2 * tokens * h * a)]
    for name, k, n in linear_shapes(info):
        ops.append(Op(name, wbytes[name] + tokens * (k + n) * a, 2.0 * tokens * k * n, "gemm"))
        if name == "qkv_proj":
            ops += [Op("qk_norm_rope", 2 * tokens * (q_heads + kv_heads) * d * a),
                    Op("kv_cache_write", tokens * 2 * kv_heads * d * (a + kv_b)),
                    Op("attention", kv_read + tokens * (q_heads * d * 2 * a), attn_flops, "bf16")]
        elif name == "o_proj":
            ops.append(Op("residual_add_norm", 3 * tokens * h * a))
        elif name == "gate_up_proj":
            ops.append(Op("silu_and_mul", tokens * 3 * inter * a))
        elif name == "down_proj":
            ops.append(Op("residual_add", 3 * tokens * h * a))
    return ops


def _weight_bytes_by_layer(info: ModelInfo, w: WeightBytes) -> dict[str, float]:
    shapes = linear_shapes(info)
    per_param = (w.linear_bytes + w.scale_bytes) / w.linear_params
    return {name: k * n * per_param for name, k, n in shapes}


def decode_ops(info: ModelInfo, batch: int, context: float, quantization: str | None = None,
               kv_cache_dtype: str | None = None) -> list[Op]:
    """Ops of one decode step: `batch` sequences, each attending over `context` cached tokens."""
    w = weight_bytes(info, quantization)
    wb = _weight_bytes_by_layer(info, w)
    kv_b, a = kv_dtype_bytes(info, kv_cache_dtype), activation_bytes(info)
    d, kvh, qh = info.head_dim, info.num_kv_heads, info.num_heads
    kv_read = batch * context * 2 * kvh * d * kv_b
    attn_flops = 4.0 * batch * qh * d * context  # QK^T and PV
    ops = [Op("embed", batch * info.hidden_size * a)]
    for _ in range(info.num_layers):
        ops += _layer_ops(info, batch, wb, kv_b, context, attn_flops, kv_read)
    lm = info.vocab_size * info.hidden_size
    ops += [Op("final_norm", 2 * batch * info.hidden_size * a),
            Op("lm_head", w.lm_head_bytes + w.embed_bytes * info.tie_word_embeddings + batch * (info.hidden_size * a + info.vocab_size * 4),
               2.0 * batch * lm, "bf16")]  # lm_head stays 16 bit
    return ops


def prefill_ops(info: ModelInfo, prompt_tokens: int, quantization: str | None = None,
                kv_cache_dtype: str | None = None) -> list[Op]:
    """Ops of one whole-prompt prefill of a single sequence (causal attention; logits of the last token only)."""
    w = weight_bytes(info, quantization)
    wb = _weight_bytes_by_layer(info, w)
    kv_b, a = kv_dtype_bytes(info, kv_cache_dtype), activation_bytes(info)
    t, d = prompt_tokens, info.head_dim
    kv_read = t * 2 * info.num_kv_heads * d * a  # this prompt's own K and V, read once by flash attention
    attn_flops = 2.0 * info.num_heads * d * t * t  # QK^T and PV over the causal half
    ops = [Op("embed", t * info.hidden_size * a)]
    for _ in range(info.num_layers):
        ops += _layer_ops(info, t, wb, kv_b, t, attn_flops, kv_read)
    ops += [Op("final_norm", 2 * t * info.hidden_size * a),
            Op("lm_head", w.lm_head_bytes + info.hidden_size * a + info.vocab_size * 4,
               2.0 * info.vocab_size * info.hidden_size, "bf16")]
    return ops


def _op_times(op: Op, limits: Limits) -> tuple[float, float]:
    """(seconds to move its bytes, seconds to do its FLOPs) for one op."""
    rate = {"gemm": limits.gemm_tflops, "bf16": limits.attention_tflops}.get(op.unit)
    return op.bytes / (limits.bandwidth_gbs * 1e9), op.flops / (rate * 1e12) if rate else 0.0


def roofline(ops: list[Op], limits: Limits) -> dict:
    """Lower bounds on the time of ops run one after another: op by op (`seconds`), and as one (`seconds_whole`)."""
    times = [_op_times(op, limits) for op in ops]
    per_op = [max(t) for t in times]
    memory_part = sum(m for m, c in times if m >= c)
    t_mem, t_flops = sum(m for m, _ in times), sum(c for _, c in times)
    return {"seconds": sum(per_op), "seconds_whole": max(t_mem, t_flops), "memory_seconds": t_mem,
            "compute_seconds": t_flops, "bytes": sum(op.bytes for op in ops), "flops": sum(op.flops for op in ops),
            "bound": "memory" if memory_part >= sum(per_op) / 2 else "compute", "limits": asdict(limits)}


def decode_ceiling(info: ModelInfo, gpu: str | GpuSpec, batch: int, context: float,
                   quantization: str | None = None, kv_cache_dtype: str | None = None,
                   profile: dict | None = None) -> dict:
    """The fastest a decode step can run: step seconds, tokens/s over the batch, and per stream."""
    spec = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu)
    limits = Limits.of(spec, weight_dtype(info, quantization), profile)
    r = roofline(decode_ops(info, batch, context, quantization, kv_cache_dtype), limits)
    return r | {"batch": batch, "context": context, "step_ms": r["seconds"] * 1e3,
                "tokens_per_s": batch / r["seconds"], "per_stream_tokens_per_s": 1 / r["seconds"]}


def prefill_ceiling(info: ModelInfo, gpu: str | GpuSpec, prompt_tokens: int, quantization: str | None = None,
                    kv_cache_dtype: str | None = None, profile: dict | None = None) -> dict:
    """The fastest one prompt can be prefilled: seconds (a floor on TTFT) and prompt tokens/s."""
    spec = gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu)
    limits = Limits.of(spec, weight_dtype(info, quantization), profile)
    r = roofline(prefill_ops(info, prompt_tokens, quantization, kv_cache_dtype), limits)
    return r | {"prompt_tokens": prompt_tokens, "ms": r["seconds"] * 1e3, "tokens_per_s": prompt_tokens / r["seconds"]}


