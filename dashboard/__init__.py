"""The Streamlit dashboard: `qwen3lab dashboard` runs app.py; pages live in views/, shared parts in ui.py."""
