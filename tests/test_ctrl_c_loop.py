"""Ctrl-C around attribute's rounds of load (tpcomm/attribute/aiorun.py), in real processes sent real SIGINTs.

CI once saw a Ctrl-C land while asyncio built a round's event loop: the run was marked as it should be, but the
user got a traceback from a half-built loop's finaliser and a coroutine never awaited. With plain asyncio.run the
first test's child shows that in roughly 4 of 10 presses on this machine (measured: 17 of 40).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

CHILD = r"""
import asyncio, sys
from tpcomm.attribute import aiorun

mode = sys.argv[1]

async def short():
    await asyncio.sleep(0)
    return 1

async def long():
    try:
        await asyncio.sleep(60)
    finally:
        print("round cleaned up", flush=True)
        if mode == "stubborn":  # a round that takes its time to wind down: a second Ctrl-C ends it
            print("winding down", flush=True)
            await asyncio.sleep(60)

rounds = 0
print("ready", flush=True)
try:
    while True:
        aiorun.run(short if mode == "short" else long)
        rounds += 1
except KeyboardInterrupt:
    print("interrupted after", rounds, "rounds", flush=True)
    sys.exit(130)
"""


def _child(tmp_path, mode: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_ctrl_c_at_any_moment_of_back_to_back_rounds_ends_cleanly(tmp_path):
    rng = random.Random(7)
    for trial in range(25):
        p = _child(tmp_path, "short")
        time.sleep(rng.uniform(0.02, 0.2))
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130 and "interrupted after" in out, (trial, p.returncode, out, err[-2000:])
        assert err == "", (trial, err[-2000:])  # no finaliser traceback, no "never awaited" warning


def test_ctrl_c_mid_round_cancels_it_and_its_clean_up_runs(tmp_path):
    p = _child(tmp_path, "long")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (p.returncode, out, err[-2000:])
    assert out.splitlines() == ["round cleaned up", "interrupted after 0 rounds"], out
    assert err == "", err[-2000:]


def test_a_second_ctrl_c_ends_a_round_that_winds_down_slowly(tmp_path):
    p = _child(tmp_path, "stubborn")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    assert p.stdout.readline().strip() == "round cleaned up"
    assert p.stdout.readline().strip() == "winding down"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 10, "the second Ctrl-C did not end the round"
    assert p.returncode == 130 and "interrupted after 0 rounds" in out, (p.returncode, out, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
