"""What every page shares: the store (cached briefly, so new runs appear on refresh), the runs being compared,
the SLOs, friendly errors, and number formats. Pages call these and the qwen3lab modules; nothing here speaks
SQL or does statistics.
"""
from __future__ import annotations

import json
import math
from contextlib import ExitStack, contextmanager
import os
import sys
from pathlib import Path

import pandas as pd
import streamlit as st

from qwen3lab.analysis import comparable, compare, efficiency, export, plots, selection
from qwen3lab.analysis.claims import claims as claims_of
from qwen3lab.analysis.wording import launches, margin_text, slo_text, verdict_text  # noqa: F401 - pages call ui.slo_text
from qwen3lab.errors import Qwen3LabError
from qwen3lab.experiment.spec import SLO
from qwen3lab.store import DEFAULT_DB, Store

DB_ENV = "QWEN3LAB_DB"
TTL_S = 5  # new runs of a sweep appear within this long, or at once with Refresh
ALL = "(all experiments)"  # compare across experiments, e.g. an imported vllm bench run beside qwen3lab's own


# --- the database --------------------------------------------------------------------------------------
def db_path() -> str:
    """--db after `--` on the streamlit command line, else $QWEN3LAB_DB, else ./qwen3lab.duckdb."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--db" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--db="):
            return a.split("=", 1)[1]
    return os.environ.get(DB_ENV) or DEFAULT_DB


def store() -> Store:
    return Store(db_path())


@contextmanager
def one_open_file():
    """One render's queries on one open of the file. DuckDB shares an open database between the connections of a
    process, so the file's metadata and blocks are read once a render instead of once a query (at 10,000 runs the
    opens were most of a page's time). Released when the render ends: a sweep still writes between renders."""
    with ExitStack() as held:
        if Path(db_path()).exists():
            try:
                held.enter_context(store().connect(read_only=True))
            except Qwen3LabError:
                pass  # a writer holds the file: each query waits for it, as before
        yield


def stop_with(exc: Exception) -> None:
    """A store error as a message that says what to do, then stop the page."""
    msg = str(exc)
    if "no database" in msg or not Path(db_path()).exists():
        st.info(f"No results yet at `{db_path()}`. Measure the default experiment with `make demo` (or "
                "`qwen3lab run experiments/cpu-tiny.yaml --db PATH`), then press Refresh. Another file: "
                "`qwen3lab dashboard --db PATH`.")
    else:
        st.error(f"Could not read `{db_path()}`: {msg}")
    st.stop()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _runs(db: str, stamp: float) -> pd.DataFrame:
    df = Store(db).runs()  # without the JSON columns: at 10,000 runs reading them was a third of the page
    if not df.empty:
        df["label"] = compare.run_labels(df)
    return df


def runs() -> pd.DataFrame:
    """All runs, newest first, with a `label` column; stops the page with a hint when there are none."""
    try:
        df = _runs(db_path(), mtime())
    except Qwen3LabError as exc:
        stop_with(exc)
    if df.empty:
        stop_with(Qwen3LabError("no database" if not Path(db_path()).exists() else "no runs stored yet"))
    return df  # st.cache_data hands each caller its own copy


def mtime() -> float:
    # A new run rewrites the file (or its WAL): the cache key changes and the next rerun reads it again.
    p = Path(db_path())
    return max((f.stat().st_mtime for f in (p, p.with_name(p.name + ".wal")) if f.exists()), default=0.0)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def requests(db: str, run_ids: tuple[str, ...], with_chunks: bool = False) -> pd.DataFrame:
    df = Store(db).requests(list(run_ids), with_chunks=with_chunks)
    return df if df is not None else pd.DataFrame()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def samples(db: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    df = Store(db).samples(list(run_ids))
    return df if df is not None else pd.DataFrame()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run(db: str, run_id: str) -> dict:
    return Store(db).run(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ceilings(db: str, run_ids: tuple[str, ...]) -> pd.DataFrame:
    """Each run's roofline ceilings and efficiency (efficiency.run_ceiling), or why it has none."""
    samp = samples(db, run_ids)
    rows = []
    for rid in run_ids:
        mine = samp[samp.run_id == rid] if not samp.empty else None
        rows.append({"run_id": rid, **efficiency.run_ceiling(run(db, rid), mine)})
    return pd.DataFrame(rows)


@st.cache_data(ttl=60, show_spinner=False, max_entries=64)
def winner(db: str, run_ids: tuple[str, ...], slo_json: str) -> compare.Winner:
    data = compare.load_runs(Store(db), list(run_ids), requests=requests(db, run_ids))  # the CDFs' rows too
    return compare.pick_winner(data, SLO.model_validate_json(slo_json))


def winner_or_stop(db: str, run_ids: tuple[str, ...], slo: SLO) -> compare.Winner:
    """The winner of the picked runs; runs that cannot be compared stop the page with which field differs."""
    try:
        return winner(db, run_ids, slo.model_dump_json())
    except comparable.NotComparable as exc:
        st.error(str(exc))
        st.stop()


@st.cache_data(ttl=60, show_spinner="Bootstrapping each trial against its baseline…", max_entries=16)
def claims(db: str, experiment: str, slo_json: str, stamp: float) -> pd.DataFrame:
    return claims_of(Store(db), experiment, SLO.model_validate_json(slo_json))


def refresh_button() -> None:
    if st.sidebar.button("Refresh", icon=":material/refresh:", help="Read the database again (new runs of a sweep)"):
        st.cache_data.clear()
        st.rerun()


# --- what is compared ----------------------------------------------------------------------------------
def default_selection(df: pd.DataFrame) -> list[str]:
    """Every ok launch of the largest group of comparable runs (comparable.groups: one experiment and
    comparability key, most trials first; a capacity experiment's load points by offered load, never across
    loads), reliable ones. Runs of other groups stay selectable by hand (the winner then says which field differs)."""
    found = comparable.groups(df)
    return list(found[0]["run_ids"]) if found else []


def group_id(g: dict) -> str:
    return f"{g['experiment']} · {g['key']}"


def group_label(g: dict) -> str:
    chapters = ", ".join(str(c) for c in g["chapters"]) or "no chapter"
    what = f"{g['trials']} configurations at {g['load']}" if g["load"] else f"{g['trials']} trials"
    return f"{g['experiment']} · {chapters} · key {g['key']} · {what}, {len(g['run_ids'])} runs"


def is_capacity_experiment(df: pd.DataFrame, experiment: str | None) -> bool:
    """Only capacity searches measured it: its configurations are ranked by capacity (the Capacity page); its
    load points are compared only at one offered load."""
    mine = df[(df.experiment == experiment) & df.status.isin(selection.MEASURED)] if experiment else df.iloc[0:0]
    return not mine.empty and "search_id" in mine and bool(mine.search_id.notna().all())


def opens_on_capacity() -> bool:
    """Whether the dashboard opens on the Capacity page: the experiment in view is a capacity experiment."""
    try:
        df = _runs(db_path(), mtime())
    except Qwen3LabError:
        return False
    if df.empty:
        return False
    return is_capacity_experiment(df, st.session_state.get("experiment") or default_experiment(df))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def capacity_ranking(db: str, experiment: str, stamp: float) -> pd.DataFrame:
    """One row per configuration of an experiment's capacity searches, ranked by capacity (capacity.per_configuration:
    its newest `launches` searches combined), with `run_id`: the run of its last passing load point."""
    from qwen3lab.measure import capacity as cap

    s = Store(db)
    mine = s.capacities(experiment=experiment)
    if mine.empty:
        return mine
    ranked = cap.per_configuration(mine.sort_values("started_at", ascending=False))
    ranked = ranked.sort_values("capacity", ascending=False, na_position="last").reset_index(drop=True)
    points = s.runs(experiment=experiment, status="ok")
    passing = {}
    for r in ranked.itertuples():
        hit = points[(points.search_id == r.search_id) & (points.offered_load == r.low)]
        passing[r.search_id] = hit.run_id.iloc[0] if not hit.empty else None
    return ranked.assign(run_id=ranked.search_id.map(passing))


def default_experiment(df: pd.DataFrame) -> str | None:
    """The newest experiment qwen3lab ran itself (imports and endpoints only when there is nothing else)."""
    ok = df[df.status.isin(selection.MEASURED) & df.experiment.notna()]
    own = ok[ok.engine_kind == "vllm"]
    pick = own if not own.empty else ok
    return None if pick.empty else str(pick.experiment.iloc[0])


def selection_sidebar(df: pd.DataFrame) -> list[str]:
    """Experiment, group of comparable runs and the runs to compare, kept across pages in st.session_state."""
    exps = [e for e in df.experiment.dropna().unique()]
    if not exps:
        return []
    exps.append(ALL)
    if pending := st.session_state.pop("pending_selection", None):  # set by a page before its widgets exist
        st.session_state.experiment, st.session_state.run_ids = pending
    if st.session_state.get("experiment") not in exps:
        st.session_state.experiment = default_experiment(df) or exps[0]
        st.session_state.pop("run_ids", None)

    def new_experiment():
        st.session_state.pop("run_ids", None)
        st.session_state.pop("group", None)

    exp = st.sidebar.selectbox("Experiment", exps, key="experiment", on_change=new_experiment)
    mine = df if exp == ALL else df[df.experiment == exp]
    found = {group_id(g): g for g in comparable.groups(mine)}
    if found:
        if st.session_state.get("group") not in found:
            st.session_state.group = next(iter(found))

        def new_group():
            st.session_state.run_ids = list(found[st.session_state.group]["run_ids"])

        st.sidebar.selectbox("Comparable runs", list(found), key="group", format_func=lambda g: group_label(found[g]),
                             on_change=new_group, help="Runs of one workload, tokenizer, machine and vLLM build "
                             "(the comparability key), by experiment and chapters; the largest group is picked for you")
    choices = mine[mine.status.isin(selection.MEASURED)]
    text = (choices.experiment.astype(str) + ": " if exp == ALL else "") + choices.label + " · " + choices.run_id.str[-6:]
    labels = dict(zip(choices.run_id, text))
    if "run_ids" not in st.session_state or not set(st.session_state.run_ids) <= set(labels):
        st.session_state.run_ids = list(found[st.session_state.group]["run_ids"]) if found else []
    picked = st.sidebar.multiselect("Runs to compare", list(labels), key="run_ids", format_func=labels.get,
                                    help="Every launch of the group's trials is picked (same workload, tokenizer, "
                                         "machine and build); a trial's launches are pooled")
    return picked


def stop_without_runs(df: pd.DataFrame, what: str) -> None:
    """Nothing picked: a capacity experiment is sent to its Capacity page, anything else asked to pick runs."""
    exp = st.session_state.get("experiment")
    if is_capacity_experiment(df, exp):
        st.info(f"`{exp}` measured capacities: each configuration on one server at rising loads. Its load points "
                "stand for no trial and are not ranked against each other; the Capacity page ranks the "
                "configurations by capacity.")
        st.page_link("views/capacity.py", label="Capacity: the winner by capacity", icon=":material/speed:")
    else:
        st.info(what)
    st.stop()


def load_point_note(df: pd.DataFrame, run_ids: list[str]) -> None:
    """Load points picked: say they are ranked at their one offered load, and where the winner by capacity is."""
    picked = df[df.run_id.isin(run_ids)]
    if "offered_load" not in picked or picked.offered_load.isna().all():
        return
    loads = sorted({f"{a or 'load'} {v:g}" for a, v in zip(picked.load_axis, picked.offered_load) if pd.notna(v)})
    st.caption(f"Capacity load points at {', '.join(loads)}: ranked at that offered load only, never across loads. "
               "The winner by capacity (the largest load within the SLOs) is on the Capacity page.")
    st.page_link("views/capacity.py", label="Capacity: the winner by capacity", icon=":material/speed:")


AXIS_UNITS = {"request_rate": "req/s", "concurrency": "concurrent requests"}


def capacity_winner_card(ranked: pd.DataFrame) -> None:
    """The winner by capacity (never a load point against another), its bracket against the runner-up's."""
    done = ranked[ranked.capacity.notna() & (ranked.status == "ok")]
    with st.container(border=True):
        if done.empty:
            st.markdown("### No capacity within the SLOs yet")
            st.caption("No configuration has a finished search whose lowest load met the SLOs.")
            return
        top = done.iloc[0]
        name = f"{top.chapter}/{top.trial}" if top.chapter else top.trial
        st.markdown(f"### :material/trophy: Winner by capacity: `{name}`")
        unit = AXIS_UNITS.get(top.axis, top.axis)
        st.markdown(f"Capacity **{top.capacity:g} {unit}** ({top.axis}; last pass {num(top.low, '{:g}')}, first fail "
                    f"{num(top.high, '{:g}')}); {launches_of(int(top.launches))}.")
        if len(done) > 1:
            second = done.iloc[1]
            apart = pd.notna(second.high) and top.low >= second.high
            st.markdown(f"**Runner-up `{second.trial}`**: {second.capacity:g} {AXIS_UNITS.get(second.axis, second.axis)} (first fail "
                        f"{num(second.high, '{:g}')}).")
            (st.success if apart else st.info)(
                "The brackets do not overlap: the winner carries more load." if apart else
                "The brackets overlap: the bisection cannot tell these two apart; measure a finer step or more launches.")
        if int(top.launches) < 2:
            st.caption("One launch per configuration: a second launch would show how much capacity varies between "
                       "launches.")
        if isinstance(top.run_id, str) and st.button("Export the winner's launch command", icon=":material/terminal:",
                                                      type="primary", key="capacity-export"):
            st.session_state.export_run = top.run_id
            st.switch_page("views/export.py")


def launches_of(n: int) -> str:
    return "1 launch" if n == 1 else f"{n} launches"


def compare_runs(experiment: str, run_ids: list[str]) -> None:
    """Make these the runs to compare (from a page, after the sidebar widgets were drawn) and go to Compare."""
    st.session_state.pending_selection = (experiment, list(run_ids))
    st.switch_page("views/compare.py")


def slo_from_state(df: pd.DataFrame, run_ids: list[str]) -> SLO:
    """The SLOs the user set on the Winner page, else those of the experiment that made these runs."""
    if "slo" in st.session_state:
        return SLO.model_validate(st.session_state.slo)
    rows = df[df.run_id.isin(run_ids)]
    for raw in rows.slo_json.dropna():
        try:
            return SLO.model_validate(json.loads(raw))
        except (ValueError, TypeError):
            continue
    return SLO()


# --- words and numbers ---------------------------------------------------------------------------------
def num(v, fmt: str = "{:,.1f}", unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return fmt.format(v) + (f" {unit}" if unit else "")


def winner_card(w: compare.Winner, slo: SLO) -> None:
    """The answer first: which trial, its figures, its margin over the runner-up, and whether that can be told."""
    with st.container(border=True):
        if w.winner is None:
            st.markdown("### No winner under these SLOs")
            st.warning(verdict_text(w))
            if not w.ranking.empty:
                near = w.ranking.iloc[0]
                st.markdown(f"Closest: `{near.label}`: {near.why_not}. P95 TTFT {num(near.p95_ttft_ms, '{:,.0f}', 'ms')}, "
                            f"P95 TPOT {num(near.p95_tpot_ms, '{:.1f}', 'ms')}, P99 E2EL "
                            f"{num(near.p99_e2el_ms, '{:,.0f}', 'ms')}.")
            st.caption(f"SLOs: {slo_text(slo)}")
            return
        top = w.ranking.iloc[0]
        st.markdown(f"### :material/trophy: Winner: `{w.winner.label}`")
        # A table, not st.metric: metric cells cut their figures ("Goo… 2…") in a narrow column; a table wraps
        st.markdown("| | |\n|---|---|\n"
                    f"| Goodput | {num(top.goodput, '{:.2f}', 'req/s')} |\n"
                    f"| Output throughput | {num(top.output_throughput, '{:,.0f}', 'tok/s')} |\n"
                    f"| P95 TTFT | {num(top.p95_ttft_ms, '{:,.0f}', 'ms')} |\n"
                    f"| P95 TPOT | {num(top.p95_tpot_ms, '{:.1f}', 'ms')} |\n"
                    f"| Launches | {int(top.launches)} |")
        if w.runner_up is not None:
            st.markdown(f"**Margin over `{w.runner_up.label}`** ({launches(w.runner_up_trial)}): {margin_text(w)} goodput")
        (st.info if w.within_noise else st.success)(verdict_text(w))
        st.caption(f"SLOs: {slo_text(slo)} · {launches(w.winner_trial)}, newest run {w.winner.run_id} · recomputed "
                   "from the stored requests, no re-run. The interval is Welch's t over the launches' figures "
                   f"(docs/statistics.md) · comparability key {comparable.describe(w.winner.row)}.")


def ranking_table(ranking: pd.DataFrame) -> None:
    """The verdict columns first (meets the SLOs, by how much it misses them), then the figures, units in headers."""
    show = ranking[["rank", "label", "slo_pass", "why_not", "goodput", "output_throughput", "request_throughput",
                    "p95_ttft_ms", "p95_tpot_ms", "p99_e2el_ms", "launches", "completed", "failed", "run_id"]]
    table(show, column_config={
        "rank": st.column_config.NumberColumn("#", width=40, pinned=True),
        "label": st.column_config.TextColumn("trial", width="large", pinned=True),
        "slo_pass": st.column_config.CheckboxColumn("meets SLOs", width=90),
        "why_not": st.column_config.TextColumn("misses the SLOs by", width="large"),
        "goodput": st.column_config.NumberColumn("goodput (req/s)", format="%.2f"),
        "output_throughput": st.column_config.NumberColumn("output (tok/s)", format="%.0f"),
        "request_throughput": st.column_config.NumberColumn("requests (req/s)", format="%.2f"),
        "p95_ttft_ms": st.column_config.NumberColumn("P95 TTFT (ms)", format="%.0f"),
        "p95_tpot_ms": st.column_config.NumberColumn("P95 TPOT (ms)", format="%.1f"),
        "p99_e2el_ms": st.column_config.NumberColumn("P99 E2EL (ms)", format="%.0f"),
        "completed": st.column_config.NumberColumn("ok (requests)"), "failed": st.column_config.NumberColumn("failed (requests)"),
        "run_id": "newest run",
    })


def table(df: pd.DataFrame, links: tuple[str, ...] = (), **kwargs):
    """st.dataframe as every page shows one: no index, the page's width, a missing value an empty cell: text by
    `blanks`, numbers by the placeholder (Streamlit draws a missing number "None" otherwise)."""
    kwargs = {"hide_index": True, "width": "stretch", **kwargs}
    return st.dataframe(blanks(df, links), placeholder="", **kwargs)


def blanks(df: pd.DataFrame, links: tuple[str, ...] = ()) -> pd.DataFrame:
    """Missing text as an empty cell, never "None" (numbers stay numbers: a missing one is an empty cell too);
    `links` stay missing (an empty link would still be drawn as a link)."""
    out = df.copy()
    for col in out.columns:
        if col not in links and (out[col].dtype == object or pd.api.types.is_string_dtype(out[col])):
            out[col] = out[col].where(out[col].notna(), "")
    return out


def pareto(ranking: pd.DataFrame, slo: SLO):
    return plots.pareto_figure(ranking, label="label", slo_ttft_ms=slo.ttft_p95_ms or slo.ttft_ms)


def legend_below(fig, height: int | None = None):
    """Side by side charts keep their width for the data: the legend goes under the plot."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.25, x=0), margin=dict(r=10))
    if height:
        fig.update_layout(height=height)
    return fig


def export_for(db: str, run_id: str, host: str, port: int, model: str | None = None) -> export.Export:
    return export.export_run(run(db, run_id), host=host, port=port, model=model)


def read_text_tail(path: str | None, max_bytes: int = 200_000) -> str | None:
    """The end of a log file (logs are long; the end says why a server stopped)."""
    p = resolve_file(path)
    if p is None:
        return None
    with open(p, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - max_bytes))
        return f.read().decode(errors="replace")


def resolve_file(path: str | None) -> Path | None:
    """A stored path as written (relative to where the run was started), else beside the database."""
    if not path:
        return None
    for p in (Path(path), Path(db_path()).resolve().parent / path):
        if p.is_file():
            return p
    return None


def notebook_html(path: Path) -> str | None:
    """An executed notebook as HTML (nbconvert comes with Jupyter); None when nbconvert is missing."""
    try:
        import nbformat
        from nbconvert import HTMLExporter
    except ImportError:
        return None
    try:
        body, _ = HTMLExporter(template_name="classic").from_notebook_node(nbformat.read(str(path), as_version=4))
    except Exception:  # noqa: BLE001 - an unreadable notebook is still offered for download
        return None
    return body
