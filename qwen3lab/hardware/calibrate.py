"""Measure this GPU and hold the planner's roofline against it.

Microbenchmarks give the machine's own limits: device-to-device copy bandwidth (bytes read plus bytes
written), a large BF16 matrix product's rate, the time of one tiny kernel replayed inside a CUDA graph (the
floor under every launch), and weight streaming through GEMVs of shapes the model does not have. Then a
Qwen3-14B-shaped decode step (random BF16 weights, a KV cache of `context` tokens per sequence, CUDA graphs)
is timed at each batch size, fused like vLLM's (torch.compile, flash attention) and eager, and compared
with two predictions from the planner's op list (see `predict_decode`).

No constant is fitted to the decode timings: the limits come from their own microbenchmarks and the kernel
count from the profiler. Run: `qwen3lab calibrate` or `python -m qwen3lab.hardware.calibrate --json` (needs only
torch and this package's planner, so it runs on a bare GPU machine).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone

from qwen3lab.hardware import memory, roofline
from qwen3lab.hardware.catalogue import GiB, match_gpu, probe_gpus, save_profile
from qwen3lab.models import ModelInfo, model_info

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TARGET_ERROR = 0.15


def _torch():
    try:
        import torch
    except ImportError as exc:
        from qwen3lab.errors import MissingDependency

        raise MissingDependency("torch", "pip install torch (a CUDA build; calibrate measures the local GPU)") from exc
    if not torch.cuda.is_available():
        from qwen3lab.errors import Qwen3LabError

        raise Qwen3LabError("calibrate needs a CUDA GPU, and torch sees none here (torch.cuda.is_available() is False)")
    return torch


def _time_ms(torch, fn, repeat: int = 20, warmup: int = 3) -> list[float]:
    """Device time of each of `repeat` calls, in ms, after `warmup` untimed calls (CUDA events)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def measure_copy_bandwidth(torch, gib: float = 4.0) -> dict:
    """Device-to-device copy of `gib` GiB: (bytes read + bytes written) / time, GB/s."""
    n = int(gib * GiB) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(torch, lambda: dst.copy_(src))
    med = statistics.median(ms)
    return {"copy_bandwidth_gbs": 2 * n * 2 / (med * 1e-3) / 1e9, "copy_bytes": 2 * n * 2, "copy_ms": ms}


def measure_read_bandwidth(torch, gib: float = 4.0) -> dict:
    """A sum over `gib` GiB: bytes read / time, GB/s (reported beside the copy figure; not used to predict)."""
    x = torch.randn(int(gib * GiB) // 2, dtype=torch.bfloat16, device="cuda")
    ms = _time_ms(torch, lambda: x.sum(dtype=torch.float32))
    out = {"read_bandwidth_gbs": x.numel() * 2 / (statistics.median(ms) * 1e-3) / 1e9}
    return out


def measure_matmul(torch, n: int = 8192) -> dict:
    """BF16 (and, where torch can, FP8) n x n x n products on random data: dense TFLOP/s."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    ms = _time_ms(torch, lambda: a @ b)
    out = {"matmul_bf16_tflops": 2 * n**3 / (statistics.median(ms) * 1e-3) / 1e12, "matmul_n": n, "matmul_ms": ms}
    try:  # FP8 tensor cores (sm89+): reported only; the decode step here is BF16
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        ms8 = _time_ms(torch, lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        out["matmul_fp8_tflops"] = 2 * n**3 / (statistics.median(ms8) * 1e-3) / 1e12
    except Exception as exc:  # noqa: BLE001 - no FP8 on this card or this torch
        out["matmul_fp8_tflops"] = None
        out["matmul_fp8_why_not"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def measure_kernel_floor(torch, kernels: int = 512) -> dict:
    """Seconds per tiny kernel (an in-place add on one hidden-state row) replayed in a CUDA graph."""
    x = torch.randn(5120, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1e-3)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1e-3)
    ms = _time_ms(torch, graph.replay)
    return {"kernel_floor_us": statistics.median(ms) * 1e3 / kernels, "kernel_floor_kernels": kernels}


def measure_gemv(torch, columns: int = 4096, rows=(8192, 32768, 131072, 262144), gib_per_size: float = 2.0) -> dict:
    """Weight streaming as decode does it, on shapes not in the model: one input row against weights of
    64 MiB to 2 GiB, each size replayed in a CUDA graph over distinct weights (none left in L2). A line
    through the four points, t = overhead + bytes / bandwidth, gives both constants."""
    F = torch.nn.functional
    x = torch.randn(1, columns, dtype=torch.bfloat16, device="cuda")
    points = []
    for n in rows:
        size = n * columns * 2
        weights = [torch.randn(n, columns, dtype=torch.bfloat16, device="cuda") for _ in range(max(2, int(gib_per_size * GiB // size)))]
        for w in weights:
            F.linear(x, w)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in weights:
                F.linear(x, w)
        ms = statistics.median(_time_ms(torch, graph.replay))
        points.append({"bytes": size, "us": ms * 1e3 / len(weights), "gemvs": len(weights)})
        del graph, weights
        torch.cuda.empty_cache()
    n = len(points)
    mx = sum(p["bytes"] for p in points) / n
    my = sum(p["us"] for p in points) / n
    slope = (sum((p["bytes"] - mx) * (p["us"] - my) for p in points) / sum((p["bytes"] - mx) ** 2 for p in points))
    return {"gemv_bandwidth_gbs": 1e-3 / slope, "gemv_overhead_us": my - slope * mx, "gemv_points": points}


class Qwen3DecodeStep:
    """One decode step of a Qwen3 decoder in plain torch: random BF16 weights, a KV cache of `context`
    tokens per sequence for up to `max_batch` sequences, the layers and shapes of `info`.

    Ways to run it over the same weights: `fused` (like vLLM: the pieces between attentions compiled by
    torch.compile, compiled on first use), `eager` (one kernel per torch op) and `fused_flash`. Attention is
    two batched GEMMs around a softmax except in `fused_flash`; the KV write is eager in all."""

    def __init__(self, torch, info: ModelInfo, max_batch: int, context: int, seed: int = 0, device: str = "cuda"):
        self.torch, self.info, self.context = torch, info, context
        F = torch.nn.functional
        self.F = F
        gen = torch.Generator(device=device).manual_seed(seed)
        h, d, qh, kvh, inter = info.hidden_size, info.head_dim, info.num_heads, info.num_kv_heads, info.intermediate_size

        def rand(*shape, std=0.02):  # random, never zeros (zeros run faster on tensor cores)
            return torch.randn(*shape, dtype=torch.bfloat16, device=device, generator=gen) * std

        # Linear weights as vLLM keeps them: [out, in], applied with F.linear (x @ W.T).
        self.layers = [{
            "qkv": rand((qh + 2 * kvh) * d, h), "o": rand(h, qh * d), "gate_up": rand(2 * inter, h),
            "down": rand(h, inter), "ln1": 1 + rand(h), "ln2": 1 + rand(h),
            "q_norm": (1 + rand(d)) / math.sqrt(d), "k_norm": 1 + rand(d),  # q_norm carries 1/sqrt(d)
        } for _ in range(info.num_layers)]
        self.embed = rand(info.vocab_size, h)
        self.lm_head = rand(info.vocab_size, h)
        self.norm = 1 + rand(h)
        cache_shape = (info.num_layers, max_batch, kvh, context, d)
        self.k_cache = torch.empty(cache_shape, dtype=torch.bfloat16, device=device)
        self.v_cache = torch.empty(cache_shape, dtype=torch.bfloat16, device=device)
        for cache in (self.k_cache, self.v_cache):
            for layer in cache:  # a layer at a time: random K/V without a second cache-sized buffer
                layer.normal_(generator=gen)
        pos = torch.arange(d // 2, device=device, dtype=torch.float32)
        angle = (context - 1) / (info.raw.get("rope_theta", 1e6) ** (2 * pos / d))
        self.cos = torch.cat([angle.cos(), angle.cos()]).to(torch.bfloat16)
        self.sin = torch.cat([angle.sin(), angle.sin()]).to(torch.bfloat16)
        self._fused = None

    # -- the pieces --------------------------------------------------------------------------------------
    def _rope(self, x):
        half = x.shape[-1] // 2
        rotated = self.torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin

    def _pre(self, x, ln1, w_qkv, q_norm, k_norm):
        """Input norm, QKV projection, per-head q/k norms and rope: q [b, q_heads, d], k and v [b, kv_heads, d]."""
        F, info = self.F, self.info
        b, d, qh, kvh = x.shape[0], info.head_dim, info.num_heads, info.num_kv_heads
        y = F.rms_norm(x, (info.hidden_size,), ln1, 1e-6)
        q, k, v = F.linear(y, w_qkv).split([qh * d, kvh * d, kvh * d], dim=-1)
        q = self._rope(F.rms_norm(q.view(b, qh, d), (d,), q_norm, 1e-6))
        k = self._rope(F.rms_norm(k.view(b, kvh, d), (d,), k_norm, 1e-6))
        return q, k, v.view(b, kvh, d)

    def _post(self, x, attn, w_o, ln2, w_gate_up, w_down):
        """Output projection and residual, post-attention norm, MLP and residual."""
        F = self.F
        x = x + F.linear(attn.reshape(x.shape[0], -1), w_o)
        gate, up = F.linear(F.rms_norm(x, (self.info.hidden_size,), ln2, 1e-6), w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w_down)

    def _head(self, x):
        logits = self.F.linear(self.F.rms_norm(x, (self.info.hidden_size,), self.norm, 1e-6), self.lm_head)
        return logits.argmax(dim=-1)

    def attention(self, q, k_cache, v_cache):
        """Grouped-query attention of one new token per sequence over its whole cache (the scale is in
        q_norm): each K/V head is read once, by a batched GEMM over (sequence, KV head) whose rows are
        that head's query heads. q: [b, q_heads, d]; caches: [b, kv_heads, context, d]."""
        b, kvh, ctx, d = k_cache.shape
        k3, v3 = k_cache.reshape(b * kvh, ctx, d), v_cache.reshape(b * kvh, ctx, d)
        scores = self.torch.bmm(q.reshape(b * kvh, q.shape[1] // kvh, d), k3.transpose(1, 2))
        return self.torch.bmm(scores.softmax(dim=-1), v3).view(b, q.shape[1], d)

    def flash_attention(self, q, k_cache, v_cache):
        """The same attention through PyTorch's flash kernel (grouped-query heads, no scores in memory)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = self.F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, scale=1.0, enable_gqa=True)
        return out.squeeze(2)

    # -- the step ----------------------------------------------------------------------------------------
    def _run(self, ids, pre, attend, post, head):
        b, pos = ids.shape[0], self.context - 1
        x = self.embed[ids]
        for i, w in enumerate(self.layers):
            q, k, v = pre(x, w["ln1"], w["qkv"], w["q_norm"], w["k_norm"])
            k_cache, v_cache = self.k_cache[i, :b], self.v_cache[i, :b]
            k_cache[:, :, pos] = k
            v_cache[:, :, pos] = v
            x = post(x, attend(q, k_cache, v_cache), w["o"], w["ln2"], w["gate_up"], w["down"])
        return head(x)

    def eager(self, ids):
        """One kernel per torch op (norms, rope pieces, residual adds, silu and mul apart)."""
        return self._run(ids, self._pre, self.attention, self._post, self._head)

    def _compiled(self):
        if self._fused is None:
            compile_ = lambda fn: self.torch.compile(fn, fullgraph=True)  # noqa: E731
            self._fused = (compile_(self._pre), compile_(self._post), compile_(self._head))
        return self._fused

    def fused(self, ids):
        """Like vLLM's step: the pieces between attentions compiled (norms, rope and residuals fused into the
        GEMMs' neighbours), attention reading each K/V head once (vLLM's backends pack a KV head's query
        heads together for decode; so do the batched GEMMs here)."""
        pre, post, head = self._compiled()
        return self._run(ids, pre, self.attention, post, head)

    def fused_flash(self, ids):
        """As `fused`, with PyTorch's flash SDPA for attention. On the H200 it read K/V at half the copy
        bandwidth at batch 512 (each query head reads its K/V head), so it is not the default."""
        pre, post, head = self._compiled()
        return self._run(ids, pre, self.flash_attention, post, head)

    __call__ = eager


def _count_kernels(torch, fn) -> tuple[int | None, dict]:
    """Kernels one call launches, and their device time by kind, read by the profiler (eager, not timed)."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
                   and not e.name.lower().startswith(("memcpy", "memset"))]
    except Exception as exc:  # noqa: BLE001 - the profiler is a diagnostic; prediction then has no floor term
        return None, {"why_not": f"{type(exc).__name__}: {exc}"[:200]}
    kinds: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for e in kernels:
        name = e.name.lower()
        kind = ("gemm" if any(s in name for s in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitk"))
                else "softmax" if "softmax" in name else "other")
        ms = e.device_time_total / 1e3
        kinds[kind] = kinds.get(kind, 0.0) + ms
        entry = by_name.setdefault(e.name[:120], [0, 0.0])
        entry[0] += 1
        entry[1] += ms
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1][1])[:24])
    return len(kernels), {"kernel_ms_by_kind": kinds, "kernel_ms_total": sum(kinds.values()),
                          "kernels_by_name": {k: {"count": c, "ms": ms} for k, (c, ms) in top.items()}}


def time_decode(torch, step, batch: int, vocab_size: int, repeat: int = 20) -> dict:
    """Median device time of one decode step at `batch`, replayed from a CUDA graph; kernel count as well."""
    ids = torch.randint(0, vocab_size, (batch,), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the capture: compiles, and cuBLAS picks kernels and workspaces
        for _ in range(3):
            step(ids)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    kernels, diag = _count_kernels(torch, lambda: step(ids))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(ids)
    ms = _time_ms(torch, graph.replay, repeat=repeat, warmup=3)
    del graph
    torch.cuda.empty_cache()
    quartiles = statistics.quantiles(ms, n=4)
    return {"batch": batch, "measured_ms": statistics.median(ms), "measured_ms_q1": quartiles[0],
            "measured_ms_q3": quartiles[2], "kernels": kernels, **diag}


LINEAR_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


def predict_decode(info: ModelInfo, batch: int, context: int, limits: dict, kernels: int | None) -> dict:
    """Two predictions of one decode step from the planner's op list and the measured limits:
    A: every op at max(bytes / copy bandwidth, FLOPs / matrix rate), plus kernels x kernel floor;
    B: as A, but the linear layers at the GEMV microbenchmark's bandwidth plus its per-GEMV overhead, and
       the kernel floor only for the kernels that are not those layers."""
    rate = limits["matmul_bf16_tflops"] * 1e12
    lim = roofline.Limits(limits["copy_bandwidth_gbs"], limits["matmul_bf16_tflops"], limits["matmul_bf16_tflops"],
                         "measured here")
    ops = roofline.decode_ops(info, batch, context)
    r = roofline.roofline(ops, lim)
    floor_s = limits["kernel_floor_us"] * 1e-6
    n_kernels = kernels or 0
    linear = [op for op in ops if op.name in LINEAR_OPS]
    t_b = sum(max(op.bytes / (limits["gemv_bandwidth_gbs"] * 1e9), op.flops / rate) + limits["gemv_overhead_us"] * 1e-6
              for op in linear)
    t_b += sum(max(op.bytes / (limits["copy_bandwidth_gbs"] * 1e9), op.flops / rate) for op in ops if op.name not in LINEAR_OPS)
    t_b += max(n_kernels - len(linear), 0) * floor_s
    return {"roofline_ms": r["seconds"] * 1e3, "roofline_whole_step_ms": r["seconds_whole"] * 1e3, "bound": r["bound"],
            "predicted_a_ms": (r["seconds"] + n_kernels * floor_s) * 1e3, "predicted_b_ms": t_b * 1e3,
            "kernel_floor_ms": n_kernels * floor_s * 1e3, "step_bytes": r["bytes"], "step_flops": r["flops"]}


JUDGED = ("fused", "predicted_b_ms")  # fixed before the second H200 run: see experiments/calibration/NOTES.md


def calibrate(model: str = "builtin:qwen3-14b", batch_sizes=BATCH_SIZES, context: int = 1024,
              repeat: int = 20, variants=("fused", "eager"),
              log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> dict:
    """Measure this GPU's limits and the decode step at each batch size; predicted vs measured for each."""
    torch = _torch()
    info = model_info(model)
    started = time.time()
    name = torch.cuda.get_device_name()
    spec = match_gpu(name)
    free, total = torch.cuda.mem_get_info()
    gpus, why = probe_gpus()
    log(f"calibrating {name} ({total / GiB:.2f} GiB as CUDA reports it)")
    limits = (measure_copy_bandwidth(torch) | measure_read_bandwidth(torch) | measure_matmul(torch)
              | measure_kernel_floor(torch) | measure_gemv(torch))
    torch.cuda.empty_cache()
    log(f"copy {limits['copy_bandwidth_gbs']:.0f} GB/s, read {limits['read_bandwidth_gbs']:.0f} GB/s, "
        f"GEMV {limits['gemv_bandwidth_gbs']:.0f} GB/s + {limits['gemv_overhead_us']:.2f} us, "
        f"BF16 {limits['matmul_bf16_tflops']:.0f} TFLOP/s, FP8 {limits['matmul_fp8_tflops'] or 0:.0f} TFLOP/s, "
        f"kernel floor {limits['kernel_floor_us']:.2f} us")
    need = max(batch_sizes) * context * memory.kv_bytes_per_token(info) + memory.weight_bytes(info).total
    if need > 0.9 * free:
        from qwen3lab.errors import Qwen3LabError

        raise Qwen3LabError(f"the decode model needs {need / GiB:.1f} GiB, this GPU has {free / GiB:.1f} GiB free: "
                            "pass smaller --batch-sizes or --context")
    step = Qwen3DecodeStep(torch, info, max(batch_sizes), context)
    measured = {}
    for variant in variants:
        rows, t0 = [], time.time()
        for batch in batch_sizes:
            got = time_decode(torch, getattr(step, variant), batch, info.vocab_size, repeat)
            pred = predict_decode(info, batch, context, limits, got["kernels"])
            row = {**got, **pred, "error_a": pred["predicted_a_ms"] / got["measured_ms"] - 1,
                   "error_b": pred["predicted_b_ms"] / got["measured_ms"] - 1,
                   "roofline_error": pred["roofline_ms"] / got["measured_ms"] - 1}
            rows.append(row)
            log(f"{variant} batch {batch:>4}: measured {got['measured_ms']:8.3f} ms; A {pred['predicted_a_ms']:8.3f} "
                f"({row['error_a']:+.1%}), B {pred['predicted_b_ms']:8.3f} ({row['error_b']:+.1%}); roofline "
                f"{row['roofline_error']:+.1%}; {got['kernels']} kernels")
        measured[variant] = {"doc": " ".join(getattr(step, variant).__doc__.split()), "seconds": time.time() - t0,
                             "decode": rows}
    del step
    torch.cuda.empty_cache()
    judged_variant, judged_key = JUDGED if JUDGED[0] in measured else (variants[0], JUDGED[1])
    rows = [dict(r, predicted_ms=r[judged_key], error=r[judged_key] / r["measured_ms"] - 1)
            for r in measured[judged_variant]["decode"]]
    worst = max(abs(r["error"]) for r in rows)
    return {
        "kind": "qwen3lab.calibration", "version": 2, "gpu_name": name, "gpu_id": spec.id if spec else None,
        "cuda_total_gib": total / GiB, "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "seconds": time.time() - started,
        "model": model, "context": context, "repeat": repeat, "gpus": gpus, "nvml": why,
        "copy_bandwidth_gbs": limits["copy_bandwidth_gbs"], "read_bandwidth_gbs": limits["read_bandwidth_gbs"],
        "gemv_bandwidth_gbs": limits["gemv_bandwidth_gbs"], "gemv_overhead_us": limits["gemv_overhead_us"],
        "matmul_bf16_tflops": limits["matmul_bf16_tflops"], "matmul_fp8_tflops": limits["matmul_fp8_tflops"],
        "kernel_floor_us": limits["kernel_floor_us"], "microbenchmarks": limits,
        "datasheet": spec.to_dict() if spec else None,
        "predictions": {"A": " ".join(predict_decode.__doc__.split("A: ")[1].split(";")[0].split()),
                        "B": " ".join(predict_decode.__doc__.split("B: ")[1].split()).rstrip(".")},
        "judged": {"variant": judged_variant, "prediction": judged_key},
        "variants": measured, "decode": rows, "worst_error": worst, "target_error": TARGET_ERROR,
        "within_target": worst <= TARGET_ERROR,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:qwen3-14b")
    parser.add_argument("--context", type=int, default=1024, help="cached tokens per sequence")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--variants", default="fused,eager", help="fused (like vLLM), eager, or both")
    parser.add_argument("--out", help="also write the JSON here (default: this machine's profile)")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout instead of a table")
    args = parser.parse_args(argv)
    result = calibrate(args.model, tuple(int(b) for b in args.batch_sizes.split(",")), args.context, args.repeat,
                       tuple(args.variants.split(",")))
    path = save_profile(result, args.out)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        from rich.console import Console

        from qwen3lab.terminal import calibration_table

        Console().print(calibration_table(result))
        print(f"profile written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
