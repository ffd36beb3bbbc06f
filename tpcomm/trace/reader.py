"""Read one Kineto (torch-profiler) trace per rank, streaming, into compact columns.

A Kineto trace is one JSON object whose `traceEvents` array holds every event;
vLLM's traces run to tens of MB per rank, a GPU run's to hundreds. json.load
would hold the whole text and a dict per event at once, so the reader walks the
top-level object itself and decodes one event at a time with
json.JSONDecoder.raw_decode over a sliding buffer (stdlib only). What it keeps
per complete event ("ph": "X") is a row of integers in array columns
(category, interned name, thread, start, duration, correlation, external id),
plus the args of the few events whose metadata the analysis reads
(communication and step annotations, launch records). Memory grows with the
number of events, never with the size of their args or the JSON text.

Time: Kineto `ts`/`dur` are microseconds (floats); `baseTimeNanoseconds`, when
the trace has it, is the offset to the Unix epoch: t_ns = base + ts * 1000. On
one host that is the clock tpcomm's hook records with (time.time_ns()).

Rank: `distributedInfo.rank`, else a `rank<N>` / `rank-<N>` in the file name,
else an error naming the file.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from tpcomm.errors import InputError

CHUNK = 1 << 20  # characters read per refill
# One JSON value (an event, a header field) longer than this is no Kineto trace (a real event is < 100 kB):
# stop there rather than hold a gzip bomb's one string in memory.
MAX_VALUE = 32 << 20
# Event categories kept, as small integers in the `cat` column.
CATS = (
    "cpu_op",
    "user_annotation",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_runtime",
    "cuda_driver",
)  # not python_function (with_stack: most of a vLLM GPU trace's events), nor anything else: no rule reads them
CAT_CODE = {c: i for i, c in enumerate(CATS)}
DEVICE_CATS = {CAT_CODE[c] for c in ("kernel", "gpu_memcpy", "gpu_memset")}
HOST_CATS = {CAT_CODE[c] for c in ("cpu_op", "user_annotation")}
RUNTIME_CATS = {CAT_CODE[c] for c in ("cuda_runtime", "cuda_driver")}
_WS = re.compile(r"[ \t\n\r]*")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)
EXPECTED = "a Kineto trace as torch.profiler writes it (*.pt.trace.json[.gz], one JSON object with traceEvents)"


@dataclass
class RankTrace:
    """One rank's trace: header fields and the kept events as columns (see the module docstring)."""

    path: Path
    rank: int
    rank_from: str  # "distributedInfo" | "file name"
    header: dict  # top-level keys except traceEvents
    names: list[str] = field(default_factory=list)  # name id -> name
    cat: array = field(default_factory=lambda: array("b"))
    name: array = field(default_factory=lambda: array("l"))
    tid: array = field(default_factory=lambda: array("q"))
    ts_ns: array = field(default_factory=lambda: array("q"))  # trace clock, ns (ts * 1000)
    dur_ns: array = field(default_factory=lambda: array("q"))
    corr: array = field(default_factory=lambda: array("q"))  # CUDA correlation id, -1 if none
    ext: array = field(default_factory=lambda: array("q"))  # Kineto External id, -1 if none
    args: dict[int, dict] = field(default_factory=dict)  # row -> args, for rows keep_args selected
    events_seen: int = 0  # every element of traceEvents, kept or not

    @property
    def base_ns(self) -> int:
        b = self.header.get("baseTimeNanoseconds")
        return int(b) if isinstance(b, int | float) else 0

    @property
    def world_size(self) -> int | None:
        info = self.header.get("distributedInfo")
        w = info.get("world_size") if isinstance(info, dict) else None
        return int(w) if isinstance(w, int) else None

    @property
    def host(self) -> str | None:
        h = self.header.get("host_name")
        return str(h) if h else None

    def __len__(self) -> int:
        return len(self.ts_ns)


def read_header(path: str | Path) -> RankTrace:
    """The trace's top-level keys before `traceEvents` (Kineto writes distributedInfo there) and its rank, no
    event read: what a set of traces can be checked on before reading millions of events."""
    return read_trace(path, None, header_only=True)


def read_trace(path: str | Path, keep_args, header_only: bool = False) -> RankTrace:
    """Stream one trace file. `keep_args(cat, name) -> bool` says whose args to keep (the rest are dropped)."""
    path = Path(path)
    what = f"trace {path}"
    try:
        raw = path.open("rb")
    except OSError as e:
        raise InputError(what, f"cannot be read ({e.strerror})", EXPECTED) from None
    with raw:
        magic = raw.read(2)
        raw.seek(0)
        binary = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="strict")
        try:
            tr = _Parser(text, what).parse(path, keep_args, header_only)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise InputError(what, f"is truncated or not valid gzip ({e})", EXPECTED) from None
        except UnicodeDecodeError:
            raise InputError(what, "is not UTF-8 text", EXPECTED) from None
    info = tr.header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    for key in ("rank", "world_size"):
        v = info.get(key)
        if v is not None and not (type(v) is int and 0 <= v < 1 << 20):
            raise InputError(what, f"has distributedInfo.{key} {str(v)[:40]!r}: not a rank number", EXPECTED)
    if isinstance(info.get("rank"), int):
        tr.rank, tr.rank_from = int(info["rank"]), "distributedInfo"
    else:
        m = _RANK_IN_NAME.search(path.name)
        if not m and header_only:  # distributedInfo may come after the events in a non-Kineto writer's file
            tr.rank, tr.rank_from = -1, ""
            return tr
        if not m:
            raise InputError(
                what,
                "names no rank (no distributedInfo.rank in it, no rank<N> in its file name)",
                "a trace written under torch.distributed, or a file named like *rank0*.json.gz",
            )
        tr.rank, tr.rank_from = int(m.group(1)[:9]), "file name"
    return tr


class _Parser:
    """The top-level object, key by key; `traceEvents` element by element."""

    def __init__(self, f, what: str):
        self.f, self.what = f, what
        self.buf, self.pos, self.eof = "", 0, False
        self.dec = json.JSONDecoder()

    def _fill(self) -> bool:
        if self.eof:
            return False
        more = self.f.read(CHUNK)
        if not more:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + more
        self.pos = 0
        return True

    def _peek(self) -> str:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str) -> str:
        c = self._peek()
        if not c:
            raise InputError(self.what, "ends in the middle of the JSON (truncated)", EXPECTED)
        if c not in chars:
            raise InputError(self.what, f"has {c!r} where one of {chars!r} was expected: not a Kineto trace", EXPECTED)
        self.pos += 1
        return c

    def _value(self):
        self._peek()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise InputError(self.what, "nests JSON deeper than Python can decode", EXPECTED) from None
            except json.JSONDecodeError as e:
                # An incomplete value at the buffer's end: read more and decode again; at EOF it is truncated.
                if len(self.buf) - self.pos > MAX_VALUE:
                    raise InputError(
                        self.what,
                        f"holds one JSON value of more than {MAX_VALUE >> 20} MB: not a Kineto trace",
                        EXPECTED,
                    ) from None
                if self._fill():
                    continue
                raise InputError(self.what, f"is not valid JSON ({e.msg}): truncated?", EXPECTED) from None
            if end == len(self.buf) and not self.eof and self._fill():
                continue  # a number may go on in the next chunk
            self.pos = end
            return v

    def parse(self, path: Path, keep_args, header_only: bool = False) -> RankTrace:
        if self._peek() != "{":
            raise InputError(self.what, "is not a JSON object: not a Kineto trace", EXPECTED)
        self.pos += 1
        tr = RankTrace(path, -1, "", {})
        seen_events = False
        if self._peek() == "}":
            self.pos += 1
        else:
            while True:
                key = self._value()
                self._expect(":")
                if key == "traceEvents":
                    if header_only:
                        return tr
                    self._events(tr, keep_args)
                    seen_events = True
                else:
                    tr.header[key] = self._value()
                if self._expect(",}") == "}":
                    break
        if not seen_events:
            raise InputError(self.what, "has no traceEvents array: not a Kineto trace", EXPECTED)
        return tr

    def _events(self, tr: RankTrace, keep_args) -> None:
        """The events array. Where the buffer holds several whole events they are decoded in one json.loads of
        the run up to the last `}, {` boundary (C speed, no per-event Python call); a boundary that is not a
        top-level one (inside a string or nested args) makes that text invalid JSON: then one event at a time.
        """
        self._expect("[")
        if self._peek() == "]":
            self.pos += 1
            return
        add = _Adder(tr, keep_args, self.what)
        try:
            self._elements(add)
        finally:
            tr.events_seen = add.n

    def _elements(self, add) -> None:
        while True:
            if len(self.buf) - self.pos < CHUNK and not self.eof:
                self._fill()
            cut = _last_boundary(self.buf, self.pos)
            if cut is not None:
                try:
                    batch = json.loads("[" + self.buf[self.pos : cut] + "]")
                except (ValueError, RecursionError):
                    batch = None
                if batch is not None:
                    add(batch)
                    self.pos = _BOUNDARY_TAIL.match(self.buf, cut).end()
                    continue
            add([self._value()])
            if self._expect(",]") == "]":
                return


_BOUNDARY = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*(?=\{)")
_BOUNDARY_TAIL = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_TAIL = 1 << 16  # characters searched back for the last event boundary


def _last_boundary(buf: str, pos: int) -> int | None:
    """The end of the last `}` followed by `, {` in buf[pos:] (searched in its last 64 kB), else None."""
    last = None
    for m in _BOUNDARY.finditer(buf, max(pos, len(buf) - _TAIL)):
        last = m
    return None if last is None else last.start() + 1


# The args keys tpcomm/trace reads (collective metadata, record_shapes); the rest of a kept event's args is dropped.
META_KEYS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Group size",
    "Process Group Name",
    "Process Group Description",
    "Input Dims",
    "Input type",
)
# A timestamp or duration past this (us) is no clock reading: ~146 years of ns in an int64.
_MAX_US = 2**62 / 1000


class _Adder:
    """Appends decoded events to a RankTrace's columns; a value the columns cannot hold is a one-line error."""

    def __init__(self, tr: RankTrace, keep_args, what: str):
        self.tr, self.keep, self.what = tr, keep_args, what
        self.ids: dict[str, int] = {name: i for i, name in enumerate(tr.names)}
        self.n = 0  # events seen (all phases), for the error message
        self.kept: dict[tuple[int, int], bool] = {}  # (cat, name id) -> keep_args' answer: names repeat

    def __call__(self, events: list) -> None:
        tr, ids, names, cat_code, kept = self.tr, self.ids, self.tr.names, CAT_CODE, self.kept
        for ev in events:
            self.n += 1
            if type(ev) is not dict or ev.get("ph") != "X":
                continue
            c = cat_code.get(ev.get("cat"))
            if c is None:
                continue
            try:
                nm = ev.get("name", "")
                if type(nm) is not str:
                    raise TypeError("name is not a string")
                a = ev.get("args") or {}
                if type(a) is not dict:
                    raise TypeError("args is not an object")
                t, d = float(ev.get("ts", 0)), float(ev.get("dur", 0))
                if not (abs(t) < _MAX_US and abs(d) < _MAX_US):  # also NaN
                    raise ValueError(f"ts {ev.get('ts')!r} / dur {ev.get('dur')!r} out of range")
                tid = ev.get("tid", 0)
                if type(tid) is not int:  # Kineto's are ints; a name (some writers) is hashed to one, stably
                    tid = zlib.crc32(str(tid).encode())
                elif not -(2**63) <= tid < 2**63:
                    raise ValueError(f"tid {tid} out of range")
                corr, ext = int(a.get("correlation", -1)), int(a.get("External id", -1))
                i = ids.get(nm)
                if i is None:
                    i = ids[nm] = len(names)
                    names.append(nm)
                tr.corr.append(corr)  # first: the int64 columns raise OverflowError before any other is touched
                try:
                    tr.ext.append(ext)
                except OverflowError:
                    tr.corr.pop()
                    raise
            except (TypeError, ValueError, OverflowError) as e:
                raise InputError(
                    self.what, f"has an event ({self.n}th) whose fields are not numbers it can hold ({e})", EXPECTED
                ) from None
            tr.cat.append(c)
            tr.name.append(i)
            tr.tid.append(tid)
            tr.ts_ns.append(round(t * 1000))
            tr.dur_ns.append(round(d * 1000))
            k = kept.get((c, i))
            if k is None:
                k = kept[(c, i)] = bool(self.keep(c, nm))
            if k:  # only the metadata the analysis reads: a GPU trace's kernels carry a dozen keys each
                tr.args[len(tr.ts_ns) - 1] = {m: a[m] for m in META_KEYS if m in a}
