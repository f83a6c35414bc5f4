"""Experiment files: a base engine + workload + SLO, and chapters of trials written as dotted overrides.

    name: cpu-tiny
    engine: {model: builtin:qwen3-tiny, load_format: dummy}
    workload: {num_requests: 200, concurrency: 16}
    slo: {ttft_p95_ms: 500}
    chapters:
      scheduler:
        question: Does a smaller batch cap help latency?
        matrix: {engine.max_num_seqs: [8, 128]}
        trials: [{name: eager, engine.enforce_eager: true}]

Top-level `trials`/`matrix` form a chapter named `main`. Every error names the file, the trial, the field,
the value, what is allowed, and the fix, before anything is launched.
"""
from __future__ import annotations

import copy
import difflib
import itertools
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from qwen3lab.errors import SpecError, SpecErrors
from qwen3lab.experiment.spec import SLO, AnyEngine, EndpointConfig, EngineConfig, Search, Trial, Workload

_ENGINE = TypeAdapter(AnyEngine)
Repeats = Union[Annotated[int, Field(ge=1, le=50)], Literal["auto"]]  # launches of each trial, or auto


class Chapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str | None = Field(None, description="What this chapter answers.")
    notebook: str | None = Field(None, description="Notebook that runs it (default: by chapter name).")
    baseline: str | None = Field(None, description="Trial the others are compared against (default: the first).")
    skip: str | None = Field(None, description="Why the whole chapter cannot run on this engine.")
    repeats: Repeats | None = Field(None, description="Launches of each trial of this "
                                                 "chapter, or auto (default: the experiment's repeats).")
    max_repeats: int | None = Field(None, ge=2, le=50, description="With repeats: auto, the most launches of a trial "
                                    "(default: the experiment's max_repeats).")
    matrix: dict[str, list[Any]] = Field(default_factory=dict, description="Dotted key -> values, crossed.")
    trials: list[dict[str, Any]] = Field(default_factory=list, description="Trials as {name, dotted overrides}.")


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Experiment name, stored with every run.")
    description: str | None = Field(None, description="What and why.")
    gpu: str | None = Field(None, description="GPU this experiment is for (catalogue id, e.g. a100-80g); pre-flight checks fit on it.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Base EngineConfig or EndpointConfig.")
    workload: dict[str, Any] = Field(default_factory=dict, description="Base Workload.")
    slo: dict[str, Any] = Field(default_factory=dict, description="SLO targets.")
    repeats: Repeats = Field(1, description="Launches of each trial, interleaved across "
                                           "a chapter's trials (A B C A B C) so slow drift spreads evenly; 2 or more "
                                           "puts the launch-to-launch spread into every interval. auto: 2 each, then "
                                           "one more of each of the leading two while their intervals overlap, up "
                                           "to max_repeats.")
    max_repeats: int = Field(4, ge=2, le=50, description="With repeats: auto, the most launches of a trial.")
    matrix: dict[str, list[Any]] = Field(default_factory=dict, description="Chapter `main`: dotted key -> values.")
    trials: list[dict[str, Any]] = Field(default_factory=list, description="Chapter `main`: explicit trials.")
    chapters: dict[str, Chapter] = Field(default_factory=dict, description="Named chapters of the workbook.")
    search: Search | None = Field(None, description="Adaptive search over launch flags (`qwen3lab search`).")
    path: str | None = Field(None, description="Where the file was read from (set by load).")

    def all_chapters(self) -> dict[str, Chapter]:
        out = {}
        if self.matrix or self.trials:
            out["main"] = Chapter(matrix=self.matrix, trials=self.trials)
        return out | dict(self.chapters)


TRIAL_KEYS = {"name", "skip_reason", "baseline", "tags"}


def _set_dotted(doc: dict, key: str, value: Any, where: str) -> None:
    head, _, rest = key.partition(".")
    if head not in ("engine", "workload", "slo") or not rest:
        raise SpecError(f"{where}.{key}", value, "engine.FIELD, workload.FIELD or slo.FIELD (dotted)",
                        "write overrides as e.g. engine.max_num_seqs: 64")
    node = doc[head]
    parts = rest.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _label(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _expand_chapter(chapter: Chapter, where: str) -> list[dict[str, Any]]:
    """Trial specs (name + overrides) of one chapter: explicit trials, then the matrix product."""
    specs = [dict(t) for t in chapter.trials]
    if chapter.matrix:
        keys = list(chapter.matrix)
        for values in itertools.product(*(chapter.matrix[k] for k in keys)):
            overrides = dict(zip(keys, values))
            specs.append({"name": override_name(overrides), **overrides})
    for i, spec in enumerate(specs):
        if "name" not in spec:
            raise SpecError(f"{where}.trials[{i}].name", None, "a short unique name", "add name: ... to the trial")
    names = [s["name"] for s in specs]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise SpecError(f"{where}.trials", dup, "unique trial names within a chapter", "rename the duplicates")
    return specs


def _trial(exp: Experiment, chapter_name: str, chapter: Chapter, spec: dict[str, Any], baseline: str | None,
           where: str) -> Trial:
    doc = {"engine": copy.deepcopy(exp.engine), "workload": copy.deepcopy(exp.workload), "slo": copy.deepcopy(exp.slo)}
    for key, value in spec.items():
        if key in TRIAL_KEYS:
            continue
        if key in ("engine", "workload", "slo") and isinstance(value, dict):
            doc[key] |= value
        else:
            _set_dotted(doc, key, value, where)
    doc["engine"].setdefault("kind", "vllm")
    engine = _validate(_ENGINE, doc["engine"], f"{where} engine", "engine")
    workload = _validate(TypeAdapter(Workload), doc["workload"], f"{where} workload", "workload")
    slo = _validate(TypeAdapter(SLO), doc["slo"], f"{where} slo", "slo")
    return Trial(
        experiment=exp.name, chapter=chapter_name, name=str(spec["name"]), engine=engine, workload=workload,
        slo=slo, skip_reason=spec.get("skip_reason") or chapter.skip,
        baseline=None if spec["name"] == baseline else baseline, tags=spec.get("tags", {}),
        **_repeats(exp, chapter),
    )


def _repeats(exp: Experiment, chapter: Chapter) -> dict[str, Any]:
    """A trial's repeats: a number, or auto = two launches, and more for the leading two up to max_repeats."""
    repeats = chapter.repeats or exp.repeats
    if repeats == "auto":
        return {"repeats": 2, "max_repeats": chapter.max_repeats or exp.max_repeats}
    return {"repeats": repeats}


def override_name(overrides: dict[str, Any]) -> str:
    """A trial's name made from its dotted overrides, as the matrix names them."""
    return ",".join(f"{k.split('.')[-1]}={_label(v)}" for k, v in overrides.items())


def trial_from(exp: Experiment, chapter: str, overrides: dict[str, Any]) -> Trial:
    """One trial of the experiment's base with dotted overrides (a search's suggestion). Raises SpecErrors."""
    spec = {"name": override_name(overrides), **overrides}
    try:
        return _trial(exp, chapter, Chapter(), spec, None, f"{exp.path or exp.name}: search {spec['name']!r}")
    except SpecError as exc:
        raise SpecErrors([exc]) from None


def expand(exp: Experiment, only: list[str] | None = None) -> list[Trial]:
    """Every trial of the experiment (or of the chapters in `only`), validated; all errors reported at once."""
    chapters = exp.all_chapters()
    if only:
        unknown = [c for c in only if c not in chapters]
        if unknown:
            raise SpecError("--only", unknown, ", ".join(chapters) or "(no chapters)", "name chapters of this experiment")
    trials, errors = [], []
    for cname, chapter in chapters.items():
        if only and cname not in only:
            continue
        where = f"{exp.path or exp.name}: chapters.{cname}"
        try:
            specs = _expand_chapter(chapter, where)
        except SpecError as exc:
            errors.append(exc)
            continue
        baseline = chapter.baseline or (specs[0]["name"] if specs else None)
        for spec in specs:
            try:
                trials.append(_trial(exp, cname, chapter, spec, baseline, f"{where} trial {spec['name']!r}"))
            except SpecErrors as exc:
                errors += exc.errors
            except SpecError as exc:
                errors.append(exc)
    if errors:
        raise SpecErrors(errors)
    return trials


def load(path: str | Path) -> Experiment:
    path = Path(path)
    if not path.is_file():
        raise SpecError("experiment", str(path), "a YAML file that exists", "check the path (see experiments/)")
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise SpecError("experiment", str(path), "a mapping with name, engine, workload, ...", "see experiments/cpu-tiny.yaml")
    raw.setdefault("name", path.stem)
    return _validate(TypeAdapter(Experiment), {**raw, "path": str(path)}, str(path), "")


def _refuse_duplicate_keys(node: yaml.Node, path: tuple = ()) -> None:
    """A key written twice in one mapping is an error, not PyYAML's silent last-wins: a user who writes
    max_num_seqs twice would otherwise measure a configuration they did not mean."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, (*path, i))
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in with `<<: *anchor` may be overridden: that is what a merge means
        key = str(key_node.value)
        if key in seen:
            first, again = seen[key].start_mark, key_node.start_mark
            field = ".".join(str(p) for p in (*path, key))
            raise SpecError(field, key, "each key once per mapping",
                            f"keep one of the two: lines {first.line + 1} and {again.line + 1} both set {field} "
                            "(YAML would silently keep the last)", f"{again.name}:{again.line + 1}:{again.column + 1}")
        seen[key] = key_node
        _refuse_duplicate_keys(value_node, (*path, key))


# Experiment files are written by hand: the largest shipped one is 13 KB and about 2,000 values. The limits stop
# a file whose aliases (`*name`) expand a few lines into 10^8 values from holding the CPU for minutes.
MAX_FILE_BYTES = 1 << 20
MAX_VALUES = 100_000


def _refuse_alias_bombs(root: yaml.Node) -> None:
    """Count the values the document holds once its aliases are expanded, without expanding them: each node's
    count is kept, so an alias costs one look-up. Refuses past MAX_VALUES, and an alias inside what it names."""
    counts: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: yaml.Node) -> int:
        if id(node) in counts:
            return counts[id(node)]
        mark = node.start_mark
        where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}"
        if id(node) in open_nodes:
            raise SpecError("yaml", f"an alias inside the value it names (line {mark.line + 1})",
                            "aliases (*name) of values defined before them, not containing them",
                            "write the value out instead of referring to itself", where)
        open_nodes.add(id(node))
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        total = 1 + sum(count(child) for child in children)
        if total > MAX_VALUES:
            raise SpecError("yaml", f"more than {MAX_VALUES:,} values once its aliases (*name) are expanded",
                            f"at most {MAX_VALUES:,} values after alias expansion",
                            f"write fewer nested aliases: the value starting at line {mark.line + 1} "
                            f"expands to {total:,}", where)
        open_nodes.discard(id(node))
        counts[id(node)] = total
        return total

    count(root)


def read_yaml(path: str | Path) -> Any:
    """A YAML file, or a SpecError at the file, line and column of the first syntax error or duplicate key."""
    path = Path(path)
    if (size := path.stat().st_size) > MAX_FILE_BYTES:
        raise SpecError("experiment", f"{path} ({size:,} bytes)", f"at most {MAX_FILE_BYTES:,} bytes",
                        "an experiment file is a few KB of YAML written by hand: check that this is the file "
                        "you meant (experiments/ holds examples)", str(path))
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError("experiment", str(path), "a UTF-8 text file",
                        f"save it as UTF-8 ({exc.reason} at byte {exc.start})") from None
    loader.name = str(path)  # else every mark says '<unicode string>'
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_alias_bombs(node)  # first: the duplicate-key walk below expands aliases
        _refuse_duplicate_keys(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        lines = (mark.buffer or "").splitlines() if mark else []
        line = lines[mark.line].strip() if mark and mark.line < len(lines) else None
        opened = exc.context_mark if exc.context_mark and exc.context_mark is not mark else None
        since = f" ({exc.context} that began at line {opened.line + 1}, column {opened.column + 1})" if opened else ""
        raise SpecError("yaml", line or None, "valid YAML",
                        f"fix the syntax at line {mark.line + 1 if mark else '?'}, column "
                        f"{mark.column + 1 if mark else '?'}: {exc.problem}{since}", where) from None
    except yaml.YAMLError as exc:
        raise SpecError("yaml", str(path), "valid YAML", f"fix the syntax: {exc}", str(path)) from None
    except RecursionError:  # PyYAML composes nested values by recursion
        raise SpecError("yaml", str(path), "values nested at most a few hundred levels deep",
                        "flatten the nesting: an experiment file needs a handful of levels", str(path)) from None
    finally:
        loader.dispose()


def _validate(adapter: TypeAdapter, data: Any, where: str, prefix: str):
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise SpecErrors([_spec_error(e, where, prefix, adapter) for e in exc.errors()]) from None


def _known_fields(prefix: str, loc: tuple) -> list[str]:
    models = {"engine": (EngineConfig, EndpointConfig), "workload": (Workload,), "slo": (SLO,), "": (Experiment,)}
    if prefix == "" and loc and loc[0] == "chapters":
        return list(Chapter.model_fields)
    names = set()
    for m in models.get(prefix, ()):
        names |= set(m.model_fields)
    return sorted(names)


def _spec_error(err: dict, where: str, prefix: str, adapter: TypeAdapter) -> SpecError:
    loc = tuple(p for p in err["loc"] if p not in ("vllm", "endpoint"))
    field = ".".join(str(p) for p in (prefix, *loc) if p != "")
    value = err.get("input")
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        known = _known_fields(prefix, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "remove it"
        return SpecError(field, value, "known fields: " + ", ".join(known), f"{hint} (unknown keys are rejected)", where)
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return SpecError(field or "engine.kind", value, "kind: vllm (launch) or kind: endpoint (measure a URL)",
                         "set engine.kind", where)
    if kind == "missing":
        return SpecError(field, None, "a value (this field is required)", f"add {loc[-1]}: ...", where)
    fix = {"literal_error": "use one of the allowed values", "int_parsing": "write a whole number",
           "int_type": "write a whole number", "float_parsing": "write a number", "bool_parsing": "write true or false",
           "greater_than": "raise it", "greater_than_equal": "raise it", "less_than_equal": "lower it",
           "value_error": f"change {field or 'it'} to what is allowed (`qwen3lab schema {prefix or 'experiment'}` "
                          "describes every field)"}.get(
        kind, f"see `qwen3lab schema {prefix or 'experiment'}` for every field and its description")
    return SpecError(field, value, msg, fix, where)
