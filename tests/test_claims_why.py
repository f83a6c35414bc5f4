"""Claims and chapters say what they cannot show, on the committed H200 results: every trial of the experiment
either has a claim or a row saying why not; the chapter notebooks end in the winner card's words."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from qwen3lab import workbook
from qwen3lab.analysis import compare, selection, wording
from qwen3lab.analysis.claims import claims as claims_of
from qwen3lab.store import Store

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "experiments" / "results" / "h200-qwen3-14b.duckdb"
EXP = "h200-qwen3-14b"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("h200") / H200.name
    shutil.copy(H200, path)  # the committed file is never written
    return Store(path)


@pytest.fixture(scope="module")
def claims(store):
    return claims_of(store, EXP, compare.stored_slo(store, EXP))


def test_every_trial_has_a_claim_or_says_why(store, claims):
    runs = selection.standalone(store.runs(experiment=EXP))
    named = set(runs.baseline.dropna())
    trials = {(c, t) for c, t in zip(runs.chapter, runs.trial) if t not in named}
    assert trials == set(zip(claims.chapter, claims.trial))
    why = claims.groupby(["chapter", "trial"]).verdict.first()
    # measured before a chapter's slice stored its baseline: the largest effect of the file, not left out silently
    assert why["scheduler", "enforce-eager"].startswith("not compared: no run of its chapter names a baseline")
    assert f"`qwen3lab compare scheduler/enforce-eager scheduler/defaults --experiment {EXP}`" in \
        why["scheduler", "enforce-eager"]
    assert why["block_size", "block-32"].startswith("not compared: ")
    status = dict(zip(runs.chapter + "/" + runs.trial, runs.status))
    for label in ("attention_and_builds/FA2", "emulation/rtx4090-bf16"):
        chapter, trial = label.split("/")
        assert why[chapter, trial].startswith(f"not compared: no finished run ({status[label]}: ")


def test_the_experiment_files_baseline_stands_in_for_runs_that_stored_none(store):
    got = claims_of(store, EXP, compare.stored_slo(store, EXP), baselines={"scheduler": "defaults"})
    eager = got[(got.trial == "enforce-eager") & (got.metric == "output_throughput")]
    assert len(eager) == 1 and eager.baseline.iloc[0] == "defaults"
    ok = store.runs(experiment=EXP, chapter="scheduler", status="ok").set_index("trial")
    # the stored summaries, independently: the pooled requests give the same change to a few percent
    expected = 100 * (ok.output_throughput["enforce-eager"] / ok.output_throughput["defaults"] - 1)
    assert abs(eager.change_pct.iloc[0] - expected) < 3
    assert eager.verdict.iloc[0].startswith("one launch")  # one launch a side: no verdict
    assert not ((got.chapter == "scheduler") & got.verdict.str.startswith("not compared")).any()


def test_a_chapter_ends_with_its_verdict_in_the_winner_cards_words(store):
    ch = workbook.open_chapter(ROOT / "experiments" / "h200-qwen3-14b.yaml", "attention_and_builds", db=store.path)
    text = ch.verdict().data
    v = compare.winners(store, EXP, ch.slo, chapter="attention_and_builds")[0]
    assert text.startswith("### Verdict") and wording.verdict_text(v.winner) in text
    assert wording.slo_text(ch.slo) in text and "FA2: not compared: no finished run" in text
    effects = ch.effects()
    table = workbook.claims_table(effects)
    assert list(table.columns[:3]) == ["verdict", "chapter", "trial"] and not table.isin(["None", "nan"]).any().any()
    for r in effects[effects.verdict == "worse"].itertuples():  # each told claim is a sentence with its interval
        assert f"{r.change_pct:+.1f}% (95% CI {r.low_pct:+.1f} .. {r.high_pct:+.1f}), **worse**" in text


@pytest.mark.parametrize("stem", [s for s, c in workbook.NOTEBOOKS.items() if c])
def test_every_chapter_notebook_ends_with_its_verdict(stem):
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    assert nb.cells[-1].cell_type == "code" and nb.cells[-1].source.splitlines()[-1] == "ch.verdict()"


def test_the_claims_percentile_gives_numpys_very_numbers():
    import numpy as np

    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 20, 1042, 1043):
        for q in (50, 95, 99):
            v = rng.gamma(4.0, 0.05, (40, n))
            assert np.array_equal(compare.percentile_last_axis(v, q), np.percentile(v, q, axis=-1)), (n, q)
    v[0, 0] = np.nan  # NaN: numpy's own path
    assert np.array_equal(compare.percentile_last_axis(v, 95), np.percentile(v, 95, axis=-1), equal_nan=True)
