"""The package's floor plan, read from the source: no import cycles, no import of a higher layer, executions
import no presentation, and no module over ~450 lines without a reason at its top (see README, Layout)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qwen3lab"
# Lower layers never import higher ones (README, Layout). Within a layer any import is fine, cycles are not.
LAYERS = [
    ["errors", "models", "traffic.spec", "experiment.spec", "hardware.catalogue", "redact", "spool", "store", "sink",
     "builds"],
    ["experiment.files", "analysis.metrics", "analysis.selection", "analysis.comparable", "analysis.stats",
     "measure.workload", "measure.telemetry", "measure.engine", "measure.attention", "hardware.memory", "hardware.roofline", "measure.prompt_tokens",
     "traffic.sources", "traffic.build", "traffic.replay", "traffic.shape"],
    # compare reads stored rows only (metrics, selection, stats): below the executor, whose repeats: auto asks it
    ["hardware.planner", "experiment.preflight", "hardware.calibrate", "analysis.validity", "analysis.compare",
     "analysis.claims", "analysis.uncompared", "analysis.drift", "measure.router", "analysis.history",
     "analysis.regress"],
    ["measure.events", "measure.loadgen", "measure.topology", "measure.provenance", "measure.runner",
     "measure.schedule", "measure.executor", "measure.ray_worker", "measure.ray_executor", "measure.loadpoint",
     "measure.capacity", "measure.suggestions", "measure.search", "measure.soak", "campaign",
     "traffic.conversations"],
    ["analysis.export", "analysis.deploy", "analysis.importers", "analysis.plots", "analysis.wording",
     "analysis.efficiency", "analysis.history_plot", "analysis.static_charts", "traffic.figures"],
    ["workbook", "workbook.chapter", "workbook.analysis", "workbook.report", "workbook.capacity", "terminal", "sweep",
     "dashboard_launch", "cli", "__main__", "kuberay", "campaign_cli", "timer", "cli_common", "cli_builds",
     "cli_deploy", "cli_traffic", "traffic.show"],
]
PRESENTATION = {"rich", "plotly", "streamlit", "IPython", "terminal", "analysis.plots", "workbook"}
MAY_PRESENT = {"terminal", "sweep", "cli", "__main__", "analysis.plots", "analysis.static_charts", "workbook",
               "workbook.chapter", "campaign_cli", "analysis.history_plot", "cli_common", "cli_builds", "cli_deploy", "cli_traffic",
               "workbook.analysis", "workbook.report", "workbook.capacity", "traffic.figures", "traffic.show",
               "hardware.calibrate"}  # its main() is the command line run on the GPU host: it prints its table
MAX_LINES = 450
# Known exceptions, each with its reason; an entry that no longer applies fails its test, so none goes stale.
UPWARD_ALLOWED = {("hardware.calibrate", "terminal"): "its main() is the command line run on the GPU host"}
SPLIT_PENDING: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            out[name] = f
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """qwen3lab modules (without the prefix) and presentation libraries this file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top = name.split(".")[0]
            if top in PRESENTATION:
                found.add(top)
            if top == "qwen3lab":
                inner = name.removeprefix("qwen3lab").lstrip(".")
                if inner in MODULES:
                    found.add(inner)
    return found


GRAPH = {name: {d for d in _imports(path) if d != name} for name, path in MODULES.items()}


def _layer(name: str) -> int | None:
    return next((i for i, names in enumerate(LAYERS) if name in names), None)


def test_every_module_has_a_layer():
    # A package's __init__ that imports nothing (a docstring) is only a folder.
    missing = [n for n, path in MODULES.items() if _layer(n) is None and (path.name != "__init__.py" or GRAPH[n])]
    assert not missing, f"modules without a layer in LAYERS: {missing}"


def test_no_import_points_to_a_higher_layer():
    upward = {(a, b) for a, deps in GRAPH.items()
              for b in deps if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)}
    assert upward <= set(UPWARD_ALLOWED), sorted(upward - set(UPWARD_ALLOWED))
    assert set(UPWARD_ALLOWED) <= upward, f"no longer needed: {sorted(set(UPWARD_ALLOWED) - upward)}"


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for dep in GRAPH.get(node, ()):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for name in GRAPH:
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_executions_import_no_presentation():
    bad = {a: sorted(GRAPH[a] & PRESENTATION) for a in GRAPH if a not in MAY_PRESENT and GRAPH[a] & PRESENTATION}
    assert not bad, bad


def test_long_modules_say_why_at_the_top():
    long = set()
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > MAX_LINES and "lines:" not in text[:1500].lower():
            long.add(name)
    assert long <= set(SPLIT_PENDING), f"over {MAX_LINES} lines without a 'Lines: why' note at the top: " \
                                       f"{sorted(long - set(SPLIT_PENDING))}"
    assert set(SPLIT_PENDING) <= long, f"split already, drop from SPLIT_PENDING: {sorted(set(SPLIT_PENDING) - long)}"
