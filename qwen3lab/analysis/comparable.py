"""Which runs may be set against each other: the comparability key.

Two runs are compared, ranked or pooled only when they sent the same requests (the requests digest: lengths,
prompts, arrival schedule), tokenized the same way (tokenizer fingerprint), on the same kind of machine (CPU
model and GPUs) and with the same vLLM build (vLLM and torch versions). Everything else (the engine flags)
is what is being compared. A field nobody recorded (an imported result) reads "unknown": it matches
"unknown", and the key says so. A capacity search's load point also carries its offered load: points at
different loads are never set against each other (the load is part of the workload; the Capacity page ranks
configurations by capacity instead).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from qwen3lab.errors import Qwen3LabError

# field of the key -> run columns it is made of
FIELDS: dict[str, tuple[str, ...]] = {
    "workload": ("requests_digest",),
    "tokenizer": ("tokenizer_fingerprint",),
    "machine": ("cpu", "gpu"),
    "build": ("vllm_version", "torch_version"),
}
UNKNOWN = "unknown"


class NotComparable(Qwen3LabError):
    """Runs of different workloads, tokenizers, machines or builds were asked to be compared."""


def _text(v) -> str | None:
    if v is None or (isinstance(v, float) and v != v):  # NaN from a DataFrame
        return None
    return str(v)


def chosen_builds(rows: Iterable[Mapping]) -> bool:
    """Whether the runs were launched by different pythons: builds chosen on purpose (engine.build or
    engine.python, the attention_and_builds chapter), so the build is the knob being compared. The same python
    with another vLLM (an upgrade in place between two runs) stays a difference of circumstance."""
    return len({str(r.get("python_executable")) for r in rows if _text(r.get("python_executable"))}) > 1


def key_fields(row: Mapping, across_builds: bool = False) -> dict[str, str]:
    """The key's fields of one run row, each as text ('unknown' when not recorded); `across_builds`: without the
    build (runs whose trials chose their builds, set against each other)."""
    out = {}
    for name, cols in FIELDS.items():
        if across_builds and name == "build":
            continue
        parts = [_text(row.get(c)) for c in cols]
        out[name] = UNKNOWN if all(p is None for p in parts) else " / ".join(p or "?" for p in parts)
    if (load := _text(row.get("offered_load"))) is not None:  # only load points: other runs' keys stay as stored
        out["load"] = f"{_text(row.get('load_axis')) or 'load'} {float(load):g}"
    return out


def comparability_key(row: Mapping, across_builds: bool = False) -> str:
    """A short digest of the key's fields: equal keys, comparable runs."""
    blob = json.dumps(key_fields(row, across_builds), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def differences(a: Mapping, b: Mapping, across_builds: bool = False) -> list[str]:
    """'workload: 3f2a.. vs 91bc..' for each field of the key in which two runs differ."""
    fa, fb = key_fields(a, across_builds), key_fields(b, across_builds)
    return [f"{k}: {fa.get(k, 'none')} vs {fb.get(k, 'none')}" for k in dict.fromkeys([*fa, *fb])
            if fa.get(k) != fb.get(k)]


def check(rows: Iterable[Mapping], labels: Iterable[str] | None = None) -> str:
    """The one key of `rows`; raises NotComparable naming each differing field and the runs it parts. Where a
    trial among them chose its build, the builds may differ: that is what is compared."""
    rows = list(rows)
    across = chosen_builds(rows)
    labels = list(labels) if labels is not None else [str(r.get("run_id")) for r in rows]
    if not rows:
        return ""
    first = rows[0]
    problems = [f"{labels[0]} and {lab} differ in " + "; ".join(d)
                for r, lab in zip(rows[1:], labels[1:]) if (d := differences(first, r, across))]
    if problems:
        raise NotComparable(
            "these runs cannot be set against each other: " + " | ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + ". Compare runs of one workload, tokenizer, machine and vLLM build: pick one chapter "
              "(--chapter), or runs that share the comparability key (`qwen3lab runs --json` lists it).")
    return comparability_key(first, across)


def groups(runs) -> list[dict]:
    """The groups of runs that may be compared, largest first: one per experiment and key, of the ok runs not
    marked unreliable. Runs that measure a trial come first (most trials first); then a capacity search's load
    points, which group by offered load (the highest load most configurations measured first); a soak's windows
    are no group. Each: experiment, chapters, key, load (None, or 'request_rate 64'), run_ids (newest first),
    trials (how many), newest."""
    from qwen3lab.analysis import selection

    ok = runs[runs.status.isin(selection.MEASURED)] if not runs.empty else runs
    if ok.empty:
        return []
    if "validity" in ok:
        ok = ok[ok.validity.isna()]
    if "soak_id" in ok:
        ok = ok[ok.soak_id.isna()]
    # a key per distinct combination of the key's columns, not per run: thousands of runs share a few keys
    cols = [c for c in (*(c for group in FIELDS.values() for c in group), "offered_load", "load_axis") if c in ok]
    combos = ok[cols].astype(object).where(ok[cols].notna(), None)
    seen: dict[tuple, tuple[str, str | None]] = {}
    keys, loads = [], []
    for combo in combos.itertuples(index=False, name=None):
        if combo not in seen:
            row = dict(zip(cols, combo))
            seen[combo] = (comparability_key(row), key_fields(row).get("load"))
        keys.append(seen[combo][0])
        loads.append(seen[combo][1])
    out: dict[tuple, dict] = {}
    trial_keys = ok.trial_key.fillna(ok.run_id) if "trial_key" in ok else ok.run_id
    chapters = ok.chapter if "chapter" in ok else [None] * len(ok)
    for exp, run_id, trial, chapter, key, load, offered, started in zip(
            ok.experiment, ok.run_id, trial_keys, chapters, keys, loads,
            ok.offered_load if "offered_load" in ok else [None] * len(ok), ok.started_at):  # newest first
        g = out.setdefault((exp, key), {"experiment": exp, "key": key, "load": load, "chapters": [], "run_ids": [],
                                        "trials": set(), "newest": started, "_load": _text(offered)})
        g["run_ids"].append(run_id)
        g["trials"].add(trial)
        if _text(chapter) is not None and chapter not in g["chapters"]:
            g["chapters"].append(chapter)
    found = [dict(g, trials=len(g["trials"])) for g in out.values()]
    found.sort(key=lambda g: (g["_load"] is not None, -g["trials"], -float(g["_load"] or 0), -len(g["run_ids"])))
    return [{k: v for k, v in g.items() if k != "_load"} for g in found]  # stable: newer groups first on ties


def describe(row: Mapping) -> str:
    """The key and its fields in one line, for the winner line and the report."""
    f = key_fields(row)
    short = {k: (v[:12] if k in ("workload", "tokenizer") and v != UNKNOWN else v) for k, v in f.items()}
    return f"{comparability_key(row)} (" + ", ".join(f"{k} {v}" for k, v in short.items()) + ")"
