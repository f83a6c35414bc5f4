"""Everything the CLI prints (rich): run results, stored runs, dry-run verdicts, the progress of every long
command (one renderer of measure/events), the schema, capacity, search and soak, and the hardware commands' tables
(plan, calibrate, probe). Presentation only: executions never import it."""
from __future__ import annotations

import math

from rich import box
from rich import progress as rich
from rich.table import Table

from qwen3lab.errors import SpecError
from qwen3lab.experiment.spec import SEARCH_OBJECTIVES
from qwen3lab.measure.events import Listener, label
from qwen3lab.sweep import starting_vs_measuring


def _num(v, fmt="{:.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


# "steady p95": TTFT p95 without the opening burst of a closed loop (analysis/metrics.py steady_state).
METRICS = ("ok/\ntotal", "out\ntok/s", "TTFT\np50", "TTFT\np95", "steady\np95", "TPOT\np50", "E2EL\np99", "good-\nput")


def _run_table(title: str, labels: tuple[str, ...]) -> Table:
    """Label columns, the key metrics, then the run id: no vertical rules and two-line headers, so a run's row
    fits in about 110 columns; narrower, the labels fold and the metrics stay whole."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for name in labels:
        t.add_column(name, overflow="fold")
    for name in METRICS:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("run", overflow="fold")
    return t


def _metric_cells(s: dict | None) -> list[str]:
    if not s:
        return ["-"] * len(METRICS)
    total = (s.get("completed") or 0) + (s.get("failed") or 0)
    return [f"{int(s.get('completed') or 0)}/{int(total)}", _num(s.get("output_throughput")),
            _num(s.get("median_ttft_ms"), "{:.0f}"),
            _num(s.get("p95_ttft_ms"), "{:.0f}"), _num(s.get("steady_p95_ttft_ms"), "{:.0f}"), _num(s.get("median_tpot_ms"), "{:.2f}"),
            _num(s.get("p99_e2el_ms"), "{:.0f}"), _num(s.get("request_goodput"), "{:.2f}")]


def _the_same(df, column: str) -> str | None:
    """The one value every row shares, for the title instead of a column."""
    values = set(df[column].dropna().astype(str)) if column in df else set()
    return values.pop() if len(values) == 1 and df[column].notna().all() else None


def results_table(results, db: str) -> Table:
    from qwen3lab.store import Store

    rows = Store(db).runs(run_ids=[r.run_id for r in results], with_json=True)
    by_id = {r["run_id"]: r for r in rows.to_dict("records")} if not rows.empty else {}
    t = _run_table("Results (latencies in ms)", ("trial", "status"))
    for r in results:
        t.add_row(f"{r.trial.chapter}/{r.trial.name}", r.status, *_metric_cells(by_id.get(r.run_id)), r.run_id)
    return t


def _attention(row: dict) -> str | None:
    """The attention backend a run's server logged, with its FlashAttention version: FLASH_ATTN/FA3."""
    backend, fa = row.get("attention_backend"), row.get("flash_attn_version")
    if not isinstance(backend, str):
        return None
    return backend + (f"/FA{int(fa)}" if fa == fa and fa is not None else "")


def runs_table(df) -> Table:
    experiment = None if df.empty else _the_same(df, "experiment")
    vllm = None if df.empty else _the_same(df, "vllm_version")
    if not df.empty and "attention_backend" in df:
        df = df.assign(attention=[_attention(r) for r in df.to_dict("records")])
    attention = None if df.empty else _the_same(df, "attention")
    title = f"{len(df)} runs" + (f" of {experiment}" if experiment else "") + (f", vLLM {vllm}" if vllm else "") \
        + (f", {attention}" if attention else "")
    labels = (() if experiment else ("experiment",)) + ("trial", "status")
    t = _run_table(f"{title} (latencies in ms)", labels)
    if not vllm:
        t.add_column("vLLM")
    if not attention:
        t.add_column("attention")
    if not df.empty and "validity" in df:  # an unreliable measurement says so beside its reason
        df = df.assign(reason=[" · ".join(x for x in (r, v) if isinstance(x, str) and x)
                               for r, v in zip(df.reason, df.validity)])
    reasons = not df.empty and (df.reason.fillna("").astype(str) != "").any()
    if reasons:
        t.add_column("reason", overflow="fold", max_width=40)
    for row in df.to_dict("records") if not df.empty else []:
        cells = ([] if experiment else [str(row.get("experiment"))])
        cells += [f"{row.get('chapter')}/{row.get('trial')}", row["status"], *_metric_cells(row), row["run_id"]]
        cells += [] if vllm else [_num(row.get("vllm_version"), "{}")]
        cells += [] if attention else [_num(row.get("attention"), "{}")]  # NaN where no run logged one
        t.add_row(*cells, *([str(row.get("reason") or "")] if reasons else []))
    return t


def dry_run_table(verdicts, machine) -> Table:
    where = machine.gpu_name or machine.device
    t = Table(title=f"Dry run: {len(verdicts)} trials, judged for {where}", show_lines=True)
    for name in ("chapter", "trial", "pre-flight", "launch command / reason"):
        t.add_column(name, overflow="fold")
    for v in verdicts:
        cfg = v.trial.engine
        cmd = cfg.to_shell() if cfg.kind == "vllm" else f"(endpoint {cfg.url})"
        lines = [cmd]
        if v.skip:
            lines.append(f"[yellow]skip: {v.skip}[/]")
        lines += [f"[red]{e}[/]" for e in v.errors]
        lines += [f"[dim]note: {n}[/]" for n in v.notes]
        if v.plan:
            lines.append(f"[dim]plan: {v.plan.get('summary', '')}[/]")
        colour = {"ok": "green", "skip": "yellow"}.get(v.label, "red")
        t.add_row(v.trial.chapter, v.trial.name, f"[{colour}]{v.label}[/]", "\n".join(lines))
    return t


def print_dry_run(planned, console) -> None:
    """Every planned trial's launch command and verdict, a count per verdict, and whether a run would launch."""
    console.print(dry_run_table(planned.verdicts, planned.machine))
    counts: dict[str, int] = {}
    for v in planned.verdicts:
        counts[v.label] = counts.get(v.label, 0) + 1
    console.print(f"{len(planned.verdicts)} trials: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if planned.errors:
        console.print(f"[bold red]{len(planned.errors)} pre-flight error(s)[/]: a run of this file would launch "
                      "nothing until they are fixed.")


def progress_bar(console) -> rich.Progress:
    """The bar every long command shows. Redrawn once a second (rich's default is 10), and only where someone
    sees it (a terminal, a notebook): the redraw thread shares the GIL and the CPU with the load it reports on,
    and into a pipe or a file it draws nothing until the end anyway."""
    return rich.Progress(rich.TextColumn("{task.description}"), rich.BarColumn(), rich.MofNCompleteColumn(),
                         rich.TimeElapsedColumn(), console=console, transient=False, refresh_per_second=1,
                         auto_refresh=console.is_terminal or console.is_jupyter)


class Progress(Listener):
    """Every long command's progress (run, sweep, capacity, search, soak) from measure/events: one bar for the
    whole, one per unit in flight (a launch, a capacity search, a notebook; the Ray executor runs several at
    once), each event's line printed above them."""

    STATUS_COLOUR = {"ok": "green", "complete": "green", "skipped": "yellow", "held": "yellow",
                     "interrupted": "yellow", "pruned": "yellow", "unbounded": "green"}

    def __init__(self, console):
        self.bar = progress_bar(console)
        # a log line is printed whole (soft_wrap): a terminal folds it, a pipe or a log file keeps it greppable
        super().__init__(log=lambda text: self.bar.console.print(text, markup=False, highlight=False,
                                                                 soft_wrap=True))
        self.overall = None
        self.total: int | None = None
        self.tasks: dict[str, list] = {}  # each unit's bars, oldest first (two launches of a trial may overlap)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def started(self, title, count) -> None:
        self.total = count
        self.overall = self.bar.add_task(f"[bold]{title}", total=count)

    def _advance(self) -> None:
        if self.overall is not None:
            self.bar.advance(self.overall)

    def resumed(self, trial, text) -> None:
        self.bar.console.print(f"= {label(trial)}: {text}", style="dim", markup=False, highlight=False,
                               soft_wrap=True)
        self._advance()

    def left_out(self, trial, why) -> None:
        super().left_out(trial, why)
        self._advance()

    def extra_launch(self, trial, why) -> None:
        super().extra_launch(trial, why)
        if self.total is not None:
            self.total += 1
            self.bar.update(self.overall, total=self.total)

    def launching(self, trial, text, total=None) -> None:
        task = self.bar.add_task(_short(f"  {label(trial)}: {text}"), total=total)
        self.tasks.setdefault(label(trial), []).append(task)

    def requests_done(self, trial, count) -> None:
        if self.tasks.get(label(trial)):
            self.bar.advance(self.tasks[label(trial)][0], count)

    def point(self, trial, text) -> None:
        self.bar.console.print(f"    {label(trial)} {text}", style="dim", highlight=False, markup=False,
                               soft_wrap=True)
        if self.tasks.get(label(trial)):
            self.bar.update(self.tasks[label(trial)][0], description=_short(f"  {label(trial)}: {text}"))

    def finished(self, trial, status, text) -> None:
        if self.tasks.get(label(trial)):
            self.bar.remove_task(self.tasks[label(trial)].pop(0))
        colour = self.STATUS_COLOUR.get(status, "red")
        self.bar.console.print(f"[{colour}]{status:>9}[/] {label(trial)}", end="", highlight=False)
        self.bar.console.print(f": {text}" if text else "", highlight=False, markup=False, soft_wrap=True)
        self._advance()


def _short(text: str, width: int = 64) -> str:
    """A bar's description on one line: the start of a long launch command is enough to know it."""
    return text if len(text) <= width else text[:width - 1] + "…"


def schema_table(section: str) -> Table:
    from qwen3lab.experiment.files import Chapter, Experiment
    from qwen3lab.experiment.spec import SLO, Capacity, EndpointConfig, EngineConfig, Range, Search, Source, Workload

    models = {"engine": EngineConfig, "endpoint": EndpointConfig, "workload": Workload, "slo": SLO,
              "experiment": Experiment, "chapter": Chapter, "capacity": Capacity, "search": Search, "range": Range, "source": Source}
    if section not in models:
        raise SpecError("section", section, ", ".join(models), "pick one of those")
    model = models[section]
    t = Table(title=f"{section} fields")
    for name in ("field", "type", "default", "description"):
        t.add_column(name, overflow="fold")
    for name, f in model.model_fields.items():
        default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
        t.add_row(name, str(f.annotation).replace("typing.", ""), default, f.description or "")
    return t


def sweep_table(result, db: str) -> Table:
    """One row per executed notebook: status, seconds, and the runs it stored, by status."""
    from qwen3lab.store import Store

    runs = Store(db).runs(experiment=result.experiment)
    t = Table(title=f"sweep {result.experiment}")
    for col in ("notebook", "status", "seconds", "starting / measuring s", "runs stored (this notebook)", "output"):
        t.add_column(col, overflow="fold")
    for ex in result.executions:
        mine = runs[runs.notebook_path == str(ex.output_path)] if not runs.empty else runs
        counts = mine.status.value_counts().to_dict() if not mine.empty else {}
        split = starting_vs_measuring(mine)
        split = f"{split[0]:.0f} / {split[1]:.0f}" if split else "-"
        t.add_row(ex.notebook, ex.status, f"{ex.seconds:.0f}" if ex.seconds is not None else "-", split,
                  ", ".join(f"{n} {k}" for k, n in counts.items()) or "-", str(ex.output_path))
    return t


# --- capacity and search: `qwen3lab capacity`, `qwen3lab search` ------------------------------------------
def capacity_table(results) -> Table:
    """One row per configuration: capacity, its bracket, and the points measured (load: + pass, - fail,
    ~ transient: too short to show a steady state)."""
    t = Table(title="Capacity under the SLOs (largest passing load; bracket = last pass, first fail)",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("trial", "status", "axis", "capacity", "bracket", "points", "start s", "search"):
        t.add_column(name, overflow="fold", justify="right" if name in ("capacity", "start s") else "left")
    for r in results:
        points = " ".join(f"{p.load:g}{ {'pass': '+', 'fail': '-', 'transient': '~'}[p.verdict]}" for p in r.points)
        t.add_row(f"{r.trial.chapter}/{r.trial.name}", r.status, r.axis, _num(r.capacity, "{:g}"),
                  f"[{_num(r.low, '{:g}')}, {_num(r.high, '{:g}')}]", points or "-", _num(r.start_s, "{:.0f}"),
                  r.search_id)
    return t


def search_table(result) -> Table:
    """A search's history: each suggestion, its state and objective, the best marked."""
    t = Table(title=f"Search {result.study} ({', '.join(result.objectives)}; {result.stopped})",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("#", "params", "state", "value", "interval", "why / run"):
        t.add_column(name, overflow="fold", justify="right" if name in ("#", "value") else "left")
    best = result.best.number if result.best else None
    for s in result.history:
        params = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in s.params.items())
        t.add_row(("* " if s.number == best else "") + str(s.number), params, s.state, _num(s.value, "{:g}"),
                  f"[{_num(s.low, '{:g}')}, {_num(s.high, '{:g}')}]" if s.low is not None or s.high is not None else "-",
                  s.reason if s.state != "complete" else (s.search_id or s.run_id or ""))
    if len(result.objectives) == 2:
        t.caption = (f"Pareto front ({' and '.join(f'{o} {SEARCH_OBJECTIVES[o][:3]}' for o in result.objectives)}): "
                     + (", ".join(f"#{f.number} {_num(f.value, '{:g}')} / {_num(f.value2, '{:g}')}"
                                  for f, _ in result.front) or "none measured with both values"))
    return t


# --- hardware: `qwen3lab plan`, `calibrate`, `probe` ----------------------------------------------------
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
                     f"{topo.get('logical_cpus')} threads ({topo.get('allowed_cpus')} allowed to this process); "
                     f"vector: {', '.join(topo.get('vector_isa') or []) or '?'}")
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


# --- verdicts ----------------------------------------------------------------------------------------------
def compare_table(df, a_label: str, b_label: str) -> Table:
    t = Table(title=f"{a_label} against {b_label}", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("metric", "A", "B", "A - B (95% CI)", "change", "verdict"):
        t.add_column(name, overflow="fold", justify="left" if name in ("metric", "verdict") else "right")
    for r in df.to_dict("records"):
        fmt = "{:+.1f}" if r["metric"] == "p95_ttft_ms" else "{:+.2f}"
        t.add_row(r["metric"], _num(r["a"], fmt.replace("+", "")), _num(r["b"], fmt.replace("+", "")),
                  f"{fmt.format(r['difference'])} ({fmt.format(r['low'])} .. {fmt.format(r['high'])})",
                  f"{_num(r['change_pct'], '{:+.1f}')}%",
                  r["verdict"] + (f": {r['would_take']}" if r.get("would_take") else ""))
    return t


def soak_table(result) -> Table:
    """The soak's counts, then its drift: each metric's first and last window, the change and its interval."""
    t = Table(title=f"Soak {result.soak_id} of {result.trial.chapter}/{result.trial.name}: {result.status}"
              + (f" ({result.reason})" if result.reason else ""), box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("metric", "first window", "last window", "change", "95% interval", "drift?"):
        t.add_column(name, justify="left" if name in ("metric", "drift?") else "right")
    t.add_row("windows / server starts", str(len(result.windows)), str(result.server_starts), "", "", "")
    t.add_row("crashes / OOMs", str(result.crashes), str(result.ooms), "", "", "")
    for metric, m in (result.drift.get("metrics") or {}).items():
        t.add_row(metric, _num(m["first"], "{:.3g}"), _num(m["last"], "{:.3g}"), _num(m["change_pct"], "{:+.1f}%"),
                  f"[{_num(m['low'], '{:+.1f}')}, {_num(m['high'], '{:+.1f}')}]%",
                  "drift" if metric in result.drift.get("drift", []) else "noise")
    if result.drift.get("note"):
        t.caption = result.drift["note"]
    return t
