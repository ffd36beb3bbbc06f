"""Malicious or broken traces for `tpcomm trace` (issue 32 item 5): each exits 2 with one line, in bounded time
and memory, whatever the file holds. The bombs are generated here at a size that keeps the test fast (hundreds
of MB of JSON behind a few MB of gzip); what the test holds the reader to is the bound: a JSON value over 32 MB is
refused as it is read, and a trace set with a rank missing is refused from the traces' headers, before any event
is read. Limits (per case, the `tpcomm trace` process alone, its os.wait4 rusage in a small wrapper process): 10 s of CPU, 300 MB peak RSS."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

CPU_S, RSS_MB = 10.0, 300.0
_WRAP = (
    "import json, os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, st, ru = os.wait4(p.pid, 0)\n"
    "u = {'rc': os.waitstatus_to_exitcode(st), 'cpu_s': ru.ru_utime + ru.ru_stime, 'peak_mb': ru.ru_maxrss / 1024}\n"
    "open(sys.argv[1], 'w').write(json.dumps(u))\n"
)


def _head(rank: int, world: int = 2) -> str:
    return f'{{"schemaVersion": 1, "distributedInfo": {{"rank": {rank}, "world_size": {world}}}, "traceEvents": ['


def _ev(ts="1.0", dur="2.0", tid="7", args='{"correlation": 1}') -> str:
    return (
        '{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, '
        f'"tid": {tid}, "ts": {ts}, "dur": {dur}, "args": {args}}}'
    )


def _plain(d: Path, rank: int, body: str, world: int = 2) -> None:
    (d / f"rank{rank}.json").write_text(_head(rank, world) + body + "]}")


def _gz_stream(path: Path, parts) -> None:
    with gzip.open(path, "wt", compresslevel=1) as f:
        for p in parts:
            f.write(p)


def _bomb_string(d: Path) -> None:
    # one event whose name is a 64 MB string (a 1 GB one behaves the same: refused at 32 MB)
    chunk = "A" * (1 << 20)
    _gz_stream(d / "rank0.json.gz", [_head(0, 1), '{"ph": "X", "name": "', *([chunk] * 64), '"}]}'])


def _bomb_events_missing_rank(d: Path) -> None:
    # rank 0 of a world of 2: ~100 MB of events, and no rank 1; the header says so before any event is read
    block = ",".join([_ev()] * 2000)
    _gz_stream(d / "rank0.json.gz", [_head(0, 2), block, *(["," + block] * 350), "]}"])


CASES = {
    "deep nesting": lambda d: _plain(d, 0, "[" * 200_000 + "]" * 200_000, world=1),
    "deep nesting in the header": lambda d: (d / "rank0.json").write_text(
        '{"deviceProperties": ' + "[" * 200_000 + "]" * 200_000 + ', "traceEvents": []}'
    ),
    "NaN timestamp": lambda d: _plain(d, 0, _ev(ts="NaN"), world=1),
    "1e300 timestamp": lambda d: _plain(d, 0, _ev(ts="1e300"), world=1),
    "-1e18 timestamp": lambda d: _plain(d, 0, _ev(ts="-1e18"), world=1),
    "string timestamp": lambda d: _plain(d, 0, _ev(ts='"yesterday"'), world=1),
    "args a list": lambda d: _plain(d, 0, _ev(args="[1, 2]"), world=1),
    "correlation a string": lambda d: _plain(d, 0, _ev(args='{"correlation": "x"}'), world=1),
    "thread id 2^80": lambda d: _plain(d, 0, _ev(tid=str(2**80)), world=1),
    "rank 2^80": lambda d: (d / "rank0.json").write_text(
        '{"distributedInfo": {"rank": ' + str(2**80) + ', "world_size": 2}, "traceEvents": []}'
    ),
    "gzip bomb of one string": _bomb_string,
    "gzip bomb of events, rank 1 missing": _bomb_events_missing_rank,
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_malicious_trace_exits_2_with_one_line_in_bounded_time_and_memory(case, tmp_path):
    d = tmp_path / "prof"
    d.mkdir()
    CASES[case](d)
    outp, errp, usage = tmp_path / "stdout", tmp_path / "stderr", tmp_path / "usage.json"
    # Through a small wrapper process: a child forked straight from pytest would inherit pytest's peak RSS
    # (Linux carries the forking process's high-water mark into ru_maxrss across exec).
    cmd = [sys.executable, "-m", "tpcomm.cli", "trace", str(d), "--out", str(tmp_path / "run")]
    with outp.open("w") as fo, errp.open("w") as fe:
        p = subprocess.Popen(
            [sys.executable, "-c", _WRAP, str(usage), *cmd],
            stdout=fo,
            stderr=fe,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            p.wait(timeout=120)  # a hang fails the test instead of stalling the suite
        finally:
            p.kill()
    u = json.loads(usage.read_text())
    rc, cpu, peak = u["rc"], u["cpu_s"], u["peak_mb"]
    out, err = outp.read_text(), errp.read_text()
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert rc == 2, (case, out[-500:], err[-2000:])
    assert len(lines) == 1 and "trace" in lines[0], lines[:5]
    assert not (tmp_path / "run" / "trace").exists()  # nothing written
    assert cpu <= CPU_S and peak <= RSS_MB, (case, f"{cpu:.1f} s CPU, {peak:.0f} MB")
