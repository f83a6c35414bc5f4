"""The user's own traffic: datasets, timestamped traces and multi-turn conversations as workloads (docs/traffic.md).

spec: the `workload.source` field; sources: reading each file format; build: entries -> exact requests;
replay: when each request (or session) is sent; conversations: sessions of turns on the wire;
shape: what a file holds (`qwen3lab traffic`) and its shape-only export.
"""
