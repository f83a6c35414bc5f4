"""Tables for the terminal (rich): results of a run, stored runs, dry-run verdicts, the schema."""
from __future__ import annotations

import math

from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qwen3lab.errors import SpecError
from qwen3lab.measure.capacity import Listener as CapacityListener
from qwen3lab.measure.executor import Listener
from qwen3lab.measure.search import Listener as SearchListener


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


class TrialProgress(Listener):
    """executor.execute shown as a progress bar: one bar for the experiment, one for the trial's requests."""

    def __init__(self, console):
        self.console = console
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, transient=False)
        super().__init__(log=self.bar.console.print)
        self.overall = self.task = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def started(self, planned) -> None:
        self.overall = self.bar.add_task(f"[bold]{planned.experiment.name}", total=len(planned.verdicts))

    def resumed(self, trial, run_id, status) -> None:
        self.log(f"[dim]= {trial.chapter}/{trial.name}: {status} earlier (run {run_id})[/]")
        self.bar.advance(self.overall)

    def left_out(self, trial, why) -> None:
        super().left_out(trial, why)
        self.bar.advance(self.overall)

    def launching(self, trial, verdict) -> None:
        w = trial.workload
        self.task = self.bar.add_task(f"  {trial.chapter}/{trial.name}",
                                      total=w.num_requests if not w.duration_s else None)

    def requests_done(self, trial, count) -> None:
        self.bar.advance(self.task, count)

    def finished(self, result) -> None:
        self.bar.remove_task(self.task)
        colour = {"ok": "green", "skipped": "yellow"}.get(result.status, "red")
        self.log(f"[{colour}]{result.status:>8}[/] {result.trial.chapter}/{result.trial.name}"
                 + (f": {result.reason}" if result.reason else ""))
        self.bar.advance(self.overall)


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


class _Bar:
    """A rich progress bar as a context manager, for the listeners below."""

    def __init__(self, console):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console, transient=False)
        self.overall = self.task = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


class CapacityProgress(_Bar, CapacityListener):
    """capacity.run_capacities as a bar per experiment and one per configuration's points."""

    def __init__(self, console):
        _Bar.__init__(self, console)
        CapacityListener.__init__(self, log=self.bar.console.print)

    def started(self, name, count):
        self.overall = self.bar.add_task(f"[bold]{name} capacity", total=count)

    def resumed(self, result):
        super().resumed(result)
        self.bar.advance(self.overall)

    def launching(self, trial):
        self.task = self.bar.add_task(f"  {trial.chapter}/{trial.name}: starting the server", total=None)

    def point(self, trial, point):
        super().point(trial, point)
        self.bar.update(self.task, description=f"  {trial.chapter}/{trial.name}: {point.index + 1} points, "
                        f"last {point.load:g} {'pass' if point.passed else 'fail'}")

    def requests_done(self, count):
        if self.task is not None:
            self.bar.advance(self.task, count)

    def finished(self, result):
        self.bar.remove_task(self.task)
        super().finished(result)
        self.bar.advance(self.overall)


class SearchProgress(_Bar, SearchListener):
    """search.run_search as one line per suggestion and a bar of the configuration being measured."""

    def __init__(self, console):
        _Bar.__init__(self, console)
        SearchListener.__init__(self, log=self.bar.console.print)
        self.task = self.bar.add_task("search: first configuration", total=None)

    def trial_done(self, t, best, budget_used):
        super().trial_done(t, best, budget_used)
        self.bar.update(self.task, completed=0, description=f"search: {budget_used} measured, best so far "
                        + (f"{best.value:g} ({best.params})" if best else "none"))

    def requests_done(self, n):
        self.bar.advance(self.task, n)


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
    return t
