"""Nobody let in: secret values never reach DuckDB, the spool, the server log, the exports or the dashboard;
names that look like SQL are only ever data."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen3lab.analysis import export
from qwen3lab.experiment.spec import EngineConfig, Trial
from qwen3lab.measure import runner, topology
from qwen3lab.redact import REDACTED, Redactor, is_secret_name
from qwen3lab.store import Store

from .conftest import TINY, small_workload, tiny_config
from .test_cli import qwen3lab

SECRETS = {"HF_TOKEN": "hf_s3cretTokenValue", "MY_DB_PASSWORD": "pa55-w0rd-value", "api": "sk-apikey-0123456789"}


def test_secret_names_by_whole_part():
    assert all(map(is_secret_name, ["HF_TOKEN", "VLLM_API_KEY", "--api-key", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"]))
    assert not any(map(is_secret_name, ["TOKENIZERS_PARALLELISM", "max_num_batched_tokens", "--tokenizer",
                                        "VLLM_CPU_KVCACHE_SPACE", "KEYBOARD"]))
    hide = Redactor(EngineConfig(env={"HF_TOKEN": "abcdef", "TOKENIZERS_PARALLELISM": "false"},
                                 extra_args=["--api-key=k3y-value"]))
    assert hide({"a": ["x abcdef y", "false", "--api-key=k3y-value"]}) == \
        {"a": [f"x {REDACTED} y", "false", f"--api-key={REDACTED}"]}


def test_secrets_are_redacted_everywhere_they_could_land(tmp_path, monkeypatch):
    env = {**TINY["env"], "HF_TOKEN": SECRETS["HF_TOKEN"], "MY_DB_PASSWORD": SECRETS["MY_DB_PASSWORD"]}
    cfg = tiny_config(env=env, extra_args=["--api-key", SECRETS["api"]])  # the server then wants a bearer token
    trial = Trial(experiment="secrets", name="with-secrets", engine=cfg, workload=small_workload(num_requests=6))
    db = tmp_path / "s.duckdb"
    store = Store(db)
    result = runner.run_trial(trial, store, tmp_path / "runs")
    assert result.status == "ok", result.reason  # measured through its --api-key

    def leaked(text: str) -> list[str]:
        return [name for name, value in SECRETS.items() if value in text]

    with store.connect(read_only=True) as con:  # every column of every table, as text
        for table in ("runs", "requests", "samples"):
            rows = con.execute(f"SELECT * FROM {table}").fetchall()
            assert not leaked(json.dumps(rows, default=str)), table
    assert not leaked(db.read_bytes().decode("latin-1"))
    row = store.run(result.run_id)
    assert row["env"]["HF_TOKEN"] == REDACTED and row["config"]["extra_args"] == ["--api-key", REDACTED]
    assert row["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"  # not a secret: kept
    log = Path(row["log_path"])
    assert log.stat().st_size > 0 and not leaked(log.read_text())

    ex = export.export_run(row, model="Qwen/Qwen3-0.6B")
    for fmt in export.FORMATS:
        assert not leaked(ex.get(fmt)), fmt
    assert 'HF_TOKEN="${HF_TOKEN:?' in ex.shell and "-e MY_DB_PASSWORD " in ex.docker
    assert "qwen3lab-secrets" in ex.kubernetes and any("secret values are not stored" in n for n in ex.notes)

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("QWEN3LAB_DB", str(db))
    for page, state, query in (("views/export.py", {"run_ids": [result.run_id], "experiment": "secrets",
                                                    "export_run": result.run_id, "export_model": "Qwen/Qwen3-0.6B"}, {}),
                               ("views/file.py", {}, {"run": result.run_id, "what": "log"})):
        st.cache_data.clear()
        at = AppTest.from_file(str(Path(__file__).parents[1] / "dashboard" / "app.py"), default_timeout=120)
        for k, v in state.items():
            at.session_state[k] = v
        at.run()
        for k, v in query.items():
            at.query_params[k] = v
        at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        shown = "\n".join(str(c.value) for c in at.code)
        assert shown and not leaked(shown), page


def test_a_secret_on_one_route_of_a_split_topology_is_redacted_in_its_row_and_every_log(tmp_path):
    """A token and an --api-key set on the long route only. No server: the run is begun and finished as the runner
    does, around the three logs a split launch writes, filled here as vLLM and the router would fill them (vLLM
    prints its non-default args, the api key included)."""
    long = {"env": {"HF_TOKEN": SECRETS["HF_TOKEN"]}, "extra_args": ["--api-key", SECRETS["api"]]}
    cfg = tiny_config(topology={"kind": "split", "threshold_tokens": 100,
                                "routes": {"short": {"max_model_len": 1024}, "long": long}})
    assert SECRETS["api"] in topology.launch_command(cfg)  # what would be stored, were it not redacted
    trial = Trial(experiment="secrets", name="split", engine=cfg, workload=small_workload())
    db = tmp_path / "s.duckdb"
    store = Store(db)
    begun = runner.begin_run(trial, store, runs_dir=tmp_path / "runs")
    logs = topology.log_paths(cfg, begun.log_path)
    assert sorted(logs) == ["long", "router", "short"] and logs["short"] == begun.log_path
    for name, path in logs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{name}: non-default args: {{'api_key': ['{SECRETS['api']}']}}, "
                        f"HF_TOKEN={SECRETS['HF_TOKEN']}\n")
    runner.finish(store, begun, "failed", f"the long server exited: args --api-key {SECRETS['api']}", None, {},
                  log=lambda _: None)

    def leaked(text: str) -> list[str]:
        return [name for name, value in SECRETS.items() if value in text]

    row = store.run(begun.run_id)
    assert not leaked(json.dumps(row, default=str)) and not leaked(db.read_bytes().decode("latin-1"))
    stored_long = row["config"]["topology"]["routes"]["long"]
    assert stored_long == {"env": {"HF_TOKEN": REDACTED}, "extra_args": ["--api-key", REDACTED]}
    assert REDACTED in row["launch_command"] and REDACTED in row["reason"]
    for name, path in logs.items():
        text = path.read_text()
        assert not leaked(text) and text.count(REDACTED) == 2, (name, text)
    ex = export.export_run(row, model="Qwen/Qwen3-0.6B")
    for fmt in export.SPLIT_FORMATS:
        assert not leaked(getattr(ex, fmt)), fmt
    assert 'HF_TOKEN="${HF_TOKEN:?' in ex.shell
    assert any("secret values are not stored" in n for n in ex.notes)  # the secret is the long route's alone


HOSTILE_NAMES = ["x'; DROP TABLE runs; --", 'q"uote', "back\\slash", "semi;colon $(id) `id`", "ünï ✓ 名前",
                 "line\nbreak", "%_wild_%"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_experiment_and_trial_names_are_only_data(tmp_path, name):
    """Stored through the runner (a trial skipped on this CPU: no server needed), read back by name."""
    db = tmp_path / "h.duckdb"
    store = Store(db)
    trial = Trial(experiment=name, chapter=name, name=name, workload=small_workload(),
                  engine=tiny_config(model="builtin:qwen3-14b-awq", max_model_len=None, enforce_eager=None))
    result = runner.run_trial(trial, store, tmp_path / "runs")
    assert result.status == "skipped"
    (row,) = store.runs(experiment=name, chapter=name).to_dict("records")
    assert (row["experiment"], row["trial"], row["chapter"]) == (name, name, name)
    assert store.runs(experiment=name + "x").empty and store.runs(experiment="%").empty  # equality, not LIKE
    listed = json.loads(qwen3lab("runs", "--db", str(db), "--experiment", name, "--json", timeout=120).stdout)
    assert [r["trial"] for r in listed] == [name]
    assert set(store.experiments()) == {name}  # the runs table is still there, with its one row
