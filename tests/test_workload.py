"""Workloads: exact token lengths, the same bytes on a re-run, arrivals with the asked-for statistics."""
from __future__ import annotations

import numpy as np
import pytest

from qwen3lab.measure import workload as wl
from qwen3lab.experiment.spec import RequestClass, Workload

TOKENIZER = "qwen3lab/assets/models/qwen3-tiny"


@pytest.fixture(scope="module")
def tok():
    return wl.load_tokenizer(TOKENIZER)


def test_prompts_have_exact_token_counts(tok):
    w = Workload(mix=[RequestClass(name="r", prompt_tokens=(1, 3000), output_tokens=8)], num_requests=60, seed=3)
    reqs = wl.build_requests(w, tok, max_model_len=None)
    assert len({r.prompt_tokens for r in reqs}) > 30
    for r in reqs:
        assert tok.count(r.prompt) == r.prompt_tokens


def test_same_seed_same_bytes_other_seed_other_bytes(tok):
    w = Workload(mix="recipe-mix", num_requests=20, seed=7)
    a = wl.build_requests(w, tok, 4096)
    b = wl.build_requests(w, wl.PromptTokenizer(TOKENIZER), 4096)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert wl.requests_digest(a) == wl.requests_digest(b)
    c = wl.build_requests(w.model_copy(update={"seed": 8}), tok, 4096)
    assert wl.requests_digest(a) != wl.requests_digest(c)


def test_recipe_mix_shares_and_scaling(tok):
    w = Workload(mix="recipe-mix", num_requests=2000, seed=1)
    reqs = wl.build_requests(w, tok, max_model_len=40960, count=2000)
    share = {c: sum(r.request_class == c for r in reqs) / len(reqs) for c in ("chat", "summary", "long_document")}
    assert share["chat"] == pytest.approx(0.3, abs=0.04) and share["summary"] == pytest.approx(0.4, abs=0.04)
    for r in reqs:
        assert r.prompt_tokens + r.output_tokens <= 40960
        if r.request_class == "summary":  # fits in 40960: left at the recipe's 2k-8k
            assert 2048 <= r.prompt_tokens <= 8192
        if r.request_class == "chat":
            assert r.prompt_tokens < 512


def test_fit_mix_leaves_fitting_classes_alone():
    mix = wl.MIXES["recipe-mix"]
    assert wl.fit_mix(mix, 200_000)[2].prompt_tokens == (65536, 131072)
    long_doc = wl.fit_mix(mix, 32768)[2]
    assert long_doc.prompt_tokens[1] + long_doc.output_tokens[1] <= 32768


def test_shared_prefix(tok):
    w = Workload(num_requests=200, shared_prefix_fraction=0.5, shared_prefix_tokens=64, seed=2)
    reqs = wl.build_requests(w, tok, 2048)
    shared = [r for r in reqs if r.shared_prefix]
    assert 0.4 < len(shared) / len(reqs) < 0.6
    heads = {r.prompt[:200] for r in shared}
    assert len(heads) == 1  # one common prefix
    assert len({r.prompt[:200] for r in reqs if not r.shared_prefix}) > 50


def test_gamma_arrivals_rate_and_burstiness():
    for burst in (1.0, 0.25):
        w = Workload(request_rate=20.0, burstiness=burst, concurrency=None, seed=5)
        gaps = np.diff(wl.arrival_offsets(w, 20000))
        assert gaps.mean() == pytest.approx(1 / 20, rel=0.05)
        # Gamma with shape k: coefficient of variation 1/sqrt(k)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burst), rel=0.08)
    assert wl.arrival_offsets(Workload(), 10) is None


def test_enable_thinking_needs_chat():
    with pytest.raises(ValueError, match="api: chat"):
        Workload(enable_thinking=False)
