"""Which process a pid is: boot id, pid and start time name one process on one machine, never another;
and how long the calling thread has waited for a CPU (thread_cpu_wait_ns).

A pid alone is reused after the process dies and a host name is shared by
containers on one machine, so neither says that a pid seen here is the
process another program reported. The kernel's boot id and the process's
start time (clock ticks since boot, /proc/<pid>/stat field 22) do. Linux
only: elsewhere identity() is None and callers fall back to asking the
process's owner. Standard library only (the hook imports it in vLLM's
processes).
"""

from __future__ import annotations

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def identity(pid: int) -> str | None:
    """'<boot id>/<pid>/<start ticks>' of a live or zombie process, None if it is not visible here."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
        with open(f"/proc/{int(pid)}/stat") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": field 3 (state) is fields[0]
    if len(fields) < 20:
        return None
    return f"{boot}/{int(pid)}/{fields[19]}"


def state(pid: int) -> str | None:
    """The process's state letter from /proc/<pid>/stat (R running, S sleeping, D disk wait, T stopped by a
    signal, t stopped by a tracer, Z zombie), None if it is not visible here."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except (OSError, ValueError):
        return None
    return fields[0] if fields else None


def thread_cpu_wait_ns(tid: int | None = None) -> int | None:
    """How long thread `tid` of this process (None: the calling thread) has been runnable but waiting for a
    CPU since it started (Linux schedstat run_delay, ns): another task held its core. None where the kernel
    does not keep it (no file, or "0 0 0": schedstats off)."""
    try:
        with open(f"/proc/self/task/{int(tid)}/schedstat" if tid else "/proc/thread-self/schedstat") as f:
            run, wait = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError, TypeError):
        return None
    return wait if run > 0 else None
