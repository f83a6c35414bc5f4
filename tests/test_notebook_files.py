"""The committed notebooks: valid nbformat, a tagged parameters cell first, no stored outputs, and exactly what
tools/build_notebooks.py writes; every chapter of every experiment has its notebook."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from qwen3lab.experiment import files as xp
from qwen3lab import workbook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


def test_the_workbook_has_every_notebook():
    assert [p.stem for p in NOTEBOOKS] == sorted(workbook.NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_and_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: stored outputs in a cell; run tools/build_notebooks.py"
            assert cell.execution_count is None
    if workbook.NOTEBOOKS[path.stem]:  # a chapter notebook names its chapter and takes the small-run knobs
        params = first.source
        assert f'chapter = "{workbook.NOTEBOOKS[path.stem]}"' in params
        for name in ("experiment", "db", "runs_dir", "notebook_path", "num_requests", "max_trials"):
            assert f"{name} = " in params


def test_notebooks_are_what_the_builder_writes():
    got = subprocess.run([sys.executable, "tools/build_notebooks.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True)
    assert got.returncode == 0, got.stdout + got.stderr


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_chapter_has_a_notebook(path):
    exp = xp.load(path)
    for name, chapter in exp.all_chapters().items():
        stem = workbook.notebook_for(name, chapter)
        assert stem and (ROOT / "notebooks" / f"{stem}.ipynb").is_file(), f"{path.name}: chapter {name}"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiments_cover_the_whole_workbook(path):
    exp = xp.load(path)
    if exp.search is not None and not exp.all_chapters():
        return  # a search-only experiment (qwen3lab search) is not a workbook
    if exp.workload.get("capacity") is not None:
        return  # nor is a capacity experiment (qwen3lab capacity), whose every trial asks for its capacity
    if path.stem in NOT_WORKBOOKS:
        return
    chapters = set(exp.all_chapters())
    assert {c for c in workbook.NOTEBOOKS.values() if c} <= chapters


# Experiment files that are not a workbook, each with why (an entry whose file is gone fails below).
NOT_WORKBOOKS = {"cpu-tiny-nightly": "the scheduled history's one trial, launched three times a campaign "
                                     "(docs/history.md)"}


def test_every_not_workbook_entry_names_an_experiment_file():
    assert set(NOT_WORKBOOKS) <= {p.stem for p in EXPERIMENTS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_code_cell_parses(path):
    import ast

    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code":
            ast.parse(cell.source, filename=f"{path.name} cell {i}")
