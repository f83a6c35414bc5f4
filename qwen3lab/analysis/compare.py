"""Comparing stored trials: ranking under SLOs, the winner's margin, and each knob's effect against its baseline.

Everything is recomputed from the stored per-request rows, so changing an SLO never needs a re-run. A trial
is every ok launch stored under its trial key; its figures are the mean over those launches, and every
difference is a t test on the launch figures (analysis/stats.py, docs/statistics.md). Only runs with one
comparability key (analysis/comparable.py) are set against each other.

A launch's own noise (its standard error, the floor of the launch-to-launch variance) comes from resampling it.
Rates (goodput, throughput) are not resampled as single requests against the fixed duration: with fixed output
lengths that leaves a throughput unchanged. By Little's law a run's rate is (work of its requests) / (their summed
latency) x (its mean concurrency, summed latency / duration), which is exactly work / duration; resampling blocks
of consecutive requests (latency and work together, so a slow stretch stays slow) lets the summed latency vary.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from qwen3lab.analysis import comparable, selection, stats
from qwen3lab.analysis.metrics import RequestTable, per_request_slo, request_table, slo_violations, summarize
from qwen3lab.analysis.stats import Interval
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import Store

# metric -> higher is better
METRICS = {"goodput": True, "output_throughput": True, "p95_ttft_ms": False}
SUMMARY_OF = {"goodput": "request_goodput", "output_throughput": "output_throughput", "p95_ttft_ms": "p95_ttft_ms"}
UNIT = {"goodput": "req/s", "output_throughput": "tok/s", "p95_ttft_ms": "ms"}


@dataclass
class RunData:
    """One launch: its stored row and its measured requests."""

    run_id: str
    label: str
    duration: float
    table: RequestTable
    row: dict

    @property
    def trial_key(self) -> str:
        return str(self.row.get("trial_key") or self.run_id)

    def summary(self, slo: SLO) -> dict:
        return summarize(self.table, self.duration, slo)

    def per_request(self, slo: SLO) -> np.ndarray:
        """Columns per request: good?, output tokens, TTFT (NaN if failed)."""
        t = self.table
        good = np.zeros(len(t), dtype=float)
        good[t.ok] = t.good(per_request_slo(slo))
        out = np.where(t.ok, t.output_tokens, 0).astype(float)
        return np.column_stack([good, out, t.ttft])

    def per_block(self, slo: SLO) -> np.ndarray:
        """Blocks of consecutive requests (send order): good requests, output tokens, summed latency (s)."""
        x = self.per_request(slo)
        e2el = np.where(self.table.ok, np.nan_to_num(self.table.e2el), 0.0)
        slot = np.arange(len(x)) // stats.block_size(len(x))
        out = np.zeros((int(slot[-1]) + 1 if len(x) else 0, 3))
        np.add.at(out, slot, np.column_stack([x[:, :2], e2el]))
        return out

    def concurrency(self) -> float:
        """Mean requests in flight: summed latency / duration (Little's law)."""
        ok = self.table.ok
        return float(np.nansum(self.table.e2el[ok])) / max(self.duration, 1e-9)

    def launch(self, metric: str, slo: SLO) -> stats.Launch:
        """This run's resampling units for `metric`: blocks for rates, succeeded requests for P95 TTFT."""
        if metric == "p95_ttft_ms":
            t = self.table
            return stats.Launch(t.ttft[t.ok & np.isfinite(t.ttft)][:, None])
        return stats.Launch(self.per_block(slo), self.concurrency())


def _rate(column: int) -> stats.Statistic:
    """Over blocks [good, tokens, latency]: work / summed latency x mean concurrency (= work / duration)."""
    return lambda x, scale: x[..., column].sum(axis=-1) / np.maximum(x[..., 2].sum(axis=-1), 1e-12) * scale


def _p95_ttft(x: np.ndarray, scale: float) -> np.ndarray:
    return percentile_last_axis(x[..., 0], 95) * 1000


def percentile_last_axis(v: np.ndarray, q: float) -> np.ndarray:
    """np.percentile(v, q, axis=-1) (linear), the same numbers, a third faster: a partition around only the two
    order statistics it needs (claims resample every launch's P95 TTFT 400 times)."""
    n = v.shape[-1]
    if n < 2 or not np.isfinite(v).all():
        return np.percentile(v, q, axis=-1)
    at = q / 100 * (n - 1)
    lo = int(np.floor(at))
    hi, t = min(lo + 1, n - 1), at - lo
    part = np.partition(v, [lo, hi], axis=-1)
    a, b = part[..., lo], part[..., hi]
    diff = b - a
    return a + diff * t if t < 0.5 else b - diff * (1 - t)  # numpy's own lerp, so the very same floats


STATISTICS: dict[str, stats.Statistic] = {"goodput": _rate(0), "output_throughput": _rate(1), "p95_ttft_ms": _p95_ttft}


@dataclass
class TrialData:
    """A trial: every launch given for its trial key, newest first."""

    key: str
    label: str
    launches: list[RunData] = field(default_factory=list)

    @property
    def newest(self) -> RunData:
        return self.launches[0]

    def summary(self, slo: SLO) -> dict:
        """Mean over launches of each figure; completed and failed summed; the SLO verdict on those."""
        per = [r.summary(slo) for r in self.launches]
        out = {k: float(np.mean([p[k] for p in per])) for k, v in per[0].items()
               if isinstance(v, (int, float)) and k not in ("completed", "failed", "slo_pass")}
        out["completed"] = int(sum(p["completed"] for p in per))
        out["failed"] = int(sum(p["failed"] for p in per))
        out["launches"] = len(per)
        out["violations"] = slo_violations(out, slo)
        out["slo_pass"] = not out["violations"]
        return out


def load_runs(store: Store, run_ids: list[str], with_chunks: bool = False, rows: pd.DataFrame | None = None,
              requests: pd.DataFrame | None = None) -> list[RunData]:
    """The runs with their measured requests; `rows`, `requests`: what the caller has read already (a query less)."""
    rows = store.runs(run_ids=run_ids) if rows is None else rows[rows.run_id.isin(run_ids)]
    if rows.empty:
        return []
    reqs = store.requests(run_ids, with_chunks=with_chunks) if requests is None else requests
    by_run = dict(tuple(reqs.groupby("run_id", sort=False))) if reqs is not None and not reqs.empty else {}
    out = []
    for row in rows.to_dict("records"):
        mine = by_run.get(row["run_id"], pd.DataFrame())
        if mine.empty or not row.get("duration"):
            continue
        out.append(RunData(row["run_id"], run_label(row), float(row["duration"]), request_table(mine), row))
    order = {rid: i for i, rid in enumerate(run_ids)}
    return sorted(out, key=lambda r: order.get(r.run_id, 0))


def run_label(row: dict) -> str:
    return f"{row.get('chapter')}/{row.get('trial')}" if row.get("trial") else row["run_id"]


def run_labels(runs: pd.DataFrame) -> pd.Series:
    """run_label of every row, column-wise (the dashboard labels every stored run)."""
    has = runs.trial.notna() & (runs.trial.astype(str) != "")
    return (runs.chapter.astype(str) + "/" + runs.trial.astype(str)).where(has, runs.run_id)


def trials_of(runs: list[RunData]) -> list[TrialData]:
    """Runs grouped into trials by trial key (launches of one configuration and workload), in first-seen order."""
    by_key: dict[str, TrialData] = {}
    for r in runs:
        by_key.setdefault(r.trial_key, TrialData(r.trial_key, r.label)).launches.append(r)
    for t in by_key.values():
        t.launches.sort(key=lambda r: str(r.row.get("started_at") or ""), reverse=True)
    return list(by_key.values())


def _as_trial(x: RunData | TrialData) -> TrialData:
    return x if isinstance(x, TrialData) else TrialData(x.trial_key, x.label, [x])


def rank(runs: list[RunData], slo: SLO) -> pd.DataFrame:
    """Trials ranked by goodput under `slo` (ties broken by output throughput); SLO misses rank last.

    Raises NotComparable when the runs do not share one comparability key.
    """
    comparable.check([r.row for r in runs], [r.label for r in runs])
    recs = []
    for t in trials_of(runs):
        s = t.summary(slo)
        recs.append({"trial_key": t.key, "label": t.label, "launches": s["launches"],
                     "goodput": s.get("request_goodput", s["request_throughput"]),
                     "output_throughput": s["output_throughput"], "request_throughput": s["request_throughput"],
                     "p95_ttft_ms": s["p95_ttft_ms"], "p95_tpot_ms": s["p95_tpot_ms"], "p99_e2el_ms": s["p99_e2el_ms"],
                     "completed": s["completed"], "failed": s["failed"], "slo_pass": s["slo_pass"],
                     "why_not": "; ".join(s["violations"]), "run_id": t.newest.run_id})
    df = pd.DataFrame(recs)
    if df.empty:
        return df
    df = df.sort_values(["slo_pass", "goodput", "output_throughput"], ascending=False).reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def figures(t: RunData | TrialData, slo: SLO, metric: str = "goodput", n_boot: int = 400) -> stats.Figures:
    """A trial's (or a launch's) `metric` per launch, each with its within-launch standard error."""
    if metric not in STATISTICS:
        raise ValueError(f"metric {metric!r}: use one of {', '.join(STATISTICS)}")
    launches = [r.launch(metric, slo) for r in _as_trial(t).launches]
    if any(len(x.units) == 0 for x in launches):
        return stats.Figures(np.full(len(launches), np.nan), np.full(len(launches), np.nan))
    return stats.figures(launches, STATISTICS[metric], n_boot)


def difference(a: RunData | TrialData, b: RunData | TrialData, slo: SLO, metric: str = "goodput",
               n_boot: int = 400, relative: bool = False) -> Interval:
    """metric(a) - metric(b), or metric(a)/metric(b) - 1 in percent when `relative`, with Welch's t interval
    over the two trials' launch figures (n_boot: resamples for each launch's own noise)."""
    return stats.welch(figures(a, slo, metric, n_boot), figures(b, slo, metric, n_boot), relative)


@dataclass
class Winner:
    ranking: pd.DataFrame
    winner: RunData | None  # the winning trial's newest launch (its launch command is exported)
    runner_up: RunData | None
    margin: Interval | None  # winner goodput - runner-up goodput, requests/s, at its Holm step's level
    winner_trial: TrialData | None = None
    runner_up_trial: TrialData | None = None
    key: str = ""
    confident: bool = False  # ahead of every other trial meeting the SLOs, Holm over those tests (best of N)
    rivals: int = 0  # how many trials the winner was tested against

    @property
    def within_noise(self) -> bool:
        return self.margin is not None and not self.confident

    @property
    def verdict(self) -> str:
        """better / can't tell / one launch."""
        if self.winner_trial is None or self.runner_up_trial is None or self.margin is None:
            return ""
        return stats.verdict(self.margin, True, self.confident)


def pick_winner(runs: list[RunData], slo: SLO, n_boot: int = 400) -> Winner:
    """The top trial under `slo`; confident only when its goodput is ahead of every other trial that meets the
    SLOs (the runner-up alone when none does), with Holm's correction over those tests: it was picked as the
    best of N, and the top of N equal trials is ahead of the rest by chance."""
    ranking = rank(runs, slo)
    if ranking.empty:
        return Winner(ranking, None, None, None)
    trials = {t.key: t for t in trials_of(runs)}
    key = comparable.check([r.row for r in runs])
    if not ranking.slo_pass[0]:
        return Winner(ranking, None, None, None, key=key)  # nothing meets the SLOs: no winner, say so
    first = trials[ranking.trial_key[0]]
    if len(ranking) < 2:
        return Winner(ranking, first.newest, None, None, first, None, key)
    second = trials[ranking.trial_key[1]]
    rivals = [trials[k] for k, ok in zip(ranking.trial_key[1:], ranking.slo_pass[1:]) if ok] or [second]
    ivs, ahead = stats.best_of(figures(first, slo, "goodput", n_boot),
                               [figures(t, slo, "goodput", n_boot) for t in rivals])
    return Winner(ranking, first.newest, second.newest, ivs[0], first, second, key, all(ahead), len(rivals))


def chapter_trials(store: Store, experiment: str, chapter: str | None = None,
                   include_unreliable: bool = False, runs: pd.DataFrame | None = None) -> list[RunData]:
    """Every ok launch of every trial key of an experiment (or one chapter), reliable ones unless asked.

    Not only the current definition of each name (selection.current): a smoke run with fewer requests is its
    own trial, set only against runs of its own comparability key, and never hides the full measurement.
    """
    runs = selection.standalone(store.runs(experiment=experiment, chapter=chapter) if runs is None else runs)
    runs = runs[runs.status.isin(selection.MEASURED)] if not runs.empty else runs
    if runs.empty:
        return []
    if not include_unreliable:
        runs = runs[~unreliable(runs)]
    return load_runs(store, list(runs.run_id), rows=runs)


def unreliable(runs: pd.DataFrame) -> pd.Series:
    """Runs marked "unreliable: ..." by analysis/validity.py (older files have no such column: none are)."""
    if "validity" not in runs:
        return pd.Series(False, index=runs.index)
    return runs.validity.fillna("").astype(str).str.startswith("unreliable")


# --- re-scoring stored runs: the winner of each comparable group, and A against B --------------------------
@dataclass
class Verdict:
    """A group's winner with its margins: over the runner-up, and over the chapter's baseline."""

    winner: Winner
    chapters: list[str]
    baseline: TrialData | None = None
    over_baseline: Interval | None = None
    unreliable_in: int = 0  # launches ranked here although marked unreliable (--include-unreliable)
    unreliable_out: int = 0  # launches of the experiment (or chapter) left out as unreliable


def stored_slo(store: Store, experiment: str) -> SLO:
    """The SLOs the experiment's newest run was measured under (what `--slo` overrides)."""
    import json

    runs = store.runs(experiment=experiment)
    text = next((s for s in runs.get("slo_json", []) if isinstance(s, str) and s), None)
    return SLO.model_validate(json.loads(text)) if text else SLO()


def winners(store: Store, experiment: str, slo: SLO, chapter: str | None = None,
            include_unreliable: bool = False, n_boot: int = 400) -> list[Verdict]:
    """One verdict per group of comparable runs (same comparability key) of an experiment or chapter."""
    data = chapter_trials(store, experiment, chapter, include_unreliable)
    everything = store.runs(experiment=experiment, chapter=chapter, status="ok")
    marked = int(unreliable(everything).sum()) if not everything.empty else 0
    if not data and marked:
        raise comparable.NotComparable(
            f"every ok run of {experiment}{' chapter ' + chapter if chapter else ''} ({marked}) is marked unreliable "
            "(see `qwen3lab runs`): pass --include-unreliable to rank them anyway, or measure on a quieter machine")
    groups: dict[str, list[RunData]] = {}
    across = comparable.chosen_builds(r.row for r in data)  # a chapter of builds sets them against each other
    for r in data:
        groups.setdefault(comparable.comparability_key(r.row, across), []).append(r)
    out = []
    for runs in groups.values():
        w = pick_winner(runs, slo, n_boot)
        chapters = list(dict.fromkeys(str(r.row.get("chapter")) for r in runs))
        bad = sum(1 for r in runs if str(r.row.get("validity") or "").startswith("unreliable"))
        v = Verdict(w, chapters, unreliable_in=bad, unreliable_out=0 if include_unreliable else marked)
        if w.winner_trial is not None:
            base_name = w.winner.row.get("baseline")
            bases = [t for t in trials_of(runs) if isinstance(base_name, str) and t.newest.row.get("trial") == base_name
                     and t.newest.row.get("chapter") == w.winner.row.get("chapter")]
            if bases and bases[0].key != w.winner_trial.key:
                v.baseline = bases[0]
                v.over_baseline = difference(w.winner_trial, bases[0], slo, "goodput", n_boot)
        out.append(v)
    return out


def resolve(store: Store, ref: str, experiment: str | None = None, include_unreliable: bool = True) -> TrialData:
    """A run id, a trial key, or CHAPTER/TRIAL (of `experiment`) -> the trial with its ok launches."""
    runs = store.runs(experiment=experiment, status="ok")
    if runs.empty:
        raise comparable.NotComparable(f"no ok runs{' of ' + experiment if experiment else ''} to find {ref!r} in")
    labels = runs.chapter.astype(str) + "/" + runs.trial.astype(str)
    if (runs.run_id == ref).any():
        pick = runs[runs.run_id == ref]
    else:
        pick = runs[(runs.trial_key == ref) | (labels == ref)]
        if pick.trial_key.nunique() > 1:  # one label, several configurations or workloads: the newest
            pick = pick[pick.trial_key == pick.trial_key.iloc[0]]
    if pick.empty:
        raise comparable.NotComparable(
            f"{ref!r} is neither a run id, a trial key nor CHAPTER/TRIAL of an ok run"
            f"{' of ' + experiment if experiment else ''}: list them with `qwen3lab runs`")
    trials = trials_of(load_runs(store, list(pick.run_id)))
    if not trials:
        raise comparable.NotComparable(f"{ref!r} has no stored requests to compare")
    return trials[0]


def _both(a: TrialData, b: TrialData, slo: SLO, metric: str, n_boot: int) -> tuple[Interval, Interval]:
    """The difference and the relative change (percent) of metric(a) against metric(b); the verdict rests on the
    difference: a zero baseline has no relative change."""
    fa, fb = figures(a, slo, metric, n_boot), figures(b, slo, metric, n_boot)
    return stats.welch(fa, fb), stats.welch(fa, fb, relative=True)


def _row(iv: Interval, rel: Interval) -> dict:
    return {"change_pct": rel.estimate, "low_pct": rel.low, "high_pct": rel.high, "difference": iv.estimate,
            "low": iv.low, "high": iv.high, "p_value": iv.p_value, "df": iv.df, "detectable": iv.detectable,
            "detectable_pct": rel.detectable, "launches_needed": iv.needed}


def _decided(iv: Interval) -> bool:
    """Better or worse at 95%, on two launches or more a side: nothing more to ask for."""
    return iv.excludes_zero and not iv.one_launch


def compare_two(a: TrialData, b: TrialData, slo: SLO, n_boot: int = 400) -> pd.DataFrame:
    """Each metric of a against b: both figures, the difference, its 95% interval, the verdict, and (can't
    tell) the smallest difference these launches detect and the launches a trial would need for the observed."""
    comparable.check([a.newest.row, b.newest.row], [a.label, b.label])
    sa, sb = a.summary(slo), b.summary(slo)
    recs = []
    for metric, higher in METRICS.items():
        iv, rel = _both(a, b, slo, metric, n_boot)
        key = SUMMARY_OF[metric] if SUMMARY_OF[metric] in sa else "request_throughput"
        recs.append({"metric": metric, "a": sa[key], "b": sb[key], **_row(iv, rel),
                     "verdict": stats.verdict(iv, higher, iv.excludes_zero),
                     "would_take": "" if _decided(iv) else stats.would_take(iv, UNIT[metric])})
    return pd.DataFrame(recs)


def runs_under(store: Store, runs: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    """`runs` with slo_pass, request_goodput and why_not recomputed under `slo` (rows without requests: NaN)."""
    out = runs.copy()
    ok = list(out[out.status == "ok"].run_id) if not out.empty else []
    by_id = {r.run_id: r.summary(slo) for r in load_runs(store, ok)}
    out["request_goodput"] = [by_id[r]["request_goodput"] if r in by_id and "request_goodput" in by_id[r]
                              else (by_id[r]["request_throughput"] if r in by_id else np.nan) for r in out.run_id]
    out["slo_pass"] = [bool(by_id[r]["slo_pass"]) if r in by_id else False for r in out.run_id]
    out["why_not"] = ["; ".join(slo_violations(by_id[r], slo)) if r in by_id else "no stored requests"
                      for r in out.run_id]
    return out


def parse_slo(pairs: list[str] | None, base: SLO | None = None) -> SLO:
    """`ttft_p95_ms=500` items over `base`; a bad one is an error naming it, the allowed fields and the fix."""
    from qwen3lab.errors import Qwen3LabError

    values = (base or SLO()).model_dump()
    for item in pairs or []:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in SLO.model_fields:
            raise Qwen3LabError(f"--slo {item!r}: write NAME=VALUE with NAME one of {', '.join(SLO.model_fields)}, "
                                "e.g. --slo ttft_p95_ms=500")
        try:
            values[name] = None if value.strip().lower() in ("", "none") else float(value)
        except ValueError:
            raise Qwen3LabError(f"--slo {item!r}: {value!r} is not a number of milliseconds (or a fraction for "
                                "max_failed_fraction); e.g. --slo tpot_p95_ms=50") from None
    try:
        return SLO(**values)
    except Exception as exc:  # pydantic: a value out of range
        raise Qwen3LabError(f"--slo: {exc}".splitlines()[0] + f" ({'; '.join(pairs or [])}): limits are > 0 ms, "
                            "max_failed_fraction within 0..1") from None
