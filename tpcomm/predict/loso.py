"""Leave-one-source-out validation: every row of a source (a page, an issue, a vendor table) is held out
together while the fitted constants are refitted on the rows of the other sources, then that source's rows are
predicted with those constants. So no row is predicted by a constant its own source informed.

The fitted constants (CONSTANTS) are the ones validation.json's rows set (each fitted row lists them in `fits`):
a GPU's memory efficiency and GEMM ramp (A100, H20), an engine's own GEMM ramp on a GPU (gpt-fast on A100,
kernels.ENGINE_RAMP_US; held out, it falls back to the fold's ramp of that GPU), the host time of vLLM V0, of SGLang's overlap scheduler and of
TGI 1.0 (with its own growth with TP; held out, TGI falls back to its stated assumption, vLLM V0's growth),
the KV efficiency, three MoE backends' fixed cost per layer and the AWQ-GEMM slowdown; the generic GEMM ramp of
GPUs without a fit is derived from the fitted ramps (kernels.RAMP_US: central = their geometric mean, high = the
highest). The refit: coordinate descent, each constant by golden section on the sum of squared log errors of the
central prediction over the rows that list it, the others held at their current values. A refitted constant
keeps the shipped range's relative width around its new central value; one whose every fitting row is held out
falls back to the assumption used where no fit exists (UNFITTED), and the range says so. A held-out row whose
engine none of the rows left (that inform the constants it uses) ran gets its GEMM ramp widened by
coverage.widen_uncovered, the rule the shipped prediction uses, on the fold's own fitted ramps.

Units: tok/s, percent; constants in their own units (fraction, us, ms).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tpcomm.plan.layout import Layout
from tpcomm.predict import engine_on, load_inputs
from tpcomm.predict.coverage import (
    GENERIC_RAMP,
    GPU_GROUPS,
    constants_in_use,
    coverage,
    gpu_group,
    ramp_fits,
    widen_uncovered,
)
from tpcomm.predict.engine import HOST, HOST_TP
from tpcomm.predict.hardware import load_profile
from tpcomm.predict.kernels import (
    ENGINE_RAMP_US,
    KV_EFFICIENCY,
    MOE_LAYER_US,
    RAMP_US,
    WEIGHT_KERNEL,
    engine_ramp_constant,
)
from tpcomm.predict.latency_range import make_range
from tpcomm.predict.model import Knobs, step_time
from tpcomm.predict.ranges import MEMORY_EFFICIENCY_RANGE, Input, central_knobs, evaluate, range_inputs, span
from tpcomm.predict.validation import Result, load_rows, model_of

ROUNDS = 3  # coordinate-descent passes (the joint A100 fit settles in two)
GOLDEN_STEPS = 28


@dataclass(frozen=True)
class Constant:
    name: str
    field: str  # the RangeInputs field it sets
    bounds: tuple[float, float]  # search interval of the refit
    shipped: tuple[float, float, float]  # low, central, high as shipped (the fit on every source)
    # "fit": refitted on its rows; "bound": its rows only bound it (kept as shipped while one is left)
    kind: str = "fit"


def _profile_range(gpu: str, key: str) -> tuple[float, float, float]:
    p = load_profile(GPU_GROUPS[gpu][0])
    lo, hi = p[f"{key}_range"]
    return (lo, p[key], hi)


def constants() -> dict[str, Constant]:
    out = {}
    for g in GPU_GROUPS:
        if "memory_efficiency_range" in load_profile(GPU_GROUPS[g][0]):
            out[f"{g}.memory_efficiency"] = Constant(
                f"{g}.memory_efficiency", "memory_efficiency", (0.15, 0.97), _profile_range(g, "memory_efficiency")
            )
        out[f"{g}.ramp_us"] = Constant(f"{g}.ramp_us", "ramp_us", (0.0, 60.0), _profile_range(g, "ramp_us"))
    for (family, g), v in ENGINE_RAMP_US.items():  # an engine's own ramp on a GPU (ranges.engine_ramp)
        name = engine_ramp_constant(family, g)
        out[name] = Constant(name, "ramp_us", (0.0, 60.0), v[:3])
    for runner in ("vllm-v0", "sglang-overlap", "tgi-1.0"):
        out[f"host.{runner}"] = Constant(f"host.{runner}", "host_ms", (0.0, 6.0), HOST[runner][:3])
    # One TP-1 row bounds SGLang's host time from above (host + GPU <= 2.4 ms); it does not fit a value.
    out["host.sglang-overlap"] = replace(out["host.sglang-overlap"], kind="bound")
    out["host_tp.vllm"] = Constant("host_tp.vllm", "host_tp", (0.0, 6.0), HOST_TP["vllm-v0"][:3])
    out["host_tp.tgi-1.0"] = Constant("host_tp.tgi-1.0", "host_tp", (0.0, 6.0), HOST_TP["tgi-1.0"][:3])
    out["kv_efficiency"] = Constant("kv_efficiency", "kv_efficiency", (0.05, 1.0), KV_EFFICIENCY[:3])
    for b in ("nvfp4-sm12", "mxfp4-sm8", "sglang-gptq-moe", "mla-fp8-sglang-early"):
        out[f"moe.{b}"] = Constant(f"moe.{b}", "moe_layer_us", (0.0, 2000.0), MOE_LAYER_US[b][:3])
    out["weight_kernel.awq-gemm"] = Constant(
        "weight_kernel.awq-gemm", "quant_kernel_factor", (0.05, 1.0), WEIGHT_KERNEL["awq-gemm"][:3]
    )
    return out


def unfitted(name: str) -> Input:
    """The input where no fitting row is left: the assumption tpcomm uses for a GPU or backend without a fit."""
    why = "no row of the other sources fits it"
    if name.endswith(".memory_efficiency"):
        lo, c, hi = MEMORY_EFFICIENCY_RANGE
        return Input(lo, c, hi, f"unfitted ({why}): the generic memory efficiency")
    if name.endswith(".ramp_us"):
        return Input(*RAMP_US[:3], f"unfitted ({why}): the generic GEMM ramp")
    if name.startswith("ramp_us."):  # with_values puts the fold's ramp of the GPU in its place
        return Input(*RAMP_US[:3], f"unfitted ({why}): the GPU's GEMM ramp, fitted on other engines' rows")
    if name == "host.vllm-v0":
        return Input(*HOST["vllm-v1"][:3], f"unfitted ({why}): vLLM V1 without async scheduling's range")
    if name == "host.sglang-overlap":
        return Input(*HOST["vllm-v1-async"][:3], f"unfitted ({why}): as vLLM's async scheduling")
    if name == "host_tp.vllm":
        return Input(0.0, 0.0, 0.0, f"unfitted ({why}): no host cost growing with TP")
    if name == "host.tgi-1.0":
        return Input(*HOST["tgi"][:3], f"unfitted ({why}): TGI's assumed range (engine.HOST['tgi'])")
    if name == "host_tp.tgi-1.0":  # fit() replaces it with the fold's vLLM V0 growth, as engine.HOST_TP['tgi'] assumes
        return Input(*HOST_TP["tgi"][:3], f"unfitted ({why}): as vLLM V0's growth with TP")
    if name == "kv_efficiency":
        lo, c, hi = MEMORY_EFFICIENCY_RANGE
        return Input(lo, c, hi, f"unfitted ({why}): each row's weight memory efficiency")
    if name.startswith("moe."):
        return Input(*MOE_LAYER_US["default"][:3], f"unfitted ({why}): the default MoE backend's cost")
    return Input(1.0, 1.0, 1.0, f"unfitted ({why}): quantized GEMMs stream like the rest")


@dataclass
class Prepared:
    row: dict
    plan: object
    hw: dict
    ri: object
    k: Knobs
    uses: tuple[str, ...]  # the constants this row's prediction depends on
    generic_ramp: bool  # the row's GPU has no ramp fit: the generic ramp (derived from the fitted ones)
    eng: object = None


def prepare(row: dict, qconfigs: dict) -> Prepared:
    k = Knobs(context=row["context"])
    hw, plan, eng = load_inputs(
        model_of(row, qconfigs), Layout(tp=row["tp"]), row["gpu"], None, [row["batch"]], row["engine"], k, None
    )
    eng = engine_on(eng, hw)
    main = max(plan.for_batch(1), key=lambda c: c.count, default=None)
    lat = make_range(
        hw, None, None, n=main.group_size if main else row["tp"], nbytes=main.bytes if main else 0, engine=eng
    )
    ri = range_inputs(hw, k, lat, eng, plan.model, row["tp"])
    uses = constants_in_use(hw, eng, ri, set(CONSTS))
    gpu = gpu_group(hw)
    return Prepared(row, plan, hw, ri, k, tuple(uses), gpu is None and "ramp_us" not in hw, eng)


def source_of(row: dict, by: str = "source") -> str:
    """The group a row is held out with: its source page (a commit pinned in the URL is part of the page: the
    Qwen speed-benchmark page was rewritten for each model generation) or, stricter, its publisher (the part of
    `publisher` before the first comma or parenthesis: the Qwen team's three speed-benchmark pages go together)."""
    if by == "publisher":
        return re.split(r"[(,]", row["publisher"])[0].strip()
    return row.get("source_group") or row["source"]


def with_values(p: Prepared, values: dict[str, Input], ramp_generic: Input):
    ri = p.ri
    changes = {}
    for name in p.uses:
        if name in values and CONSTS[name].field != "host_tp":
            changes[CONSTS[name].field] = values[name]
    tp_name = next((n for n in p.uses if n.startswith("host_tp.")), None)
    if tp_name:  # the host term at this TP: base + log2(TP) x the per-doubling cost
        base = changes.get("host_ms") or Input(*p.eng.host_ms, p.eng.host_source)
        t, f = values[tp_name], math.log2(p.row["tp"])
        changes["host_ms"] = Input(
            base.low + f * t.low, base.central + f * t.central, base.high + f * t.high, base.source
        )
    own = _own_ramp(p.uses)
    if own and values[own].source.startswith("unfitted"):  # no row of this engine left: the GPU's ramp of this fold
        changes["ramp_us"] = values[_gpu_ramp(own)]
    unfit = lambda f: f in changes and changes[f].source.startswith("unfitted")  # noqa: E731
    if p.generic_ramp or unfit("ramp_us"):
        changes["ramp_us"] = ramp_generic  # an unfitted GPU takes the generic ramp of this fold's fits
    if unfit("kv_efficiency"):
        m = changes.get("memory_efficiency", ri.memory_efficiency)
        changes["kv_efficiency"] = Input(m.low, m.central, m.high, changes["kv_efficiency"].source)
    return replace(ri, **changes)


def _central_tok(p: Prepared, ri) -> float:
    return step_time(p.plan, p.row["batch"], p.hw, ri.latency.central, central_knobs(ri, p.k), eager=ri.eager)[
        "tok_per_s"
    ]


def _golden(f, lo: float, hi: float) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(GOLDEN_STEPS):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def scaled(const: Constant, v: float, source: str) -> Input:
    lo, c, hi = const.shipped
    hi2 = hi * v / c
    if const.field in ("memory_efficiency", "kv_efficiency", "quant_kernel_factor"):
        hi2 = min(hi2, 1.0)
    return Input(lo * v / c, v, hi2, source)


def derived_ramp(values: dict[str, Input]) -> Input:
    """kernels.RAMP_US's rule on the fold's fitted ramps: central their geometric mean, high the highest."""
    fitted = [values[f"{g}.ramp_us"] for g in GPU_GROUPS]
    fitted = [x for x in fitted if not x.source.startswith("unfitted")]
    if not fitted:
        return Input(*RAMP_US[:3], "the generic GEMM ramp as shipped (no fitted ramp left)")
    c = math.exp(sum(math.log(max(x.central, 1e-3)) for x in fitted) / len(fitted))
    return Input(RAMP_US[0], c, max(x.high for x in fitted), "the generic GEMM ramp from this fold's fitted ramps")


def fit(prepared: list[Prepared], label: str = "") -> dict[str, Input]:
    """The constants refitted on `prepared` (the rows of the sources not held out)."""
    fitters = {name: [p for p in prepared if name in p.row.get("fits", [])] for name in CONSTS}
    values = {name: Input(*c.shipped, "shipped") if fitters[name] else unfitted(name) for name, c in CONSTS.items()}
    by_id = {p.row["id"]: p for p in prepared}
    for _ in range(ROUNDS):
        for name, c in CONSTS.items():
            rows = fitters[name]
            if not rows or c.kind == "bound":
                continue

            def loss(v, name=name, rows=rows):
                trial = {**values, name: Input(v, v, v, "trial")}
                return sum(_log_error(p, trial, by_id) ** 2 for p in rows)

            v = _golden(loss, *c.bounds)
            values[name] = scaled(c, v, f"refitted on {len(rows)} rows{label}")
    t = values["host_tp.tgi-1.0"]
    if t.source.startswith("unfitted"):  # TGI's assumption (engine.HOST_TP['tgi']): as vLLM V0's, this fold's value
        v = values["host_tp.vllm"]
        values["host_tp.tgi-1.0"] = Input(v.low, v.central, v.high, f"{t.source}, here {v.source}")
    return values


def _log_error(p: Prepared, values: dict[str, Input], by_id: dict[str, Prepared]) -> float:
    """log(predicted / measured); for a row fitted relative to another (`fits_relative_to`: a checkpoint beside its
    reference, the difference being what it fits), the log error of the ratio of the two."""
    ramp = derived_ramp(values)
    err = math.log(_central_tok(p, with_values(p, values, ramp)) / p.row["measured_tok_per_s"])
    ref = p.row.get("fits_relative_to")
    if ref and ref in by_id:
        q = by_id[ref]
        err -= math.log(_central_tok(q, with_values(q, values, ramp)) / q.row["measured_tok_per_s"])
    return err


def predict_row(p: Prepared, values: dict[str, Input], rows: list[dict] | None = None) -> Result:
    """One row predicted with `values`; `rows`: the rows these constants were fitted on (the rows left once its
    source is held out; None: every row). An engine none of the rows informing the constants in use ran gets its
    GEMM ramp widened by coverage.widen_uncovered, the same rule as the shipped prediction, on this fold's fits (the
    spread of the ramps refitted on these rows)."""
    ramp = derived_ramp(values)
    ri = with_values(p, values, ramp)
    uses = [_gpu_ramp(n) if n == _own_ramp(p.uses) and values[n].source.startswith("unfitted") else n for n in p.uses]
    uses = [GENERIC_RAMP if _unfitted_ramp(n, values) else n for n in uses]
    cov = coverage(p.eng, uses, rows)
    fitted = {g: values[f"{g}.ramp_us"].central for g in GPU_GROUPS if not _unfitted_ramp(f"{g}.ramp_us", values)}
    fitted |= {  # an engine's own ramp on a GPU, where a row of the fold fits it: one more (GPU, engine) pair
        n: v.central for n, v in values.items() if n.startswith("ramp_us.") and not v.source.startswith("unfitted")
    }
    ri, cov = widen_uncovered(ri, cov, ramp_fits(load_rows()[0] if rows is None else rows, fitted))
    central, cs = evaluate(p.plan, p.row["batch"], p.hw, ri, p.k)
    r = span(central["tok_per_s"], [c["tok_per_s"] for c in cs])
    return Result(p.row, r["central"], r["low"], r["high"], coverage=cov.as_dict())


def _own_ramp(uses) -> str | None:
    """The engine's own GEMM ramp on the row's GPU among the constants in use (kernels.ENGINE_RAMP_US)."""
    return next((n for n in uses if n.startswith("ramp_us.")), None)


def _gpu_ramp(own: str) -> str:
    """The GPU's ramp an engine's own ramp stands in for: ramp_us.<engine>.<gpu> -> <gpu>.ramp_us."""
    return f"{own.rsplit('.', 1)[1]}.ramp_us"


def _unfitted_ramp(name: str, values: dict[str, Input]) -> bool:
    """A GPU ramp with no fitting row left in this fold: its rows take the fold's generic ramp (derived from every
    ramp still fitted), so those are the rows that inform it."""
    return name.endswith(".ramp_us") and name in values and values[name].source.startswith("unfitted")


@dataclass
class Fold:
    source: str
    rows: list[Result]
    informed: list[str]  # the constants its rows fit (with all sources)
    values: dict[str, Input]  # the constants without it
    rest: list[dict]  # the rows the constants without it were fitted on


def run(by: str = "source") -> tuple[list[Fold], dict[str, Input]]:
    """Every source held out in turn; and the fit on every source (the in-sample constants of this procedure)."""
    rows, qconfigs = load_rows()
    prepared = [prepare(r, qconfigs) for r in rows]
    full = fit(prepared, " (every source)")
    folds = []
    groups: dict[str, list[Prepared]] = {}
    for p in prepared:
        groups.setdefault(source_of(p.row, by), []).append(p)
    for src, members in groups.items():
        informed = sorted({f for p in members for f in p.row.get("fits", [])})
        rest = [p for p in prepared if source_of(p.row, by) != src]
        values = fit(rest, f" (without {short(src)})") if informed else full
        rest_rows = [p.row for p in rest]
        folds.append(Fold(src, [predict_row(p, values, rest_rows) for p in members], informed, values, rest_rows))
    return folds, full


def in_sample(values: dict[str, Input]) -> list[Result]:
    """Every row predicted with one set of constants (the fit on every source: this procedure's in-sample)."""
    rows, qconfigs = load_rows()
    return [predict_row(prepare(r, qconfigs), values, rows) for r in rows]


def report(by: str = "source") -> dict:
    """LOSO beside in-sample: per source its rows' results and the constants its rows informed (their value with
    every source and without this one); summaries over every row and over TP >= 2 rows."""
    from tpcomm.predict.validation import run as shipped_run
    from tpcomm.predict.validation import summary

    folds, full = run(by)
    loso_rows = [r for f in folds for r in f.rows]
    refit_rows = in_sample(full)
    shipped_rows = shipped_run()
    tp2 = lambda rs: [r for r in rs if r.row["tp"] >= 2]  # noqa: E731
    return {
        "grouping": by,
        "sources": [
            {
                "source": f.source,
                "rows": [r.as_dict() for r in f.rows],
                "informed": {
                    n: {"with_every_source": full[n].as_dict(), "without_this_source": _shown(n, f.values)}
                    for n in f.informed
                },
            }
            for f in folds
        ],
        "constants_every_source": {n: v.as_dict() for n, v in full.items()},
        "summary": {
            name: {"all_rows": summary(rs), "tp_2_and_more": summary(tp2(rs))}
            for name, rs in (
                ("leave_one_source_out", loso_rows),
                ("in_sample_refit", refit_rows),
                ("in_sample_shipped", shipped_rows),
            )
        },
    }


def _shown(name: str, values: dict[str, Input]) -> dict:
    """A constant as the fold's rows use it (an unfitted GPU ramp is the fold's generic ramp)."""
    v = values[name]
    if name.startswith("ramp_us.") and v.source.startswith("unfitted"):  # the fold's GPU ramp, as with_values uses
        g = _shown(_gpu_ramp(name), values)
        return {**g, "source": f"{v.source}: {g['source']}"}
    if name.endswith(".ramp_us") and v.source.startswith("unfitted"):
        g = derived_ramp(values)
        v = Input(g.low, g.central, g.high, f"{v.source}, from this fold's fitted ramps")
    return v.as_dict()


def short(src: str) -> str:
    m = re.match(r"https://github.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", src)
    if m:
        return f"{m.group(1)}#{m.group(2)}"
    m = re.match(r"https://github.com/([^/]+/[^/]+)/blob/([0-9a-f]{7})[0-9a-f]*/(.*)", src)
    if m:
        return f"{m.group(1)}@{m.group(2)}:{m.group(3).rsplit('/', 1)[-1]}"
    return src


CONSTS = constants()
