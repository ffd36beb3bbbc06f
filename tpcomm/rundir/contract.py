"""The run-directory contract: every file a tpcomm command writes, its schema, and who writes it.

Stages talk only through the run directory (DESIGN.md at the repository root), so this is their API.
`RunDir` (layout.py) reads and writes through the specs below and checks them:
a table missing a column (or holding the wrong kind of values in it), a JSON
document missing a key or holding a value of the wrong type (its dataclass in documents.py or results.py
says which), or a document of another schema version is refused
with one line naming the file, the field and the command that writes it
(`SchemaError`, an `InputError`: exit 2 at the CLI). Absent files are not
errors: an absent file means "not measured".

Versions: every JSON document carries `schema_version` (in each element of a
list document); every Parquet table carries it in its key-value metadata
(`tpcomm.schema_version`). A file older than its spec's `min_version` (the
layout this tpcomm reads; schema 2 changed attribution/summary.json into
tpcomm.rundir.results.Attribution) is refused with one line saying how to redo it
from the run's own records; files whose layout did not change load from any
version, and newer versions than SCHEMA_VERSION are refused.

Units are in column names (`*_us`, `*_ms`, `*_ns`, `bytes`, `*_GBps` = 1e9 B/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpcomm.errors import InputError

# 3: attribution levels carry delivery_term and host_load (older summaries still load); 4: a decode token's period
# runs from the end of the step before it to the end of its own (analysis/split.py decode_pairs; 3 and older: start
# to start): a summary of 3 or older still loads, and where its files no longer reproduce it compare says why.
SCHEMA_VERSION = 4
PERIODS_END_TO_END = 4  # the first schema_version whose attribution was analysed with end-to-end periods

# Column kinds: i integer, f number (int or float), s text, b boolean.
_KIND_NAMES = {"i": "integers", "f": "numbers", "s": "text", "b": "booleans"}


@dataclass(frozen=True)
class Col:
    name: str
    kind: str  # one of _KIND_NAMES
    doc: str = ""


@dataclass(frozen=True)
class FileSpec:
    path: str
    format: str  # json | table | aux (logs, raw streams, rendered outputs: no schema)
    writer: str  # the command that writes it
    doc: str
    columns: tuple[Col, ...] = ()  # tables: required columns
    optional: tuple[Col, ...] = ()  # tables: columns added later; checked when present, absent in older files
    keys: tuple[str, ...] = ()  # JSON documents: required top-level keys (of each element, for a list)
    list_doc: bool = False  # JSON document that is a list of objects
    min_version: int = 1  # the oldest schema_version whose layout of this file this tpcomm reads
    redo: str = ""  # how to write it anew from what the run directory holds, when that is possible

    def __str__(self) -> str:
        return self.path


class SchemaError(InputError):
    """A run-directory file that does not match the contract (one line, exit 2)."""

    def __init__(self, spec: FileSpec | str, problem: str, field: str | None = None, expected: str | None = None):
        path, writer = (spec.path, spec.writer) if isinstance(spec, FileSpec) else (str(spec), "tpcomm")
        self.path, self.field = path, field
        where = f"{path}" + (f" [{field}]" if field else "")
        super().__init__(where, problem, expected or f"the file as `{writer}` writes it; rerun that command")


def _cols(spec: str) -> tuple[Col, ...]:
    """'name:kind name:kind ...' -> Col tuple (compact, so a schema reads as one block)."""
    return tuple(Col(*c.split(":")) for c in spec.split())


ATTRIBUTE = "tpcomm attribute --server-url URL --out RUN_DIR"
PROBE = "tpcomm probe --gpus N --model MODEL --out RUN_DIR"

META = FileSpec(
    "meta.json",
    "json",
    "any tpcomm command with --out",
    "tpcomm + stack versions, command lines",
    keys=("created_utc", "versions", "commands"),
)
STATUS = FileSpec(
    "status.json",
    "json",
    "any tpcomm command with --out",
    "per stage: {state: running|complete|incomplete|failed, utc, ...}",
)
TOPO = FileSpec(
    "topo.json",
    "json",
    "tpcomm topo --out RUN_DIR",
    "GPUs, links, P2P, NUMA, NCCL env",
)
PLAN = FileSpec(
    "plan.json",
    "json",
    "tpcomm plan --model MODEL --tp N --out RUN_DIR",
    "`tpcomm plan --json`",
    keys=("model", "layout"),
)
PREDICT = FileSpec(
    "predict.json",
    "json",
    "tpcomm predict --model MODEL --tp N --out RUN_DIR",
    "`tpcomm predict --json`",
    keys=("model", "layout", "hardware"),
)

PROBE_RESULTS = FileSpec(
    "probe/results.parquet",
    "table",
    PROBE,
    "one row per (backend, op, mode, bytes, timing)",
    columns=_cols(
        "backend:s op:s mode:s timing:s bytes:i world_size:i p50_us:f p99_us:f algbw_GBps:f busbw_GBps:f wrong:f"
    ),
)
PROBE_RESULTS_JSON = FileSpec("probe/results.json", "json", PROBE, "JSON twin of probe/results.parquet")
PROBE_FIT = FileSpec(
    "probe/fit.json",
    "json",
    PROBE,
    "fitted latency model per backend and op",
)
PROBE_JSONL = FileSpec("probe/results.jsonl", "aux", PROBE, "rank 0's raw record stream")
REPLAY = FileSpec(
    "probe/replay.json",
    "json",
    "tpcomm probe --replay --out RUN_DIR",
    "decode-step replay: conditions, schedule, per (backend, mode) timings and split",
)
REPLAY_STEPS = FileSpec(
    "probe/replay_steps.parquet",
    "table",
    "tpcomm probe --replay --out RUN_DIR",
    "one row per replayed step and timing (full | compute | comm)",
    columns=_cols(
        "backend:s mode:s timing:s step:i step_us:f compute_us:f transfer_us:f wait_us:f n_collectives:i ranks:i"
    ),
)
REPLAY_COLLECTIVES = FileSpec(
    "probe/replay_collectives.parquet",
    "table",
    "tpcomm probe --replay --out RUN_DIR",
    "one row per collective per rank per replayed step (aligned as attribute does)",
    columns=_cols(
        "backend:s mode:s timing:s rank:i group:s group_size:i step:i call_idx:i "
        "site:s layer:i op:s bytes:i t_start_ns:i duration_us:f transfer_us:f "
        "wait_us:f entry_skew_us:f complete:b"
    ),
)

_HOOK_COLL = (
    "rank:i group:s group_rank:i group_size:i op:s bytes:i dtype:s backend:s step:i call_idx:i "
    "t_start_ns:i t_end_ns:i duration_us:f timing:s"
)
_HOOK_STEP = "rank:i step:i t_start_ns:i t_end_ns:i duration_us:f num_seqs:i num_tokens:i kind:s"
# `path` (added after tpcomm 0.1.0, schema 1 still): the vLLM code path that issued the call, "group_coordinator"
# or a fused kernel that bypasses it ("flashinfer_fused_ar_rmsnorm*", hook/fused.py). Older records lack
# it: read them as "group_coordinator".
_HOOK_COLL_OPTIONAL = _cols("path:s")
HOOK_COLLECTIVES = FileSpec(
    "hook/collectives.parquet",
    "table",
    ATTRIBUTE,
    "one row per collective call per rank (hook records, wall clock)",
    columns=_cols(_HOOK_COLL),
    optional=_HOOK_COLL_OPTIONAL,
)
# Optional step columns (schema 1 still): `untimed_collectives`, collectives that ran in a step sampled for CUDA
# graph timing without a row (graph timing off at server start, or a graph sample not read; absent: 0); and, from
# CUDA workers, the step's GPU span on the host clock (hook/gpuclock.py: gpu_start_ns, gpu_end_ns, NaN where not
# read; gpu_duration_us), which attribute's split uses instead of the host span when present.
_HOOK_STEP_OPTIONAL = _cols("untimed_collectives:i gpu_start_ns:f gpu_end_ns:f gpu_duration_us:f")
HOOK_STEPS = FileSpec(
    "hook/steps.parquet",
    "table",
    ATTRIBUTE,
    "one row per engine step per rank",
    columns=_cols(_HOOK_STEP),
    optional=_HOOK_STEP_OPTIONAL,
)
HOOK_STEP_REQUESTS = FileSpec(
    "hook/step_requests.parquet",
    "table",
    ATTRIBUTE,
    "one row per engine step per rank and request of attribute's own it served (its X-Request-Id number; tokens "
    "scheduled): which step made each token above C=1 (hook/recorder.py)",
    columns=_cols("rank:i step:i request:i tokens:i"),
)
HOOK_META = FileSpec("hook/meta.json", "json", ATTRIBUTE, "the server's records meta (versions, ranks, dropped)")
HOOK_STATUS = FileSpec("hook/status.json", "json", ATTRIBUTE, "GET /tpcomm/v1/status at the start of the run")

LOAD_REQUESTS = FileSpec(
    "load/requests.parquet",
    "table",
    ATTRIBUTE,
    "one row per client request",
    columns=_cols(
        "concurrency:i repeat:i round:i in_stats:b request_id:i ok:b "
        "output_tokens:f ttft_ms:f tpot_ms:f e2e_ms:f t_start_ns:f t_end_ns:f"
    ),
    # the end on the wall clock as it read then, and the clock's step during the request (load.RequestClock);
    # older files lack both: no step was measured
    optional=_cols("t_end_wall_ns:f clock_step_ms:f t_start_mono_ns:f t_end_mono_ns:f"),
)
LOAD_TOKENS = FileSpec(
    "load/tokens.parquet",
    "table",
    ATTRIBUTE,
    "one row per streamed chunk (client clock): one token, or several that the API server coalesced when it fell "
    "behind (requests.parquet's output_tokens counts tokens)",
    columns=_cols("request_id:i concurrency:i repeat:i token_idx:i t_ns:i"),
    # tokens in the chunk (the server's token_ids; -1: not said). Older files lack it: one token per chunk
    # where the chunks of a request number its output tokens, else unknown.
    optional=_cols("n_tokens:i"),
)
LOAD_LEVELS = FileSpec(
    "load/levels.json",
    "json",
    ATTRIBUTE,
    "per concurrency level: throughput, percentiles, flags",
    keys=("concurrency", "repeat"),
    list_doc=True,
)

ATTR_STEPS = FileSpec(
    "attribution/steps.parquet",
    "table",
    ATTRIBUTE,
    "one row per decode step (terms averaged over ranks)",
    columns=_cols("concurrency:i repeat:i step:i step_us:f compute_us:f transfer_us:f wait_us:f"),
)
ATTR_STEPS_BY_RANK = FileSpec(
    "attribution/steps_by_rank.parquet",
    "table",
    ATTRIBUTE,
    "one row per (rank, step), all step kinds",
    columns=_cols("rank:i step:i"),
)
ATTR_COLLECTIVES = FileSpec(
    "attribution/collectives.parquet",
    "table",
    ATTRIBUTE,
    "hook records aligned across ranks: transfer_us and wait_us per call",
    columns=_cols(_HOOK_COLL + " transfer_us:f wait_us:f"),
)
ATTR_TIMELINE = FileSpec(
    "attribution/timeline.json",
    "json",
    ATTRIBUTE,
    "one decode step per rank from the aligned records (what the report draws)",
    keys=("step", "ranks"),
)
ATTR_SUMMARY = FileSpec(
    "attribution/summary.json",
    "json",
    ATTRIBUTE,
    "tpcomm.rundir.results.Attribution: per level split, client side, closure, cross-check; the measured verdict",
    keys=("levels",),
    min_version=2,
    redo="tpcomm attribute --reanalyse RUN_DIR (redoes the analysis from the run's own records)",
)

LEVERS = FileSpec(
    "levers.json",
    "json",
    "tpcomm attribute / tpcomm trace / tpcomm predict --out RUN_DIR (each after its own file)",
    "tpcomm.analysis.levers.RunLevers: what to set, ranked by effect, the basis of the figures, the inputs' SHA-256",
    keys=("basis", "levers", "bounds", "inputs"),
    redo="tpcomm report RUN_DIR computes them again when they are absent or older than their inputs",
)

PROFILE_SUMMARY = FileSpec("profile/summary.json", "json", ATTRIBUTE + " --profile", "trace vs hook comparison")
PROFILE_HOOK = FileSpec(
    "profile/hook_collectives.parquet", "table", ATTRIBUTE + " --profile", "hook records of the profiled requests"
)
PROFILE_EVENTS = FileSpec(
    "profile/comm_events.parquet",
    "table",
    ATTRIBUTE + " --profile",
    "communication events found in the torch-profiler traces",
)

REPORT_PDF = FileSpec("report.pdf", "aux", "tpcomm report RUN_DIR", "the report")
REPORT_MD = FileSpec("report.md", "aux", "tpcomm report RUN_DIR", "the report's Markdown twin")
SERVER_LOG = FileSpec("server.log", "aux", "tpcomm demo", "the demo's vLLM server log")

ALL: dict[str, FileSpec] = {
    s.path: s
    for s in (
        META,
        STATUS,
        TOPO,
        PLAN,
        PREDICT,
        LEVERS,
        PROBE_RESULTS,
        PROBE_RESULTS_JSON,
        PROBE_FIT,
        PROBE_JSONL,
        REPLAY,
        REPLAY_STEPS,
        REPLAY_COLLECTIVES,
        HOOK_COLLECTIVES,
        HOOK_STEPS,
        HOOK_STEP_REQUESTS,
        HOOK_META,
        HOOK_STATUS,
        LOAD_REQUESTS,
        LOAD_TOKENS,
        LOAD_LEVELS,
        ATTR_STEPS,
        ATTR_STEPS_BY_RANK,
        ATTR_COLLECTIVES,
        ATTR_TIMELINE,
        ATTR_SUMMARY,
        PROFILE_SUMMARY,
        PROFILE_HOOK,
        PROFILE_EVENTS,
        REPORT_PDF,
        REPORT_MD,
        SERVER_LOG,
    )
}


# ---- torch-profiler (Kineto) traces read into the hook's record tables (issue 18) ---------------------------
# Written by `tpcomm trace TRACE_DIR --out RUN_DIR` and by `attribute --profile`: the same columns as the hook's
# records plus `source` ("trace"), so the same alignment and split read them.
TRACE_WRITER = "tpcomm trace TRACE_DIR --out RUN_DIR (or tpcomm attribute --profile --profile-dir DIR)"
TRACE_COLLECTIVES = FileSpec(
    "trace/collectives.parquet",
    "table",
    TRACE_WRITER,
    "one row per collective per rank read from the traces (kernel or op name, bytes from metadata or shapes, "
    "-1 when the trace holds none), aligned across ranks: transfer_us and wait_us per call",
    columns=_cols(_HOOK_COLL + " source:s transfer_us:f wait_us:f"),
    optional=_HOOK_COLL_OPTIONAL,
)
TRACE_STEPS = FileSpec(
    "trace/steps.parquet",
    "table",
    TRACE_WRITER,
    "one row per engine step per rank read from the traces (vLLM's execute ranges, else ProfilerStep#N)",
    columns=_cols(_HOOK_STEP + " source:s"),
)
TRACE_STEPS_BY_RANK = FileSpec(
    "trace/steps_by_rank.parquet",
    "table",
    TRACE_WRITER,
    "per rank and step: span, compute, collective, transfer, wait, gap to the next step (us)",
    columns=_cols("rank:i step:i step_us:f compute_us:f coll_us:f transfer_us:f wait_us:f gap_us:f"),
)
TRACE_SUMMARY = FileSpec(
    "trace/summary.json",
    "json",
    TRACE_WRITER,
    "the traces' split (per token, or per step for training traces), per rank totals, plan cross-check, "
    "unclassified communication-like names, conditions",
    keys=("source", "split", "ranks"),
)
TRACE_COMPARE = FileSpec(
    "trace/compare.json",
    "json",
    ATTRIBUTE + " --profile",
    "both instruments on one window: per term hook ms, trace ms, difference",
    keys=("terms",),
)
TRACE_PERFETTO = FileSpec("trace/perfetto.json", "aux", TRACE_WRITER, "aligned steps and collectives (Perfetto)")
HOOK_PERFETTO = FileSpec(
    "trace/hook_perfetto.json", "aux", "tpcomm trace --from-hook RUN_DIR", "the hook's aligned records (Perfetto)"
)
PROFILE_HOOK_STEPS = FileSpec(
    "profile/hook_steps.parquet",
    "table",
    ATTRIBUTE + " --profile",
    "hook step rows of the profiled requests",
    columns=_cols(_HOOK_STEP),
)
ALL.update(
    {
        s.path: s
        for s in (
            TRACE_COLLECTIVES,
            TRACE_STEPS,
            TRACE_STEPS_BY_RANK,
            TRACE_SUMMARY,
            TRACE_COMPARE,
            TRACE_PERFETTO,
            HOOK_PERFETTO,
            PROFILE_HOOK_STEPS,
        )
    }
)


def spec_for(name: FileSpec | str) -> FileSpec | None:
    return name if isinstance(name, FileSpec) else ALL.get(str(name))


# ---- checks -------------------------------------------------------------------
def check_version(spec: FileSpec | str, version) -> None:
    floor = spec.min_version if isinstance(spec, FileSpec) else 1
    if (version is None or (isinstance(version, int) and version < floor)) and floor > 1:
        raise SchemaError(
            spec,
            f"was written by an older tpcomm (schema_version {version if version is not None else 'none'}; this "
            f"tpcomm reads {floor}..{SCHEMA_VERSION})",
            "schema_version",
            expected=(spec.redo or f"the file as `{spec.writer}` writes it")
            + "; meta.json names the tpcomm that wrote it",
        )
    if version is None:
        return  # written before schema versions existed: loads when its fields are there
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise SchemaError(
            spec,
            f"has schema_version {version!r}; this tpcomm reads versions 1..{SCHEMA_VERSION} "
            "(written by another tpcomm version)",
            "schema_version",
        )


def check_json(spec: FileSpec, doc, writing: bool = False) -> Any:
    """Checks `doc` against `spec` and returns it as its dataclass (documents.parse)."""
    items = doc if spec.list_doc else [doc]
    if spec.list_doc and not isinstance(doc, list):
        raise SchemaError(spec, f"is a JSON {type(doc).__name__}, not a list of objects")
    for item in items:
        if not isinstance(item, dict):
            raise SchemaError(spec, f"holds a JSON {type(item).__name__} where an object was expected")
        check_version(spec, item.get("schema_version"))
        for k in spec.keys:
            if k not in item:
                raise SchemaError(spec, "lacks a required key", k)
    # The type of every value a reader uses: the document's dataclass (documents.py), one definition.
    from tpcomm.rundir.documents import parse

    return parse(spec, doc, writing)


def check_table(spec: FileSpec, df, version=None) -> None:
    check_version(spec, version)
    if len(df) == 0 and len(df.columns) == 0:
        return  # an empty table: nothing recorded
    for col in spec.columns:
        if col.name not in df.columns:
            raise SchemaError(spec, f"lacks the column (has: {', '.join(map(str, df.columns))})", col.name)
        if not _kind_ok(df[col.name], col.kind):
            raise SchemaError(
                spec, f"column holds {df[col.name].dtype} values, expected {_KIND_NAMES[col.kind]}", col.name
            )
    for col in spec.optional:
        if col.name in df.columns and not _kind_ok(df[col.name], col.kind):
            raise SchemaError(
                spec, f"column holds {df[col.name].dtype} values, expected {_KIND_NAMES[col.kind]}", col.name
            )


def _kind_ok(s, kind: str) -> bool:
    from pandas.api import types as t

    if s.isna().all():
        return True  # all missing: "not measured", any kind
    if kind == "i":
        return t.is_integer_dtype(s) or (t.is_float_dtype(s) and bool((s.dropna() % 1 == 0).all()))
    if kind == "f":
        return t.is_numeric_dtype(s) and not t.is_bool_dtype(s)
    if kind == "b":
        return t.is_bool_dtype(s) or (t.is_object_dtype(s) and s.dropna().map(lambda v: isinstance(v, bool)).all())
    return t.is_string_dtype(s) or t.is_object_dtype(s)


# ---- `tpcomm compare RUN_A RUN_B --out DIR` (tpcomm/compare/) ------------------------------------------------
COMPARE = "tpcomm compare RUN_A RUN_B --out DIR"
COMPARE_JSON = FileSpec(
    "compare.json",
    "json",
    COMPARE,
    "tpcomm.compare.results.Comparison: per level B - A of every term with its interval, sites, conditions, verdict",
    keys=("run_a", "run_b", "kind", "levels", "conditions", "verdict"),
)
COMPARE_PDF = FileSpec("compare.pdf", "aux", COMPARE, "the comparison's report")
COMPARE_MD = FileSpec("compare.md", "aux", COMPARE, "the comparison's Markdown twin")
ALL.update({s.path: s for s in (COMPARE_JSON, COMPARE_PDF, COMPARE_MD)})
