"""Which measured rows informed a prediction's fitted constants, whether any of them ran the engine predicted
for, and how the range widens where none did (issue 29 item 2: "where no measurement covers an engine version,
the range says so and widens, and the JSON names which rows informed it").

The fitted constants are the ones rows of tpcomm/predict/data/validation.json set (each fitted row lists them in
`fits`): a GPU's memory efficiency and GEMM ramp, an engine's own GEMM ramp on a GPU (kernels.ENGINE_RAMP_US:
gpt-fast on A100, which stands in for that GPU's ramp for that engine), vLLM V0's, SGLang's and TGI 1.0's host time, the growth of the host term
with TP, the KV efficiency, the fitted MoE backends' cost per layer and the AWQ-GEMM slowdown. A prediction uses
some of them (`constants_in_use`); the rows that informed it are the fitted rows of those constants among the rows
available (shipped: the whole table; leave-one-source-out: the rows left once a source is held out), and for a GPU
without a ramp fit every row that fits a ramp (the generic ramp is derived from them, kernels.RAMP_US).

Covered: at least one of those rows ran the engine family predicted for (vllm, sglang, tgi, gpt-fast,
transformers). The family, not the version, decides: within a family the version-dependent paths the model knows
are explicit, each with its own stated range (host runner by version, custom all-reduce default, MoE backend by
version with its own `covered_by_a_measurement`, the AWQ GEMM before vLLM 0.5.3); whether the exact version was
measured is reported beside it (`engine_version_measured`) and widens nothing.

The widening (`widen_uncovered`, the one place it is defined). A fitted GEMM ramp is the one fitted constant that
carries the engine's own kernels: as fitted on TP-1 rows it is the fixed cost per weight GEMM *plus the fixed cost
of the layer's other small kernels*, which TP-1 data cannot separate (kernels.RAMP_US) and which is what an engine
changes (torch.compile fuses small kernels; another engine runs other GEMM and norm kernels). On a GPU whose ramp
was fitted with engine F, a prediction for an engine E that no informing row ran has no measurement of E's
per-kernel cost. What the rows do measure is how far that cost moves between the (GPU, engine) pairs that have a
fit: shipped, 6.5 us (H20 + SGLang 0.4.6), 7.4 us (A100 + gpt-fast), 8.5 us (RTX PRO 6000 + vLLM 0.17) and 15.5
us (A100 + vLLM 0.6.3), a factor 2.4 (`ramp_fits`; in a leave-one-source-out fold, the fold's own refitted values of
the pairs still fitted).
So E's per-kernel cost on this GPU is taken to lie anywhere in that measured spread: the ramp's range becomes the
hull of the GPU's own fitted range and [lowest fitted central, highest fitted central]; its central is kept, so no
central prediction moves. A GPU without a fit already takes the generic ramp (1-23 us), which spans every fit:
nothing to widen there. The spread mixes GPU and engine differences: one GPU has fits from two engines (A100: vLLM
0.6.3 15.5 us, gpt-fast 7.4, a factor 2.1 on the same chip), the others one each; as a measure of the engine effect
alone it is an upper bound where the GPUs differ, and it says nothing of an engine whose per-kernel cost lies
outside every fitted pair's.

Not widened, and said so in docs/predict.md: the memory efficiency (large streaming reads, taken as a property of
the GPU), the KV efficiency (one fit, vLLM 0.6.3 on A100: no spread across engines to derive a widening from),
and the engine's own host and launch terms (HOST, HOST_TP, LAUNCH_US in engine.py: stated assumptions for that
engine, not constants carried from another engine's rows). A value the user gives (--ramp-us) is fixed and never
widened.

Units: us per weight GEMM (ramp), tok/s.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from importlib import resources

# The GPU profiles that share one fit (the same chip): the names fitted rows use in `fits` (`a100.ramp_us`, ...).
GPU_GROUPS = {
    "a100": ("a100-sxm", "a100-pcie", "a100-sxm-40gb"),
    "h20": ("h20",),
    "rtx-pro-6000": ("rtx-pro-6000", "rtx-pro-6000-server"),
}
GENERIC_RAMP = "ramp_us (generic)"  # the pseudo-constant a GPU without a ramp fit uses: derived from every ramp fit
# The range input each fitted constant sets (the prefix before the first dot, or the whole name).
FIELD = {
    "memory_efficiency": "memory_efficiency",
    "ramp_us": "ramp_us",
    "host": "host_ms",
    "host_tp": "host_ms",
    "kv_efficiency": "kv_efficiency",
    "moe": "moe_layer_us",
    "weight_kernel": "quant_kernel_factor",
}


def field_of(constant: str) -> str:
    if constant == GENERIC_RAMP:
        return "ramp_us"
    head, _, tail = constant.partition(".")
    return FIELD[tail] if tail in FIELD else FIELD[head]


def gpu_group(hw: dict) -> str | None:
    return next((g for g, names in GPU_GROUPS.items() if hw.get("profile") in names), None)


@functools.lru_cache(maxsize=1)
def table_rows() -> tuple[dict, ...]:
    doc = json.loads(resources.files("tpcomm.predict").joinpath("data", "validation.json").read_text())
    return tuple(doc["rows"])


def family_of(engine_spec: str | None) -> str:
    from tpcomm.predict.engine import resolve_engine

    return resolve_engine(engine_spec).family


def constants_in_use(hw: dict, eng, ri, known: set[str] | None = None) -> list[str]:
    """The fitted constants this prediction depends on (`known`: the names that exist as fitted constants, default
    every name some row of the table fits). A given value (--ramp-us, --host-ms, ...) uses no constant."""
    if known is None:
        known = {c for r in table_rows() for c in r.get("fits") or []}
    given = lambda f: getattr(ri, f, None) is not None and getattr(ri, f).source.startswith("given")  # noqa: E731
    from tpcomm.predict.kernels import ENGINE_RAMP_US, engine_ramp_constant

    uses = ["kv_efficiency"]
    g = gpu_group(hw)
    family = getattr(eng, "family", None)
    own_ramp = engine_ramp_constant(family, g) if (family, g) in ENGINE_RAMP_US else None
    if g:
        uses += [f"{g}.{key}" for key in ("memory_efficiency", "ramp_us") if f"{g}.{key}" in known]
        if own_ramp in known:  # the engine's own ramp on this GPU stands in for the GPU's (ranges.engine_ramp)
            uses = [own_ramp if c == f"{g}.ramp_us" else c for c in uses]
    elif "ramp_us" not in hw:  # no fit for this GPU: the generic ramp, derived from every fitted ramp
        uses.append(GENERIC_RAMP)
    if eng is not None:
        from tpcomm.predict.engine import HOST_TP

        if eng.runner in ("vllm-v0", "sglang-overlap", "tgi-1.0"):
            uses.append(f"host.{eng.runner}")
        if eng.runner in HOST_TP:
            uses.append("host_tp.tgi-1.0" if eng.runner == "tgi-1.0" else "host_tp.vllm")
    if getattr(ri, "moe_layer_us", None) is not None and f"moe.{ri.moe_backend}" in known:
        uses.append(f"moe.{ri.moe_backend}")
    if getattr(ri, "quant_kernel_factor", None) is not None:
        uses.append("weight_kernel.awq-gemm")
    return [c for c in uses if not given(field_of(c))]


@dataclass(frozen=True)
class Coverage:
    """The rows that informed the constants a prediction uses, and whether any ran its engine."""

    engine: str  # the engine predicted for (its name as given)
    family: str
    version: str | None
    informed_by: dict[str, list[str]]  # constant -> ids of the available rows that fit it
    row_engines: dict[str, str]  # row id -> the engine that row ran
    widened: dict | None = field(default=None)

    @property
    def rows(self) -> list[str]:
        return sorted({r for ids in self.informed_by.values() for r in ids})

    @property
    def engines(self) -> list[str]:
        return sorted({self.row_engines[r] for r in self.rows})

    @property
    def covered(self) -> bool:
        return any(family_of(e) == self.family for e in self.engines)

    @property
    def version_measured(self) -> bool:
        from tpcomm.predict.engine import resolve_engine

        return any(
            (x := resolve_engine(e)).family == self.family and self.version is not None and x.version == self.version
            for e in self.engines
        )

    def statement(self) -> str:
        eng = ", ".join(self.engines) or "none"
        if self.covered:
            return (
                f"engine {self.engine}: covered: rows that informed the fitted constants in use ran {eng} "
                f"({len(self.rows)} rows)"
            )
        s = (
            f"engine {self.engine}: NOT COVERED: no row that informed the fitted constants in use ran {self.family} "
            f"(they ran {eng}; {len(self.rows)} rows)"
        )
        w = self.widened
        if w is None:
            return s + "; nothing to widen (no fitted per-kernel cost in use)"
        sp = w["spread_of_fitted_ramps_us"]
        if not w["changed"]:
            return s + (
                f"; the GEMM ramp in use ({_lh(w['to'])} us) already spans the fitted ramps ({_lh(sp)} us): not widened"
            )
        s += f"; GEMM ramp widened {_lh(w['from'])} -> {_lh(w['to'])} us to span the fitted ramps ({_lh(sp)} us)"
        if w.get("tok_per_s_from") and w.get("tok_per_s_to"):
            s += f": single stream {_lh(w['tok_per_s_from'], '.1f')} -> {_lh(w['tok_per_s_to'], '.1f')} tok/s"
        return s

    def as_dict(self) -> dict:
        return {
            "engine": self.engine,
            "engine_family": self.family,
            "covered": self.covered,
            "engine_version_measured": self.version_measured,
            "engines_of_informing_rows": self.engines,
            "informed_by": self.informed_by,
            "rows": self.rows,
            "widened": self.widened,
            "statement": self.statement(),
        }


def _lh(r: dict, f: str = "g") -> str:
    return f"{r['low']:{f}}-{r['high']:{f}}"


def coverage(eng, uses: list[str], rows=None) -> Coverage:
    """The rows among `rows` (default: the whole table) that fit each constant in `uses`; a GPU without a ramp fit
    (GENERIC_RAMP) is informed by every row that fits a ramp."""
    rows = table_rows() if rows is None else rows
    informed = {}
    for c in uses:
        if c == GENERIC_RAMP:
            ids = [r["id"] for r in rows if any(f.endswith(".ramp_us") for f in r.get("fits") or [])]
        else:
            ids = [r["id"] for r in rows if c in (r.get("fits") or [])]
        informed[c] = ids
    row_engines = {r["id"]: r.get("engine") or "vllm" for r in rows}
    return Coverage(eng.name, eng.family, eng.version, informed, row_engines)


@dataclass(frozen=True)
class RampFit:
    """A (GPU, engine) pair whose GEMM ramp a row fits: the measured per-kernel costs the widening spans."""

    gpu: str  # a GPU_GROUPS key
    engines: tuple[str, ...]  # the engines of the rows that fit it
    central_us: float

    def label(self) -> str:
        return f"{self.central_us:.3g} us ({self.gpu} + {', '.join(self.engines)})"


@functools.lru_cache(maxsize=1)
def _shipped_ramp_fits() -> tuple[RampFit, ...]:
    return tuple(ramp_fits(table_rows(), None))


def ramp_fits(rows=None, centrals: dict[str, float] | None = None) -> list[RampFit]:
    """The fitted ramps among `rows` (default: the whole table): per GPU group with a row that fits its ramp, and
    per engine with its own ramp on a GPU (kernels.ENGINE_RAMP_US) with a row that fits it, the central value
    (`centrals`, a leave-one-source-out fold's refit, keyed by GPU group or by the engine ramp's constant name;
    default the shipped profile's or table's)."""
    if rows is None and centrals is None:
        return list(_shipped_ramp_fits())
    from tpcomm.predict.hardware import load_profile

    rows = table_rows() if rows is None else rows
    out = []
    for g, names in GPU_GROUPS.items():
        fitting = [r for r in rows if f"{g}.ramp_us" in (r.get("fits") or [])]
        if not fitting or (centrals is not None and g not in centrals):
            continue
        c = load_profile(names[0])["ramp_us"] if centrals is None else centrals[g]
        out.append(RampFit(g, tuple(sorted({r.get("engine") or "vllm" for r in fitting})), c))
    from tpcomm.predict.kernels import ENGINE_RAMP_US, engine_ramp_constant

    for (family, g), shipped in ENGINE_RAMP_US.items():
        name = engine_ramp_constant(family, g)
        fitting = [r for r in rows if name in (r.get("fits") or [])]
        if not fitting or (centrals is not None and name not in centrals):
            continue
        c = shipped[1] if centrals is None else centrals[name]
        out.append(RampFit(g, tuple(sorted({r.get("engine") or "vllm" for r in fitting})), c))
    return out


def widen_uncovered(ri, cov: Coverage, fits: list[RampFit]) -> tuple[object, Coverage]:
    """The range inputs for an engine no informing row ran: the GEMM ramp's range becomes the hull of its own and
    [lowest, highest] of the fitted ramps' central values (`fits`: the (GPU, engine) pairs with a fit among the rows
    the constants came from), its central kept; see the module docstring for why. A covered engine, a ramp the user
    gave, or no ramp fit at all: returned unchanged."""
    if cov.covered:
        return ri, cov
    r = ri.ramp_us
    if r.source.startswith("given") or not fits or not any(field_of(c) == "ramp_us" for c in cov.informed_by):
        return ri, replace(cov, widened=None)
    cheap, dear = min(fits, key=lambda f: f.central_us), max(fits, key=lambda f: f.central_us)
    lo, hi = min(r.low, cheap.central_us), max(r.high, dear.central_us)
    w = {
        "input": "ramp_us",
        "changed": (lo, hi) != (r.low, r.high),
        "from": {"low": r.low, "central": r.central, "high": r.high},
        "to": {"low": lo, "central": r.central, "high": hi},
        "spread_of_fitted_ramps_us": {"low": cheap.central_us, "high": dear.central_us},
        "fitted_ramps": [{"gpu": f.gpu, "engines": list(f.engines), "central_us": f.central_us} for f in fits],
        "rule": (
            "hull of the GPU's own GEMM ramp range and the spread of the fitted ramps of every (GPU, engine) pair "
            f"with a fit, {cheap.label()} to {dear.label()}; central kept: the fitted ramp carries the per-kernel "
            "cost of the engine it was fitted with, and no row that informed the constants in use ran this engine "
            "(tpcomm/predict/coverage.py)"
        ),
    }
    if not w["changed"]:
        return ri, replace(cov, widened=w)
    from tpcomm.predict.ranges import Input

    why = (
        f"widened for engine {cov.engine}, which no informing row ran, to span the fitted ramps "
        f"({cheap.label()} to {dear.label()}): {_lh(w['from'])} -> {lo:g}-{hi:g} us"
    )
    return replace(ri, ramp_us=Input(lo, r.central, hi, f"{r.source}; {why}")), replace(cov, widened=w)
