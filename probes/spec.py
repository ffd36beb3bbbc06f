"""What to measure: sizes, ops, the list of measurements. Pure Python (no torch),
shared by the rank side and by `tpcomm probe`.

Units: bytes are the per-rank input buffer of one call (the plan's convention:
all_gather's output is bytes * world size; reduce_scatter's output bytes / world).
"""

from __future__ import annotations

import re

OPS = ("all_reduce", "all_gather", "gather", "reduce_scatter", "all_to_all", "send_recv")
# The probes this folder implements (backends.py), plain fallback first; each is a backend's "probe" in
# tpcomm/backends/*.json (tests/test_backends.py holds the two to each other: this folder imports only torch).
CPU_BACKENDS = ("gloo", "shm")
GPU_BACKENDS = ("nccl", "pynccl", "custom-ar")
BACKENDS = CPU_BACKENDS + GPU_BACKENDS
MODES = ("eager", "graph")
# Ops a backend never has, whatever the machine: not asked of it where every op must run (tpcomm selfcheck).
NOT_IN_BACKEND = {"gloo": {"reduce_scatter": "gloo has no reduce_scatter_tensor in torch.distributed"}}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int8": 1, "uint8": 1, "int32": 4, "float8_e4m3fn": 1}

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def parse_bytes(text: str) -> int:
    """'14336', '14K', '1M', '2GiB' -> bytes (K = 1024, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (expected e.g. 14336, 16K, 1M)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_sizes(text: str) -> list[int]:
    """'1K:64M:x2,14336' -> sizes. A range is START:END[:xFACTOR|:+STEP] (default x2)."""
    out: list[int] = []
    for tok in filter(None, (t.strip() for t in text.split(","))):
        parts = tok.split(":")
        if len(parts) == 1:
            out.append(parse_bytes(parts[0]))
            continue
        if len(parts) not in (2, 3):
            raise ValueError(f"{tok!r} is not a size range (expected START:END[:xFACTOR|:+STEP], e.g. 1K:64M:x2)")
        lo, hi = parse_bytes(parts[0]), parse_bytes(parts[1])
        step = parts[2] if len(parts) == 3 else "x2"
        if lo < 1 or hi < lo:
            raise ValueError(f"{tok!r}: need 1 <= START <= END")
        if step[:1] in "xX*":
            f = float(step[1:])
            if f <= 1:
                raise ValueError(f"{tok!r}: factor must be > 1")
            v = float(lo)
            while v <= hi:
                out.append(int(v))
                v *= f
        elif step[:1] == "+":
            inc = parse_bytes(step[1:])
            if inc < 1:
                raise ValueError(f"{tok!r}: step must be >= 1")
            out.extend(range(lo, hi + 1, inc))
        else:
            raise ValueError(f"{tok!r}: step {step!r} must be xFACTOR or +BYTES")
    if not out:
        raise ValueError("no sizes given")
    return sorted(set(out))


def build_items(backends, modes, op_sizes: dict[str, list[tuple[int, str]]]) -> list[dict]:
    """One measurement per (backend, mode, op, bytes, dtype), in run order:
    all-reduce first (what decode waits on most), small sizes first."""
    items = []
    for b in backends:
        for mode in modes:
            for op in sorted(op_sizes, key=lambda o: OPS.index(o) if o in OPS else 99):
                for nbytes, dtype in sorted(set(op_sizes[op])):
                    items.append({"backend": b, "mode": mode, "op": op, "bytes": int(nbytes), "dtype": dtype})
    return items
