"""`workload.source`: a traffic file replayed as the workload (typed, extra fields refused, each one described)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FORMATS = ("mooncake", "azure", "burstgpt", "sharegpt", "openai-chat", "prompts", "conversations")


class Source(BaseModel):
    """A file of requests: its lengths, text, times and sessions are sent instead of a synthetic mix."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    path: str = Field(description="The traffic file: absolute, relative to the working folder, or to the repo root.")
    format: Literal["auto", *FORMATS] = Field(  # type: ignore[valid-type]
        "auto", description="mooncake (JSONL timestamp, input_length, output_length, hash_ids), azure (CSV "
        "TIMESTAMP, ContextTokens, GeneratedTokens), burstgpt (CSV Timestamp, Request tokens, Response tokens), "
        "sharegpt (JSON conversations, every turn), openai-chat (JSONL messages), prompts (JSONL prompt, "
        "output_tokens), conversations (JSONL session_id, turn, delay_ms); auto: read from the file.")
    timestamp_unit: Literal["ms", "s"] | None = Field(
        None, description="Unit of the file's timestamps; default ms for mooncake (as AIPerf and SGLang read it), "
        "s for burstgpt and conversations.")
    block_tokens: int = Field(512, ge=1, description="Tokens per mooncake hash id: requests sharing a hash id "
                              "share that block's tokens exactly.")
    replay: bool = Field(True, description="Send at the file's timestamps (open loop); false: by request_rate / "
                         "concurrency as for a mix.")
    time_scale: float = Field(1.0, gt=0, description="Replay speed: the trace's times are divided by it "
                              "(2 replays twice as fast).")
    start: float = Field(0.0, ge=0, description="Seconds into the trace where the window begins.")
    limit: int | None = Field(None, ge=1, description="At most this many requests (or sessions) from the window.")
    sample: float = Field(1.0, gt=0, le=1, description="Keep this fraction of the window's requests (or "
                          "sessions), drawn with workload.seed.")
    history: Literal["recorded", "generated"] = Field(
        "recorded", description="Multi-turn: a later turn carries the recorded assistant replies, or the "
        "server's own (generated).")
    session_rate: float | None = Field(None, gt=0, description="Multi-turn: sessions started per second (Poisson); "
                                       "unset: workload.concurrency sessions at once.")
    think_time_s: float | None = Field(None, ge=0, description="Multi-turn: pause before each later turn; unset: "
                                       "the file's delay_ms, else none.")
    output_tokens: int = Field(128, ge=1, description="Output tokens of a request whose file gives none.")

    @model_validator(mode="after")
    def _checks(self):
        if not self.path.strip():
            raise ValueError("source.path is empty: name the traffic file")
        return self
