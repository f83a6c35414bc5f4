"""History: each trial's figures campaign after campaign, and where one moved beyond noise.

A campaign (qwen3lab/campaign.py) is one dated invocation; its launches of a trial are that trial's figure on
that date. Trials are matched across campaigns by name (chapter/trial), not by trial key: what a scheduled run
exists to catch is the same-named trial meeting another vLLM build, driver, configuration or qwen3lab.

Each campaign's point is the mean of its launch figures with its launch-to-launch interval (stats.trial_interval);
each campaign is set against the campaign before it with Welch's t on launch figures (stats.welch, the
within-launch floor), Holm-corrected over the trial's steps x metrics; one launch on either side gives no verdict.
The verdict rules are analysis/stats.py's (docs/statistics.md); this module only says which launches meet. Two
campaigns whose launches sent other requests, tokenized otherwise or ran on another machine are not compared
(the comparability key without its build: the build is what a history is for). A step that moved beyond noise is
marked with the campaign before it and what changed between them (`changes`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qwen3lab.analysis import comparable, compare, selection, stats
from qwen3lab.analysis.compare import RunData, TrialData
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store

METRICS = compare.METRICS  # metric -> higher is better
NOT_COMPARED = "not compared"


def parse_metrics(names: list[str] | None) -> dict[str, bool]:
    """--metric values, each one of compare.METRICS (all of them when none)."""
    from qwen3lab.errors import Qwen3LabError

    bad = [m for m in names or [] if m not in METRICS]
    if bad:
        raise Qwen3LabError(f"--metric {bad[0]!r} is not one of {', '.join(METRICS)}: e.g. --metric p95_ttft_ms")
    return {m: METRICS[m] for m in (names or METRICS)}


def campaign_runs(store: Store, experiment: str | None = None, include_unreliable: bool = False,
                  campaign_ids: list[str] | None = None) -> list[RunData]:
    """The ok launches that belong to a campaign (of an experiment, or of the campaigns named), with their rows."""
    runs = selection.standalone(store.runs(experiment=experiment))
    if runs.empty or "campaign_id" not in runs:
        return []
    runs = runs[runs.status.isin(selection.MEASURED) & runs.campaign_id.notna()]
    if campaign_ids is not None:
        runs = runs[runs.campaign_id.isin(campaign_ids)]
    if not include_unreliable and not runs.empty:
        runs = runs[~compare.unreliable(runs)]
    return compare.load_runs(store, list(runs.run_id)) if not runs.empty else []


def label(row: dict) -> str:
    return f"{row.get('experiment')}:{row.get('chapter')}/{row.get('trial')}"


def build_of(row: dict) -> str:
    """The vLLM build a launch ran: its version and torch's ('unknown' when not recorded)."""
    return f"vllm {row.get('vllm_version') or '?'} / torch {row.get('torch_version') or '?'}"


@dataclass
class Side:
    """One campaign's (or one build's) launches of one trial, and what they ran on."""

    trial: TrialData
    campaign: dict  # the campaigns row (or {} for a group of builds)

    @property
    def row(self) -> dict:
        return self.trial.newest.row

    def context(self) -> dict[str, str]:
        """What may differ between two campaigns of a trial, each in words."""
        rows = [r.row for r in self.trial.launches]
        pick = lambda k: ", ".join(sorted({str(r.get(k)) for r in rows if r.get(k) is not None})) or "?"  # noqa: E731
        return {"build": ", ".join(sorted({build_of(r) for r in rows})),
                "python": pick("python_executable"),
                "driver": str(self.campaign.get("driver") or "none (no NVIDIA GPU)"),
                "config digest": ", ".join(sorted({str(r.get("config_hash") or "?")[:12] for r in rows})),
                "experiment file": str(self.campaign.get("experiment_digest") or "?"),
                "qwen3lab commit": str(self.campaign.get("qwen3lab_commit") or "?")}


def changes(before: Side, after: Side) -> list[str]:
    """'build: vllm 0.31.0 / torch 2.12.0 -> vllm 0.32.0 / torch 2.13.0' for each thing that differs."""
    a, b = before.context(), after.context()
    return [f"{k}: {a[k]} -> {b[k]}" for k in a if a[k] != b[k]]


def not_comparable(before: Side, after: Side) -> str | None:
    """Why two sides' launches may not be set against each other (other requests, tokenizer, machine), or None."""
    fa, fb = comparable.key_fields(before.row), comparable.key_fields(after.row)
    diff = [f"{k}: {fa[k]} vs {fb.get(k)}" for k in fa if k != "build" and fa[k] != fb.get(k)]
    return f"{NOT_COMPARED}: {'; '.join(diff)}" if diff else None


def step(before: Side, after: Side, metrics: dict[str, bool], slo: SLO, n_boot: int = 400) -> list[dict]:
    """after against before, per metric: both figures, the difference and the relative change with Welch's
    interval, p (NaN: not tested), and whether it could be compared. The verdicts are given by `judge`."""
    why = not_comparable(before, after)
    out = []
    for metric, higher in metrics.items():
        fb, fa = compare.figures(before.trial, slo, metric, n_boot), compare.figures(after.trial, slo, metric, n_boot)
        iv = stats.welch(fa, fb)
        rel = stats.welch(fa, fb, relative=True) if fb.mean else stats.NAN  # a zero BASE has no relative change
        out.append({"metric": metric, "higher_is_better": higher, "before": fb.mean, "after": fa.mean,
                    "difference": iv.estimate, "low": iv.low, "high": iv.high, "change_pct": rel.estimate,
                    "low_pct": rel.low, "high_pct": rel.high, "p_value": iv.p_value,
                    "before_launches": fb.n, "after_launches": fa.n, "not_compared": why,
                    "would_take": stats.would_take(iv, compare.UNIT[metric]), "_iv": iv})
    return out


def judge(rows: list[dict]) -> None:
    """Each row's verdict, Holm-corrected over the rows (one family): better, worse, can't tell, one launch, or
    not compared."""
    ps = [np.nan if r["not_compared"] or r["_iv"].one_launch else r["p_value"] for r in rows]
    for r, sure in zip(rows, stats.holm(ps)):
        iv = r.pop("_iv")
        r["verdict"] = r["not_compared"] or stats.verdict(iv, r["higher_is_better"], bool(sure))
        if r["verdict"] in ("better", "worse"):
            r["would_take"] = ""


def launches_of(name: str, runs: list[RunData]) -> TrialData:
    """Launches as one trial, newest first (one name: its definition may differ between campaigns)."""
    return TrialData(name, name, sorted(runs, key=lambda r: str(r.row.get("started_at") or ""), reverse=True))


def _sides(runs: list[RunData], campaigns: pd.DataFrame) -> dict[str, list[Side]]:
    """Per trial label, its sides in campaign order (oldest first)."""
    info = {r["campaign_id"]: r for r in campaigns.to_dict("records")} if not campaigns.empty else {}
    order = {cid: i for i, cid in enumerate(info)}
    grouped: dict[str, dict[str, list[RunData]]] = {}
    for r in runs:
        grouped.setdefault(label(r.row), {}).setdefault(str(r.row["campaign_id"]), []).append(r)
    out = {}
    for name, by_campaign in grouped.items():
        cids = sorted(by_campaign, key=lambda c: order.get(c, len(order)))
        out[name] = [Side(launches_of(name, by_campaign[c]), info.get(c, {"campaign_id": c})) for c in cids]
    return out


def slo_of(runs: list[RunData], pairs: list[str] | None = None) -> SLO:
    """The SLOs the newest launch was measured under, with --slo overrides."""
    newest = max(runs, key=lambda r: str(r.row.get("started_at") or ""), default=None)
    text = newest.row.get("slo_json") if newest else None
    base = SLO.model_validate(json.loads(text)) if isinstance(text, str) and text else SLO()
    return compare.parse_slo(pairs, base)


def history(store: Store, experiment: str, trial: str | None = None, metrics: list[str] | None = None,
            slo: list[str] | None = None, include_unreliable: bool = False, n_boot: int = 400) -> pd.DataFrame:
    """One row per trial x metric x campaign, oldest campaign first: the campaign's figure with its 95% launch
    interval, its build, and (after the first) the step from the campaign before: change, interval, verdict,
    what changed. `marked`: the step moved beyond noise (better or worse)."""
    from qwen3lab.errors import Qwen3LabError

    wanted = parse_metrics(metrics)
    runs = campaign_runs(store, experiment, include_unreliable)
    if trial:
        runs = [r for r in runs if f"{r.row.get('chapter')}/{r.row.get('trial')}" == trial or r.row.get("trial") == trial]
    if not runs:
        raise Qwen3LabError(f"no ok launches of {experiment!r}{' trial ' + trial if trial else ''} in any campaign "
                            f"of {store.path}: campaigns are recorded by `qwen3lab run`, `sweep` and `capacity` "
                            "(list them with `qwen3lab campaigns`)" + ("" if include_unreliable else
                                                                         "; --include-unreliable counts launches "
                                                                         "marked unreliable"))
    the_slo = slo_of(runs, slo)
    out = []
    for name, sides in _sides(runs, store.campaigns(experiment=experiment)).items():
        rows = []
        for i, side in enumerate(sides):
            for metric, higher in wanted.items():
                iv = stats.trial_interval(compare.figures(side.trial, the_slo, metric, n_boot))
                rows.append({"trial": name.split(":", 1)[1], "metric": metric, "campaign_id": side.campaign["campaign_id"],
                             "started_at": side.campaign.get("started_at", side.row.get("started_at")),
                             "build": side.context()["build"], "launches": len(side.trial.launches),
                             "value": iv.estimate, "value_low": iv.low, "value_high": iv.high})
        steps = []
        for before, after in zip(sides, sides[1:]):
            changed = "; ".join(changes(before, after))
            for s in step(before, after, wanted, the_slo, n_boot):
                steps.append(s | {"campaign_id": after.campaign["campaign_id"],
                                  "previous": before.campaign["campaign_id"], "changed": changed})
        judge(steps)
        by = {(s["campaign_id"], s["metric"]): s for s in steps}
        for r in rows:
            s = by.get((r["campaign_id"], r["metric"]), {})
            out.append(r | {"previous": s.get("previous"), "change_pct": s.get("change_pct"),
                            "low_pct": s.get("low_pct"), "high_pct": s.get("high_pct"), "p_value": s.get("p_value"),
                            "verdict": s.get("verdict", ""), "changed": s.get("changed", ""),
                            "marked": s.get("verdict") in ("better", "worse")})
    return pd.DataFrame(out)
