"""What the workbook notebooks call: one chapter of an experiment, its pre-flight table, its runs, its figures.

A notebook stays thin: a tagged `parameters` cell, the question, then

    ch = workbook.open_chapter(experiment, chapter, db=db, ...)
    ch.plan()                  # every trial: launch command, pre-flight verdict
    ch.run(max_trials=...)     # executor.execute with resume; every run stored with this notebook's path
    ch.runs()                  # the stored runs standing for this chapter's trials

and figures from `qwen3lab.analysis.plots`. The package holds three concepts: the chapter runner (chapter.py),
each chapter's own analysis (analysis.py: backend table, hit rate, soak windows, ...), the capacity chapter
(capacity.py) and the 99 report (report.py); `from qwen3lab import workbook` gives the notebooks all of it under one name.
"""
from qwen3lab.analysis.wording import claims_table
from qwen3lab.workbook.analysis import (backend_table, drift, environment, environment_tables, long_context_memory,
                                        prefix_hit_rates, router_cost, routing_table, soak_events, soak_windows,
                                        thinking_table, what_fits)
from qwen3lab.workbook.chapter import (CHAPTER_NOTEBOOK, NOTEBOOKS, RUN_COLUMNS, ChapterRun, chdir_repo, notebook_for,
                                       open_chapter, say, setup_plotly, small_run)
from qwen3lab.workbook.capacity import CapacityChapter, capacity_chapter
from qwen3lab.workbook.report import Report, report

__all__ = ["claims_table", "CapacityChapter", "capacity_chapter", "CHAPTER_NOTEBOOK", "NOTEBOOKS", "RUN_COLUMNS", "ChapterRun", "Report", "backend_table", "chdir_repo",
           "drift", "environment", "environment_tables", "long_context_memory", "notebook_for", "open_chapter",
           "prefix_hit_rates", "report", "router_cost", "routing_table", "say", "setup_plotly", "small_run", "soak_events", "soak_windows",
           "thinking_table", "what_fits"]
