"""Request mixes with exact token lengths, seeded, and their arrival times.

A prompt of N tokens is N words drawn from the tokenizer's own vocabulary: each word is a single token of the
form " letters", which byte-level BPE pre-tokenizers (Qwen's and GPT-2's) always split apart, so the server
counts exactly N prompt tokens. The same tokenizer and seed give the same prompts byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from qwen3lab.errors import SpecError
from qwen3lab.models import default_tokenizer, resolve_model_path
from qwen3lab.experiment.spec import RequestClass, Workload

# The recipes' traffic, at the real model's scale (131072-token context). `fit_to_context` scales a class down
# only where it does not fit the served model's max_model_len.
MIXES: dict[str, list[RequestClass]] = {
    "fixed-128": [RequestClass(name="fixed", prompt_tokens=128, output_tokens=128)],
    "chat": [RequestClass(name="chat", prompt_tokens=(32, 512), output_tokens=(64, 256))],
    "recipe-mix": [
        RequestClass(name="chat", weight=0.3, prompt_tokens=(32, 511), output_tokens=(64, 256)),
        RequestClass(name="summary", weight=0.4, prompt_tokens=(2048, 8192), output_tokens=(256, 512)),
        RequestClass(name="long_document", weight=0.3, prompt_tokens=(65536, 131072), output_tokens=(512, 1024)),
    ],
    "long-document": [RequestClass(name="long_document", prompt_tokens=(65536, 131072), output_tokens=(256, 512))],
}
_WORD = re.compile(r"^ [A-Za-z]{2,}$")


@dataclass(frozen=True)
class Request:
    index: int
    request_class: str
    prompt: str
    prompt_tokens: int
    output_tokens: int
    shared_prefix: bool


class PromptTokenizer:
    """The server's tokenizer, loaded with the light `tokenizers` library (no torch, no transformers)."""

    def __init__(self, source: str):
        from tokenizers import Tokenizer

        self.source = source
        path = Path(source).expanduser()
        if path.is_dir():
            file = path / "tokenizer.json"
            if not file.is_file():
                raise SpecError("tokenizer", source, "a folder with tokenizer.json, or a hub id",
                                "set engine.tokenizer to the tokenizer's folder or hub id")
            self._tok = Tokenizer.from_file(str(file))
        else:
            try:
                self._tok = Tokenizer.from_pretrained(source)
            except Exception as exc:  # network or unknown id
                raise SpecError("tokenizer", source, "a local folder with tokenizer.json or a reachable hub id",
                                f"download it first or point engine.tokenizer at a local copy ({exc})") from exc
        self.fingerprint = hashlib.sha256(self._tok.to_str().encode()).hexdigest()[:16]

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        return len(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    @property
    def words(self) -> list[str]:
        """Vocabulary entries that are one token alone and in any sequence, sorted for determinism."""
        if not hasattr(self, "_words"):
            words = []
            for token_id in range(self._tok.get_vocab_size()):
                text = self._tok.decode([token_id])
                if _WORD.match(text) and self._tok.encode(text, add_special_tokens=False).ids == [token_id]:
                    words.append(text)
            if len(words) < 64:
                raise SpecError("tokenizer", self.source, "a byte-level BPE vocabulary with plain words",
                                "use the model's own tokenizer")
            self._words = sorted(words)
        return self._words


@lru_cache(maxsize=8)
def load_tokenizer(source: str) -> PromptTokenizer:
    return PromptTokenizer(source)


def tokenizer_source(engine) -> str:
    if engine.tokenizer:
        return engine.tokenizer
    if engine.kind == "vllm":
        return (default_tokenizer(engine.model, engine.load_format)
                or resolve_model_path(engine.model, engine.load_format))
    return engine.model


def resolve_mix(workload: Workload) -> list[RequestClass]:
    if isinstance(workload.mix, list):
        return workload.mix
    if workload.mix not in MIXES:
        raise SpecError("workload.mix", workload.mix, ", ".join(MIXES) + ", or a list of request classes",
                        "pick a named mix or write the classes out")
    return MIXES[workload.mix]


def _bounds(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def fit_mix(mix: list[RequestClass], max_model_len: int, template_tokens: int = 0) -> list[RequestClass]:
    """Scale down each class whose longest prompt + output would not fit; classes that fit are untouched."""
    fitted = []
    for cls in mix:
        p_lo, p_hi = _bounds(cls.prompt_tokens)
        o_lo, o_hi = _bounds(cls.output_tokens)
        room = max_model_len - template_tokens
        if o_hi >= room:
            o_hi = max(1, room // 4)
            o_lo = min(o_lo, o_hi)
        if p_hi + o_hi > room:
            scale = (room - o_hi) / p_hi
            p_lo, p_hi = max(1, int(p_lo * scale)), max(1, int(p_hi * scale))
        fitted.append(cls.model_copy(update={"prompt_tokens": (p_lo, p_hi), "output_tokens": (o_lo, o_hi)}))
    return fitted


def build_requests(workload: Workload, tokenizer: PromptTokenizer, max_model_len: int | None,
                   template_tokens: int = 0, count: int | None = None) -> list[Request]:
    """The exact requests of a trial, warmup first. `template_tokens` is what a chat template adds."""
    mix = resolve_mix(workload)
    if max_model_len and workload.fit_to_context:
        mix = fit_mix(mix, max_model_len, template_tokens)
    rng = np.random.default_rng(workload.seed)
    words = tokenizer.words
    weights = np.array([c.weight for c in mix], dtype=float)
    weights /= weights.sum()
    prefix_len = workload.shared_prefix_tokens
    prefix_ids = rng.integers(0, len(words), size=prefix_len)
    total = count if count is not None else workload.warmup_requests + workload.num_requests
    out = []
    for i in range(total):
        cls = mix[int(rng.choice(len(mix), p=weights))]
        p_lo, p_hi = _bounds(cls.prompt_tokens)
        o_lo, o_hi = _bounds(cls.output_tokens)
        n_prompt = int(rng.integers(p_lo, p_hi + 1))
        n_out = int(rng.integers(o_lo, o_hi + 1))
        shared = prefix_len > 0 and rng.random() < workload.shared_prefix_fraction
        body_len = max(0, n_prompt - template_tokens)
        ids = rng.integers(0, len(words), size=body_len)
        if shared:
            k = min(prefix_len, body_len)
            ids[:k] = prefix_ids[:k]
        prompt = "".join(words[j] for j in ids)
        out.append(Request(i, cls.name, prompt, n_prompt, n_out, bool(shared)))
    return out


def verify_lengths(requests: list[Request], tokenizer: PromptTokenizer, template_tokens: int = 0) -> None:
    """Guard the exact-length promise on the local tokenizer (cheap: one encode per prompt)."""
    for r in requests:
        got = tokenizer.count(r.prompt) + template_tokens
        if got != r.prompt_tokens:
            raise AssertionError(f"request {r.index}: built {got} prompt tokens, wanted {r.prompt_tokens}")


def arrival_offsets(workload: Workload, n: int) -> np.ndarray | None:
    """Send times in seconds from the start, gamma gaps with shape `burstiness`; None = as fast as allowed."""
    if workload.request_rate is None:
        return None
    rng = np.random.default_rng(workload.seed + 1)
    shape = workload.burstiness
    gaps = rng.gamma(shape, 1.0 / (workload.request_rate * shape), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def requests_digest(requests: list[Request]) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(json.dumps([r.request_class, r.prompt_tokens, r.output_tokens, r.prompt]).encode())
        if getattr(r, "source_digest", None):  # a traffic file: its content, schedule and sessions too
            h.update(json.dumps([r.source_digest, r.at, r.session, r.turn, r.think_s, r.messages]).encode())
    return h.hexdigest()[:16]
