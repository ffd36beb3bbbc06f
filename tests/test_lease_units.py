"""The recording's lease in the hook (core.Hook, in this process: the same object a worker holds) and the
words for a server that shut itself down (ranks.RankDeath). The real server's side is tests/test_shutdown_server.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tpcomm.attribute.ranks import RankDeath
from tpcomm.hook.core import Hook


def test_a_lease_ends_the_recording_at_a_step_end_and_a_call_renews_it():
    # No sleeps against the lease (a loaded host stretches them): the lease's end is moved, not waited for.
    h = Hook()
    h.start(session="s", lease_s=30.0)
    assert h.armed and h.lease_s == 30.0
    before = h.lease_until_mono_ns
    time.sleep(0.01)
    h.renew()  # a client's call: the lease starts again from now
    assert h.lease_until_mono_ns > before and h.lease_until_mono_ns >= time.monotonic_ns() + 29e9
    h._step_meta = (time.time_ns(), 1, 1, 0)
    h.step_end(output=object())  # within the lease: still armed
    assert h.armed
    h.lease_until_mono_ns = time.monotonic_ns() - 1  # the lease ran out (no client called for lease_s)
    h._step_meta = (time.time_ns(), 1, 1, 0)
    h.step_end(output=object())  # past it: disarmed in the step, nothing waited for
    assert not h.armed and h.lease_ended_ns > 0 and h.stopped_ns == h.lease_ended_ns
    h.renew()  # a call after the end does not re-arm
    assert not h.armed


def test_a_lease_that_ran_out_without_steps_ends_at_the_next_call():
    h = Hook()
    h.start(session="s", lease_s=0.05)
    time.sleep(0.1)
    assert h.lease_over(time.time_ns()) and not h.armed


_LEASE_ACROSS_A_STEP = """
import sys, time
from tpcomm.hook.core import Hook

step_file = sys.argv[1]
h = Hook()
h.start(session="s", lease_s=30.0)
open(step_file, "w").write(sys.argv[2] + "\\n")  # the wall clock stepped (libfaketime), the monotonic one not
h._step_meta = (time.time_ns(), 1, 1, 0)
h.step_end(output=object())
armed_after_step = h.armed
h.lease_until_mono_ns = time.monotonic_ns() - 1  # then the lease really runs out
h._step_meta = (time.time_ns(), 1, 1, 0)
h.step_end(output=object())
print(armed_after_step, h.armed)
"""


@pytest.mark.parametrize("step", ["+60", "-3600"])
def test_a_wall_clock_step_neither_ends_a_recording_nor_keeps_it_past_its_lease(tmp_path, step):
    """A 30 s lease, then the wall clock stepped a minute forward (the old lease, on the wall clock, ended the
    recording at once and blamed a client that had died) or an hour back (it kept recording an hour past the
    lease). libfaketime steps the wall clock of the process for real; the monotonic clock is left alone."""
    from faketime import stepping_env

    step_file = tmp_path / "faketime"
    env = stepping_env(step_file)
    r = subprocess.run(
        [sys.executable, "-c", _LEASE_ACROSS_A_STEP, str(step_file), step],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False"], r.stdout + r.stderr[-2000:]


def test_a_shutdown_the_api_server_began_blames_no_rank():
    d = RankDeath(0, 123, time.time_ns(), 2, [], [1])
    assert "TP rank 0 (pid 123) died" in d.message()
    d.shutdown_before_ms = 40.0
    msg = d.message()
    assert msg.startswith("the vLLM server shut down during C=2") and "not a rank's failure" in msg
    assert "died" not in msg and d.to_dict()["server_shutdown"] is True
    d.shutdown_before_ms = -3000.0  # vLLM's own shutdown after a rank's death: the rank is named
    assert "TP rank 0 (pid 123) died" in d.message()
