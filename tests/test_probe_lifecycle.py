"""Probe and replay fixes that run on the CPU: backends destroy the groups (communicators) they built, also
when their construction fails half-way; the isolated sample's order on a GPU (line-up, slack, line-up, the
test delay, then the timed op); the replay's graph warm-up and capture inside the backends' capture()
contexts on one stream (FlashInfer PCIe IPC's single-stream guard)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def world1(tmp_path):
    """A real one-rank gloo world (what a probe rank runs in, minus the other ranks)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.new_group(backend="gloo")
    dist.destroy_process_group()


def _live(group) -> bool:
    from torch.distributed.distributed_c10d import _world

    return group in _world.pg_map


def test_a_backend_destroys_its_groups_on_close(world1):
    from probes.backends import make_backend

    be = make_backend("gloo", world1, 0)
    own = list(be._own_groups)
    assert own and all(_live(g) for g in own)
    be.close()
    assert not any(_live(g) for g in own) and not hasattr(be, "_own_groups")
    be.close()  # twice is harmless
    assert _live(world1)  # the caller's group is not the backend's to destroy


def test_a_backend_that_fails_half_way_destroys_what_it_built(world1, monkeypatch):
    from probes import backends

    made = []

    class Half(backends.GlooBackend):
        def __init__(self, cpu_group, local_rank):
            super().__init__(cpu_group, local_rank)
            made.extend(self._own_groups)
            self._group("gloo")
            made.append(self._own_groups[-1])
            raise backends.Ineligible("refused after building two groups")

    with pytest.raises(backends.Ineligible, match="two groups"):
        backends.built(Half, world1, 0)
    assert len(made) == 2 and not any(_live(g) for g in made)


def test_isolated_sample_lines_up_again_after_the_slack(monkeypatch):
    """GPU order: line-up, slack, line-up, the test's delay, start event, op, end event. Without the second
    line-up each rank starts the op when its own slack ends (slack lengths differ with the SM clock)."""
    from probes import measure

    log = []

    class Ev:
        def __init__(self, **kw):
            pass

        def record(self):
            log.append("event")

        def query(self):
            return False

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.01

    monkeypatch.setattr(torch.cuda, "Event", Ev)
    monkeypatch.setenv("TPCOMM_PROBE_SLACK_US", "0")  # no calibration (it would need a GPU)
    backend = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
    timer = measure.Timer(backend)
    timer._slack = lambda: log.append("slack")
    us = timer.time_us(lambda: log.append("op"), lambda: log.append("lineup"), lambda: log.append("late"))
    assert log == ["lineup", "slack", "lineup", "late", "event", "op", "event"] and us == pytest.approx(10.0)
    assert timer.overran is False
    # CPU: one line-up, no slack
    log.clear()
    cpu = measure.Timer(types.SimpleNamespace(device=torch.device("cpu")))
    cpu.time_us(lambda: log.append("op"), lambda: log.append("lineup"), lambda: log.append("late"))
    assert log == ["lineup", "late", "op"]


def test_replay_warms_up_and_captures_inside_capture_on_one_stream(monkeypatch):
    """probes/replay.py _capture: every backend's capture() is entered before the warm-up, and the warm-up and
    the capture run on the same stream (FlashInfer's PcieIpcAllReduceWorkspace binds to the first stream it
    runs on after capture() rebinds it, and raises on any other)."""
    from probes import replay

    log = []

    class Stream:
        def __init__(self):
            self.id = len([x for x in log if x[0] == "stream"])
            log.append(("stream", self.id))

        def wait_stream(self, other):
            pass

        def synchronize(self):
            log.append(("sync", self.id))

    current = [None]

    class StreamCtx:
        def __init__(self, s):
            self.s = s

        def __enter__(self):
            current[0] = self.s

        def __exit__(self, *a):
            current[0] = None

    class GraphCtx:
        def __init__(self, g, stream=None):
            self.stream = stream

        def __enter__(self):
            current[0] = self.stream
            log.append(("capture", self.stream.id if self.stream else None))

        def __exit__(self, *a):
            current[0] = None

    class Backend:
        def capture(self):
            class C:
                def __enter__(self_):
                    log.append(("capture() in",))

                def __exit__(self_, *a):
                    log.append(("capture() out",))

            return C()

    class Step:
        def issue(self, timing, state):
            log.append(("issue", current[0].id if current[0] is not None else None))
            return 3

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", StreamCtx)
    monkeypatch.setattr(torch.cuda, "graph", GraphCtx)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    g, n = replay._capture(Step(), "full", [Backend()])
    assert n == 3
    side = log[0][1]
    inside = log[log.index(("capture() in",)) : log.index(("capture() out",))]
    assert inside[0] == ("capture() in",)
    assert [e for e in inside if e[0] in ("issue", "capture")] == [
        ("issue", side),
        ("issue", side),
        ("capture", side),
        ("issue", side),
    ]
    assert not any(e[0] == "issue" for e in log[: log.index(("capture() in",))])  # no warm-up before capture()
