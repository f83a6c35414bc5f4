from qwen3lab.cli import app

app()
