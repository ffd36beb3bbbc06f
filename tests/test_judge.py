"""One module per judgement (tpcomm/judge/): inputs on both sides of each threshold, and the same verdict
from attribute's summary, the terminal, the report and predict for the same numbers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tpcomm.judge import bottleneck, definitions
from tpcomm.judge import levers as L
from tpcomm.rundir.documents import what_if
from tpcomm.rundir.results import Terms

COMMANDS = {"probe": "tpcomm probe ...", "attribute": "tpcomm attribute ..."}


@pytest.mark.parametrize("transfer,expect", [(49.0, False), (50.0, True), (51.0, True)])
def test_bottleneck_at_half_the_token_in_transfer(transfer, expect):
    t = Terms(compute=100.0 - transfer - 5.0, transfer=transfer, wait=0.0, host_gap=5.0)
    v = bottleneck.measured(t)
    assert v.interconnect_is_bottleneck is expect and v.decided
    assert v.statement.startswith("The interconnect is the bottleneck" if expect else "The interconnect is a major")


def test_major_part_from_a_quarter_and_wait_is_not_the_link():
    low = bottleneck.measured(Terms(compute=70.0, transfer=24.0, wait=1.0, host_gap=5.0))
    high = bottleneck.measured(Terms(compute=69.0, transfer=26.0, wait=0.0, host_gap=5.0))
    assert "not the bottleneck" in low.statement and "major" not in low.statement
    assert "a major part" in high.statement
    # Collective time 60% of the token, but most of it rank skew: not the link's bottleneck, and said so.
    skew = bottleneck.measured(Terms(compute=35.0, transfer=10.0, wait=50.0, host_gap=5.0))
    assert skew.interconnect_is_bottleneck is False and skew.wait_exceeds_transfer
    assert skew.collective_share == pytest.approx(0.6) and "faster link would not remove it" in skew.statement


def test_a_model_verdict_is_stated_only_where_every_corner_agrees():
    agree = bottleneck.over_range(
        {"weights": 40.0, "collectives": 60.0}, [{"weights": 30.0, "collectives": 70.0}], COMMANDS, True
    )
    assert agree["decided"] and agree["interconnect_is_bottleneck"] is True
    split = bottleneck.over_range(
        {"weights": 50.0, "collectives": 50.0},
        [{"weights": 55.0, "collectives": 45.0}, {"weights": 45.0, "collectives": 55.0}],
        COMMANDS,
        True,
    )
    assert (
        not split["decided"] and split["interconnect_is_bottleneck"] is None and split["decides"] == COMMANDS["probe"]
    )
    assert "cannot decide" in split["statement"] and "45-55%" in split["statement"]


def test_attribute_terminal_report_and_predict_give_one_verdict_for_the_same_numbers():
    """The same milliseconds (no rank skew) through the measured path and through predict's ranges."""
    from tpcomm.attribute.show import render
    from tpcomm.predict import ranges

    for transfer in (3.0, 7.0):  # a 10 ms token: 30% and 70% transfer
        t = Terms(compute=10.0 - transfer - 1.0, transfer=transfer, wait=0.0, host_gap=1.0)
        measured = bottleneck.measured(t)
        model = ranges.classify({"compute": t.compute, "collectives": t.transfer, "host": t.host_gap})
        assert measured.interconnect_is_bottleneck == model["bottleneck"] == (transfer > 5)
        # The terminal prints attribute's verdict as written into the summary.
        res = {"levels": [], "attribution": _summary(t, measured), "notes": [], "complete": True, "run_dir": "x"}
        buf = io.StringIO()
        render(res, Console(file=buf, width=400))
        assert measured.statement in " ".join(buf.getvalue().split())


def _summary(t: Terms, v) -> dict:
    from tpcomm.rundir.results import Attribution, LevelSplit, to_json

    lv = LevelSplit(
        1,
        0,
        True,
        None,
        None,
        "hook",
        "host",
        t.total,
        t,
        None,
        [],
        100,
        1.0,
        1.0,
        {},
        {},
        None,
        None,
        None,
        None,
        [],
        {},
    )
    return to_json(
        Attribution(
            source="hook",
            plugin=True,
            plugin_note=None,
            method="",
            conditions={},
            plan_config={},
            windows=[],
            notes=[],
            levels=[lv],
            verdict=v,
            headline={"concurrency": 1, "repeat": 0},
        )
    )


PCIE_TP8 = L.Machine(platform="cuda", link="pcie", p2p=True, tp=8, gpus=8)


def _w(name, delta, low=None, **kw):
    """A what-if as predict.json holds it, read through its dataclass."""
    return what_if(
        {
            "name": name,
            "tok_per_s": 100.0 * (1 + delta / 100),
            "delta_pct": delta,
            "delta_pct_range": {"low": delta if low is None else low, "high": delta},
            **kw,
        }
    )


def test_a_one_shot_all_reduce_is_offered_only_where_the_machine_allows_it():
    w = [_w("one-shot-allreduce", 20.0)]
    got, _ = L.levers(w, PCIE_TP8, "b")
    assert "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1" in got[0].setting
    for m, why in (
        (L.Machine(platform="cuda", link="pcie", p2p=False, tp=8), "P2P"),
        (L.Machine(platform="cuda", link="nvlink", p2p=True, tp=8), "already its default"),
        (L.Machine(platform="cpu", link="shm", tp=2), "CPU"),
        (
            L.Machine(
                platform="cuda", link="pcie", p2p=True, tp=2, allreduce_paths=[{"path": "custom-ar", "eligible": True}]
            ),
            "already in use",
        ),
        # What the run measured, without topo: the hook's tag, or a trace's kernel family (backends registry).
        (L.Machine(platform="cuda", link="pcie", p2p=True, tp=2, measured_allreduce=["custom_ar"]), "custom-ar"),
        (L.Machine(platform="cuda", link="pcie", p2p=True, tp=4, measured_allreduce=["nccl_symm"]), "nccl-symm-mem"),
    ):
        got, skipped = L.levers(w, m, "b")
        assert got == [] and why in skipped[0]["why"], (m, skipped)
    # Topo's opt-in lever string, when topo knows the path.
    m = L.Machine(
        platform="cuda",
        link="pcie",
        p2p=True,
        tp=4,
        allreduce_paths=[{"path": "flashinfer-pcie-ipc", "eligible": False, "lever": "SET_ME=1"}],
    )
    assert L.levers(w, m, "b")[0][0].setting == "SET_ME=1"
    # A run whose all-reduces went through NCCL (hook: pynccl; trace: nccl) still gets the one-shot lever.
    for ran in ("pynccl", "nccl"):
        assert L.levers(w, L.Machine(platform="cuda", link="pcie", p2p=True, tp=4, measured_allreduce=[ran]), "b")[0]


def test_another_link_is_a_what_if_not_a_lever_whether_or_not_predict_says_so():
    """predict --attribution writes the nvlink what-if without `lever` (calibrate.py); predict alone with
    lever false. Either way it is not offered as a setting (it once crashed the levers on a typed what-if)."""
    for said in ({}, {"lever": False, "lever_note": "no NVLink on this card"}):
        got, skipped = L.levers([_w("nvlink", 30.0, **said), _w("p2p-disabled", 5.0, **said)], PCIE_TP8, "b")
        assert got == [] and [s["name"] for s in skipped] == ["nvlink", "p2p-disabled"], skipped
        assert all(("not a setting" in s["why"]) == (not said) for s in skipped), skipped


def test_tp_levers_need_memory_and_gpus_and_a_gain_everywhere():
    got, skipped = L.levers(
        [_w("tp4", 10.0, fits_memory=False), _w("tp16", 10.0), _w("tp2", 15.0, low=-2.0), _w("tp8", 5.0)],
        L.Machine(platform="cuda", link="pcie", p2p=True, tp=4, gpus=8),
        "b",
    )
    assert [x.name for x in got] == ["tp8"] and got[0].setting == "--tensor-parallel-size 8"
    whys = {s["name"]: s["why"] for s in skipped}
    assert "does not fit" in whys["tp4"] and "8 visible" in whys["tp16"] and "no gain" in whys["tp2"]


def test_collectives_free_is_a_bound_not_a_lever_and_the_measured_bounds_come_from_the_split():
    t = {"compute": 6.0, "transfer": 1.0, "wait": 2.0, "host_gap": 1.0}
    w = [what_if(x) for x in L.measured_whatifs(t)]
    by = {x.name: x for x in w}
    assert by["no-interconnect-cost"].ms_per_token == 7.0 and by["no-rank-skew"].ms_per_token == 8.0
    got, _ = L.levers(w, L.Machine(platform="cpu", link="shm", tp=2), "measured")
    kinds = {x.name: x.kind for x in got}
    assert kinds == {"no-rank-skew": "lever", "no-interconnect-cost": "bound"}
    assert "VLLM_CPU_OMP_THREADS_BIND" in next(x for x in got if x.name == "no-rank-skew").setting


def test_definitions_are_built_from_the_constants():
    from tpcomm.judge import tolerances as T

    assert f"within {T.CLOSURE_TOL_PCT:g}%" in definitions.TERM["closure"]
    assert f"{T.STALL_FACTOR:g} engine periods" in definitions.TERM["stall"]
    assert f"{bottleneck.BOTTLENECK_SHARE:.0%}" in definitions.TERM["bottleneck"]


def test_the_level_that_speaks_is_the_lowest_complete_concurrency_its_median_repeat():
    from tpcomm.judge.speaks import level_that_speaks

    def speaks(levels):
        return level_that_speaks(
            levels,
            concurrency=lambda x: x[0],
            figure=lambda x: x[1],
            incomplete=lambda x: x[2],
        )

    ok = None
    lv = [(2, 5.0, ok), (1, 9.0, ok), (1, 7.0, ok), (1, 8.0, ok), (1, 1.0, "a request failed"), (1, None, ok)]
    assert speaks(lv) == (1, 8.0, ok)  # the median of 7, 8, 9; the incomplete 1.0 and the unmeasured left out
    assert speaks([(1, 3.0, "other traffic"), (4, 2.0, ok), (4, 6.0, ok)]) == (4, 6.0, ok)  # upper of two
    assert speaks([(1, 3.0, "other traffic"), (2, None, ok)]) is None


def test_the_term_registry_is_the_terms_of_the_typed_split():
    """tpcomm/terms.py is the one list: the typed `Terms` has exactly its engine terms, in its order, and every
    output's definition, label and colour of a term comes from it."""
    import dataclasses

    from tpcomm import terms
    from tpcomm.compare.levels import LABELS
    from tpcomm.report.figures import COLORS

    assert tuple(f.name for f in dataclasses.fields(Terms)) == terms.ENGINE_TERMS
    for t in terms.ENGINE:
        assert definitions.TERM[t.name] == t.definition and t.definition.startswith(t.label)
        assert COLORS[t.name] == t.colour and LABELS[t.name] == t.long_label
