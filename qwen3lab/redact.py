"""Secrets are never stored: values of env vars and flags named like a token, key, secret or password (and an
endpoint's api_key) are replaced by `<redacted>` in run rows, the spool, every log a run wrote
(a split topology's two servers and its router too) and so in exports and the
dashboard, which only read what was stored. The names are matched by whole parts (HF_TOKEN, VLLM_API_KEY,
--api-key), so max_num_batched_tokens or TOKENIZERS_PARALLELISM are not mistaken for secrets.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"
_SECRET_PART = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?)(_|$)", re.IGNORECASE)
MIN_SECRET_LEN = 4  # a shorter value ("on", "1") would redact ordinary text everywhere


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_PART.search(name.lstrip("-").replace("-", "_")))


def secret_values(config: Any) -> list[str]:
    """The secret values a config carries: secret-named env vars, values of secret-named flags, api_key; for a
    split topology also those of each route's server (a route's overrides may set its own HF_TOKEN or --api-key)."""
    configs = [config]
    if getattr(config, "topology", None) is not None:
        configs += config.route_engines().values()
    values = [v for c in configs for v in _own_secrets(c)]
    # longest first, so a secret that contains another is replaced whole
    return sorted({v for v in values if v and len(v) >= MIN_SECRET_LEN and v != REDACTED}, key=len, reverse=True)


def _own_secrets(config: Any) -> list[str]:
    values = [v for k, v in (getattr(config, "env", None) or {}).items() if is_secret_name(k)]
    args = list(getattr(config, "extra_args", None) or [])
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.startswith("--") and is_secret_name(flag):
            if eq:
                values.append(value)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values.append(args[i + 1])
    if getattr(config, "api_key", None):
        values.append(config.api_key)
    return values


class Redactor:
    """Replaces one config's secret values wherever they appear: strings, and strings inside dicts and lists."""

    def __init__(self, config: Any):
        self.values = secret_values(config)

    def __call__(self, obj: Any) -> Any:
        if not self.values:
            return obj
        if isinstance(obj, str):
            for value in self.values:
                obj = obj.replace(value, REDACTED)
            return obj
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(v) for v in obj)
        return obj

    def files(self, paths) -> None:
        for path in paths:
            self.file(path)

    def file(self, path: str | os.PathLike) -> None:
        """Rewrite a file (a server log: vLLM prints its non-default args, --api-key included) without them."""
        path = Path(path)
        if not self.values or not path.is_file():
            return
        text = path.read_text(errors="replace")
        clean = self(text)
        if clean != text:
            tmp = path.with_suffix(path.suffix + ".redacting")
            tmp.write_text(clean)
            os.replace(tmp, path)
