"""Measuring: launch and watch vLLM, build the workload, stream it, sample telemetry, run trials."""
