"""What a launch configuration needs and allows on a GPU, before it runs: memory fit, KV capacity, and
roofline ceilings on decode and prefill speed.

Memory follows vLLM 0.32's own accounting (file names below are under vllm/ of that release):
  KV bytes = total x gpu_memory_utilization - weights - runtime buffers - profile-run peak - CUDA graphs
  (v1/worker/gpu_worker.py determine_available_memory; v1/worker/utils.py request_memory)
  blocks   = KV bytes // (block_size x KV bytes per token)         (v1/core/kv_cache_utils.py)
  capacity = blocks / ceil(max_model_len / block_size) x max_model_len, the "KV cache size: N tokens" log line
On vLLM's CPU backend the KV bytes are exactly VLLM_CPU_KVCACHE_SPACE GiB (platforms/cpu.py, cpu_worker.py).
Weights, KV bytes and capacity rules are exact; runtime buffers, the profile-run peak and CUDA-graph memory
are estimates (ESTIMATES below), which is why every real run stores vLLM's own capacity beside the planner's.

The roofline bounds one decode step (or one prefill) op by op: each op must move its bytes through memory and
do its FLOPs on the tensor cores, so it takes at least max(bytes / bandwidth, FLOPs / rate); the ops run one
after another, so the step takes at least their sum. That sum is never below the whole-step bound
max(all bytes / bandwidth, all FLOPs / rate), which is also reported.

Imports stay light (no pydantic, no torch) so calibration runs on a bare GPU machine.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qwen3lab.hardware.catalogue import GiB, GpuSpec, get_gpu, match_gpu
from qwen3lab.models import ModelInfo, model_info

MiB = 2**20

# Estimates, each with why. They are what the planner cannot read from a config; the stored pair
# (planner_kv_tokens, vllm_kv_tokens) of every real run shows how wrong they are.
ESTIMATES = {
    # cuBLAS/cuBLASLt workspaces, sampler and input-batch buffers, block tables: vLLM counts them as consumed
    # memory after its profile run (non_torch_increase + persistent torch allocations).
    "runtime_gib": 0.4,
    # Live bytes per token at the peak of the profile forward pass: the residual, the normed input, the
    # gate_up output (2 x intermediate) and the SiLU-and-mul output (intermediate), all 16 bit.
    "forward_peak_values_per_token": lambda info: 2 * info.hidden_size + 3 * info.intermediate_size,
    # Bytes per logit in the dummy sampler run (gpu_model_runner._dummy_sampler_run): bf16 logits, their fp32
    # copy, fp32 probabilities and fp32 exponential noise; top-k/top-p run in Triton, without a sort, where
    # Triton is present (v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p).
    "sampler_bytes_per_logit": 2 + 4 + 4 + 4,
    # vLLM's CUDA-graph estimate (gpu_model_runner.profile_cudagraph_memory): the largest graph's activations
    # plus a per-graph cost; graphs are captured for FULL and PIECEWISE modes at each capture size.
    "cudagraph_per_graph_mib": 2.0,
}

# vLLM 0.32 defaults (engine/arg_utils.py get_batch_defaults, config/cache.py, platforms/cpu.py).
GPU_MEMORY_UTILIZATION = 0.92
GPU_BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128


def serve_batch_defaults(total_bytes: int, device_name: str, device: str = "cuda") -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that `vllm serve` picks on this device (engine/arg_utils.py)."""
    if device == "cpu":
        return 128, 2048
    if total_bytes >= 160 * GiB:
        return 1024, 16384
    if total_bytes >= 70 * GiB and "a100" not in device_name.lower():
        return 1024, 8192
    return 256, 2048


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """Decode batch sizes vLLM captures by default (config/vllm.py): [1, 2, 4] + 8..248 by 8 + 256.. by 16."""
    largest = min(max_num_seqs * 2, 512, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest] + list(range(8, min(largest + 1, 256), 8))
    return sizes + list(range(256, largest + 1, 16))


# --- bytes ------------------------------------------------------------------------------------------------

def weight_dtype(info: ModelInfo, quantization: str | None = None) -> str:
    """How the linear layers' weights are stored on the GPU: bf16, fp16, fp8 or int4."""
    method = quantization or info.quant_method
    if method in ("fp8", "fbgemm_fp8", "modelopt") or (method == "compressed-tensors" and info.quant_bits == 8):
        return "fp8"
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin") or info.quant_bits == 4:
        return "int4"
    return "fp16" if info.torch_dtype in ("float16", "half") else "bf16"


def activation_bytes(info: ModelInfo) -> int:
    return 4 if info.torch_dtype == "float32" else 2


@dataclass(frozen=True)
class WeightBytes:
    """Weights as they sit in GPU memory; embeddings, lm_head and norms stay 16 bit in every scheme here."""

    dtype: str
    linear_params: int
    linear_bytes: int  # quantized payload of the decoder's linear layers
    scale_bytes: int  # quantization scales and zero points
    embed_bytes: int
    lm_head_bytes: int
    norm_bytes: int

    @property
    def total(self) -> int:
        return self.linear_bytes + self.scale_bytes + self.embed_bytes + self.lm_head_bytes + self.norm_bytes

    @property
    def read_per_step(self) -> int:
        """Bytes a decode step reads: all but an untied embedding table, of which only B rows are gathered."""
        return self.total - (self.embed_bytes if self.lm_head_bytes else 0)


def _linear_shapes(info: ModelInfo) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of one decoder layer's linear layers, fused as vLLM fuses them."""
    h, d, inter = info.hidden_size, info.head_dim, info.intermediate_size
    return [("qkv_proj", h, (info.num_heads + 2 * info.num_kv_heads) * d), ("o_proj", info.num_heads * d, h),
            ("gate_up_proj", h, 2 * inter), ("down_proj", inter, h)]


def weight_bytes(info: ModelInfo, quantization: str | None = None) -> WeightBytes:
    dtype = weight_dtype(info, quantization)
    act = activation_bytes(info)
    linear_params, linear, scales = 0, 0, 0
    group = int(info.quant_group_size or 128)
    for _, k, n in _linear_shapes(info):
        params = k * n
        linear_params += params
        if dtype == "fp8":
            linear += params
            # Block-wise checkpoints (Qwen3-14B-FP8: 128x128) keep one fp32 scale per block; online fp8 one per tensor.
            block = (info.raw.get("quantization_config") or {}).get("weight_block_size")
            scales += 4 * (math.ceil(n / block[0]) * math.ceil(k / block[1]) if block else 1)
        elif dtype == "int4":
            linear += params // 2
            # AWQ: fp16 scales and 4-bit zero points per group of `group` input features (scales, qzeros).
            scales += (k // group) * n * 2 + (k // group) * n // 2
        else:
            linear += params * act
    layers = info.num_layers
    norms = (2 * info.hidden_size + 2 * info.head_dim * info.has_qk_norm) * layers + info.hidden_size
    embed = info.vocab_size * info.hidden_size * act
    return WeightBytes(dtype, linear_params * layers, linear * layers, scales * layers, embed,
                       0 if info.tie_word_embeddings else embed, norms * act)


FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")


def kv_dtype_bytes(info: ModelInfo, kv_cache_dtype: str | None = None) -> int:
    """Bytes per KV element: 1 for fp8 (per-tensor scales only), else the model's dtype ("auto")."""
    if kv_cache_dtype in FP8_KV:
        return 1
    if kv_cache_dtype in ("bfloat16", "float16"):
        return 2
    return activation_bytes(info)


def kv_bytes_per_token(info: ModelInfo, kv_cache_dtype: str | None = None) -> int:
    """layers x (K and V) x kv_heads x head_dim x bytes: 160 KiB for Qwen3-14B in BF16, 80 KiB in FP8."""
    return info.num_layers * 2 * info.num_kv_heads * info.head_dim * kv_dtype_bytes(info, kv_cache_dtype)


# --- memory plan ------------------------------------------------------------------------------------------

@dataclass
class MemoryPlan:
    """Where a GPU's (or the CPU engine's) memory goes under one engine configuration."""

    device: str  # catalogue id, or "cpu"
    device_name: str
    total_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int  # total x gpu_memory_utilization: vLLM's whole budget
    weights: WeightBytes
    runtime_bytes: int
    activation_peak_bytes: int
    cudagraph_bytes: int
    kv_bytes: int  # left for the KV cache (negative when nothing is left)
    kv_bytes_per_token: int
    kv_cache_dtype: str
    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int  # as vLLM logs it: "KV cache size: N tokens"
    max_concurrency: float  # requests at max_model_len, as vLLM logs it
    does_not_fit: str | None
    basis: dict[str, str] = field(default_factory=dict)

    def concurrency_at(self, context_len: int) -> tuple[int, str]:
        """Most sequences of `context_len` tokens that can run at once, and what limits them."""
        usable = max(self.num_blocks - 1, 0)  # vLLM's block pool keeps one null block
        by_kv = usable // math.ceil(context_len / self.block_size)
        return (by_kv, "kv") if by_kv < self.max_num_seqs else (self.max_num_seqs, "max_num_seqs")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["weights"] = asdict(self.weights) | {"total": self.weights.total}
        return out


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _get(cfg: Any, name: str):
    """A field of an EngineConfig, of anything with its attribute names, or of its dict (a stored config)."""
    if isinstance(cfg, dict):
        return cfg.get(name)
    return None if cfg is None else getattr(cfg, name, None)


def _cpu_kv_bytes(cfg: Any, env: dict | None) -> tuple[int | None, str]:
    """VLLM_CPU_KVCACHE_SPACE in GiB (the engine's env over the caller's), as vllm/platforms/cpu.py reads it."""
    value = (_get(cfg, "env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if value is None:
        value = (env if env is not None else os.environ).get("VLLM_CPU_KVCACHE_SPACE")
    if value in (None, ""):
        return None, ("VLLM_CPU_KVCACHE_SPACE unset: vLLM gives the KV cache the NUMA node's memory x "
                      "gpu_memory_utilization minus what the worker already holds (not predicted)")
    try:
        gib = int(value)
    except ValueError:
        from qwen3lab.errors import SpecError

        raise SpecError("engine.env.VLLM_CPU_KVCACHE_SPACE", value, "a whole number of GiB (vLLM reads it with int())",
                        'write e.g. VLLM_CPU_KVCACHE_SPACE: "4"') from None
    return gib * GiB, f"VLLM_CPU_KVCACHE_SPACE={gib} GiB (exact)"


_DTYPES = {"half": "float16", "float": "float32", "float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


def with_engine_dtype(info: ModelInfo, cfg: Any) -> ModelInfo:
    """The model as the engine runs it: `--dtype` (when set) replaces the checkpoint's torch_dtype."""
    dtype = _DTYPES.get(_get(cfg, "dtype") or "auto")
    return info if dtype is None or dtype == info.torch_dtype else replace(info, torch_dtype=dtype)


def plan_memory(cfg: Any, info: ModelInfo, gpu: str | GpuSpec = "a100-80g", env: dict | None = None,
                total_bytes: int | None = None) -> MemoryPlan:
    """The memory plan of one engine configuration (an EngineConfig or anything with its attribute names;
    None = vLLM's defaults) on a catalogue GPU or on "cpu". `total_bytes` overrides the device's total
    (e.g. what this machine's CUDA reports)."""
    on_cpu = gpu == "cpu"
    spec = None if on_cpu else (gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu))
    info = with_engine_dtype(info, cfg)
    quantization = _get(cfg, "quantization")
    kv_dtype = _get(cfg, "kv_cache_dtype") or "auto"
    weights = weight_bytes(info, quantization)
    kv_tok = kv_bytes_per_token(info, kv_dtype)
    util = _get(cfg, "gpu_memory_utilization") or GPU_MEMORY_UTILIZATION
    max_model_len = _get(cfg, "max_model_len") or info.max_position_embeddings
    block = _get(cfg, "block_size") or (CPU_BLOCK_SIZE if on_cpu else GPU_BLOCK_SIZE)
    basis: dict[str, str] = {}
    if on_cpu:
        total = total_bytes or _host_memory_bytes()
        name = "vLLM CPU backend"
    else:
        total = total_bytes or spec.memory_total_bytes
        name = spec.name
        basis["total"] = "given" if total_bytes else ("cuda_total_gib of the catalogue" if spec.cuda_total_gib
                                                      else "marketed size (CUDA's total not catalogued)")
    seqs_default, tokens_default = serve_batch_defaults(total, name, "cpu" if on_cpu else "cuda")
    max_num_seqs = _get(cfg, "max_num_seqs") or seqs_default
    max_tokens = _get(cfg, "max_num_batched_tokens") or min(tokens_default, max_num_seqs * max_model_len)
    if not _get(cfg, "max_num_seqs"):
        max_num_seqs = min(max_num_seqs, max_tokens)
    requested = math.ceil(total * util)
    runtime = activation = cudagraph = 0
    if on_cpu:
        kv, why = _cpu_kv_bytes(cfg, env)
        basis["kv"] = why
        if kv is None:  # auto: node memory x utilization - the worker's RSS (roughly the weights and ~1 GiB)
            kv = requested - weights.total - GiB
            basis["kv"] += "; estimated as RAM x gpu_memory_utilization - weights - 1 GiB"
    else:
        runtime = int(ESTIMATES["runtime_gib"] * GiB)
        act_b = activation_bytes(info)
        forward = max_tokens * ESTIMATES["forward_peak_values_per_token"](info) * act_b
        sampler_rows = min(max_num_seqs, max_tokens)
        sampler = sampler_rows * info.vocab_size * ESTIMATES["sampler_bytes_per_logit"] + max_tokens * info.hidden_size * act_b
        activation = max(forward, sampler)
        if not _get(cfg, "enforce_eager"):
            sizes = cudagraph_capture_sizes(max_num_seqs, max_tokens)
            cudagraph = int(max(sizes) * ESTIMATES["forward_peak_values_per_token"](info) * act_b
                            + 2 * len(sizes) * ESTIMATES["cudagraph_per_graph_mib"] * MiB)
        kv = requested - weights.total - runtime - activation - cudagraph
        basis |= {"weights": "exact from config.json", "runtime": "estimate", "activation_peak": "estimate",
                  "cudagraph": "estimate" if cudagraph else "none (enforce_eager)", "kv": "what is left"}
    bytes_per_block = block * kv_tok
    num_blocks = max(kv // bytes_per_block, 0)
    blocks_per_request = math.ceil(max_model_len / block)
    concurrency = num_blocks / blocks_per_request
    plan = MemoryPlan(
        device="cpu" if on_cpu else spec.id, device_name=name, total_bytes=total, gpu_memory_utilization=util,
        requested_bytes=requested, weights=weights, runtime_bytes=runtime, activation_peak_bytes=activation,
        cudagraph_bytes=cudagraph, kv_bytes=kv, kv_bytes_per_token=kv_tok, kv_cache_dtype=kv_dtype,
        block_size=block, num_blocks=num_blocks, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_tokens, kv_capacity_tokens=int(concurrency * max_model_len),
        max_concurrency=concurrency, does_not_fit=None, basis=basis)
    plan.does_not_fit = _why_not(plan, info, on_cpu)
    return plan


def _why_not(plan: MemoryPlan, info: ModelInfo, on_cpu: bool) -> str | None:
    """A sentence with the numbers and the fix, when vLLM would refuse to start (None when it fits)."""
    budget = f"{_gib(plan.total_bytes)} x {plan.gpu_memory_utilization:g}"
    w = plan.weights
    label = {"bf16": "BF16", "fp16": "FP16", "fp8": "FP8", "int4": "4-bit"}[w.dtype]
    if not on_cpu and w.total > plan.requested_bytes:
        fix = ("use FP8 (Qwen/Qwen3-14B-FP8, or quantization: fp8) or AWQ (Qwen/Qwen3-14B-AWQ)"
               if w.dtype in ("bf16", "fp16") else "use a smaller quantization or a larger GPU")
        return f"{label} weights {_gib(w.total)} > {budget} = {_gib(plan.requested_bytes)} usable: {fix}"
    # vLLM needs one request at max_model_len, plus the null block (v1/core/kv_cache_utils.py get_kv_cache_configs).
    need_blocks = math.ceil(plan.max_model_len / plan.block_size) + 1
    if plan.num_blocks < need_blocks:
        fits_len = max(plan.num_blocks - 1, 0) * plan.block_size
        where = ("VLLM_CPU_KVCACHE_SPACE" if on_cpu else
                 f"{budget} = {_gib(plan.requested_bytes)} minus weights {_gib(w.total)} and "
                 f"{_gib(plan.runtime_bytes + plan.activation_peak_bytes + plan.cudagraph_bytes)} of buffers")
        if plan.kv_bytes <= 0:
            return (f"no memory left for the KV cache ({where}): use a smaller quantization, lower "
                    "max_num_batched_tokens, or raise gpu_memory_utilization")
        fixes = [f"lower max_model_len to {fits_len:,} or less"]
        if plan.kv_cache_dtype not in FP8_KV:
            fixes.append("use kv_cache_dtype: fp8 (half the bytes)")
        if on_cpu:
            fixes.append("raise VLLM_CPU_KVCACHE_SPACE")
        else:
            fixes.append("raise gpu_memory_utilization" + {"bf16": " or quantize the weights (FP8, AWQ)", "fp16": " or quantize "
                         "the weights (FP8, AWQ)", "fp8": " or use AWQ weights"}.get(w.dtype, ""))
        return (f"KV cache {_gib(plan.kv_bytes)} ({where}) holds {plan.num_blocks * plan.block_size:,} tokens, "
                f"fewer than one request at max_model_len {plan.max_model_len:,} needs "
                f"({_gib(plan.max_model_len * plan.kv_bytes_per_token)}): " + ", or ".join(fixes))
    return None


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


# --- roofline ---------------------------------------------------------------------------------------------

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
    qkv = (q_heads + 2 * kv_heads) * d
    ops = [Op("input_layernorm", 2 * tokens * h * a)]
    for name, k, n in _linear_shapes(info):
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
    shapes = _linear_shapes(info)
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


# --- what pre-flight, the CLI and the dashboard call ------------------------------------------------------

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
    free = f"KV {_gib(max(plan.kv_bytes, 0))} = {plan.kv_capacity_tokens:,} tokens ({plan.max_concurrency:.1f}x {plan.max_model_len:,})"
    if gpu_id == "cpu":
        out["summary"] = f"{free}; {plan.basis['kv']}"
        return out
    out["summary"] = f"weights {_gib(plan.weights.total)} {plan.weights.dtype}, {free}"
    lengths = _mean_lengths(workload)
    if lengths and not plan.does_not_fit:
        prompt, output = lengths
        batch = min(getattr(workload, "concurrency", None) or plan.max_num_seqs, plan.max_num_seqs)
        q, kv = _get(cfg, "quantization"), plan.kv_cache_dtype
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
