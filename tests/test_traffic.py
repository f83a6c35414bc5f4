"""Traffic files without a server: reading each format, auto-detection, errors, windows, fitting, exact bytes,
the pre-flight refusal and `qwen3lab traffic`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qwen3lab.errors import SpecError
from qwen3lab.experiment import preflight
from qwen3lab.experiment.spec import EngineConfig, Trial, Workload
from qwen3lab.measure import workload as wl
from qwen3lab.traffic import build as tb, shape, sources
from qwen3lab.traffic.spec import Source

TRACES = "experiments/traces/"
FILES = {"mooncake_conversation_1000.jsonl": "mooncake", "azure_llm_conv_2023_2000.csv": "azure",
         "burstgpt_format_handmade.csv": "burstgpt", "sharegpt_multiturn.json": "sharegpt",
         "openai_chat_multiturn.jsonl": "openai-chat", "prompts.jsonl": "prompts",
         "conversations.jsonl": "conversations"}


@pytest.fixture(scope="module")
def tok():
    return wl.load_tokenizer("qwen3lab/assets/models/qwen3-tiny")


def _w(source: dict, **kw) -> Workload:
    return Workload(**{"concurrency": 4, "source": source, **kw})


@pytest.mark.parametrize("name", list(FILES))
def test_auto_detection_reads_each_committed_file(name):
    t = sources.load(Source(path=TRACES + name))
    assert t.format == FILES[name] and t.entries
    assert t.multi_turn == (FILES[name] in ("sharegpt", "openai-chat", "conversations"))


def test_each_format_reads_its_fields():
    moon = sources.load(Source(path=TRACES + "mooncake_conversation_1000.jsonl")).entries
    first = json.loads(open(TRACES + "mooncake_conversation_1000.jsonl").readline())
    assert (moon[0].prompt_tokens, moon[0].output_tokens, moon[0].hash_ids) == (
        first["input_length"], first["output_length"], first["hash_ids"])
    last = json.loads(open(TRACES + "mooncake_conversation_1000.jsonl").readlines()[-1])
    assert moon[-1].at == pytest.approx(last["timestamp"] / 1000)  # ms by default
    assert sources.load(Source(path=TRACES + "mooncake_conversation_1000.jsonl", timestamp_unit="s")
                        ).entries[-1].at == pytest.approx(last["timestamp"])
    azure = sources.load(Source(path=TRACES + "azure_llm_conv_2023_2000.csv")).entries
    assert (azure[0].at, azure[0].prompt_tokens, azure[0].output_tokens) == (0.0, 374, 44)
    assert azure[1].at == pytest.approx(50.9951690 - 46.6805900)  # 7 fractional digits kept
    burst = sources.load(Source(path=TRACES + "burstgpt_format_handmade.csv"))
    assert burst.skipped == 1 and [e.prompt_tokens for e in burst.entries] == [472, 1087, 300, 95, 640]
    share = sources.load(Source(path=TRACES + "sharegpt_multiturn.json")).entries
    trip = [e for e in share if e.session == "trip"]
    assert [e.turn for e in trip] == [0, 1, 2] and trip[0].system.startswith("You are")
    assert trip[1].text.startswith("Which of those") and trip[0].reply.startswith("Walk Alfama")
    chat = sources.load(Source(path=TRACES + "openai_chat_multiturn.jsonl")).entries
    assert [(e.session, e.turn, e.output_tokens) for e in chat] == [("units", 0, None), ("units", 1, 24),
                                                                     ("sky", 0, 16)]
    conv = sources.load(Source(path=TRACES + "conversations.jsonl")).entries
    assert [(e.session, e.turn, e.delay_s) for e in conv][:3] == [("a", 0, None), ("a", 1, 0.2), ("a", 2, 0.2)]


@pytest.mark.parametrize("content, name, words", [
    ("a,b\n1,2\n", "x.csv", ["ContextTokens", "Request tokens", "set source.format"]),
    ('{"foo": 1}\n', "x.jsonl", ["keys ['foo']", "hash_ids", "session_id", "messages", "prompt"]),
    ('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": "abc"}\n', "x.jsonl",
     ["line 1", "hash_ids: a list of integers"]),
    ('{"timestamp": 0, "input_length": "many", "output_length": 2}\n', "x.jsonl", ["line 1", "input_length"]),
    ('{"prompt": "hi"}\nnot json\n', "x.jsonl", ["line 2", "one JSON object a line"]),
    ('{"session_id": "a", "turn": 0}\n', "x.jsonl", ["prompt (text) or input_length"]),
    ('[{"conversations": 3}]', "x.json", ["item 0", 'an object with a "conversations" list']),
])
def test_bad_files_are_refused_naming_the_line_and_the_fix(tmp_path, content, name, words):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SpecError) as err:
        sources.load(Source(path=str(path)))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_missing_file_and_an_empty_window_are_refused():
    with pytest.raises(SpecError, match="an existing traffic file"):
        sources.load(Source(path="no/such/file.jsonl"))
    with pytest.raises(SpecError, match="lower start"):
        tb.requests(_w({"path": TRACES + "azure_llm_conv_2023_2000.csv", "start": 1e6}), None, None)


def test_window_start_limit_and_sample(tok):
    src = {"path": TRACES + "azure_llm_conv_2023_2000.csv", "start": 60, "limit": 10}
    reqs = tb.requests(_w(src, fit_to_context="scale"), tok, 2048)
    entries = [e for e in sources.load(Source(path=src["path"])).entries if e.at >= 60][:10]
    assert len(reqs) == 10 and reqs[0].at == 0.0
    assert [r.at for r in reqs] == pytest.approx([e.at - entries[0].at for e in entries])
    half = tb.requests(_w({**src, "limit": None, "sample": 0.5}, fit_to_context="scale"), tok, 2048)
    n_window = sum(e.at >= 60 for e in sources.load(Source(path=src["path"])).entries)
    assert 0.4 * n_window < len(half) < 0.6 * n_window
    fast = tb.requests(_w({**src, "time_scale": 2.0}, fit_to_context="scale"), tok, 2048)
    assert [r.at for r in fast] == pytest.approx([r.at / 2 for r in reqs])


def test_lengths_that_do_not_fit_are_refused_or_scaled_by_one_factor(tok):
    src = {"path": TRACES + "mooncake_conversation_1000.jsonl", "limit": 30}
    with pytest.raises(SpecError) as err:
        tb.requests(_w(src), tok, 2048)
    assert "longer than max_model_len 2048" in str(err.value) and "fit_to_context: scale" in str(err.value)
    reqs = tb.requests(_w(src, fit_to_context="scale"), tok, 2048)
    entries = sources.load(Source(path=src["path"])).entries[:30]
    scale = reqs[0].scale
    assert 0 < scale < 1 and all(r.scale == scale for r in reqs)
    assert max(r.prompt_tokens + r.output_tokens for r in reqs) <= 2048
    assert [r.prompt_tokens for r in reqs] == [max(1, int(e.prompt_tokens * scale)) for e in entries]
    wl.verify_lengths(reqs, tok)
    text = {"path": TRACES + "prompts.jsonl"}
    with pytest.raises(SpecError, match="shorten the texts"):
        tb.requests(_w(text, fit_to_context="scale"), tok, 8)


def test_shared_hash_ids_share_their_blocks_tokens_exactly(tmp_path, tok):
    path = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [1, 2, 3]},
            {"timestamp": 5, "input_length": 20, "output_length": 2, "hash_ids": [1, 2, 4]},
            {"timestamp": 9, "input_length": 20, "output_length": 2, "hash_ids": [5, 6, 7]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b, c = tb.requests(_w({"path": str(path), "block_tokens": 8}), tok, 2048)
    ids = [tok._tok.encode(r.prompt, add_special_tokens=False).ids for r in (a, b, c)]
    assert ids[0][:16] == ids[1][:16] and ids[0][16:] != ids[1][16:] and ids[0][:8] != ids[2][:8]
    assert [len(x) for x in ids] == [20, 20, 20] and [r.at for r in (a, b, c)] == pytest.approx([0, 0.005, 0.009])  # ms


def test_same_file_and_seed_same_bytes_and_the_file_is_in_the_digest(tmp_path, tok):
    src = {"path": TRACES + "burstgpt_format_handmade.csv"}
    one = wl.requests_digest(tb.requests(_w(src), tok, 4096))
    assert one == wl.requests_digest(tb.requests(_w(src), tok, 4096))
    assert one != wl.requests_digest(tb.requests(_w(src, seed=1), tok, 4096))
    copy = tmp_path / "b.csv"
    copy.write_text(open(TRACES + "burstgpt_format_handmade.csv").read().replace("95,120", "95,121"))
    assert one != wl.requests_digest(tb.requests(_w({"path": str(copy)}), tok, 4096))


def test_multi_turn_requests_carry_the_recorded_history(tok):
    reqs = tb.requests(_w({"path": TRACES + "sharegpt_multiturn.json", "think_time_s": 0.5},
                                api="chat"), tok, 2048)
    trip = [r for r in reqs if r.session == "trip"]
    assert [r.turn for r in trip] == [0, 1, 2] and [r.think_s for r in trip] == [0, 0.5, 0.5]
    roles = [m["role"] for m in trip[2].messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert trip[2].messages[2]["content"] == trip[0].reply and trip[2].messages[-1]["content"] == trip[2].user
    assert trip[0].prompt_tokens < trip[1].prompt_tokens < trip[2].prompt_tokens


def test_preflight_refuses_a_trace_that_does_not_fit_before_any_server():
    cfg = EngineConfig(model="builtin:qwen3-tiny", load_format="dummy", max_model_len=2048)
    trial = Trial(experiment="x", name="t", engine=cfg,
                  workload=_w({"path": TRACES + "mooncake_conversation_1000.jsonl", "limit": 5}))
    verdict = preflight.check(trial)
    assert not verdict.ok and "x/default/t" in str(verdict.errors[0]) or "x/" in str(verdict.errors[0])
    assert "fit_to_context: scale" in str(verdict.errors[0])
    ok = trial.model_copy(update={"workload": _w({"path": TRACES + "mooncake_conversation_1000.jsonl",
                                                   "limit": 5}, fit_to_context="scale")})
    assert preflight.check(ok).ok


def test_traffic_command_summarises_and_exports_a_shape_without_text(tmp_path):
    out = tmp_path / "shape.jsonl"
    got = subprocess.run([sys.executable, "-m", "qwen3lab", "traffic", TRACES + "sharegpt_multiturn.json", "--json",
                          "--export-shape", str(out)], capture_output=True, text=True, check=True)
    summary = json.loads(got.stdout)
    assert summary["sessions"] == 3 and summary["requests"] == 8 and summary["turns_per_session"]["max"] == 3
    text = out.read_text()
    assert "Lisbon" not in text and "Alfama" not in text
    back = sources.load(Source(path=str(out)))
    assert back.format == "conversations" and len(back.entries) == 8
    rows = [json.loads(line) for line in text.splitlines()]
    assert sorted((e.session, e.turn, e.prompt_tokens) for e in back.entries) == sorted(
        (r["session_id"], r["turn"], r["input_length"]) for r in rows)
    moon = shape.summary(sources.load(Source(path=TRACES + "mooncake_conversation_1000.jsonl")))
    assert moon["requests"] == 1000 and 0 < moon["prefix_reuse"]["reuse_fraction"] < 1
    assert moon["rate"]["mean_per_s"] == pytest.approx(1000 / moon["duration_s"])
    bad = subprocess.run([sys.executable, "-m", "qwen3lab", "traffic", "README.md"], capture_output=True, text=True)
    assert bad.returncode == 2 and "source.format" in bad.stderr
    schema = subprocess.run([sys.executable, "-m", "qwen3lab", "schema", "source"], capture_output=True, text=True,
                            check=True)
    assert "time_scale" in schema.stdout and "block_tokens" in schema.stdout


def test_capacity_on_time_scale_replays_the_trace_faster_open_loop():
    from qwen3lab.experiment.spec import Capacity
    from qwen3lab.measure import capacity, loadpoint
    from qwen3lab.traffic import replay

    spec = Capacity(axis="time_scale", start=2, min_arrival_s=30)
    w = _w({"path": TRACES + "azure_llm_conv_2023_2000.csv", "limit": 50}, capacity=spec)
    assert capacity.first_load(spec, w) == 2.0
    point = loadpoint.point_workload(w, spec, 8.0, 0, False, 30.0)
    assert point.source.time_scale == 8.0 and point.concurrency is None and point.request_rate is None
    assert point.duration_s == 30.0 and point.source.path == w.source.path
    offsets = replay.offsets(point, tb.requests(point, wl.load_tokenizer(
        "qwen3lab/assets/models/qwen3-tiny"), None))
    assert replay.lap_s(point, offsets) == pytest.approx(offsets[-1] * 50 / 49)
    with pytest.raises(ValueError, match="time_scale replays a timestamped workload.source"):
        Workload(concurrency=4, capacity=spec)


def test_a_request_starting_with_a_hash_id_sent_before_is_marked_shared(tmp_path, tok):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 16, "output_length": 2, "hash_ids": h}) + "\n"
                            for t, h in ((0, [1, 2]), (1, [1, 3]), (2, [4, 5]), (3, [4, 6]))))
    reqs = tb.requests(_w({"path": str(path), "block_tokens": 8}), tok, 2048)
    assert [r.shared_prefix for r in reqs] == [False, True, False, True]
