"""What a run row says about where it came from: the trial and its launch command, the experiment file's
commit (git, or the commit a `git archive` copy was made from), the machine. Written before the server starts.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from qwen3lab.experiment.spec import Trial
from qwen3lab.hardware import catalogue as hardware
from qwen3lab.measure import topology


# The campaign a run belongs to (qwen3lab/campaign.py sets it; a sweep's notebook kernels inherit it).
CAMPAIGN_ENV = "QWEN3LAB_CAMPAIGN"


def current_campaign() -> str | None:
    """The campaign this process (or the sweep that started its kernel) measures for."""
    return os.environ.get(CAMPAIGN_ENV) or None


def git_commit(path: str | None) -> str | None:
    """Commit of the repository holding the experiment file, with +dirty when it has local changes."""
    if not path:
        return None
    where = str(Path(path).resolve().parent)
    try:
        got = subprocess.run(["git", "-C", where, "rev-parse", "--verify", "-q", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        sha = got.stdout.strip()
        if got.returncode != 0 or not sha:
            return _archived_commit()
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--", str(Path(path).resolve())],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _archived_commit() -> str | None:
    """Outside a git checkout (a kit's `git archive` copy): the commit written beside the package, as
    `archive:SHA` (the experiment file's own state is then unknown)."""
    stamp = Path(__file__).resolve().parents[2] / "COMMIT"
    try:
        sha = stamp.read_text().strip()
    except OSError:
        return None
    return f"archive:{sha}" if sha else None


def run_fields(trial: Trial, experiment_path: str | None, notebook_path: str | None, machine: dict) -> dict:
    """The run row's provenance: the trial, its configuration and launch command, the experiment file's commit,
    and the machine it runs on (as hardware.probe says)."""
    cfg = trial.engine
    return dict(
        trial_key=trial.key, experiment=trial.experiment, chapter=trial.chapter, trial=trial.name,
        baseline=trial.baseline, engine_kind=cfg.kind, model=cfg.model,
        config_json=cfg.model_dump(mode="json", exclude={"api_key"}), config_hash=cfg.config_hash(),
        workload_json=trial.workload.model_dump(mode="json"), slo_json=trial.slo.model_dump(mode="json"),
        tags_json=trial.tags, launch_command=topology.launch_command(cfg) if cfg.kind == "vllm" else f"# endpoint {cfg.url}",
        env_json=getattr(cfg, "env", {}), git_commit=git_commit(experiment_path), experiment_path=experiment_path,
        host=machine["host"], cpu=machine["cpu"], gpu=hardware.gpu_summary(machine), notebook_path=notebook_path,
        campaign_id=current_campaign(),
    )
