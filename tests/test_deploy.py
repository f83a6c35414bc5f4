"""Exports deploy: the committed H200 results (dummy weights, the measuring host's python and offline switches)
export the real checkpoint with the winner's flags and nothing of the measuring kit, in every format, each format
checked by what reads it (bash -n, YAML, the Kubernetes schema); the tiny test model asks for --model."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from qwen3lab.analysis import compare, deploy, export
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.models import builtin_dir
from qwen3lab.store import Store

from .conftest import REPO

RESULTS = REPO / "experiments" / "results"
H200 = sorted(RESULTS.glob("h200-*.duckdb"))
K8S_VERSION = "1.33.0"
# What only the measuring host had: none of it may reach a deployment
KIT = ("dummy", "HF_HUB_OFFLINE", "FLASHINFER_SAMPLER", "taskset", "/opt/", ".cache/qwen3lab",
       "vllm.entrypoints.openai.api_server", "VLLM_CPU_")


def check_formats(ex: export.Export, checkpoint: str) -> None:
    """Each format read by what reads it, naming the checkpoint and no measuring kit."""
    for fmt in export.FORMATS:  # what runs: the comment lines above it say what was left out, and why
        text = "\n".join(line for line in ex.get(fmt).splitlines() if not line.startswith("#"))
        assert not [k for k in KIT if k in text], (fmt, text)
    command = [line for line in ex.shell.splitlines() if not line.startswith("#")]
    assert len(command) == 1 and shlex.split(command[0])[:3] == ["vllm", "serve", checkpoint], ex.shell
    for script in (ex.shell, ex.docker):
        got = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
    assert "dummy weights" in ex.shell and "flags from trial" in ex.shell  # what was measured, said in the output
    service = yaml.safe_load(ex.compose)["services"]["vllm"]
    assert service["command"][0] == checkpoint and service["image"].startswith("vllm/vllm-openai:")
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    docs = list(yaml.safe_load_all(ex.get("k8s")))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert docs[0]["spec"]["template"]["spec"]["containers"][0]["args"][0] == checkpoint


@pytest.mark.parametrize("db", H200, ids=lambda p: p.stem)
def test_every_committed_h200_run_deploys_its_real_checkpoint(db):
    store = Store(db)
    ok = store.runs(status="ok")
    assert not ok.empty
    for run_id in ok.drop_duplicates("config_hash").run_id:  # one run per config: load points share theirs
        run = store.run(run_id)
        assert run["config"]["load_format"] == "dummy"  # measured with random weights...
        ex = export.export_run(run)
        want = {"builtin:qwen3-14b": "Qwen/Qwen3-14B", "builtin:qwen3-14b-fp8": "Qwen/Qwen3-14B-FP8",
                "builtin:qwen3-14b-awq": "Qwen/Qwen3-14B-AWQ"}[run["model"]]
        check_formats(ex, want)  # ...deploys the real ones
        flags = ex.launch.argv[3:-4]  # the trial's own flags, between the model and --host/--port
        assert all(f in ex.shell.splitlines()[2] for f in flags)


def test_the_h200_winner_exports_from_the_cli():
    db = RESULTS / "h200-qwen3-14b.duckdb"
    store = Store(db)
    [verdict, *_] = sorted(compare.winners(store, "h200-qwen3-14b", compare.stored_slo(store, "h200-qwen3-14b")),
                           key=lambda v: -len(v.winner.ranking))
    winner = verdict.winner.winner
    assert winner is not None
    for fmt in ("shell", "k8s"):  # every format's text is export_run's: checked above
        out = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "export", winner.run_id, "--format", fmt,
                              "--db", str(db)], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert out.stdout == export.export_run(store.run(winner.run_id)).get(fmt)
        body = [line for line in out.stdout.splitlines() if not line.startswith("#")]
        assert "--load-format" not in "\n".join(body) and "measured with dummy weights" in out.stdout
    by_trial = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "export", winner.row["trial"], "--db", str(db)],
                              capture_output=True, text=True, cwd=REPO)
    assert by_trial.returncode == 0 and "vllm serve Qwen/Qwen3-14B" in by_trial.stdout, by_trial.stderr
    # a capacity configuration by its name: its load points share its config
    capacity = Store(RESULTS / "h200-qwen3-14b-capacity.duckdb")
    run = export.find_run(capacity, "fp8-online")
    assert run["trial"].startswith("fp8-online@") and run["status"] == "ok"
    with pytest.raises(export.ExportError, match="neither a run id nor the trial"):
        export.find_run(capacity, "fp8")


def test_the_tiny_test_model_asks_for_a_checkpoint(tmp_path):
    tiny = {"run_id": "r1", "engine_kind": "vllm", "trial": "eager", "vllm_version": "0.32.0",
            "exec_argv": ["/x/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/x/qwen3-tiny"],
            "config": EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", enforce_eager=True, python="/x/python",
                                   env={"VLLM_CPU_KVCACHE_SPACE": "1", "MY_FLAG": "kept"}).model_dump(mode="json")}
    with pytest.raises(deploy.DeployError, match=r"no checkpoint on the Hugging Face hub.*--model Qwen/"):
        export.export_run(tiny)
    ex = export.export_run(tiny, model="Qwen/Qwen3-0.6B")
    assert ex.launch.tokens() == ["MY_FLAG=kept", "vllm", "serve", "Qwen/Qwen3-0.6B", "--enforce-eager",
                                  "--host", "127.0.0.1", "--port", "8000"]
    assert "were not measured" in ex.shell and "measured on vllm-cpu" in " ".join(ex.notes)
    out = subprocess.run([sys.executable, "-m", "qwen3lab.cli", "export", "nothing-here", "--db", str(tmp_path / "x.duckdb")],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "qwen3lab run" in out.stderr  # no database: says how to make one


def test_local_dummy_folders_map_to_their_checkpoint(tmp_path):
    # the folder qwen3lab made on the measuring host (not here): known by its name
    made = EngineConfig(model="/root/.cache/qwen3lab/dummy-models/qwen3-14b-fp8-v1", load_format="dummy")
    assert deploy.checkpoint(made) == "Qwen/Qwen3-14B-FP8"
    # a folder of the user's own, here: known by its config.json's architecture and quantization
    mine = tmp_path / "my-awq"
    mine.mkdir()
    (mine / "config.json").write_bytes((builtin_dir("qwen3-14b-awq") / "config.json").read_bytes())
    assert deploy.checkpoint(EngineConfig(model=str(mine), load_format="dummy")) == "Qwen/Qwen3-14B-AWQ"
    other = json.loads((mine / "config.json").read_text()) | {"num_hidden_layers": 7}
    (mine / "config.json").write_text(json.dumps(other))
    with pytest.raises(deploy.DeployError, match="engine.model .*my-awq.*--model"):
        deploy.checkpoint(EngineConfig(model=str(mine), load_format="dummy"))
    # real weights in a folder and hub ids are deployed as they are
    assert deploy.checkpoint(EngineConfig(model=str(mine))) == str(mine)
    assert deploy.checkpoint(EngineConfig(model="Qwen/Qwen3-14B", load_format="dummy")) == "Qwen/Qwen3-14B"


def test_bad_format_names_the_allowed_ones():
    run = {"run_id": "r", "engine_kind": "vllm", "config": EngineConfig(model="builtin:qwen3-14b").model_dump(mode="json")}
    with pytest.raises(export.ExportError, match="'helm'.*shell, docker, compose, kubernetes"):
        export.export_run(run).get("helm")
