"""Prompt tokens of an OpenAI completions or chat request, counted the way vLLM's OpenAI server counts them.

The router routes by this count, so it must agree with the server's own `usage.prompt_tokens` (tests check it
against a real vLLM). Uses the light `tokenizers` library and a sandboxed Jinja chat template, as transformers'
`apply_chat_template` renders it: no torch, no transformers in the router's process.
"""
from __future__ import annotations

import json
from pathlib import Path


class PromptCounter:
    """Prompt tokens of a completions or chat body, counted the way vLLM's OpenAI server counts them.

    Completions: the prompt encoded with special tokens (vLLM's default `add_special_tokens: true`); token-id
    prompts count themselves. Chat: the model's chat template rendered like transformers'
    `apply_chat_template` (sandboxed Jinja, generation prompt on, `chat_template_kwargs` passed through), then
    encoded without special tokens, as vLLM does. A batch of prompts is as long as its longest.
    """

    def __init__(self, source: str):
        from qwen3lab.measure.workload import load_tokenizer

        self.source = source
        self.tokenizer = load_tokenizer(source)
        self._config = _tokenizer_config(source)
        self._template = None  # compiled on the first chat request
        self._bytes_bound = _bytes_bound(self.tokenizer._tok)

    def count_above(self, body: dict, api: str, limit: int) -> int | None:
        """The prompt's tokens, or None when it certainly has at most `limit` of them (then it is not tokenized).

        A byte-level BPE token covers at least one byte of the (normalized) text, so a prompt has at most its
        UTF-8 length in tokens, plus what the post-processor adds: a length decides most short prompts, where
        encoding a 128-token prompt took 0.33-0.4 ms of the router's first-token path on this machine's core."""
        text = self.render_chat(body) if api == "chat" else body.get("prompt")
        if self._bytes_bound is not None and isinstance(text, str):
            normalize, extra = self._bytes_bound
            special = body.get("add_special_tokens", api != "chat")  # vLLM encodes a rendered chat without them
            bound = len((normalize(text) if normalize else text).encode("utf-8", "surrogatepass")) + extra * special
            if bound <= limit:
                return None
        return self.chat(body, rendered=text) if api == "chat" else self.completion(body)

    def completion(self, body: dict) -> int:
        prompt = body.get("prompt")
        special = body.get("add_special_tokens", True)
        if isinstance(prompt, str):
            return self.tokenizer.count(prompt, add_special_tokens=special)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, list) and prompt:
            return max(self.completion({**body, "prompt": p}) for p in prompt)
        raise ValueError("'prompt' must be a string, a list of token ids, or a list of either")

    def chat(self, body: dict, rendered: str | None = None) -> int:
        """rendered: render_chat(body), where the caller has it already."""
        text = self.render_chat(body) if rendered is None else rendered
        return self.tokenizer.count(text, add_special_tokens=body.get("add_special_tokens", False))

    def render_chat(self, body: dict) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        if self._template is None:
            self._template = _compile_template(self._config, self.source)
        special = {k: v if isinstance(v, str) else (v or {}).get("content")
                   for k, v in self._config.items() if k.endswith("_token")}
        return self._template.render(
            messages=[_flat_content(m) for m in messages], tools=body.get("tools"), documents=body.get("documents"),
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            **special, **(body.get("chat_template_kwargs") or {}))


def _bytes_bound(tok) -> tuple | None:
    """(normalize, special tokens added) when every token of `tok` covers at least one byte, else None."""
    spec = json.loads(tok.to_str())
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    level = [p for p in parts if p.get("type") == "ByteLevel"]
    if model.get("type") != "BPE" or not level:
        return None  # e.g. SentencePiece's "▁": a token of no byte of the text
    prefix = sum(1 for p in level if p.get("add_prefix_space"))  # a space it adds before the text
    normalize = tok.normalizer.normalize_str if tok.normalizer is not None else None  # NFC may lengthen a text
    return normalize, prefix + len(tok.encode("", add_special_tokens=True).ids)


def _flat_content(message: dict) -> dict:
    # vLLM's "string" content format: a list of parts becomes its text parts joined by newlines.
    content = message.get("content")
    if isinstance(content, list):
        text = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        return {**message, "content": text}
    return message


def _tokenizer_config(source: str) -> dict:
    folder = Path(source).expanduser()
    if folder.is_dir():
        cfg = folder / "tokenizer_config.json"
        out = json.loads(cfg.read_text()) if cfg.is_file() else {}
        if (jinja := folder / "chat_template.jinja").is_file():
            out["chat_template"] = jinja.read_text()
        return out
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(source, "tokenizer_config.json")).read_text())
    except Exception:  # no network or no file: completions still count; chat says what is missing
        return {}


def _compile_template(config: dict, source: str):
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: vLLM uses "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not template:
        raise ValueError(f"the tokenizer {source} has no chat template, so chat prompts cannot be counted")
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                  ensure_ascii=ensure_ascii)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
    return env.from_string(template)
