"""What a launch configuration needs on a GPU (or vLLM's CPU engine) before it runs: weight and KV bytes,
memory fit and KV capacity, following vLLM's own accounting (per version where it differs; ACCOUNTING).

vLLM 0.26 (measured on an H200, Qwen3-14B, dummy weights: vllm-facts.md "On a GPU"):
  KV bytes = total x gpu_memory_utilization - weights - peak activation - non-torch memory
  (v1/worker/gpu_worker.py determine_available_memory, after the profile run); CUDA graphs are captured
  AFTER the KV cache is allocated, outside that budget (0.48-1.13 GiB beyond it).
vLLM 0.32 (the CPU engine here; gpu_model_runner.profile_cudagraph_memory) also takes an estimate of the CUDA
  graphs' memory off the KV budget.
  blocks   = KV bytes // (block_size x KV bytes per token)         (v1/core/kv_cache_utils.py)
  capacity = blocks / ceil(max_model_len / block_size) x max_model_len, the "KV cache size: N tokens" log line
On vLLM's CPU backend the KV bytes are exactly VLLM_CPU_KVCACHE_SPACE GiB (platforms/cpu.py, cpu_worker.py).
Weights, KV bytes and capacity rules are exact; the peak activation, non-torch memory and the online-FP8
loading overhead are fitted to vLLM's start-up lines (ACCOUNTING), which is why every real run stores vLLM's
own capacity beside the planner's.

Imports stay light (no pydantic, no torch) so calibration runs on a bare GPU machine.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qwen3lab.hardware.catalogue import GiB, GpuSpec, get_gpu
from qwen3lab.models import ModelInfo

MiB = 2**20


@dataclass(frozen=True)
class Accounting:
    """How one vLLM version sizes its KV cache, and the figures fitted to what it logged."""

    version: str
    cudagraphs_in_kv_budget: bool  # True: an estimate of the graphs' memory is taken off the KV budget
    non_torch_gib: float  # "X GiB for non-torch memory": cuBLAS workspaces, NCCL, the CUDA context's growth
    # "peak activation" of the profile run = a base (torch.compile's piecewise graphs and the sampler's
    # buffers: it does not move with max_num_seqs) + a part per scheduled token (max_num_batched_tokens), in
    # units of the (2 x hidden + 3 x intermediate) 16-bit values a token holds at the MLP's peak.
    activation_base_gib: float
    activation_per_forward_value: float
    eager_activation_saving_gib: float  # --enforce-eager (no torch.compile) peaks lower
    # Online FP8 (--quantization fp8 of a 16-bit checkpoint) keeps about one decoder layer's 16-bit linear
    # weights allocated after loading (15.86 GiB used against 15.20 GiB of FP8 payload on Qwen3-14B).
    online_fp8_extra_layers: float
    # AWQ through Marlin holds more than its int4 payload, scales and zero points: in decoder layers' worth
    # of int4 linear weights (9.62 GiB used against 9.30 GiB computed on Qwen3-14B-AWQ).
    awq_marlin_extra_layers: float
    source: str


ACCOUNTING = {
    # Fitted to vLLM 0.26.0's start-up lines on an H200 (experiments/results/h200-qwen3-14b.duckdb): BF16
    # weights 27.52 GiB, peak activation 1.61 GiB at 8192 batched tokens and 1.49 GiB at 2048 (1.14 GiB
    # eager), non-torch 0.22 GiB, KV 99.27 GiB = 650,560 tokens; online FP8 weights 15.86 GiB, AWQ 9.62 GiB.
    "0.26": Accounting(
        "0.26", False, 0.22, 1.45, 0.168, 0.47, 1.0, 2.07,
        "vLLM 0.26.0 on an H200, Qwen3-14B (dummy weights): peak activation 1.61 GiB at 8192 batched tokens, "
        "1.49 GiB at 2048, 1.14 GiB eager (1.06 GiB when torch.compile artifacts come from the cache), "
        "non-torch 0.22 GiB; online FP8 weights 15.86 GiB, AWQ 9.62 GiB"),
    "0.32": Accounting(
        "0.32", True, 0.22, 1.45, 0.168, 0.47, 1.0, 2.07,
        "vLLM 0.32 source (gpu_worker.determine_available_memory with profile_cudagraph_memory); the fitted "
        "figures are 0.26's (no GPU run of 0.32 yet)"),
}
# The version GPU plans follow unless told: the one seen on a GPU (the kit's build for torch 2.11 + CUDA 13).
DEFAULT_GPU_VLLM = os.environ.get("QWEN3LAB_GPU_VLLM_VERSION", "0.26")
# vLLM's own estimate of the graphs' size (0.32): the largest graph's activations plus a cost per graph;
# graphs are captured for FULL and PIECEWISE modes at each capture size.
CUDAGRAPH_PER_GRAPH_MIB = 2.0


def accounting_for(vllm_version: str | None) -> Accounting:
    """The accounting of the newest listed version at or below `vllm_version` (default DEFAULT_GPU_VLLM)."""
    want = _version_tuple(vllm_version or DEFAULT_GPU_VLLM)
    known = sorted(ACCOUNTING, key=_version_tuple)
    older = [v for v in known if _version_tuple(v) <= want]
    return ACCOUNTING[older[-1] if older else known[0]]


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def forward_values_per_token(info: ModelInfo) -> int:
    """16-bit values live per token at the profile forward pass's peak: the residual, the normed input, the
    gate_up output (2 x intermediate) and the SiLU-and-mul output (intermediate)."""
    return 2 * info.hidden_size + 3 * info.intermediate_size


# vLLM defaults (engine/arg_utils.py get_batch_defaults, config/cache.py, platforms/cpu.py).
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
    loading_overhead_bytes: int = 0  # held after loading but never read (online FP8's 16-bit leftovers)

    @property
    def total(self) -> int:
        return (self.linear_bytes + self.scale_bytes + self.embed_bytes + self.lm_head_bytes + self.norm_bytes
                + self.loading_overhead_bytes)

    @property
    def read_per_step(self) -> int:
        """Bytes a decode step reads: all but an untied embedding table, of which only B rows are gathered."""
        return self.total - self.loading_overhead_bytes - (self.embed_bytes if self.lm_head_bytes else 0)


def linear_shapes(info: ModelInfo) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of one decoder layer's linear layers, fused as vLLM fuses them."""
    h, d, inter = info.hidden_size, info.head_dim, info.intermediate_size
    return [("qkv_proj", h, (info.num_heads + 2 * info.num_kv_heads) * d), ("o_proj", info.num_heads * d, h),
            ("gate_up_proj", h, 2 * inter), ("down_proj", inter, h)]


def weight_bytes(info: ModelInfo, quantization: str | None = None) -> WeightBytes:
    dtype = weight_dtype(info, quantization)
    act = activation_bytes(info)
    linear_params, linear, scales = 0, 0, 0
    group = int(info.quant_group_size or 128)
    for _, k, n in linear_shapes(info):
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


def with_loading_overhead(w: WeightBytes, info: ModelInfo, quantization: str | None, acct: Accounting) -> WeightBytes:
    """Weights as vLLM reports them after loading: online FP8 of a 16-bit checkpoint also holds about one
    decoder layer's 16-bit linear weights, AWQ through Marlin about two layers' int4 ones (fitted)."""
    params = sum(k * n for _, k, n in linear_shapes(info))  # one decoder layer's linear weights
    if w.dtype == "fp8" and quantization == "fp8" and not info.quant_method:
        return replace(w, loading_overhead_bytes=int(acct.online_fp8_extra_layers * params * activation_bytes(info)))
    if w.dtype == "int4" and (quantization or info.quant_method) in ("awq", "awq_marlin"):
        return replace(w, loading_overhead_bytes=int(acct.awq_marlin_extra_layers * params // 2))
    return w


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


def gib_text(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def config_field(cfg: Any, name: str):
    """A field of an EngineConfig, of anything with its attribute names, or of its dict (a stored config)."""
    if isinstance(cfg, dict):
        return cfg.get(name)
    return None if cfg is None else getattr(cfg, name, None)


def _cpu_kv_bytes(cfg: Any, env: dict | None) -> tuple[int | None, str]:
    """VLLM_CPU_KVCACHE_SPACE in GiB (the engine's env over the caller's), as vllm/platforms/cpu.py reads it."""
    value = (config_field(cfg, "env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
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
    dtype = _DTYPES.get(config_field(cfg, "dtype") or "auto")
    return info if dtype is None or dtype == info.torch_dtype else replace(info, torch_dtype=dtype)


def plan_memory(cfg: Any, info: ModelInfo, gpu: str | GpuSpec = "a100-80g", env: dict | None = None,
                total_bytes: int | None = None, vllm_version: str | None = None) -> MemoryPlan:
    """The memory plan of one engine configuration (an EngineConfig or anything with its attribute names;
    None = vLLM's defaults) on a catalogue GPU or on "cpu". `total_bytes` overrides the device's total
    (e.g. what this machine's CUDA reports)."""
    on_cpu = gpu == "cpu"
    spec = None if on_cpu else (gpu if isinstance(gpu, GpuSpec) else get_gpu(gpu))
    info = with_engine_dtype(info, cfg)
    quantization = config_field(cfg, "quantization")
    kv_dtype = config_field(cfg, "kv_cache_dtype") or "auto"
    weights = weight_bytes(info, quantization)
    if not on_cpu:
        weights = with_loading_overhead(weights, info, quantization, accounting_for(vllm_version))
    kv_tok = kv_bytes_per_token(info, kv_dtype)
    util = config_field(cfg, "gpu_memory_utilization") or GPU_MEMORY_UTILIZATION
    max_model_len = config_field(cfg, "max_model_len") or info.max_position_embeddings
    block = config_field(cfg, "block_size") or (CPU_BLOCK_SIZE if on_cpu else GPU_BLOCK_SIZE)
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
    max_num_seqs = config_field(cfg, "max_num_seqs") or seqs_default
    max_tokens = config_field(cfg, "max_num_batched_tokens") or min(tokens_default, max_num_seqs * max_model_len)
    if not config_field(cfg, "max_num_seqs"):
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
        acct = accounting_for(vllm_version)
        runtime = int(acct.non_torch_gib * GiB)
        activation = int((acct.activation_base_gib - (acct.eager_activation_saving_gib
                                                      if config_field(cfg, "enforce_eager") else 0)) * GiB
                         + max_tokens * forward_values_per_token(info) * activation_bytes(info)
                         * acct.activation_per_forward_value)
        if not config_field(cfg, "enforce_eager"):
            sizes = cudagraph_capture_sizes(max_num_seqs, max_tokens)
            cudagraph = int(max(sizes) * forward_values_per_token(info) * activation_bytes(info)
                            + 2 * len(sizes) * CUDAGRAPH_PER_GRAPH_MIB * MiB)
        kv = requested - weights.total - runtime - activation - (cudagraph if acct.cudagraphs_in_kv_budget else 0)
        basis |= {"accounting": f"vLLM {acct.version}: {acct.source}",
                  "weights": "exact from config.json" + (" + loading overhead (fitted)"
                                                         if weights.loading_overhead_bytes else ""),
                  "runtime": f"non-torch memory {acct.non_torch_gib} GiB (fitted)",
                  "activation_peak": f"{acct.activation_base_gib} GiB + {max_tokens:,} batched tokens x "
                                     f"{acct.activation_per_forward_value} x (2 hidden + 3 intermediate) 16-bit "
                                     "values (fitted)",
                  "cudagraph": ("none (enforce_eager)" if not cudagraph else
                                "estimate, taken off the KV budget" if acct.cudagraphs_in_kv_budget else
                                "estimate, captured after the KV cache (outside gpu_memory_utilization)"),
                  "kv": "what is left"}
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
    budget = f"{gib_text(plan.total_bytes)} x {plan.gpu_memory_utilization:g}"
    w = plan.weights
    label = {"bf16": "BF16", "fp16": "FP16", "fp8": "FP8", "int4": "4-bit"}[w.dtype]
    if not on_cpu and w.total > plan.requested_bytes:
        fix = ("use FP8 (Qwen/Qwen3-14B-FP8, or quantization: fp8) or AWQ (Qwen/Qwen3-14B-AWQ)"
               if w.dtype in ("bf16", "fp16") else "use a smaller quantization or a larger GPU")
        return f"{label} weights {gib_text(w.total)} > {budget} = {gib_text(plan.requested_bytes)} usable: {fix}"
    # vLLM needs one request at max_model_len, plus the null block (v1/core/kv_cache_utils.py get_kv_cache_configs).
    need_blocks = math.ceil(plan.max_model_len / plan.block_size) + 1
    in_budget_graphs = plan.cudagraph_bytes if "taken off" in plan.basis.get("cudagraph", "") else 0
    if plan.num_blocks < need_blocks:
        fits_len = max(plan.num_blocks - 1, 0) * plan.block_size
        where = ("VLLM_CPU_KVCACHE_SPACE" if on_cpu else
                 f"{budget} = {gib_text(plan.requested_bytes)} minus weights {gib_text(w.total)} and "
                 f"{gib_text(plan.runtime_bytes + plan.activation_peak_bytes + in_budget_graphs)} of buffers")
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
        return (f"KV cache {gib_text(plan.kv_bytes)} ({where}) holds {plan.num_blocks * plan.block_size:,} tokens, "
                f"fewer than one request at max_model_len {plan.max_model_len:,} needs "
                f"({gib_text(plan.max_model_len * plan.kv_bytes_per_token)}): " + ", or ".join(fixes))
    return None


def emulated_utilization(target: str | GpuSpec, utilization: float | None, host_total_bytes: int) -> float:
    """--gpu-memory-utilization on the host that gives vLLM the target card's budget (target total x its
    utilization), so what fits, and how much KV is left, is the target's. Raises when the host is smaller."""
    spec = target if isinstance(target, GpuSpec) else get_gpu(target)
    budget = spec.memory_total_bytes * (utilization or GPU_MEMORY_UTILIZATION)
    if budget > host_total_bytes:
        from qwen3lab.errors import SpecError

        raise SpecError("engine.emulate", spec.id, f"a GPU smaller than this one ({gib_text(host_total_bytes)})",
                        "emulate a smaller card, or run on the target itself")
    return math.floor(budget / host_total_bytes * 1e6) / 1e6  # rounded down: never above the target's budget


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


