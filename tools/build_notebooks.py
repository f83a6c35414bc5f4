"""Write notebooks/*.ipynb from the cells below, so the workbook is reviewed here, as code, and stays consistent.

    python tools/build_notebooks.py           # rewrite every notebook (no outputs, no execution counts)
    python tools/build_notebooks.py --check   # exit 1 if a committed notebook differs from what this writes

Every notebook: a `parameters` cell first (papermill), the question, calls into qwen3lab.workbook, then Plotly
figures from qwen3lab.analysis.plots. Chapter notebooks share one skeleton; only their analysis cells differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks"

CHAPTER_PARAMS = '''\
experiment = "experiments/cpu-tiny.yaml"  # experiment file: one per GPU (see experiments/)
chapter = "{chapter}"  # the chapter of that file this notebook runs
db = "qwen3lab.duckdb"  # DuckDB file every run is written to
runs_dir = "runs"  # server logs: runs/<run_id>/server.log
notebook_path = None  # where this executed notebook is saved (the sweep sets it; stored with every run)
num_requests = None  # small-run override of workload.num_requests (None: the experiment's own)
warmup_requests = None  # small-run override of workload.warmup_requests
max_trials = None  # launch at most this many servers (skipped and resumed trials cost nothing)
retry_failed = False  # run again trials that failed, ran out of memory or crashed earlier{extra}'''

SETUP = '''\
from qwen3lab.analysis import plots
from qwen3lab import workbook

workbook.chdir_repo()
ch = workbook.open_chapter(experiment, chapter, db=db, runs_dir=runs_dir, notebook_path=notebook_path,
                           num_requests=num_requests, warmup_requests=warmup_requests{extra})
ch.header()'''

PLAN = '''\
# Every trial of the chapter: its exact launch command and its pre-flight verdict (nothing launched yet).
ch.plan()'''

RUN = '''\
# Run what is not measured yet (resume: finished trials are not run again); every run goes to the DuckDB file.
ch.run(max_trials=max_trials, retry_failed=retry_failed)
ch.table()'''

COMPARE = '''\
ok = ch.ok_runs()
plots.pareto_figure(ok)'''

EFFECTS = '''\
# Each trial against the chapter's baseline: relative change with a 95% interval (Welch's t over launches).
# A trial with no comparable baseline has a row saying why.
effects = ch.effects()
display(workbook.claims_table(effects))
plots.effects_figure(effects, "goodput")'''

VERDICT = '''\
# The chapter's answer in words: the winner card's wording (qwen3lab.analysis.wording).
ch.verdict()'''

CDF = '''\
plots.cdf_figure(ch.requests(), "{metric}", ch.labels)'''

SERVER_SERIES = '''\
plots.timeseries_figure(ch.samples("vllm"), ch.labels, plots.SERVER_SERIES)'''


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str, tags: list[str] | None = None):
    cell = new_code_cell(text.strip())
    if tags:
        cell.metadata["tags"] = tags
    return cell


def chapter_notebook(number: str, chapter: str, title: str, intro: str, analysis: list, params_extra: str = "",
                     setup_extra: str = "") -> nbformat.NotebookNode:
    cells = [
        code(CHAPTER_PARAMS.format(chapter=chapter, extra=params_extra), tags=["parameters"]),
        md(f"# {number} · {title}\n\n{intro.strip()}"),
        code(SETUP.format(extra=setup_extra)),
        md("## The trials and their pre-flight verdicts"),
        code(PLAN),
        md("## Run them"),
        code(RUN),
        md("## The answer"),
        *analysis,
        md("## Verdict"),
        code(VERDICT),
    ]
    return notebook(cells)


def notebook(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding gives the same file
    return nb


ENVIRONMENT = notebook([
    code('''\
experiment = "experiments/cpu-tiny.yaml"  # the experiment whose trials "what fits" is judged for
python = None  # the vLLM build to describe: a python executable or venv (None: the one running this kernel)''',
         tags=["parameters"]),
    md('''\
# 00 · Environment

What this machine is and what the vLLM build on it is: GPUs (driver, CUDA, compute capability, which NUMA node
each sits on), CPU, memory, NUMA topology, vLLM and torch versions; then what fits on the experiment's GPU.
On a machine with no GPU it says so: the embedded default runs vLLM's CPU build instead.'''),
    code('''\
import qwen3lab
from qwen3lab import workbook

workbook.chdir_repo()
print(f"qwen3lab {qwen3lab.__version__} from {qwen3lab.__file__}")
env = workbook.environment(python)
tables = workbook.environment_tables(env)
workbook.say("**No NVIDIA GPU here**: " + env["no_gpu_reason"] + ". Trials run on vLLM's CPU build."
                        if not env["gpus"] else f"**{len(env['gpus'])} GPU(s)** seen through NVML.")'''),
    md("## Machine"),
    code('tables["machine"]'),
    md("## NUMA topology (and which node each GPU sits on)"),
    code('''\
display(tables["numa"])
workbook.say("One NUMA node: binding cannot change anything on this host (see 70_numa)."
                        if env["numa_nodes"] == 1 else f"{env['numa_nodes']} NUMA nodes.")'''),
    md("## GPUs"),
    code('tables["gpus"]'),
    md("## The vLLM build"),
    code('tables["build"]'),
    md('''\
## What fits, and the ceilings

From the planner (`qwen3lab.hardware.planner.plan_trial`): memory fit and KV capacity of every trial of the experiment on
its GPU (for the CPU experiment: the Qwen3-14B checkpoints on an A100 80GB and an RTX 4090), and on a GPU the
roofline ceilings at the trial's batch and lengths: decode tokens/s (bytes each step reads over the bandwidth,
or FLOPs over the tensor rate, whichever is slower) and the TTFT floor. Each run's efficiency against them is on
the dashboard's Compare page (Roofline tab).'''),
    code('workbook.what_fits(experiment)'),
])

BASELINE = chapter_notebook("10", "baseline", "Baseline: vLLM's defaults", '''
vLLM's defaults for the chosen GPU: the reference every other chapter compares against. A flag left unset is
vLLM's default, so the baseline trial's launch command has no tuning flags at all. The GPU experiments also
carry the blog recipes' launch commands here, verbatim where valid, so the recipe is measured, not believed.''', [
    code(COMPARE),
    code(CDF.format(metric="ttft")),
    code(CDF.format(metric="tpot")),
    code('plots.class_figure(ch.requests(), ch.labels, "ttft")'),
    code(SERVER_SERIES),
    code(EFFECTS),
])

QUANTIZATION = chapter_notebook("20", "quantization", "Quantization and KV cache dtype", '''
BF16 against FP8 (the pre-quantized checkpoint and online `--quantization fp8`) against AWQ (the AWQ checkpoint,
kernel chosen by vLLM), crossed with the KV cache dtype (auto vs fp8). FP8 KV needs an attention backend with
FP8 KV support: on Ampere (sm80) and Ada (sm89) FlashAttention 2 has none, so vLLM picks FLASHINFER or
TRITON_ATTN. FP8 weights on an A100 run weight-only (W8A16, Marlin); an RTX 4090 computes in FP8 (W8A8).''', [
    md("### Which attention backend and weight kernel each combination needs (pre-flight's rules)"),
    code("workbook.backend_table(ch.trials)"),
    code(COMPARE),
    code(CDF.format(metric="tpot")),
    code(EFFECTS),
    code('''\
ch.say("On vLLM's CPU build only the KV cache dtype can be measured (FP8 KV needs a CPU with AVX-512 or AMX): "
       "FP8 and AWQ weight kernels need a GPU, so those trials are stored as skipped with the reason.") \
    if ch.machine.device == "cpu" else None'''),
])

BLOCK_SIZE = chapter_notebook("30", "block_size", "KV block size", '''
Tokens per KV cache block: 16 / 32 / 64 on the GPU (FLASH_ATTN and TRITON_ATTN: any multiple of 16; FLASHINFER:
16, 32 or 64), multiples of 32 on vLLM's CPU backend (default 128 there). The A100 recipe claims 32 "matches
Qwen3's RoPE base 10000": Qwen3's rope_theta is 1,000,000, and the block size is a memory-paging unit; measure it.''', [
    code(COMPARE),
    code(CDF.format(metric="tpot")),
    code(CDF.format(metric="ttft")),
    code(EFFECTS),
])

SCHEDULER = chapter_notebook("40", "scheduler", "Scheduler: batch caps and CUDA graphs", '''
`--max-num-seqs` (most sequences in one batch), `--max-num-batched-tokens` (token budget per step; chunked
prefill is always on in V1) and CUDA graphs / torch.compile against `--enforce-eager`. The A100 recipe sets
max_num_seqs 128 and enforce_eager; eager mode usually slows decode on a GPU. On the CPU there are no CUDA graphs,
but enforce_eager still turns off torch.compile.''', [
    code(COMPARE),
    code(CDF.format(metric="ttft")),
    code(CDF.format(metric="itl")),
    code(SERVER_SERIES),
    code(EFFECTS),
])

PREFIX_CACHE = chapter_notebook("50", "prefix_cache", "Prefix caching", '''
Automatic prefix caching on against off (`--no-enable-prefix-caching`), over workloads where a fraction of the
requests share one prefix. The hit rate is read from vLLM's own counters: the increase of
`vllm:prefix_cache_hits_total` over the increase of `vllm:prefix_cache_queries_total` during each run.''', [
    code('''\
rates = workbook.prefix_hit_rates(ch.runs(with_json=True), ch.samples("vllm"))
rates'''),
    code('plots.bar_figure(rates, "trial", "hit rate", "Prefix cache hit rate (vLLM counters)", "hits / queries")'),
    code(CDF.format(metric="ttft")),
    code(COMPARE),
    code(EFFECTS),
])

ATTENTION = chapter_notebook("60", "attention_and_builds", "Attention backends and vLLM builds", '''
Attention backends (FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION where the build has them) and two or more
vLLM builds side by side. A build is a python executable or venv (`engine.python`): another vLLM version, a
source build, a rebuilt kernel. vLLM bundles its own FlashAttention, so `pip install flash-attn` (the A100
recipe's "rebuild") does not change vLLM's speed: "comparing FlashAttention builds" means comparing vLLM builds.''',
    [
    code('''\
builds = ch.table()
# attention_backend and flash_attn_version: what each server logged it ran, not only what the trial asked for
builds[[c for c in ("trial", "status", "reason", "vllm_version", "attention_backend", "flash_attn_version",
                    "output_throughput", "p95_ttft_ms", "run_id") if c in builds]] if not builds.empty else builds'''),
    code('''\
runs = ch.runs()
pythons = runs.python_executable.dropna().unique() if "python_executable" in runs else []
ch.say("Builds measured: " + (", ".join(f"`{p}`" for p in pythons) or "none yet") + ". "
       + ("They are the **same build** (one python, one vLLM): the comparison checks the mechanism, not a speed-up."
          if len(set(map(str, pythons))) <= 1 else ""))'''),
    code(COMPARE),
    code(CDF.format(metric="tpot")),
    code(EFFECTS),
])

NUMA = chapter_notebook("70", "numa", "NUMA binding", '''
No binding against `numactl --cpunodebind=N --membind=N` against vLLM's own `--numa-bind` (in vLLM since 2026,
PR 38635; it pins GPU workers to their GPU's node). The A100 recipe claims 15-22 ms less TTFT from binding. On a
host with one NUMA node the comparison cannot show anything: every binding is the same binding.''', [
    code('''\
from qwen3lab.hardware import catalogue as hardware

nodes = hardware.numa_nodes()
display(nodes)
ch.say(f"**This host has {len(nodes)} NUMA node(s).** " + ("The comparison cannot show anything here: the numbers "
       "below only check that each launch works." if len(nodes) == 1 else ""))'''),
    code(COMPARE),
    code(CDF.format(metric="ttft")),
    code(EFFECTS),
])

LONG_CONTEXT = chapter_notebook("80", "long_context", "Long context with YaRN", '''
Qwen3-14B's native window is 32768 tokens (max_position_embeddings 40960); 64k and 128k need YaRN:
`--hf-overrides '{"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings":
32768, "rope_theta": 1000000}, "max_position_embeddings": 131072}'` (factor 2.0 and 65536 for 64k). vLLM 0.32
takes a YaRN model's max_position_embeddings as already scaled, so it must be raised beside rope_parameters.
Without YaRN vLLM refuses a longer max_model_len, which is what the A100 recipe's bare `--max-model-len 131072`
does. Here: throughput and TTFT for long documents, and the KV memory each window costs.''', [
    code('''\
memory = workbook.long_context_memory(ch.runs(with_json=True))
memory'''),
    code('plots.prompt_length_figure(ch.requests(), ch.labels, "ttft")'),
    code('plots.class_figure(ch.requests(), ch.labels, "ttft")'),
    code(COMPARE),
    code(EFFECTS),
])

ROUTING = chapter_notebook("82", "routing", "Routing: one server or two behind the router", '''
The A100 recipe's central trick: two vLLM instances on one GPU, short prompts to one tuned for latency and long
documents to one started with a long context, behind a small proxy claimed to add about 3 ms while keeping
short-request TTFT low. Here the same traffic (the recipe's 30% chat / 40% summaries / 30% long documents) goes
to one server, to two behind `qwen3lab router` split by prompt tokens (`engine.topology: {kind: split}`), and to
the same two in round-robin, so the effect of routing is told apart from the effect of having two servers. Per
request class: which server answered, TTFT, TPOT and goodput. The router's own cost is measured from short
requests sent straight to the short server and through the router, in pairs.''', [
    code('''\
# Per trial and class: the route that served it (stored with every request), TTFT/TPOT percentiles, goodput.
workbook.routing_table(ch.runs(with_json=True), ch.requests())'''),
    code('''\
# What the router itself adds to TTFT (paired: the same requests straight to the short server and through it).
workbook.router_cost(ch.runs(with_json=True))'''),
    code('plots.class_figure(ch.requests(), ch.labels, "ttft")'),
    code(CDF.format(metric="ttft")),
    code(EFFECTS),
])

THINKING = chapter_notebook("85", "thinking_mode", "Thinking mode", '''
Qwen3's thinking mode on against off, per request through `chat_template_kwargs: {"enable_thinking": ...}`
on the chat endpoint. The A100 recipe's `<think>` in the prompt and `guided_decoding` do not switch modes.
Output length, TTFT and E2EL, thinking on and off. With random (dummy) weights and a fixed max_tokens the output
length is the same by construction: only a real checkpoint without ignore_eos shows how much longer thinking is.''',
    [
    code('''\
thinking = workbook.thinking_table(ch.runs(with_json=True), ch.requests())
thinking'''),
    code('plots.request_box_figure(ch.requests(), ch.labels, "output_tokens", "Output tokens per request", "tokens")'),
    code('plots.request_box_figure(ch.requests(), ch.labels, "e2el", "E2EL per request", "ms")'),
    code(CDF.format(metric="ttft")),
    code('''\
(ch.say("Dummy weights with ignore_eos: every request generates exactly its max_tokens, so output length cannot "
        "differ here; the prompt differs by the template's empty think block when thinking is off.")
 if all(thinking.get("ignore_eos", [True])) else None)'''),
    code(EFFECTS),
])

SOAK = chapter_notebook("90", "soak", "Soak: stability over time", '''
A stability run for a set duration (the recipes claim 72 hours without a crash; the default here is short; set
`duration_s`). Crashes, out-of-memory ends and re-runs (restarts) from the stored run statuses; latency drift from
per-window percentiles and their trend; memory over time from GPU samples (none on a machine without a GPU) and
vLLM's KV cache usage.''', [
    code('''\
events = workbook.soak_events(ch.store, ch)
events'''),
    code('''\
windows = workbook.soak_windows(ch.requests(), window_s=window_s)
display(windows)
plots.window_figure(windows, ch.labels)'''),
    code('''\
trend = {ch.labels.get(r, r): workbook.drift(w, "p95_e2el_ms") for r, w in windows.groupby("run_id")}
trend'''),
    code('''\
plots.timeseries_figure(ch.samples(), ch.labels, {"vllm:kv_cache_usage_perc": "KV cache usage (0-1)",
                                                   "vllm:num_requests_running": "running requests",
                                                   **plots.GPU_SERIES})'''),
    code('''\
(ch.say("No GPU here: memory over time cannot be shown (no NVML samples); vLLM's KV cache usage is shown instead.")
 if ch.machine.device == "cpu" else None)'''),
], params_extra='''
duration_s = None  # soak length in seconds (None: the experiment's; the recipes claim 72 h, 259200 s)
window_s = 10.0  # width of the latency windows''', setup_extra=", duration_s=duration_s")

REPORT = notebook([
    code('''\
experiment = "experiments/cpu-tiny.yaml"  # the experiment to report on
db = "qwen3lab.duckdb"  # the DuckDB file its runs are in
n_boot = 400  # resamples of each launch's requests for its own noise (the floor of the launch spread)''', tags=["parameters"]),
    md('''\
# 99 · Report

For one experiment: all trials side by side (the current run of each), the winner of each group of comparable
runs (same requests, tokenizer, machine and vLLM build) under the experiment's SLOs with its margin over the
runner-up, and each knob's effect against its chapter's baseline. Intervals are Welch's t over the launches'
figures; verdicts are better / worse / can't tell (Holm-corrected across a chapter; the winner against every
other trial, as the best of N), "can't tell" says what more launches would take, and a trial of one launch gets
no verdict: the launch-to-launch spread is unknown (docs/statistics.md).'''),
    code('''\
from qwen3lab.analysis import plots
from qwen3lab import workbook

workbook.chdir_repo()
rep = workbook.report(experiment, db, n_boot=n_boot)
rep.table()'''),
    md("## Winner under the SLOs"),
    code('''\
display(rep.ranking())
rep.verdict()'''),
    code('plots.pareto_figure(rep.runs[rep.runs.status == "ok"] if not rep.runs.empty else rep.runs)'),
    md("## Each knob against its baseline"),
    code('''\
display(workbook.claims_table(rep.claims))
plots.effects_figure(rep.claims, "goodput") if not rep.claims.empty else None'''),
    code('plots.effects_figure(rep.claims, "output_throughput") if not rep.claims.empty else None'),
])

CAPACITY = notebook([
    code('''\
experiment = "experiments/cpu-tiny.yaml"  # the experiment whose baseline and leading candidates are measured
db = "qwen3lab.duckdb"  # the DuckDB file: the candidates' stored runs, and where every load point goes
runs_dir = "runs"  # server logs: runs/<search_id>/server.log
top = 2  # leading candidates: the trials with the highest stored goodput under the SLOs, beside the baseline
trials = None  # or these trials by name, e.g. ["max-num-seqs-4", "vllm-defaults"]
chapter = None  # or a chapter's trials (`qwen3lab sweep` passes the experiment's capacity chapter)
notebook_path = None  # where this executed notebook is written (qwen3lab sweep sets it)
requests_per_point = None  # closed loop: distinct requests per point (None: workload.capacity's, else num_requests)
max_points = None  # most load points per configuration (None: workload.capacity's, 12 by default)''',
         tags=["parameters"]),
    md('''\
# 95 · Capacity

How much load does each configuration serve within the SLOs? For the baseline and the leading candidates, one
server per configuration stays up while the load (`workload.capacity.axis`: request rate or concurrency) is
doubled to the first failing point and then bisected. Each point is judged on its steady window (arrivals many
request lives long, the ramp-up and the tail judged apart): it fails by flow (served below offered), by a growing
queue, or by the SLO (fewer than `min_attainment` of its requests meet every SLO); a point too short to show a
steady state is transient and decides nothing (docs/capacity.md). Configurations are ranked by capacity, with the
bracket (last passing point, first failing one) as its interval; the last table says why each point passed.'''),
    code('''\
from qwen3lab.analysis import plots
from qwen3lab import workbook

workbook.chdir_repo()
cc = workbook.capacity_chapter(experiment, db, runs_dir, top=top, trials=trials, chapter=chapter,
                               requests_per_point=requests_per_point, max_points=max_points)
cc.table()'''),
    md("## Latency against offered load (star: capacity; dotted: the SLO)"),
    code('plots.load_curve_figure(cc.points(), cc.searches(), "p95_ttft_ms", cc.limit("p95_ttft_ms"))'),
    code('plots.load_curve_figure(cc.points(), cc.searches(), "p95_tpot_ms", cc.limit("p95_tpot_ms"))'),
    md("## Goodput and attainment against offered load"),
    code('plots.load_curve_figure(cc.points(), cc.searches(), "request_goodput")'),
    code('plots.load_curve_figure(cc.points(), cc.searches(), "attainment", cc.limit("attainment"))'),
    md("## Each point's steady window: offered and served rate, queue trend, verdict"),
    code('cc.point_table()'),
])

NOTEBOOKS = {
    "00_environment": ENVIRONMENT, "10_baseline": BASELINE, "20_quantization": QUANTIZATION,
    "30_block_size": BLOCK_SIZE, "40_scheduler": SCHEDULER, "50_prefix_cache": PREFIX_CACHE,
    "60_attention_and_builds": ATTENTION, "70_numa": NUMA, "80_long_context": LONG_CONTEXT,
    "82_routing": ROUTING,
    "85_thinking_mode": THINKING, "90_soak": SOAK, "95_capacity": CAPACITY, "99_report": REPORT,
}


def main(argv: list[str]) -> int:
    OUT.mkdir(exist_ok=True)
    stale = []
    for stem, nb in NOTEBOOKS.items():
        nbformat.validate(nb)
        text = nbformat.writes(nb) + "\n"
        path = OUT / f"{stem}.ipynb"
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run python tools/build_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
