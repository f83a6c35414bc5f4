"""One chapter of an experiment as a notebook sees it: its plan (pre-flight), its run (executor.execute with
resume), and the stored runs standing for its trials (selection.standing)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from qwen3lab import campaign
from qwen3lab.analysis import selection
from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import SLO, Trial
from qwen3lab.measure import events, executor, runner
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
    "82_routing": "routing",
    "85_thinking_mode": "thinking_mode",
    "90_soak": "soak",
    "95_capacity": None,  # the baseline and the leading candidates of the whole experiment (workbook.capacity)
    "99_report": None,
}
CHAPTER_NOTEBOOK = {chapter: stem for stem, chapter in NOTEBOOKS.items() if chapter}
RUN_COLUMNS = ["chapter", "trial", "status", "reason", "validity", "output_throughput", "request_throughput", "median_ttft_ms",
               "p95_ttft_ms", "median_tpot_ms", "p99_e2el_ms", "request_goodput", "completed", "failed",
               "vllm_kv_tokens", "vllm_version", "attention_backend", "flash_attn_version", "launch_command", "run_id",
               "notebook_path"]


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

    planned: executor.Plan
    name: str
    chapter: xp.Chapter
    store: Store
    runs_dir: str
    notebook_path: str | None = None
    results: list[runner.TrialResult] = field(default_factory=list)

    @property
    def experiment(self) -> xp.Experiment:
        return self.planned.experiment

    @property
    def experiment_path(self) -> str:
        return self.planned.path

    @property
    def trials(self) -> list[Trial]:
        return self.planned.trials

    @property
    def verdicts(self) -> list[preflight.Verdict]:
        return self.planned.verdicts

    @property
    def machine(self) -> preflight.Machine:
        return self.planned.machine

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
        """Run the chapter's trials in order with resume (executor.execute), launching at most `max_trials`
        servers; every run is stored with this notebook's path."""
        # run by hand: a campaign of its own; in a sweep's kernel: the sweep's (campaign.opened joins it)
        with campaign.opened(self.store, "notebook", self.experiment_path,
                             {"chapter": self.name, "max_trials": max_trials, "retry_failed": retry_failed}):
            self.results = executor.execute(self.planned, self.store, self.runs_dir, retry_failed=retry_failed,
                                            max_trials=max_trials, notebook_path=self.notebook_path,
                                            listener=events.Listener(log))
        return self.runs()

    # --- what is stored ---------------------------------------------------------------------------------
    def runs(self, with_json: bool = False) -> pd.DataFrame:
        """The stored run that stands for each trial of this chapter (selection.standing), in trial order."""
        df = self.store.runs(experiment=self.experiment.name, chapter=self.name, with_json=with_json)
        return selection.standing(df, [t.key for t in self.trials])

    def table(self) -> pd.DataFrame:
        """The chapter's runs, the columns worth reading."""
        from qwen3lab.analysis.wording import rounded

        df = self.runs()
        return rounded(df[[c for c in RUN_COLUMNS if c in df]]) if not df.empty else df

    def ok_runs(self) -> pd.DataFrame:
        """The standing runs that are ok: the ones with figures."""
        return selection.measured(self.store.runs(experiment=self.experiment.name, chapter=self.name),
                                  [t.key for t in self.trials])

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

    def effects(self, n_boot: int = 400) -> pd.DataFrame:
        """Each ok trial against the chapter's baseline, relative change with 95% interval."""
        from qwen3lab.analysis.claims import claims as claims_of

        # the chapter's baseline from the experiment file stands in for runs that stored none (older slices)
        claims = claims_of(self.store, self.experiment.name, self.slo, n_boot=n_boot,
                                baselines={self.name: self.baseline} if self.baseline else None)
        if claims.empty:
            return claims
        mine = set(self.runs().get("run_id", []))  # standing runs, any status: a trial that never finished says so
        return claims[(claims.chapter == self.name) & claims.run_id.isin(mine)].reset_index(drop=True)

    def verdict(self, n_boot: int = 400):
        """The chapter's answer in words (wording.chapter_verdict, the winner card's wording): the last cell."""
        from qwen3lab.analysis import compare, wording
        from qwen3lab.errors import Qwen3LabError

        if self.ok_runs().empty:
            return say("### Verdict\n\nNo finished run of this chapter yet: nothing to conclude.")
        try:
            verdicts = compare.winners(self.store, self.experiment.name, self.slo, chapter=self.name, n_boot=n_boot)
        except Qwen3LabError as exc:
            return say(f"### Verdict\n\n{exc}")
        return say(wording.chapter_verdict(verdicts, self.effects(n_boot), self.slo))

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
    planned = executor.plan(exp, [chapter], machine=machine,
                            adjust=lambda t: small_run(t, num_requests, warmup_requests, duration_s))
    return ChapterRun(planned, chapter, chapters[chapter], Store(db), str(runs_dir),
                      str(notebook_path) if notebook_path else None)
