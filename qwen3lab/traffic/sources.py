"""Reading traffic files: each format into one list of entries (one entry = one request, or one turn).

No tokenizer here: text stays text, lengths stay as the file gives them; build.py makes the exact requests.
Every refusal is a SpecError naming the file, the line, what was expected and the fix.
"""
from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from qwen3lab.errors import SpecError
from qwen3lab.traffic.spec import FORMATS, Source

REPO = Path(__file__).resolve().parents[2]
TIMESTAMP_UNIT = {"mooncake": "ms", "burstgpt": "s", "conversations": "ms", "azure": "s"}


@dataclass
class Entry:
    """One request of the file. Text sources set `text`; length-only ones `prompt_tokens` (and maybe hash_ids)."""

    at: float | None = None  # seconds from the file's first timestamp
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    text: str | None = None  # the (new) user text of this request or turn
    hash_ids: list[int] | None = None
    session: str | None = None
    turn: int | None = None
    delay_s: float | None = None  # think time before this turn (multi-turn)
    reply: str | None = None  # the recorded assistant reply (multi-turn)
    system: str | None = None  # a conversation's system message, carried by its first turn


@dataclass
class Traffic:
    path: Path
    format: str
    digest: str  # sha256 of the file's bytes, first 16 hex
    entries: list[Entry] = field(default_factory=list)
    skipped: int = 0  # rows the format marks as failed or empty (burstgpt's 0-token responses)

    @property
    def multi_turn(self) -> bool:
        return any(e.turn for e in self.entries)


def resolve(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_absolute() and (REPO / p).is_file():
        return REPO / p
    raise SpecError("workload.source.path", path, "an existing traffic file",
                    f"check the path (looked in {Path.cwd()} and {REPO})")


def detect(path: Path) -> str:
    """The format of a file from its name and its first record."""
    head = path.read_text(encoding="utf-8", errors="replace")[:65536].lstrip("\ufeff")
    first = head.lstrip()[:1]
    if path.suffix.lower() == ".csv" or (first and first not in "[{"):
        header = head.splitlines()[0] if head else ""
        if "ContextTokens" in header:
            return "azure"
        if "Request tokens" in header:
            return "burstgpt"
        raise SpecError("workload.source.format", f"auto ({path.name}: header {header[:80]!r})",
                        "a CSV with TIMESTAMP,ContextTokens,GeneratedTokens (azure) or Timestamp,...,Request "
                        "tokens,Response tokens (burstgpt)", "set source.format, or fix the header")
    if first == "[":
        return "sharegpt"
    line = next((ln for ln in head.splitlines() if ln.strip()), "")
    try:
        keys = set(json.loads(line))
    except (json.JSONDecodeError, TypeError):
        raise SpecError("workload.source.format", f"auto ({path.name})", "JSON lines, a JSON list or a CSV",
                        "check the file's first line, or set source.format") from None
    if "session_id" in keys:
        return "conversations"
    if "hash_ids" in keys or {"input_length", "timestamp"} <= keys:
        return "mooncake"
    if "messages" in keys:
        return "openai-chat"
    if "prompt" in keys:
        return "prompts"
    raise SpecError("workload.source.format", f"auto ({path.name}: keys {sorted(keys)})",
                    "mooncake (hash_ids / input_length+timestamp), conversations (session_id), openai-chat "
                    "(messages) or prompts (prompt)", "set source.format, or rename the file's fields")


def load(source: Source) -> Traffic:
    """The whole file, parsed (cached by path, format and content)."""
    path = resolve(source.path)
    data = path.read_bytes()
    fmt = detect(path) if source.format == "auto" else source.format
    unit = source.timestamp_unit or TIMESTAMP_UNIT.get(fmt, "s")
    return _parse(path, fmt, unit, hashlib.sha256(data).hexdigest()[:16], data.decode("utf-8-sig"))


_CACHE: dict[tuple, Traffic] = {}


def _parse(path: Path, fmt: str, unit: str, digest: str, text: str) -> Traffic:
    key = (str(path), fmt, unit, digest)
    if key not in _CACHE:
        traffic = Traffic(path, fmt, digest)
        READERS[fmt](traffic, text, 1000.0 if unit == "ms" else 1.0)
        if not traffic.entries:
            raise SpecError("workload.source.path", str(path), f"a {fmt} file with at least one request",
                            "check the file (it holds no usable request)")
        t0 = min((e.at for e in traffic.entries if e.at is not None), default=None)
        for e in traffic.entries:
            e.at = None if e.at is None or t0 is None else e.at - t0
        _CACHE[key] = traffic
    return _CACHE[key]


def _bad(traffic: Traffic, where: str, value, allowed: str) -> SpecError:
    return SpecError(f"workload.source ({traffic.path.name} {where})", value, allowed,
                     f"fix that record or pick the right source.format (read as {traffic.format})")


def _int(traffic: Traffic, rec: dict, name: str, where: str, required: bool = True) -> int | None:
    v = rec.get(name)
    if v is None and not required:
        return None
    try:
        n = int(float(v))
    except (TypeError, ValueError):
        raise _bad(traffic, where, {name: v}, f"{name}: a whole number of tokens") from None
    if n < 0:
        raise _bad(traffic, where, {name: v}, f"{name} >= 0")
    return n


def _jsonl(traffic: Traffic, text: str):
    for no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _bad(traffic, f"line {no}", line[:80], f"one JSON object a line ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise _bad(traffic, f"line {no}", line[:80], "one JSON object a line")
            yield no, rec


def _mooncake(traffic: Traffic, text: str, per_s: float) -> None:
    for no, rec in _jsonl(traffic, text):
        where = f"line {no}"
        hashes = rec.get("hash_ids")
        if hashes is not None and not (isinstance(hashes, list) and all(isinstance(h, int) for h in hashes)):
            raise _bad(traffic, where, {"hash_ids": hashes}, "hash_ids: a list of integers")
        ts = rec.get("timestamp")
        traffic.entries.append(Entry(
            at=None if ts is None else float(ts) / per_s, prompt_tokens=_int(traffic, rec, "input_length", where),
            output_tokens=_int(traffic, rec, "output_length", where), hash_ids=hashes))


def _csv_rows(traffic: Traffic, text: str, need: tuple[str, ...]):
    reader = csv.DictReader(text.splitlines())
    names = [n.strip() for n in reader.fieldnames or []]
    missing = [n for n in need if n not in names]
    if missing:
        raise _bad(traffic, "header", names, "columns " + ", ".join(need))
    for no, row in enumerate(reader, 2):
        yield no, {k.strip(): v for k, v in row.items() if k}


def _azure_time(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        date, _, frac = value.strip().partition(".")  # 7 fractional digits: more than fromisoformat takes
        return datetime.fromisoformat(date).timestamp() + (float("0." + frac) if frac else 0.0)


def _azure(traffic: Traffic, text: str, per_s: float) -> None:
    for no, row in _csv_rows(traffic, text, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")):
        try:
            at = _azure_time(row["TIMESTAMP"])
        except ValueError:
            raise _bad(traffic, f"row {no}", row["TIMESTAMP"], "TIMESTAMP: a date-time or seconds") from None
        prompt, out = _int(traffic, row, "ContextTokens", f"row {no}"), _int(traffic, row, "GeneratedTokens", f"row {no}")
        if not prompt or not out:
            traffic.skipped += 1
            continue
        traffic.entries.append(Entry(at=at / per_s, prompt_tokens=prompt, output_tokens=out))


def _burstgpt(traffic: Traffic, text: str, per_s: float) -> None:
    for no, row in _csv_rows(traffic, text, ("Timestamp", "Request tokens", "Response tokens")):
        prompt = _int(traffic, row, "Request tokens", f"row {no}")
        out = _int(traffic, row, "Response tokens", f"row {no}")
        if not prompt or not out:  # BurstGPT logs a failed request with 0 response tokens
            traffic.skipped += 1
            continue
        try:
            at = float(row["Timestamp"]) / per_s
        except (TypeError, ValueError):
            raise _bad(traffic, f"row {no}", row["Timestamp"], "Timestamp: seconds") from None
        traffic.entries.append(Entry(at=at, prompt_tokens=prompt, output_tokens=out))


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bing": "assistant", "bard": "assistant", "system": "system"}


def _turns(traffic: Traffic, session: str, messages: list, where: str, max_tokens: int | None = None) -> None:
    """Messages (role, content) of one conversation -> one entry per user message, its reply the next assistant's."""
    entries, system = [], None
    for m in messages:
        role = _ROLES.get(str(m.get("role", m.get("from", ""))).lower())
        content = m.get("content", m.get("value"))
        if isinstance(content, list):  # OpenAI content parts: the text ones
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if role is None or not isinstance(content, str):
            raise _bad(traffic, where, m, "messages of role/from user|human, assistant|gpt or system with text")
        if role == "system":
            system = content
        elif role == "user":
            entries.append(Entry(text=content, session=session, turn=len(entries)))
        elif entries and entries[-1].reply is None:
            entries[-1].reply = content
        # an assistant message before any user one (or two in a row) has no turn to answer: left out
    if not entries:
        return
    entries[0].system = system
    if max_tokens is not None:
        entries[-1].output_tokens = max_tokens
    traffic.entries += entries


def _sharegpt(traffic: Traffic, text: str, per_s: float) -> None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(traffic, "", text[:80], f"a JSON list of conversations ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list):
        raise _bad(traffic, "", type(data).__name__, 'a JSON list of {"id", "conversations": [...]}')
    for i, conv in enumerate(data):
        if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
            raise _bad(traffic, f"item {i}", str(conv)[:80], 'an object with a "conversations" list')
        _turns(traffic, str(conv.get("id", i)), conv["conversations"], f"item {i}")


def _openai_chat(traffic: Traffic, text: str, per_s: float) -> None:
    for no, rec in _jsonl(traffic, text):
        if not isinstance(rec.get("messages"), list):
            raise _bad(traffic, f"line {no}", str(rec)[:80], 'a "messages" list')
        out = _int(traffic, rec, "output_tokens", f"line {no}", False) or _int(traffic, rec, "max_tokens",
                                                                              f"line {no}", False)
        _turns(traffic, str(rec.get("id", no)), rec["messages"], f"line {no}", out)


def _prompts(traffic: Traffic, text: str, per_s: float) -> None:
    for no, rec in _jsonl(traffic, text):
        if not isinstance(rec.get("prompt"), str):
            raise _bad(traffic, f"line {no}", str(rec)[:80], 'a "prompt" string')
        traffic.entries.append(Entry(text=rec["prompt"],
                                     output_tokens=_int(traffic, rec, "output_tokens", f"line {no}", False)))


def _conversations(traffic: Traffic, text: str, per_s: float) -> None:
    for no, rec in _jsonl(traffic, text):
        where = f"line {no}"
        if "session_id" not in rec or "turn" not in rec:
            raise _bad(traffic, where, str(rec)[:80], "session_id and turn on every line")
        if not isinstance(rec.get("prompt"), str) and rec.get("input_length") is None:
            raise _bad(traffic, where, str(rec)[:80], "a prompt (text) or input_length (tokens)")
        delay = rec.get("delay_ms")
        ts = rec.get("timestamp")
        traffic.entries.append(Entry(
            at=None if ts is None else float(ts) / per_s, text=rec.get("prompt"),
            prompt_tokens=_int(traffic, rec, "input_length", where, False),
            output_tokens=_int(traffic, rec, "output_tokens", where, False) or _int(traffic, rec, "output_length",
                                                                                    where, False),
            session=str(rec["session_id"]), turn=_int(traffic, rec, "turn", where),
            delay_s=None if delay is None else float(delay) / 1000.0, reply=rec.get("reply")))
    traffic.entries.sort(key=lambda e: (e.session, e.turn))
    seen: dict[str, int] = {}
    for e in traffic.entries:  # turns renumbered from 0 in their order: `turn` may start at 1
        e.turn = seen[e.session] = seen.get(e.session, -1) + 1


READERS = {"mooncake": _mooncake, "azure": _azure, "burstgpt": _burstgpt, "sharegpt": _sharegpt,
           "openai-chat": _openai_chat, "prompts": _prompts, "conversations": _conversations}
assert set(READERS) == set(FORMATS)
