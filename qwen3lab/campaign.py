"""A campaign: one invocation that measures (`qwen3lab run`, `sweep`, `capacity`, or a workbook chapter run by
hand), stored as one dated row so a scheduled sweep's results line up with the last ones (analysis/history.py).

    with campaign.opened(store, "run", experiment_path, params) as c:   # the row is written here, status running
        executor.execute(...)                                          # every run row names c.campaign_id
    # ended: ok, failed or interrupted (Ctrl-C, SIGTERM), with the vLLM/torch builds its runs met

The row holds when it started and ended, the experiment file's digest (its bytes: an edited file is another
digest), the papermill parameters, the commit of the qwen3lab that ran, the host and GPU driver, and, for a
sweep, its executed notebooks. The campaign id travels in the environment (QWEN3LAB_CAMPAIGN): a sweep's
notebook kernels inherit it, so their runs join the sweep's campaign instead of opening their own. A campaign
whose qwen3lab was killed (SIGKILL, a lost machine) is finished as interrupted by the next one that opens on
the same database; its runs were stored as they ended (and their spools recovered), so nothing is lost.
"""
from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3lab.measure import provenance
from qwen3lab.store import Owner, Store, new_run_id, owner_alive

ENV = provenance.CAMPAIGN_ENV
current = provenance.current_campaign  # the campaign this process (or the sweep that started its kernel) is in
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass
class Campaign:
    """The campaign in progress; its caller may set `status`/`reason` (a sweep whose notebook failed) and add
    `notebooks` before it ends."""

    campaign_id: str
    owned: bool  # False: a campaign opened by a parent process (a sweep, for its notebooks): not ended here
    status: str = "ok"
    reason: str | None = None
    notebooks: list[dict] = field(default_factory=list)
    notebooks_dir: str | None = None


_OPEN: dict[str, Campaign] = {}  # campaigns this process opened: a nested `opened` joins its own


def file_digest(path: str | os.PathLike | None) -> str | None:
    """The experiment file's content digest (16 hex): what it asked for, whatever its name or commit."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else None
    except OSError:
        return None


def qwen3lab_commit() -> str | None:
    """The commit of the qwen3lab that runs (+dirty when its package has local changes)."""
    return provenance.git_commit(str(PACKAGE_DIR))


def _driver() -> str | None:
    from qwen3lab.hardware.catalogue import probe_gpus

    gpus, _ = probe_gpus()
    return ", ".join(sorted({str(g.get("driver")) for g in gpus})) if gpus else None


def _experiment_name(path: str | os.PathLike | None) -> str | None:
    if not path:
        return None
    try:
        from qwen3lab.experiment import files as xp

        return xp.load(path).name
    except Exception:  # noqa: BLE001 - a bad file is refused by the command itself, with its own message
        return None


def recover(store: Store) -> list[str]:
    """Campaigns left `running` by a qwen3lab that is gone: finished as interrupted, ended at their last run's
    end (or their start). Returns their ids."""
    rows = store.campaigns(status="running")
    gone = [r for r in rows.to_dict("records") if not owner_alive(r)] if not rows.empty else []
    for row in gone:
        runs = store.runs()
        mine = runs[runs.campaign_id == row["campaign_id"]] if "campaign_id" in runs else runs.iloc[0:0]
        ends = mine.ended_at.dropna() if not mine.empty else []
        ended = ends.max().to_pydatetime() if len(ends) else row["started_at"]
        store.finish_campaign(row["campaign_id"], "interrupted",
                              f"qwen3lab (pid {row.get('owner_pid')} on {row.get('owner_host')}) stopped without "
                              f"ending the campaign (killed?); {len(mine)} run(s) of it are stored",
                              ended_at=ended)
    return [r["campaign_id"] for r in gone]


@contextmanager
def opened(store: Store, command: str, experiment_path: str | os.PathLike | None = None,
           params: dict[str, Any] | None = None, notebooks_dir: str | os.PathLike | None = None) -> Iterator[Campaign]:
    """A campaign around one invocation (see the module doc). Inside a campaign already (a sweep's kernel), the
    parent's campaign, left to the parent to end."""
    if (cid := current()) is not None:  # nested here (the CLI's sweep -> sweep.sweep), or a sweep's kernel
        joined = _OPEN.get(cid) or Campaign(cid, owned=False)
        joined.notebooks_dir = joined.notebooks_dir or (str(notebooks_dir) if notebooks_dir else None)
        yield joined
        return
    recover(store)
    c = Campaign("camp-" + new_run_id(), owned=True, notebooks_dir=str(notebooks_dir) if notebooks_dir else None)
    me = Owner.me()
    store.begin_campaign(c.campaign_id, command=command, experiment=_experiment_name(experiment_path),
                         experiment_path=str(Path(experiment_path).resolve()) if experiment_path else None,
                         experiment_digest=file_digest(experiment_path), params_json=params or {},
                         qwen3lab_commit=qwen3lab_commit(), host=me.host, driver=_driver(),
                         **me.fields())
    os.environ[ENV] = c.campaign_id
    _OPEN[c.campaign_id] = c
    # SIGTERM (a scheduler stopping the job) ends the campaign as Ctrl-C does, where nothing else handles it
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    if main and before == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield c
    except KeyboardInterrupt:
        c.status, c.reason = "interrupted", "stopped (Ctrl-C or SIGTERM); run the same command again to resume"
        raise
    except BaseException as exc:
        c.status, c.reason = "failed", f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        raise
    finally:
        os.environ.pop(ENV, None)
        _OPEN.pop(c.campaign_id, None)
        if main and before == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # a refused write leaves the row running: the next campaign on this file finishes it (recover)
        try:
            store.finish_campaign(c.campaign_id, c.status, c.reason, notebooks_json=c.notebooks,
                                  notebooks_dir=c.notebooks_dir)
        except Exception:  # noqa: BLE001 - the measurement's own error (if any) is the one to raise
            pass


def listing(store: Store, experiment: str | None = None):
    """Campaigns oldest first, with how many runs (ok ones too) each stored and its builds in one line."""
    import json

    df = store.campaigns(experiment=experiment)
    if df.empty:
        return df
    runs = store.runs(experiment=experiment)
    counted = runs.groupby("campaign_id").status.agg(runs="size", ok=lambda s: int((s == "ok").sum())) \
        if "campaign_id" in runs and not runs.empty else None
    df = df.join(counted, on="campaign_id") if counted is not None else df.assign(runs=0, ok=0)
    df[["runs", "ok"]] = df[["runs", "ok"]].fillna(0).astype(int)
    df["builds"] = [build_text(json.loads(b)) if isinstance(b, str) else "" for b in df.builds_json]
    df["notebooks"] = [[n.get("path") for n in json.loads(b)] if isinstance(b, str) else [] for b in df.notebooks_json]
    return df


def build_text(builds: list[dict]) -> str:
    """'vllm 0.32.0 / torch 2.13.0+cpu' for each build met, '; '-joined."""
    return "; ".join(f"vllm {b.get('vllm_version')} / torch {b.get('torch_version')}" for b in builds)
