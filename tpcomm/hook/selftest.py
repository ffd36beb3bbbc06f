"""The start-time graph-timing self-test, run in each worker before vLLM captures its CUDA graphs.

No GPU path of the hook has run on a user's server before theirs, so each worker first proves, on
its own GPU and torch, the path that graph timing takes: a tiny CUDA graph made as vLLM makes it
(`torch.cuda.CUDAGraph()`, through the hook's patched constructor: keep_graph), one stand-in
collective captured with the hook's own code (`Hook.timed`, timing events recorded into the graph),
the graph instantiated and replayed, its event-record nodes rotated to a second set where the driver
allows (graphs.py), and every event pair read. Anything wrong (an exception, an event not done after
a synchronize, a duration that is not a duration, the replay not run) switches graph timing off for
this process through failsafe.disable("graph_capture", ...), before any of vLLM's graphs hold an
event; serving goes on, collectives in graphs are then counted untimed and the split says "not
measured". It waits on the GPU (synchronize): it runs once, at start-up, outside any step.
"""

from __future__ import annotations

from typing import Any

from tpcomm.hook import failsafe

SITE = "graph_capture"
MAX_MS = 1000.0  # one tiny kernel: a duration outside [0, MAX_MS) is not one


class _Group:
    """The fields of vLLM's GroupCoordinator that Hook.timed reads at capture."""

    unique_name, rank_in_group, world_size = "tpcomm_selftest:0", 0, 1
    _tpcomm_backends = {"all_reduce": "selftest"}

    def __init__(self, device: Any) -> None:
        self.device = device


def graph_selftest(hook: Any) -> str | None:
    """Run the self-test when graph timing is on; None when it passed (or graph timing is off), else why it
    failed (graph timing is then off for this process)."""
    timer = hook.cuda
    if timer is None or not timer.graph_timing:
        return None
    counts = (timer.graphs_with_slots, timer.graphs_rotating)
    try:
        failsafe.fault("graph_selftest")
        _run(hook, timer)
        return None
    except Exception as e:  # noqa: BLE001 - whatever failed, serving goes on without graph timing
        why = f"start-time self-test failed: {type(e).__name__}: {e}"
        timer._capturing, timer.graph_timing = None, False
        failsafe.disable(SITE, why)
        return why
    finally:
        timer.graphs_with_slots, timer.graphs_rotating = counts  # the test graph is none of vLLM's


def _run(hook: Any, timer: Any) -> None:
    import torch

    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(16, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        hook.timed(_Group(dev), "all_reduce", x, lambda t: t.add_(1), x)
    ge = getattr(g, "_tpcomm_events", None)
    if ge is None:
        raise RuntimeError("no timing events were captured into the graph")
    sets = [ge.installed]
    g.replay()
    if ge.rotating:
        if not timer.rotate(g)(ge):
            raise RuntimeError("no spare event set to rotate to")
        sets.append(ge.installed)
        g.replay()
    torch.cuda.synchronize()
    for evset in sets:
        for e0, e1 in evset.pairs:
            if not (e0.query() and e1.query()):
                raise RuntimeError("a timing event was not done after a synchronize")
            ms = e0.elapsed_time(e1)
            if not 0.0 <= ms < MAX_MS:
                raise RuntimeError(f"an event pair read {ms} ms")
    want = 1 + len(sets)  # the warm-up, then one add per replay
    if float(x[0]) != want:
        raise RuntimeError(f"the graph's replays did not run ({float(x[0])} != {want})")
