"""Regress: two campaigns (or two vLLM builds) trial by trial, with the verdict rules of analysis/stats.py, so a CI
job or an upgrade can stop on a regression beyond noise.

    report = regress.regress(store, "camp-20261205-0700", "camp-20261206-0700")
    report.regressions      # (trial, metric) rows whose verdict is worse for NEW
    report.markdown()       # the table as Markdown; report.as_dict() for JSON

A side is a campaign id (or an unambiguous prefix of one), or `build:VERSION` / `build:PYTHON` (every campaign's
launches on that vLLM version, or on that interpreter). Trials meet by experiment, chapter and trial name; per
metric NEW is set against BASE with Welch's t on the launch figures (the within-launch floor), Holm-corrected over
all trials x metrics; one launch on either side gives no verdict; launches of other requests, tokenizers or
machines are not compared. The steps and the judging are history.step and history.judge: one statistics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from qwen3lab.analysis import history
from qwen3lab.analysis.compare import RunData
from qwen3lab.errors import Qwen3LabError
from qwen3lab.store import Store

FAIL_ON = ("worse", "never")
COLUMNS = ["trial", "metric", "base", "new", "change_pct", "low_pct", "high_pct", "p_value", "verdict",
           "base_launches", "new_launches", "changed", "would_take"]


@dataclass
class Report:
    base: str
    new: str
    rows: pd.DataFrame
    only_base: list[str] = field(default_factory=list)  # trials measured on one side only
    only_new: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows.verdict == "worse"] if not self.rows.empty else self.rows

    def exit_code(self, fail_on: str = "worse") -> int:
        """1 when fail_on is 'worse' and a trial's metric is worse beyond noise; else 0."""
        return int(fail_on == "worse" and not self.regressions.empty)

    def as_dict(self) -> dict:
        return {"base": self.base, "new": self.new, "regressions": int(len(self.regressions)),
                "only_in_base": self.only_base, "only_in_new": self.only_new,
                "rows": self.rows.astype(object).where(self.rows.notna(), None).to_dict("records")}

    def markdown(self) -> str:
        head = (f"# qwen3lab regress\n\nBASE `{self.base}` against NEW `{self.new}`: "
                f"{len(self.regressions)} regression(s) beyond noise (Welch's t on launch figures, Holm over "
                f"{len(self.rows)} comparisons; docs/statistics.md).\n\n")
        lines = ["| trial | metric | BASE | NEW | change (95% CI) | verdict | launches | what changed |",
                 "|---|---|---:|---:|---|---|---|---|"]
        for r in self.rows.to_dict("records"):
            lines.append(f"| {r['trial']} | {r['metric']} | {r['base']:.4g} | {r['new']:.4g} | "
                         f"{r['change_pct']:+.1f}% ({r['low_pct']:+.1f} .. {r['high_pct']:+.1f}) | {r['verdict']} | "
                         f"{r['base_launches']} / {r['new_launches']} | {r['changed'] or '-'} |")
        extra = "".join(f"\nOnly in {side}: {', '.join(names)}." for side, names in
                        (("BASE", self.only_base), ("NEW", self.only_new)) if names)
        return head + "\n".join(lines) + "\n" + extra + ("\n" if extra else "")


def side_runs(store: Store, ref: str, experiment: str | None = None,
              include_unreliable: bool = False) -> tuple[str, list[RunData], dict[str, dict]]:
    """(label, ok launches, campaign rows by id) of a campaign id or prefix, or of build:VERSION|PYTHON."""
    campaigns = store.campaigns(experiment=experiment)
    by_id = {r["campaign_id"]: r for r in campaigns.to_dict("records")} if not campaigns.empty else {}
    if ref.startswith("build:"):
        want = ref.removeprefix("build:")
        runs = [r for r in history.campaign_runs(store, experiment, include_unreliable)
                if want in (str(r.row.get("vllm_version")), str(r.row.get("python_executable")))]
        if not runs:
            builds = sorted({str(r.row.get("vllm_version")) for r in history.campaign_runs(store, experiment, True)})
            raise Qwen3LabError(f"{ref!r}: no ok launch of a campaign ran that vLLM version or python; stored "
                                f"versions: {', '.join(builds) or 'none'}. Fix: write build:VERSION, e.g. build:{builds[0] if builds else '0.32.0'}")
        return ref, runs, by_id
    match = [c for c in by_id if c == ref] or [c for c in by_id if c.startswith(ref) or c.removeprefix("camp-").startswith(ref)]
    if len(match) != 1:
        known = ", ".join(list(by_id)[-5:]) or "none"
        raise Qwen3LabError(f"{ref!r} names {'no' if not match else len(match)} campaign(s) of {store.path}"
                            f"{' experiment ' + experiment if experiment else ''}; the newest: {known}. Fix: give a "
                            "campaign id (or a prefix of one) from `qwen3lab campaigns`, or build:VERSION")
    runs = history.campaign_runs(store, experiment, include_unreliable, campaign_ids=match)
    if not runs:
        raise Qwen3LabError(f"campaign {match[0]} has no ok launch{'' if include_unreliable else ' not marked unreliable'}"
                            f" to compare (see `qwen3lab runs`)" + ("" if include_unreliable else
                                                                     "; --include-unreliable counts those"))
    return match[0], runs, by_id


def _sides(runs: list[RunData], campaigns: dict[str, dict]) -> dict[str, history.Side]:
    by: dict[str, list[RunData]] = {}
    for r in runs:
        by.setdefault(history.label(r.row), []).append(r)
    out = {}
    for name, mine in by.items():
        rows = [campaigns.get(c, {}) for c in sorted({str(r.row.get("campaign_id")) for r in mine})]
        # a build's side spans several campaigns: each field as the set of their values
        camp = {k: ", ".join(sorted({str(c.get(k)) for c in rows if c.get(k) is not None})) or None
                for k in ("driver", "experiment_digest", "qwen3lab_commit")}
        out[name] = history.Side(history.launches_of(name, mine), camp)
    return out


def regress(store: Store, base: str, new: str, metrics: list[str] | None = None, slo: list[str] | None = None,
            experiment: str | None = None, include_unreliable: bool = False, n_boot: int = 400) -> Report:
    """NEW against BASE, trial by trial (see the module doc)."""
    wanted = history.parse_metrics(metrics)
    base_label, base_runs, camps = side_runs(store, base, experiment, include_unreliable)
    new_label, new_runs, _ = side_runs(store, new, experiment, include_unreliable)
    the_slo = history.slo_of(new_runs, slo)
    a, b = _sides(base_runs, camps), _sides(new_runs, camps)
    rows = []
    for name in [n for n in a if n in b]:
        changed = "; ".join(history.changes(a[name], b[name]))
        for s in history.step(a[name], b[name], wanted, the_slo, n_boot):
            rows.append(s | {"trial": name, "base": s["before"], "new": s["after"], "base_launches": s["before_launches"],
                             "new_launches": s["after_launches"], "changed": changed})
    history.judge(rows)
    df = pd.DataFrame(rows, columns=COLUMNS) if rows else pd.DataFrame(columns=COLUMNS)
    if df.empty:
        raise Qwen3LabError(f"{base_label} and {new_label} share no trial (BASE: {', '.join(a)}; NEW: {', '.join(b)}): "
                            "compare campaigns of one experiment")
    return Report(base_label, new_label, df[COLUMNS], [n for n in a if n not in b], [n for n in b if n not in a])
