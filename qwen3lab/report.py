"""Tables for the terminal (rich): results of a run, stored runs, dry-run verdicts, the schema."""
from __future__ import annotations

import math

from rich.table import Table

from .errors import SpecError


def _num(v, fmt="{:.1f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return fmt.format(v)


def _metric_columns(t: Table) -> None:
    for name in ("ok/total", "out tok/s", "req/s", "TTFT p50", "TTFT p95", "TPOT p50", "ITL p50", "E2EL p99", "goodput"):
        t.add_column(name, justify="right")


def _metric_cells(s: dict | None) -> list[str]:
    if not s:
        return ["-"] * 9
    total = (s.get("completed") or 0) + (s.get("failed") or 0)
    return [f"{int(s.get('completed') or 0)}/{int(total)}", _num(s.get("output_throughput")),
            _num(s.get("request_throughput"), "{:.2f}"), _num(s.get("median_ttft_ms")), _num(s.get("p95_ttft_ms")),
            _num(s.get("median_tpot_ms"), "{:.2f}"), _num(s.get("median_itl_ms"), "{:.2f}"),
            _num(s.get("p99_e2el_ms")), _num(s.get("request_goodput"), "{:.2f}")]


def results_table(results, db: str) -> Table:
    from .store import Store

    rows = Store(db).runs(run_ids=[r.run_id for r in results])
    by_id = {r["run_id"]: r for r in rows.to_dict("records")} if not rows.empty else {}
    t = Table(title="Results (latencies in ms)")
    for name in ("chapter", "trial", "status"):
        t.add_column(name)
    _metric_columns(t)
    t.add_column("run")
    for r in results:
        t.add_row(r.trial.chapter, r.trial.name, r.status, *_metric_cells(by_id.get(r.run_id)), r.run_id)
    return t


def runs_table(df) -> Table:
    t = Table(title=f"{len(df)} runs (latencies in ms)")
    for name in ("run", "experiment", "chapter", "trial", "status"):
        t.add_column(name)
    _metric_columns(t)
    t.add_column("vLLM")
    t.add_column("reason", overflow="fold", max_width=40)
    for row in df.to_dict("records") if not df.empty else []:
        t.add_row(row["run_id"], str(row.get("experiment")), str(row.get("chapter")), str(row.get("trial")),
                  row["status"], *_metric_cells(row), str(row.get("vllm_version") or "-"), str(row.get("reason") or ""))
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
    from .experiment import Chapter, Experiment
    from .spec import SLO, EndpointConfig, EngineConfig, Workload

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
