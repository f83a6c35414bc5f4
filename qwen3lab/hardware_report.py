"""Terminal tables (rich) for the hardware commands: `plan`, `calibrate` and `probe`."""
from __future__ import annotations

from rich.table import Table


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n:,}"


def plan_table(rows: list[dict]) -> Table:
    """`qwen3lab plan`: one row per quantization x KV dtype x max_model_len."""
    from qwen3lab.hardware.catalogue import get_gpu

    first = rows[0]
    conc_key = next(k for k in first if k.startswith("concurrency_at_"))
    conc_len = int(conc_key.rsplit("_", 1)[-1])
    batches = [int(k.split("_b")[-1]) for k in first if k.startswith("decode_tok_s_b")]
    gpu = get_gpu(first["gpu"])
    t = Table(title=f"{gpu.name}: {gpu.cuda_total_gib or gpu.memory_gib} GiB, {gpu.bandwidth_gbs:,.0f} GB/s, "
                    f"{gpu.bf16_tflops:g} BF16 TFLOP/s; vLLM defaults")
    for name in ("weights", "KV", "max len", "fits", "weights GiB", "KV GiB", "KV tokens",
                 f"seqs @ {conc_len // 1024}k", *(f"tok/s b={b}" for b in batches)):
        t.add_column(name, justify="left" if name in ("weights", "KV", "fits") else "right")
    for r in rows:
        ok = r["fits"]
        conc = f"{r[conc_key]:,}" + ("=max" if r["concurrency_limited_by"] == "max_num_seqs" else "")
        speeds = [f"{r[f'decode_tok_s_b{b}']:,.0f}" + ("" if ok and r[f"decode_fits_b{b}"] else "*") for b in batches]
        t.add_row(r["quantization"] if r["quantization"] == r["weights"] else f"{r['quantization']} ({r['weights']})",
                  r["kv_cache_dtype"], f"{r['max_model_len']:,}" + (" Y" if r["needs_yarn"] else ""),
                  "[green]yes[/]" if ok else "[red]no[/]", f"{r['weights_gib']:.1f}",
                  f"{r['kv_gib']:.1f}" if ok else "-", _tokens(r["kv_capacity_tokens"]) if ok else "-",
                  conc if ok else "-", *speeds)
    t.caption = (f"KV tokens: vLLM's 'KV cache size' (weights, runtime and CUDA-graph memory estimated). "
                 f"seqs: sequences of {conc_len:,} tokens that fit at once (=max: capped by max_num_seqs). "
                 f"tok/s: roofline ceiling on decode tokens/s over the batch at {first['context']:,} tokens of "
                 "context each (datasheet bandwidth and tensor rate); * = that batch does not fit, or the "
                 "configuration does not start. Y = needs YaRN. Why a row does not fit: --json, does_not_fit.")
    return t


def calibration_table(result: dict) -> Table:
    """`qwen3lab calibrate`: predicted vs measured decode step at each batch size, for each variant."""
    t = Table(title=f"{result['gpu_name']} (measured): copy {result['copy_bandwidth_gbs']:,.0f} GB/s, GEMV "
                    f"{result['gemv_bandwidth_gbs']:,.0f} GB/s + {result['gemv_overhead_us']:.1f} us, BF16 "
                    f"{result['matmul_bf16_tflops']:,.0f} TFLOP/s, kernel floor {result['kernel_floor_us']:.2f} us; "
                    f"decode step of {result['model']}, {result['context']:,} tokens of context")
    for name in ("step", "batch", "measured ms", "roofline ms", "A ms", "A error", "B ms", "B error", "kernels", "bound"):
        t.add_column(name, justify="left" if name == "step" else "right")
    judged = result["judged"]
    for variant, got in result["variants"].items():
        for r in got["decode"]:
            cells = []
            for key in ("a", "b"):
                err = r[f"error_{key}"]
                mark = variant == judged["variant"] and judged["prediction"] == f"predicted_{key}_ms"
                colour = ("green" if abs(err) <= result["target_error"] else "red") if mark else "dim"
                cells += [f"{r[f'predicted_{key}_ms']:.3f}", f"[{colour}]{err:+.1%}[/]"]
            t.add_row(variant, str(r["batch"]), f"{r['measured_ms']:.3f}", f"{r['roofline_ms']:.3f}", *cells,
                      str(r["kernels"]), r["bound"])
    t.caption = (f"A: {' '.join(result['predictions']['A'].split())}. B: {' '.join(result['predictions']['B'].split())}. Judged: {judged['variant']} "
                 f"step, prediction {judged['prediction'].split('_')[1].upper()}; worst error {result['worst_error']:.1%} (target "
                 f"{result['target_error']:.0%}): " + ("within target" if result["within_target"] else "NOT within target"))
    return t


def probe_table(probe: dict) -> Table:
    """`qwen3lab probe`: this machine's CPU, NUMA nodes and GPUs."""
    t = Table(title=f"{probe['host']}: {probe['cpu']}", show_header=False)
    topo = probe.get("cpu_topology") or {}
    t.add_row("CPU", f"{topo.get('sockets')} socket(s), {topo.get('physical_cores')} cores, "
                     f"{topo.get('logical_cpus')} threads ({topo.get('allowed_cpus')} allowed to this process)")
    mem = probe.get("memory_gib")
    t.add_row("memory", f"{mem:.1f} GiB" if mem else "?")
    for node in probe.get("numa") or []:
        gib = f", {node['memory_gib']} GiB" if node.get("memory_gib") else ""
        t.add_row(f"NUMA node {node['node']}", f"CPUs {node['cpus']}{gib}")
    for g in probe.get("gpus") or []:
        link = f"PCIe gen {g.get('pcie_gen')} x{g.get('pcie_width')} (max gen {g.get('pcie_gen_max')} x{g.get('pcie_width_max')})"
        t.add_row(f"GPU {g['index']}", f"{g['name']} ({g.get('catalogue_id') or 'not in the catalogue'}), "
                                      f"{g['memory_total_mib'] / 1024:.1f} GiB, sm{''.join(map(str, g.get('compute_capability') or []))}, "
                                      f"driver {g['driver']} (CUDA {g['cuda_driver']}), SM {g.get('sm_clock_mhz')}/"
                                      f"{g.get('sm_clock_max_mhz')} MHz, {link}, NUMA node {g.get('numa_node')}")
    if not probe.get("gpus"):
        t.add_row("GPU", probe.get("no_gpu_reason") or "none")
    return t


def calibration_markdown(result: dict) -> str:
    """The calibration as markdown, committed beside its JSON (experiments/calibration/<gpu>.md)."""
    judged = result["judged"]
    key = judged["prediction"].split("_")[1].upper()
    lines = [
        f"# Calibration: {result['gpu_name']}",
        "",
        f"Measured {result['measured_at']} with torch {result['torch']} (CUDA {result['cuda_runtime']}), "
        f"`python -m qwen3lab.hardware.calibrate --json` (same as `qwen3lab calibrate`); the numbers are in "
        f"`{result['gpu_id']}.json`, the history of how the method got here in `NOTES.md`.",
        "",
        "| limit (measured here) | value | datasheet |",
        "|---|---|---|",
        f"| CUDA total memory | {result['cuda_total_gib']:.2f} GiB | {(result['datasheet'] or {}).get('memory_gib', '-')} GB (marketed) |",
        f"| copy bandwidth (read + write) | {result['copy_bandwidth_gbs']:,.0f} GB/s | "
        f"{(result['datasheet'] or {}).get('bandwidth_gbs', 0):,.0f} GB/s |",
        f"| GEMV weight streaming | {result['gemv_bandwidth_gbs']:,.0f} GB/s + {result['gemv_overhead_us']:.2f} us per GEMV | |",
        f"| BF16 matrix rate (8192^3) | {result['matmul_bf16_tflops']:,.0f} TFLOP/s | "
        f"{(result['datasheet'] or {}).get('bf16_tflops', '-')} TFLOP/s |",
        f"| FP8 matrix rate (8192^3) | {result['matmul_fp8_tflops'] or 0:,.0f} TFLOP/s | "
        f"{(result['datasheet'] or {}).get('fp8_tflops', '-')} TFLOP/s |",
        f"| kernel floor (tiny kernel in a CUDA graph) | {result['kernel_floor_us']:.2f} us | |",
        "",
        f"Decode step of `{result['model']}` (random BF16 weights, {result['context']:,} cached tokens per "
        "sequence, replayed from a CUDA graph; median of "
        f"{result['repeat']}). Predictions, from the planner's op list and the limits above only:",
        f"- A: {' '.join(result['predictions']['A'].split())}.",
        f"- B: {' '.join(result['predictions']['B'].split())}.",
        "",
        f"Judged: the **{judged['variant']}** step against prediction **{key}**: worst error "
        f"**{result['worst_error']:.1%}**, target {result['target_error']:.0%}: "
        + ("**within target at every batch size**." if result["within_target"] else "**not within target**."),
        "The judged step and prediction were fixed before the run that produced this file; NOTES.md records "
        "every run, those that missed too, and what was changed after each.",
        "",
    ]
    for variant, got in result["variants"].items():
        lines += [f"## {variant}", "", got["doc"], "",
                  "| batch | measured ms | roofline ms | A ms | A error | B ms | B error | kernels |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in got["decode"]:
            lines.append(f"| {r['batch']} | {r['measured_ms']:.3f} | {r['roofline_ms']:.3f} | {r['predicted_a_ms']:.3f} | "
                         f"{r['error_a']:+.1%} | {r['predicted_b_ms']:.3f} | {r['error_b']:+.1%} | {r['kernels']} |")
        lines.append("")
    return "\n".join(lines)
