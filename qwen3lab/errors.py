"""One root exception; every message names the bad value, what is allowed, and the fix."""
from __future__ import annotations

import reprlib
from typing import Any

# An error quotes the value it refuses, cut short: a 10^8-item value once printed 5.8 MB into a terminal.
QUOTE_CHARS = 300
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxlist, _QUOTE.maxtuple, _QUOTE.maxset, _QUOTE.maxdict = 4, 20, 20, 20, 20
_QUOTE.maxstring = _QUOTE.maxother = QUOTE_CHARS  # reprlib bounds the work, however big the value


def quote(value: Any) -> str:
    """repr(value) for a message, at most about QUOTE_CHARS characters ('...' marks a cut)."""
    text = _QUOTE.repr(value)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... (cut)"


class Qwen3LabError(Exception):
    """Root of every error qwen3lab raises on purpose."""


class SpecError(Qwen3LabError, ValueError):
    """Bad input: raised before any server starts."""

    def __init__(self, field: str, value: Any, allowed: str, fix: str, where: str | None = None):
        self.field, self.value, self.allowed, self.fix, self.where = field, value, allowed, fix, where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field} = {quote(value)} is not valid. Allowed: {allowed}. Fix: {fix}")


class SpecErrors(Qwen3LabError, ValueError):
    """Several SpecErrors found in one file, reported together."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        super().__init__("\n".join(f"- {e}" for e in errors))


class EngineError(Qwen3LabError):
    """The vLLM server did not start or died; `outcome` says how (failed, oom, timeout, crashed)."""

    def __init__(self, outcome: str, reason: str, log_path: str | None = None):
        self.outcome, self.reason, self.log_path = outcome, reason, log_path
        where = f" (server log: {log_path})" if log_path else ""
        super().__init__(f"{outcome}: {reason}{where}")


class MissingDependency(Qwen3LabError, ImportError):
    def __init__(self, module: str, install: str):
        super().__init__(f"{module} is not installed. Install it with: {install}")


def require(module: str, install: str):
    """Import an optional heavy part where it is used, with an install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module, install) from exc
