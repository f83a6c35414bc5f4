"""A traffic file's entries -> the exact requests of a trial (warmup first), as measure/workload.py does for a mix.

Real text is sent as it is; token-length-only entries get words of the tokenizer's vocabulary, one token each
(workload.PromptTokenizer.words), so the server counts exactly those lengths. Mooncake hash ids: the words of a
block are drawn from (seed, hash id), so requests sharing a hash id share that block's tokens exactly, as the
trace's prefix reuse was. Same file and seed: the same bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qwen3lab.errors import SpecError
from qwen3lab.measure import workload as wl
from qwen3lab.measure.workload import PromptTokenizer, Request
from qwen3lab.traffic import sources
from qwen3lab.traffic.sources import Entry, Traffic


@dataclass(frozen=True)
class TraceRequest(Request):
    at: float | None = None  # send offset from the window's first request, time_scale applied
    session: str | None = None
    turn: int | None = None
    think_s: float = 0.0  # pause before this turn, after the previous one ended
    messages: tuple = ()  # chat: the history so far (recorded replies) and this turn's user message
    user: str = ""  # this turn's own text (history: generated rebuilds the history around it)
    reply: str | None = None  # the recorded reply to this turn
    source_digest: str = ""
    scale: float = 1.0  # fit_to_context: scale's one factor


def window(traffic: Traffic, src, seed: int) -> list[list[Entry]]:
    """The units (a request, or a session's turns) of the window: from `start` s, sampled, at most `limit`."""
    units: dict = {}
    for i, e in enumerate(traffic.entries):
        units.setdefault(e.session if e.session is not None and traffic.multi_turn else i, []).append(e)
    picked = [u for u in units.values() if u[0].at is None or u[0].at >= src.start]
    if src.sample < 1:
        keep = np.random.default_rng(seed + 2).random(len(picked)) < src.sample
        picked = [u for u, k in zip(picked, keep) if k]
    picked = picked[:src.limit] if src.limit else picked
    if not picked:
        raise SpecError("workload.source.start", src.start, f"a window inside the trace ({len(units)} requests "
                        "or sessions)", "lower start, or raise sample")
    return picked


class Builder:
    def __init__(self, workload, tokenizer: PromptTokenizer, template_tokens: int):
        self.wl, self.src, self.tok, self.template = workload, workload.source, tokenizer, template_tokens
        self.words = tokenizer.words
        self.rng = np.random.default_rng(workload.seed)

    def synthetic(self, n: int, hash_ids: list[int] | None = None, block: int = 0) -> str:
        ids = []
        for h in hash_ids or []:
            if len(ids) >= n:
                break
            ids += list(np.random.default_rng([self.wl.seed, 7, h]).integers(0, len(self.words), size=block))
        if len(ids) < n:
            ids += list(self.rng.integers(0, len(self.words), size=n - len(ids)))
        return "".join(self.words[j] for j in ids[:n])

    def count(self, messages: list[dict]) -> int:
        if self.wl.api == "chat":
            body = {"messages": messages}
            if self.wl.enable_thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": self.wl.enable_thinking}
            return self.counter().chat(body)
        return self.tok.count("".join(m["content"] for m in messages))

    def counter(self):
        if not hasattr(self, "_counter"):
            from qwen3lab.measure.prompt_tokens import PromptCounter

            self._counter = PromptCounter(self.tok.source)
        return self._counter


def scale_factor(units: list[list[Entry]], room: int) -> float:
    """One factor for every length, so that the longest request (history included) fits in `room` tokens."""
    longest = 0
    for unit in units:
        history = 0
        for e in unit:
            longest = max(longest, history + (e.prompt_tokens or 0) + (e.output_tokens or 0))
            history += (e.prompt_tokens or 0) + (e.output_tokens or 0)
    return min(1.0, room / longest) if longest else 1.0


def requests(workload, tokenizer: PromptTokenizer, max_model_len: int | None,
             template_tokens: int = 0) -> list[Request]:
    """The exact requests of a trial: its traffic file's (build), else its mix's (measure.workload)."""
    if workload.source is None:
        return wl.build_requests(workload, tokenizer, max_model_len, template_tokens)
    return build(workload, tokenizer, max_model_len, template_tokens)


def verify(requests: list[Request], tokenizer: PromptTokenizer, template_tokens: int = 0) -> None:
    """measure.workload.verify_lengths on the requests whose prompt is one user text; a session's turns and a
    system message are counted by rendering the chat template (PromptCounter), which the tests check against vLLM."""
    alone = [r for r in requests if len(getattr(r, "messages", ())) <= 1 and getattr(r, "session", None) is None]
    wl.verify_lengths(alone, tokenizer, template_tokens)


def build(workload, tokenizer: PromptTokenizer, max_model_len: int | None,
          template_tokens: int = 0) -> list[TraceRequest]:
    """The window's requests (multi-turn: every turn, history included), refused with a clear error when one
    does not fit max_model_len and fit_to_context is not `scale`."""
    src = workload.source
    traffic = sources.load(src)
    units = window(traffic, src, workload.seed)
    lengths_only = all(e.text is None for u in units for e in u)
    scale = 1.0
    if workload.fit_to_context == "scale" and max_model_len:
        if not lengths_only:
            raise SpecError("workload.fit_to_context", "scale", "true or false for a file of text (its text is "
                            "sent as it is)", f"shorten the texts of {traffic.path.name} or serve a longer "
                            "max_model_len")
        scale = scale_factor(units, max_model_len - template_tokens - 1)
    b = Builder(workload, tokenizer, template_tokens)
    block = max(1, math.floor(src.block_tokens * scale))
    out: list[TraceRequest] = []
    too_long: list[tuple[int, int]] = []
    seen: set[int] = set()  # hash ids sent before: a request starting with one shares its first block
    for unit in units:
        history: list[dict] = [{"role": "system", "content": unit[0].system}] if unit[0].system else []
        for e in unit:
            n_out = max(1, math.floor((e.output_tokens or 0) * scale)) if e.output_tokens else None
            if e.text is not None:
                user = e.text
            else:
                n_prompt = max(1, math.floor(e.prompt_tokens * scale))
                # single-turn: the template's tokens come out of the body, so the server counts exactly n_prompt
                body = n_prompt - (template_tokens if not traffic.multi_turn else 0)
                user = b.synthetic(max(0, body), e.hash_ids, block)
            reply = e.reply
            if n_out is None:
                n_out = tokenizer.count(reply) if reply else src.output_tokens
            if traffic.multi_turn and reply is None:
                reply = b.synthetic(n_out)
            messages = history + [{"role": "user", "content": user}]
            if traffic.multi_turn or len(messages) > 1:  # a history, or a system message: counted as sent
                n_prompt = b.count(messages)
            elif e.text is not None:
                n_prompt = tokenizer.count(user) + template_tokens
            if max_model_len and n_prompt + n_out > max_model_len:
                too_long.append((n_prompt, n_out))
            i = len(out)
            prompt = "".join(m["content"] for m in messages) if workload.api != "chat" else user
            at = None if e.at is None or not src.replay else e.at / src.time_scale
            out.append(TraceRequest(
                i, traffic.format, prompt, n_prompt, n_out, bool(e.hash_ids and e.hash_ids[0] in seen), at=at, session=e.session,
                turn=e.turn if traffic.multi_turn else None, user=user, reply=reply,
                think_s=(src.think_time_s if src.think_time_s is not None else e.delay_s or 0.0) if e.turn else 0.0,
                messages=tuple(messages), source_digest=traffic.digest, scale=scale))
            history = messages + [{"role": "assistant", "content": reply or ""}]
            seen.update(e.hash_ids or ())
    if too_long:
        worst = max(too_long, key=sum)
        hint = ("set workload.fit_to_context: scale (every length scaled by one factor, stored with the run)"
                if lengths_only else "shorten those texts, or serve a longer engine.max_model_len")
        raise SpecError("workload.source", f"{traffic.path.name}: {len(too_long)} of {len(out)} requests longer "
                        f"than max_model_len {max_model_len} (longest {worst[0]} prompt + {worst[1]} output tokens)",
                        "requests whose prompt + output fit the served context", hint)
    first = min((r.at for r in out if r.at is not None), default=None)
    if first:
        out = [_shift(r, first) for r in out]
    return out


def _shift(r: TraceRequest, first: float) -> TraceRequest:
    from dataclasses import replace

    return replace(r, at=None if r.at is None else r.at - first)


def check(trial) -> list[SpecError]:
    """Pre-flight: the file reads, its window is not empty and its requests fit the served context, before any
    server starts. Text is counted with the model's tokenizer when it is at hand (else only read)."""
    from qwen3lab.models import model_info

    workload, cfg = trial.workload, trial.engine
    try:
        traffic = sources.load(workload.source)
        window(traffic, workload.source, workload.seed)
        max_len = getattr(cfg, "max_model_len", None)
        if max_len is None and getattr(cfg, "kind", None) == "vllm" and (info := model_info(cfg.model)):
            max_len = info.max_position_embeddings
        try:
            tokenizer = wl.load_tokenizer(wl.tokenizer_source(cfg))
        except SpecError:
            return []  # not at hand here: the runner checks again with the server's own tokenizer
        build(workload, tokenizer, max_len)
    except SpecError as exc:
        return [SpecError(exc.field, exc.value, exc.allowed, exc.fix,
                          exc.where or f"{trial.experiment}/{trial.chapter}/{trial.name}")]
    return []
