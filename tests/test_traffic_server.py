"""The user's own traffic on a real server (the session's shared tiny_server): every format end to end through
the runner (stored rows), a trace on schedule, hash-id reuse as vLLM prefix-cache hits, and multi-turn history.

Few requests each: the whole file adds about a minute of server time."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from qwen3lab.analysis import validity
from qwen3lab.experiment.spec import EndpointConfig, Trial, Workload
from qwen3lab.measure import engine, runner
from qwen3lab.measure.telemetry import parse_metrics

TRACES = "experiments/traces/"
TOKENIZER = str(engine.resolve_model_path("builtin:qwen3-tiny"))


def _run(server, store, tmp_path, name: str, source: dict, **workload):
    cfg = EndpointConfig(kind="endpoint", url=server.base_url, model=server.model_name, tokenizer=TOKENIZER)
    w = Workload(**{"concurrency": 4, "source": source, **workload})
    result = runner.run_trial(Trial(experiment="traffic", name=name, engine=cfg, workload=w), store, tmp_path)
    assert result.status == "ok", result.reason
    return store.run(result.run_id), store.requests([result.run_id])


# source, workload overrides, requests the window holds
FORMATS = {
    "mooncake": ({"path": TRACES + "mooncake_conversation_1000.jsonl", "limit": 6, "replay": False},
                 {"fit_to_context": "scale"}, 6),
    "azure": ({"path": TRACES + "azure_llm_conv_2023_2000.csv", "limit": 5, "time_scale": 4.0},
              {"fit_to_context": "scale", "concurrency": None}, 5),
    "burstgpt": ({"path": TRACES + "burstgpt_format_handmade.csv", "time_scale": 2.0},
                 {"fit_to_context": "scale", "concurrency": None}, 5),  # its row of 0 response tokens left out
    "prompts": ({"path": TRACES + "prompts.jsonl"}, {}, 4),
    "sharegpt": ({"path": TRACES + "sharegpt_multiturn.json"}, {"api": "chat"}, 8),
    "openai-chat": ({"path": TRACES + "openai_chat_multiturn.jsonl"}, {"api": "chat"}, 3),
    "conversations": ({"path": TRACES + "conversations.jsonl"}, {"api": "chat"}, 5),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_runs_end_to_end_with_exact_lengths(tiny_server, store, tmp_path, fmt):
    source, overrides, n = FORMATS[fmt]
    row, reqs = _run(tiny_server, store, tmp_path, fmt, source, **overrides)
    assert len(reqs) == n and reqs.error.isna().all() and set(reqs.request_class) == {fmt}
    # what the server counted is what was built: lengths exact, history included for later turns
    lengths = reqs[["session", "turn", "prompt_tokens", "prompt_tokens_target", "output_tokens",
                    "output_tokens_target"]].to_string()
    assert (reqs.output_tokens == reqs.output_tokens_target).all(), lengths
    if fmt in ("sharegpt", "openai-chat"):
        # recorded replies in the history: the first turn counts exactly; a later one as the server counts its
        # rendered history, which ran 1-2 tokens above the client's own count on these files (open: docs/traffic.md)
        first = reqs.turn == 0
        assert (reqs.prompt_tokens[first] == reqs.prompt_tokens_target[first]).all(), lengths
        later = reqs[~first]
        assert ((later.prompt_tokens >= later.prompt_tokens_target) &
                (later.prompt_tokens <= later.prompt_tokens_target * 1.03)).all(), lengths
    else:
        assert (reqs.prompt_tokens == reqs.prompt_tokens_target).all(), lengths
    # one factor for the whole window, stored with the run: Mooncake's prompts (up to 120k tokens) need it
    assert (row["summary"]["length_scale"] < 1) == (fmt == "mooncake")
    assert (reqs.prompt_tokens + reqs.output_tokens).max() <= 2048
    multi = fmt in ("sharegpt", "openai-chat", "conversations")
    assert reqs.session.notna().all() == multi and reqs.turn.notna().all() == multi


def test_later_turns_carry_their_history(tiny_server, store, tmp_path):
    """Each later turn's prompt, as the server counted it, holds the turns before it: the previous prompt, its
    reply and the new user text (recorded replies; and the server's own with history: generated)."""
    for history in ("recorded", "generated"):
        _, reqs = _run(tiny_server, store, tmp_path, f"history-{history}",
                       {"path": TRACES + "conversations.jsonl", "history": history}, api="chat")
        for _, turns in reqs.sort_values("turn").groupby("session"):
            prompts, outputs = turns.prompt_tokens.to_numpy(), turns.output_tokens.to_numpy()
            assert len(turns) >= 2 and list(turns.turn) == list(range(len(turns)))
            # later prompt > previous prompt + previous reply: the history is in it
            assert all(prompts[k] > prompts[k - 1] + outputs[k - 1] * 0.5 for k in range(1, len(turns)))
            # and a turn is sent only after the one before it ended, plus its think time
            ends = (turns.sent_at + turns.e2el).to_numpy()
            assert all(turns.sent_at.to_numpy()[k] >= ends[k - 1] for k in range(1, len(turns)))


def test_a_trace_replays_on_its_schedule(tiny_server, store, tmp_path):
    """Azure's real arrival times, twice as fast: every send within the lag threshold of its planned time."""
    src = {"path": TRACES + "azure_llm_conv_2023_2000.csv", "limit": 16, "time_scale": 2.0}
    row, reqs = _run(tiny_server, store, tmp_path, "on-schedule", src, fit_to_context="scale", concurrency=None)
    from qwen3lab.traffic import sources
    from qwen3lab.traffic.spec import Source

    times = np.array([e.at for e in sources.load(Source(**src)).entries[:16]]) / 2.0
    lag = reqs.sort_values("idx").sent_at.to_numpy() - times
    assert times[-1] > 5 and (lag > -0.005).all() and (lag < validity.MAX_SCHEDULE_LAG_S).all()
    assert row["checks"]["schedule_lag_p95_s"] is not None and row["checks"]["schedule_lag_p95_s"] < 0.1


def test_hash_id_reuse_shows_as_prefix_cache_hits(tiny_server, store, tmp_path):
    """Requests sharing hash ids share those blocks' tokens exactly: vLLM's /metrics counts them as prefix-cache
    hits. The same lengths with hash ids all distinct hit nothing."""
    def hits() -> float:
        with urllib.request.urlopen(tiny_server.base_url + "/metrics", timeout=10) as resp:
            return parse_metrics(resp.read()).get("vllm:prefix_cache_hits_total", 0.0)

    for name, ids in (("shared", [[1, 2, 3], [1, 2, 4], [1, 2, 5], [1, 2, 6]]),
                      ("distinct", [[11, 12, 13], [21, 22, 23], [31, 32, 33], [41, 42, 43]])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 384, "output_length": 4,
                                            "hash_ids": h}) + "\n" for h in ids))
        before = hits()
        _run(tiny_server, store, tmp_path, f"hash-{name}", {"path": str(path), "block_tokens": 128,
                                                            "replay": False}, concurrency=1)
        got = hits() - before
        if name == "shared":  # three later requests each find the two shared 128-token blocks cached
            assert got >= 3 * 256
        else:
            assert got < 128
