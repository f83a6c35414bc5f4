"""Reading what was stored: metrics over request rows, comparisons and verdicts, plots, exports, imports."""
