"""The plugin fails safe by construction (hook/failsafe.py, issue 27): every patch the hook applies to vLLM or
torch goes through one wrapper, vLLM's call runs exactly once whatever tpcomm's part does, its own exceptions
pass unchanged, and a fault switches that site off (status lists it; attribute and page one name it and the
terms it leaves unmeasured). The real server side is in test_hook_failsafe_server.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from tpcomm.hook import failsafe


@pytest.fixture
def fresh(monkeypatch):
    """No site off, no fault, for one test (the module's state is per process)."""
    monkeypatch.setattr(failsafe, "_off", {})
    monkeypatch.setattr(failsafe, "_off_at", {})
    failsafe.reload_faults("")
    yield failsafe
    failsafe.reload_faults("")


class Original:
    """vLLM's call, recorded: how often it ran and with what; raises `error` if set."""

    def __init__(self, error: BaseException | None = None):
        self.calls: list[tuple] = []
        self.error = error

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.error is not None:
            raise self.error
        return ("result", len(self.calls))


def _raise_before(call, *a, **k):
    raise ValueError("tpcomm before")


def _raise_after(call, *a, **k):
    call(*a, **k)
    raise ValueError("tpcomm after")


def _call_twice(call, *a, **k):
    call(*a, **k)
    return call(*a, **k)


def _swallow(call, *a, **k):
    try:
        return call(*a, **k)
    except KeyError:
        return "swallowed"


def _replace_error(call, *a, **k):
    try:
        return call(*a, **k)
    except KeyError:
        raise ValueError("tpcomm's own") from None


@pytest.mark.parametrize(
    "part,spec",
    [
        (_raise_before, ""),
        (_raise_after, ""),
        (_call_twice, ""),
        (lambda call, *a, **k: "never called it", ""),
        (lambda call, *a, **k: call(*a, **k), "collective"),  # injected before tpcomm's part
        (lambda call, *a, **k: call(*a, **k), "all"),
        (lambda call, *a, **k: call(*a, **k), "collective@after"),  # injected after vLLM's call returned
        (lambda call, *a, **k: call(*a, **k), "all@after"),
    ],
)
def test_the_original_runs_exactly_once_and_the_site_goes_off(fresh, caplog, part, spec):
    fresh.reload_faults(spec)
    orig = Original()
    w = fresh.wrap(orig, "collective", part)
    with caplog.at_level(logging.WARNING, logger="vllm.tpcomm.hook"):
        assert w(1, x=2) == ("result", 1)
        assert orig.calls == [((1,), {"x": 2})]
        assert "collective" in fresh.disabled()
        # off for the life of the process: the original straight away, the part never again
        assert w(3) == ("result", 2) and len(orig.calls) == 2
        fresh.disable("collective", "again")  # idempotent: the first reason stays, one log line
    assert fresh.disabled()["collective"] != "again"
    assert len([r for r in caplog.records if "collective off for the life" in r.getMessage()]) == 1


@pytest.mark.parametrize("part", [lambda call, *a: call(*a), _raise_after, _swallow, _replace_error])
@pytest.mark.parametrize("spec", ["", "collective@after"])
def test_the_original_s_exception_propagates_unchanged(fresh, part, spec):
    fresh.reload_faults(spec)
    boom = KeyError("vLLM's own")
    orig = Original(boom)
    with pytest.raises(KeyError) as got:
        fresh.wrap(orig, "collective", part)(1)
    assert got.value is boom and len(orig.calls) == 1
    assert got.value.__context__ is None and got.value.__cause__ is None  # not chained to tpcomm's
    # a part that hid or replaced vLLM's exception is a tpcomm bug: off; one that let it pass is not
    assert ("collective" in fresh.disabled()) == (part in (_swallow, _replace_error))


def test_keyboard_interrupt_in_tpcomm_s_part_is_not_swallowed(fresh):
    def part(call, *a):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fresh.wrap(Original(), "collective", part)()


def test_a_replacing_part_may_substitute_and_an_attempt_never_raises(fresh):
    assert fresh.wrap(Original(), "reroute", lambda call, *a: "op", replaces=True)() == "op"
    assert not fresh.disabled()
    fresh.reload_faults("routes")
    ran = []
    assert fresh.attempt("routes", ran.append, 1) is None and ran == [] and "routes" in fresh.disabled()
    fresh.reload_faults("")
    assert fresh.attempt("routes", ran.append, 2) is None and ran == []  # off: nothing runs again
    assert fresh.attempt("publish", lambda: 1 / 0) is None and "ZeroDivisionError" in fresh.disabled()["publish"]


def test_unknown_fault_names_are_logged_not_fatal(fresh, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.tpcomm.hook"):
        fresh.reload_faults("colective,graph_capture")
    assert "'colective'" in caplog.text
    with pytest.raises(failsafe.FaultInjected):
        fresh.fault("graph_capture")
    fresh.fault("collective")  # not named: nothing
    fresh.reload_faults("all")
    with pytest.raises(failsafe.FaultInjected):
        fresh.fault("a_site_a_later_hook_adds")


# Every patch the hook applies, in a fresh process with the real vLLM classes: the plugin's install (as in a
# worker), the CUDA part (backends, fused all-reduce, CUDA graphs on a stand-in of torch's CUDAGraph: no CUDA
# here) and the API server's routes. Then each registered patch is rebuilt around a recording original and
# called with every fault kind; and no tpcomm function sits on a patched owner outside the mechanism.
_WALK = r"""
import json, os, sys, types
os.environ.pop("VLLM_PLUGINS", None)
from tpcomm.hook import failsafe, fused, plugin, rpc, switch, timing
from tpcomm.hook.core import HOOK

plugin._install()
switch.attach_routes_without_allowlist()
plugin._tag_cuda_backends()
comm = types.ModuleType("flashinfer_comm_stand_in")
comm.allreduce_fusion = lambda *a, **k: None
assert fused.install(comm, group_fn=lambda: None)

class Graph:  # torch.cuda.CUDAGraph's methods, as the patch uses them
    def __new__(c, keep_graph=False):
        return object.__new__(c)
    def capture_begin(self, pool=None): pass
    def capture_end(self): pass
    def replay(self): pass
    def instantiate(self): pass

timer = timing.CudaEventTimer(graph_timing=True)
timer.driver = object()  # as if libcuda loaded: graphs are then created kept (the __new__ patch)
assert timing.patch_cuda_graphs(timer, HOOK.after_replay, HOOK.before_replay, cls=Graph)

class Original:
    def __init__(self, error=None):
        self.n, self.error = 0, error
    def __call__(self, *a, **k):
        self.n += 1
        if self.error is not None:
            raise self.error
        return ("vllm", self.n)

class Self:  # a stand-in `self`: the parts read attributes of it (world_size, ...) and may fail: that is the point
    pass

out = {"patches": [], "failures": []}
for p in failsafe.PATCHES:
    out["patches"].append([getattr(p.owner, "__name__", str(p.owner)), p.name, p.site])
    for spec in ("", p.site, p.site + "@after", "all", "all@after"):
        for raising in (False, True):
            failsafe._off.clear()
            failsafe.reload_faults(spec)
            boom = RuntimeError("vLLM's own")
            orig = Original(boom if raising else None)
            w = failsafe.wrap(orig, p.site, p.part, p.replaces)
            try:
                got = w(Self(), 1)
            except BaseException as e:
                got = e
            want = boom if raising else ("vllm", 1)
            # a part patched as a replacement may answer for the original (the routes loader, the reroute)
            substituted = p.replaces and orig.n == 0 and not isinstance(got, BaseException)
            if not substituted and (not (got is want or (not raising and got == want)) or orig.n != 1):
                out["failures"].append([p.site, p.name, spec, raising, repr(got), orig.n])
            if spec and not raising and p.site not in failsafe._off and not substituted:
                out["failures"].append([p.site, p.name, spec, raising, "the site stayed on"])

# No tpcomm function on a patched owner outside the mechanism (a wrapper carries its original's __module__).
owners = {id(p.owner): p.owner for p in failsafe.PATCHES}
stray = []
for o in owners.values():
    for name, v in list(vars(o).items()):
        mod = getattr(v, "__module__", "") or ""
        if callable(v) and mod.startswith("tpcomm") and not hasattr(v, "_tpcomm_site") and name not in rpc.METHODS:
            stray.append(f"{getattr(o, '__name__', o)}.{name}")
out["stray"] = stray
print(json.dumps(out))
"""


def test_every_patch_site_runs_vllm_s_call_once_when_tpcomm_s_part_raises():
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("VLLM_PLUGINS", "TPCOMM_FAULT")}
    r = subprocess.run([sys.executable, "-c", _WALK], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    sites = {s for _, _, s in out["patches"]}
    # every kind of place the hook patches was walked (the publishing loop and the routes' own wiring: below)
    # graph_selftest is the start-time self-test's fault site, not a patch (tests/test_hook_graph_patch.py)
    assert sites == set(failsafe.SITES) - {"graph_selftest"}, sites
    assert len(out["patches"]) >= 30
    assert out["failures"] == []
    assert out["stray"] == []


def test_routes_wiring_fails_safe_and_answers_503(fresh):
    """vLLM calls the endpoint plugin's attach_router / init_state while it builds the app: a fault leaves the
    routes out, or answering 503 (never the key-less open answer of a half-initialised state)."""
    import asyncio
    import types

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tpcomm.hook.routes import make_plugin

    app = FastAPI()
    plugin = make_plugin()
    plugin.attach_router(app)
    fresh.reload_faults("routes")
    asyncio.run(plugin.init_state(object(), app.state, types.SimpleNamespace(api_key=["k"])))
    assert "routes" in fresh.disabled()
    r = TestClient(app).get("/tpcomm/v1/status")
    assert r.status_code == 503 and "routes are off" in r.json()["error"]
    app2 = FastAPI()
    make_plugin().attach_router(app2)  # off: no routes added
    assert TestClient(app2).get("/tpcomm/v1/status").status_code == 404


def test_a_faulty_publication_switches_publishing_off(fresh, tmp_path, monkeypatch):
    import threading

    from tpcomm.hook import publish
    from tpcomm.hook.core import Hook

    monkeypatch.setenv("TPCOMM_METRICS_PUBLISH_S", "0.05")
    pub = publish.Publisher(Hook(), 0, base=tmp_path)
    fresh.reload_faults("publish")
    t = threading.Thread(target=pub.loop, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and "publish" in fresh.disabled() and not pub.path.exists()
    pub.close()


def _status(sites_off: dict) -> dict:
    return {
        "enabled": True,
        "per_rank": [
            {"rank": r, "sites_off": {s: {"reason": why, "at_ns": 1} for s, why in sites_off.items()}} for r in (0, 1)
        ],
    }


def test_attribute_names_the_sites_off_and_the_terms_they_lose():
    from tpcomm.analysis import coverage

    st = _status({"graph_capture": "RuntimeError: keep_graph", "publish": "OSError: x"})
    lines = coverage.not_timed(st)
    assert (
        "graph timing off: capture failed: RuntimeError: keep_graph (compute, transfer and wait not measured)" in lines
    )
    assert any(x.startswith("metrics publishing off") and "not measured" not in x for x in lines)
    assert "compute, transfer and wait not measured" in coverage.lost_terms(st)
    assert coverage.lost_terms(_status({"publish": "x", "backend_tag": "y"})) is None  # nothing of the split lost
    assert coverage.lost_terms(_status({"step_end": "x"})).startswith("the per-token time and all its terms")
    assert "some_new_site off" in coverage.not_timed(_status({"some_new_site": "z"}))[0]  # unknown: named, lost
    assert coverage.lost_terms(_status({"some_new_site": "z"})) is not None


def test_a_site_that_goes_off_mid_run_joins_the_status_the_analysis_reads():
    from tpcomm.analysis import coverage

    first = _status({"publish": "at start"})
    coverage.merge_sites_off(first, _status({"publish": "later reason", "step_begin": "mid-run"}))
    assert all(set(r["sites_off"]) == {"publish", "step_begin"} for r in first["per_rank"])
    assert first["per_rank"][0]["sites_off"]["publish"]["reason"] == "at start"  # the first reason stays
    assert coverage.lost_terms(first).startswith("the per-token time")
    coverage.merge_sites_off(first, None)  # a status that could not be read changes nothing


def test_lost_terms_are_not_measured_in_the_split_and_named_on_page_one(tmp_path):
    """Real records (tests/data/attribute_tiny_tp2) with a status that says graph capture timing went off: no
    level keeps a split, each says why, and page one names the site and what it lost."""
    from measured_run import measured_run

    from tpcomm.analysis.attribution import analyse_run_dir
    from tpcomm.report.analysis import analyze

    run = measured_run(tmp_path / "run")
    st = json.loads((run / "hook/status.json").read_text())
    for w in st["per_rank"]:
        w["sites_off"] = {"graph_capture": {"reason": "RuntimeError: capture failed here", "at_ns": 1}}
    (run / "hook/status.json").write_text(json.dumps(st))
    att = analyse_run_dir(run, model_source=str(run / "model_config.json"))
    assert att.levels and all(not lv.attributed and lv.per_token_ms is None for lv in att.levels)
    assert all(
        "compute, transfer and wait not measured" in lv.note and "graph timing off" in lv.note for lv in att.levels
    )
    assert att.headline is None
    warning = analyze(run).verdict.warning
    assert "graph timing off: capture failed: RuntimeError: capture failed here" in warning
    summary = json.loads((run / "attribution/summary.json").read_text())
    assert any("graph timing off" in x for x in summary["not_timed"])


def test_failsafe_interface_names_are_the_shared_ones():
    """Another branch calls these (issue 27): keep the names and the site list."""
    assert callable(failsafe.disable) and callable(failsafe.disabled) and callable(failsafe.fault)
    for s in ("collective", "graph_capture", "graph_replay", "step_begin", "step_end", "sampling", "publish", "routes"):
        assert s in failsafe.SITES
