"""Tables for the terminal (rich): results of a run, stored runs, dry-run verdicts, the schema."""
from __future__ import annotations

import math

from rich import box
from rich.table import Table

from qwen3lab.errors import SpecError


def _num(v, fmt="{:.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


METRICS = ("ok/\ntotal", "out\ntok/s", "TTFT\np50", "TTFT\np95", "TPOT\np50", "E2EL\np99", "good-\nput")


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
            _num(s.get("p95_ttft_ms"), "{:.0f}"), _num(s.get("median_tpot_ms"), "{:.2f}"),
            _num(s.get("p99_e2el_ms"), "{:.0f}"), _num(s.get("request_goodput"), "{:.2f}")]


def _the_same(df, column: str) -> str | None:
    """The one value every row shares, for the title instead of a column."""
    values = set(df[column].dropna().astype(str)) if column in df else set()
    return values.pop() if len(values) == 1 and df[column].notna().all() else None


def results_table(results, db: str) -> Table:
    from qwen3lab.store import Store

    rows = Store(db).runs(run_ids=[r.run_id for r in results])
    by_id = {r["run_id"]: r for r in rows.to_dict("records")} if not rows.empty else {}
    t = _run_table("Results (latencies in ms)", ("trial", "status"))
    for r in results:
        t.add_row(f"{r.trial.chapter}/{r.trial.name}", r.status, *_metric_cells(by_id.get(r.run_id)), r.run_id)
    return t


def runs_table(df) -> Table:
    experiment = None if df.empty else _the_same(df, "experiment")
    vllm = None if df.empty else _the_same(df, "vllm_version")
    title = f"{len(df)} runs" + (f" of {experiment}" if experiment else "") + (f", vLLM {vllm}" if vllm else "")
    labels = (() if experiment else ("experiment",)) + ("trial", "status")
    t = _run_table(f"{title} (latencies in ms)", labels)
    if not vllm:
        t.add_column("vLLM")
    reasons = not df.empty and df.reason.notna().any()
    if reasons:
        t.add_column("reason", overflow="fold", max_width=40)
    for row in df.to_dict("records") if not df.empty else []:
        cells = ([] if experiment else [str(row.get("experiment"))])
        cells += [f"{row.get('chapter')}/{row.get('trial')}", row["status"], *_metric_cells(row), row["run_id"]]
        cells += [] if vllm else [str(row.get("vllm_version") or "-")]
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


def schema_table(section: str) -> Table:
    from qwen3lab.experiment.files import Chapter, Experiment
    from qwen3lab.experiment.spec import SLO, EndpointConfig, EngineConfig, Workload

    models = {"engine": EngineConfig, "endpoint": EndpointConfig, "workload": Workload, "slo": SLO,
              "experiment": Experiment, "chapter": Chapter}
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


def capacity_table(results) -> Table:
    """One row per configuration: capacity, its bracket, and the points measured (load: pass/fail)."""
    t = Table(title="Capacity under the SLOs (largest passing load; bracket = last pass, first fail)",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("trial", "status", "axis", "capacity", "bracket", "points", "start s", "search"):
        t.add_column(name, overflow="fold", justify="right" if name in ("capacity", "start s") else "left")
    for r in results:
        points = " ".join(f"{p.load:g}{'+' if p.passed else '-'}" for p in r.points)
        t.add_row(f"{r.trial.chapter}/{r.trial.name}", r.status, r.axis, _num(r.capacity, "{:g}"),
                  f"[{_num(r.low, '{:g}')}, {_num(r.high, '{:g}')}]", points or "-", _num(r.start_s, "{:.0f}"),
                  r.search_id)
    return t
