"""`--profile`: capture vLLM's torch-profiler traces around a short C=1 round
and read them as a second instrument beside the hook, on the same window.

The traces are read by tpcomm/trace (the same classifier, step reading and
alignment as `tpcomm trace`) into the run directory's trace/ folder; the
hook's records of the same requests go to profile/. Both are split by the
same function (trace/terms.py -> analysis/split.py) over the same window
(the profiled requests, on the one clock both share on one host), and
trace/compare.json holds per term: hook, trace, difference. The counts per
rank and op name (profile/comm_events.parquet) stay beside it.

The server must run with --profiler-config '{"profiler":"torch","torch_profiler_dir":DIR}';
the traces are read from DIR (the client must see it: same host or shared disk).

Units: *_us microseconds, *_ms milliseconds per token, t_*_ns Unix clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pandas as pd

from tpcomm import netread
from tpcomm.analysis.serverclock import bound_from_start, place
from tpcomm.attribute import aiorun, load, records
from tpcomm.attribute.server import ServerInfo
from tpcomm.errors import InputError
from tpcomm.rundir import contract as C

PROFILER_HINT = (
    'start the server with --profiler-config \'{"profiler":"torch","torch_profiler_dir":"/tmp/vllm_prof"}\' '
    "and pass --profile-dir /tmp/vllm_prof"
)


def summarise_traces(paths: list[Path]) -> pd.DataFrame:
    """One row per (rank, kind, name): count and total time (us) of the communication the trace rules count."""
    from tpcomm.trace.reader import read_trace
    from tpcomm.trace.steps import keep_args, rank_tables

    frames = []
    for p in paths:
        tr = read_trace(p, keep_args)
        coll = rank_tables(tr, tr.world_size).collectives
        frames.append(
            pd.DataFrame(
                {"rank": tr.rank, "kind": coll["backend"], "name": coll["name"], "dur_us": coll["duration_us"]}
            )
        )
    if not frames:
        return pd.DataFrame(columns=["rank", "kind", "name", "count", "time_us"])
    ev = pd.concat(frames, ignore_index=True)
    return (
        ev.groupby(["rank", "kind", "name"], dropna=False)
        .agg(count=("dur_us", "size"), time_us=("dur_us", "sum"))
        .reset_index()
    )


def _undo(info: ServerInfo, state: dict) -> None:
    """The round ended early: what it left running in the server is stopped, our hook recording first (a quick
    call), then the profiler it started, each asked once with a short timeout (the server may be gone; a stop
    it received completes there all the same). Ctrl-C is held meanwhile (seconds at most), so that a second
    press cannot leave the profiler on."""
    with aiorun.ctrl_c_held():
        if state.get("recording"):
            try:
                records.stop(info, state["recording"], timeout_s=5)
            except records.HookError:
                pass
        if state.get("profiler"):
            try:
                httpx.post(
                    info.url + "/stop_profile", headers=info.headers, timeout=10, verify=netread.tls(info.verify)
                )
            except httpx.HTTPError:
                pass


def profile_run(
    info: ServerInfo,
    spec: load.LoadSpec,
    prompts: load.Prompts,
    profile_dir: str | None,
    rd,
    session: str,
    model_config=None,
    sink: list | None = None,
) -> dict:
    """The profiled round (C=1, profile_levels.profiled_requests of them); its client rows go to `sink` (where
    the caller records them as a load level: profile_levels.py). `session` names the hook recording of the
    round (leased as a level's is). Whatever ends the round before its profiler and recording are stopped
    (Ctrl-C, a server gone, an error) stops both before it goes on: neither is left running in the server."""
    from tpcomm.analysis.profile_levels import profiled_requests

    plugin = bool(info.plugin and info.plugin.get("enabled", True))
    small = load.LoadSpec(**{**spec.__dict__, "requests": profiled_requests(spec.requests, plugin)})
    prefix = f"tpcomm{time.strftime('%H%M%S')}"
    state: dict = {}  # what runs in the server now: "profiler" (our start was sent), "recording" (our session)
    try:
        doc, hook, hook_coll, hook_steps = _profiled_round(
            info, small, prompts, rd, prefix, session if plugin else None, state
        )
    except BaseException:
        _undo(info, state)
        raise
    rows = doc.pop("rows", [])
    if sink is not None:
        sink.extend(rows)
    if not doc["captured"]:
        return doc
    t0, t1 = doc["window_ns"]
    if not profile_dir:
        doc["note"] = "traces written on the server; pass --profile-dir to parse them (" + PROFILER_HINT + ")"
        return doc
    paths = _wait_for_traces(Path(profile_dir), prefix)
    if not paths:
        doc["note"] = f"no trace named {prefix}* appeared in {profile_dir}"
        return doc
    paths = [p for p in paths if "async_llm" not in p.name]  # the API server's own trace holds no rank
    summ = summarise_traces(paths)
    rd.write_table(C.PROFILE_EVENTS, summ)
    doc["traces"] = [str(p) for p in paths]
    doc["trace_comm"] = summ.to_dict("records")
    doc["comparison"] = compare_with_hook(summ, hook)
    lines = ["; ".join(_count_text(c) for c in doc["comparison"])]
    try:
        from tpcomm.analysis.crosscheck import plan_config

        plan_src, _ = plan_config(model_config, info.plugin)  # --model-config, else the server-reported config
        cmp_doc = both_instruments(rd, paths, hook_coll, hook_steps, (t0, t1), plan_src)
        doc["instruments"] = cmp_doc
        from tpcomm.trace.summary import compare_lines

        z = cmp_doc["trace_size"]
        lines.append(
            f"traces: {z['files']} files, {z['bytes'] / 1e6:.1f} MB, {z['events']:,} events, imported in "
            f"{z['import_s']:.1f} s"
        )
        if cmp_doc.get("terms"):
            lines += compare_lines(cmp_doc)
        else:
            lines += alone_lines(cmp_doc)
    except InputError as e:  # traces that cannot be read: said, and nothing measured is lost
        doc["instruments"] = {"error": str(e)}
        lines.append(f"traces not split: {e}")
    doc["summary_line"] = "\n".join(lines)
    return doc


def _profiled_round(
    info: ServerInfo, small: load.LoadSpec, prompts: load.Prompts, rd, prefix: str, session, state: dict
):
    """/start_profile, the round under our hook recording `session` (None: no plugin), the recording stopped,
    /stop_profile, the round's records: (doc, per rank and op counts, hook collectives, hook steps), the hook's
    three None without the plugin. The caller undoes on any raise."""
    from tpcomm.attribute.server import is_alive

    state["profiler"] = True  # from the moment it is sent: a start in flight may take effect
    bound = None  # the server's clock against ours (no plugin: not measured)
    try:
        r = httpx.post(
            info.url + "/start_profile",
            json={"profile_prefix": prefix},
            headers=info.headers,
            timeout=120,
            verify=netread.tls(info.verify),
        )
    except httpx.HTTPError as e:  # a start that timed out may still take effect: stopped all the same
        _undo(info, state)
        return {"captured": False, "note": f"/start_profile failed ({type(e).__name__}: {e})"}, None, None, None
    if r.status_code == 404:
        state.pop("profiler")
        return {"captured": False, "note": "the server's torch profiler is off: " + PROFILER_HINT}, None, None, None
    if r.status_code != 200:  # an error from the engine may come after the start ran in the workers: stopped too
        _undo(info, state)
        note = f"/start_profile answered HTTP {r.status_code}: {r.text[:200]}"
        return {"captured": False, "note": note}, None, None, None
    if session is not None:  # a lease as a level's: one wave of requests to its timeout, and a minute
        state["recording"] = session  # from the moment it is sent (a stop naming it never ends another's)
        ts = time.time_ns()
        started = records.start(info, session, int(min(7 * 86400, small.requests * small.timeout_s + 60)))
        bound = bound_from_start(started, ts, time.time_ns(), session)
    t0 = time.time_ns()
    rows = aiorun.run(
        lambda: load.run_round(
            info,
            small,
            prompts,
            1,
            small.requests,
            is_alive=lambda: is_alive(info.url, verify=info.verify),
            id_offset=10**9,
        )
    )
    t1 = time.time_ns()
    # the round's window on the server's clock where the recording's start bounded it apart from ours (as a
    # level's, analysis/serverclock.py; the traces and the hook's records are stamped there)
    placed, sclock = place({"t_start_ns": t0, "t_end_ns": t1}, bound, same_machine=True)
    t0, t1 = placed["t_start_ns"], placed["t_end_ns"]
    hook = hook_coll = hook_steps = None
    if session is not None:  # the recording's window is over: stopped and pulled before the profiler's traces
        records.stop(info, session)
        state.pop("recording")
        coll, steps, _ = records.fetch(info, session)
        hook_coll = coll[(coll["t_start_ns"] >= t0) & (coll["t_end_ns"] <= t1)]
        hook_steps = steps[(steps["t_start_ns"] >= t0) & (steps["t_end_ns"] <= t1)]
        hook = (
            hook_coll.groupby(["rank", "op"])
            .agg(count=("duration_us", "size"), time_us=("duration_us", "sum"))
            .reset_index()
        )
    httpx.post(
        info.url + "/stop_profile", headers=info.headers, timeout=600, verify=netread.tls(info.verify)
    ).raise_for_status()
    state.pop("profiler")
    doc = {
        "captured": True,
        "prefix": prefix,
        "requests": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "output_len": small.output_len,
        "window_ns": [t0, t1],
        "server_clock": sclock.placement if sclock.placed else None,  # "moved": the window is on the server's clock
        "rows": rows,
    }
    if session is not None:
        rd.write_table(C.PROFILE_HOOK, hook_coll)
        rd.write_table(C.PROFILE_HOOK_STEPS, hook_steps)
        doc["hook"] = hook.to_dict("records")
    return doc, hook, hook_coll, hook_steps


def both_instruments(rd, paths: list[Path], hook_coll, hook_steps, window: tuple[int, int], model_config=None) -> dict:
    """Split the traces (into trace/) and, with hook records, the hook's records over the same window with the same
    function; write trace/compare.json: per term hook, trace, difference (ms per token)."""
    from tpcomm.analysis.align import align
    from tpcomm.trace import importer, terms

    t_import = time.perf_counter()
    imp = importer.analyse(importer.load(paths), model_config, window)
    import_s = time.perf_counter() - t_import
    size = {
        "files": len(paths),
        "bytes": sum(p.stat().st_size for p in paths),
        "events": imp.traces.events_seen,
        "import_s": import_s,
    }
    importer.write(rd, imp, {"window_ns": list(window), "source": "attribute --profile", "trace_size": size})
    out = {
        "trace_size": size,
        "window_ns": list(window),
        "window_text": f"the {len(paths)} profiled ranks' steps starting in the profiled requests' "
        f"{(window[1] - window[0]) / 1e9:.2f} s",
        "trace": imp.split,
        "trace_collectives_per_step": imp.crosscheck,
        "hook": None,
        "terms": [],
    }
    if hook_coll is not None and not hook_coll.empty and hook_steps is not None:
        aligned = align(hook_coll)
        out["hook"] = terms.split(aligned, hook_steps, window)
        out["hook_collectives_per_step"] = terms.crosscheck(aligned, hook_steps, model_config, window)
        out["terms"] = terms.comparison(out["hook"], imp.split)
    rd.write_json(C.TRACE_COMPARE, out)
    return out


def alone_lines(cmp_doc: dict) -> list[str]:
    """The traces' split when there are no hook records to set beside it (a server without the plugin)."""
    sp = cmp_doc.get("trace") or {}
    pt = sp.get("per_token_ms")
    if not pt:
        return [f"traces alone: no split ({sp.get('note', 'no decode step with the step before it in the window')})"]
    terms = "  ".join(f"{k} {'n/a' if v is None else f'{v:.3f}'}" for k, v in pt.items())
    return [
        f"traces alone (no hook records), {cmp_doc.get('window_text', '')}, {sp.get('clock', 'host')} clock: "
        f"engine ms/token {sp['engine_ms_per_token']:.3f} = {terms} ({sp.get('decode_pairs', 0)} pairs/rank)"
    ]


def _count_text(c: dict) -> str:
    """One rank's communication events in the traces, and the hook's beside them where it recorded (plugin on)."""
    text = f"rank {c['rank']}: trace {c['trace_count']} comm events ({c['trace_time_us']:.0f} us)"
    if c["hook_count"] is None:
        return text
    return text + f", hook {c['hook_count']} ({c['hook_time_us']:.0f} us)"


def compare_with_hook(summ: pd.DataFrame, hook: pd.DataFrame | None) -> list[dict]:
    out = []
    for rank, g in summ.groupby("rank", dropna=False):
        h = hook[hook["rank"] == rank] if hook is not None else None
        out.append(
            {
                "rank": None if pd.isna(rank) else int(rank),
                "trace_count": int(g["count"].sum()),
                "trace_time_us": float(g["time_us"].sum()),
                "hook_count": int(h["count"].sum()) if h is not None else None,
                "hook_time_us": float(h["time_us"].sum()) if h is not None else None,
            }
        )
    return out


def _wait_for_traces(d: Path, prefix: str, timeout_s: float = 120) -> list[Path]:
    # Workers write their traces after /stop_profile returns on some versions: poll until they settle.
    deadline = time.monotonic() + timeout_s
    last: list[Path] = []
    while time.monotonic() < deadline:
        found = sorted(p for p in d.glob(f"{prefix}*") if p.name.endswith((".json", ".json.gz")))
        if found and found == last and all(_stable(p) for p in found):
            return found
        last = found
        time.sleep(1.0)
    return last


def _stable(p: Path) -> bool:
    try:
        s1 = p.stat().st_size
        time.sleep(0.2)
        return p.stat().st_size == s1 and s1 > 0
    except FileNotFoundError:
        return False
