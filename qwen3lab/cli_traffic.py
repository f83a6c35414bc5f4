"""`qwen3lab traffic`: what a traffic file holds, and its shape without text (docs/traffic.md)."""
from __future__ import annotations

from pathlib import Path

import typer

from qwen3lab.cli_common import err, fail, print_result
from qwen3lab.errors import Qwen3LabError

app = typer.Typer()  # its command joins the main app (cli.py)


@app.command()
def traffic(
    file: str = typer.Argument(help="A traffic file (mooncake, azure, burstgpt, sharegpt, openai-chat, prompts, conversations)."),
    format: str = typer.Option("auto", "--format", help="The file's format; auto reads it from the file."),
    tokenizer: str = typer.Option("builtin:qwen3-tiny", help="Tokenizer that counts the tokens of text files."),
    as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    export_shape: Path | None = typer.Option(None, "--export-shape", help="Write lengths, times, hash ids and "
                                             "sessions, no text, to this JSONL file (readable as a source)."),
):
    """What a traffic file holds: requests, duration, rate over time, lengths, prefix reuse, turns per session."""
    from qwen3lab.traffic import shape, show

    try:
        traffic, tok = shape.open_file(file, format, tokenizer)
        if export_shape:
            err.print(f"wrote {shape.export_shape(traffic, export_shape, tok)} requests' shape to {export_shape}")
        summary = shape.summary(traffic, tok)
    except (Qwen3LabError, ValueError) as exc:
        fail(exc)
    print_result(summary, as_json, lambda: show.traffic_table(summary))
