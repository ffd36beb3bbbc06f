"""The split's clock (tpcomm/analysis/split.py) on records with a known answer where the GPU runs one step
behind the host, as under vLLM's async scheduling: on the GPU step columns the split equals the answer; on
the host's enqueue spans the same records split wrong (so this test can tell the two apart)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tpcomm.analysis.align import align
from tpcomm.analysis.split import engine_split, rank_steps, top_sites
from tpcomm.analysis.synthetic import make_records

ENQUEUE_US = 250.0  # the worker's host span of a step: it only enqueues the step's GPU work


def async_records(steps: int = 400, **kw):
    """make_records' steps are the GPU's truth. The host enqueues step i while the GPU still runs step i-1:
    its span starts 100 us into the GPU's previous step and lasts ENQUEUE_US. The hook's step rows then carry
    the host span in t_start_ns/t_end_ns and the GPU span in gpu_start_ns/gpu_end_ns."""
    coll, gpu, truth = make_records(steps=steps, tp=2, calls=10, skew_us=60.0, step_gap_us=40.0, **kw)
    st = gpu.copy()
    g0 = st["t_start_ns"].to_numpy()
    prev = np.where(st["step"].to_numpy() > 0, np.roll(g0, 2), g0 - 2_000_000)  # 2 ranks per step, in order
    st["t_start_ns"] = prev + 100_000
    st["t_end_ns"] = st["t_start_ns"] + int(ENQUEUE_US * 1e3)
    st["duration_us"] = (st["t_end_ns"] - st["t_start_ns"]) / 1e3
    st["gpu_start_ns"] = gpu["t_start_ns"].astype(float)
    st["gpu_end_ns"] = gpu["t_end_ns"].astype(float)
    st["gpu_duration_us"] = gpu["duration_us"]
    st["untimed_collectives"] = 0
    return coll, st, truth


def _split(coll, st):
    return engine_split(rank_steps(align(coll), st).assign(concurrency=1, repeat=0))


def test_gpu_clock_split_equals_the_known_answer_and_the_host_clock_split_does_not():
    coll, st, truth = async_records()
    gpu = _split(coll, st)
    assert gpu["clock"] == "gpu" and gpu["steps_without_gpu_span"] == 0
    t = gpu["per_token_ms"]
    want = {
        "compute": truth["compute_us"] / 1e3,
        "transfer": truth["transfer_us"] / 1e3,
        "wait": truth["wait_us"] / 1e3,
        "host_gap": truth["gap_us"] / 1e3,
    }
    for k, v in want.items():
        assert t[k] == pytest.approx(v, rel=0.01), k
    assert gpu["engine_ms_per_token"] == pytest.approx(truth["period_us"] / 1e3, rel=0.01)
    assert sum(t.values()) == pytest.approx(gpu["engine_ms_per_token"], rel=1e-9)  # the four terms add up

    # The same records on the host clock (the GPU columns dropped: what the split did before): the period
    # still matches (the host keeps pace on average), but compute comes out negative and the forward pass
    # lands in the gap between steps.
    host = _split(coll, st.drop(columns=["gpu_start_ns", "gpu_end_ns", "gpu_duration_us"]))
    h = host["per_token_ms"]
    assert host["clock"] == "host"
    assert h["compute"] < 0 < want["compute"]
    assert h["host_gap"] > 3 * want["host_gap"] + 0.2
    assert abs(h["compute"] - want["compute"]) / want["compute"] > 0.5


def test_steps_without_a_gpu_span_leave_the_pairs_and_are_counted():
    coll, st, truth = async_records()
    lost = st["step"].isin([10, 11, 50])
    st.loc[lost, ["gpu_start_ns", "gpu_end_ns", "gpu_duration_us"]] = np.nan
    sp = _split(coll, st)
    assert sp["clock"] == "gpu" and sp["steps_without_gpu_span"] == 6  # 3 steps x 2 ranks
    # pairs touching steps 10, 11 or 50 are out (9-10, 10-11, 11-12, 49-50, 50-51): the split still holds
    assert sp["decode_pairs"] == 399 - 5
    assert sp["per_token_ms"]["transfer"] == pytest.approx(truth["transfer_us"] / 1e3, rel=0.02)


def test_untimed_collectives_are_not_read_as_zero_transfer():
    """Graph timing off at server start: the sampled steps carry untimed_collectives and no rows. The split
    must say transfer and wait were not measured, not attribute everything to compute."""
    coll, st, _ = async_records(steps=50)
    st["untimed_collectives"] = np.where(st["step"] % 8 == 0, 10, 0)
    sp = _split(coll.iloc[0:0], st)
    assert sp["per_token_ms"] is None and "untimed" in sp["note"] and "TPCOMM_GRAPH_TIMING=1" in sp["note"]
    # and where both exist, only pairs without untimed collectives carry the transfer
    sp = _split(coll.assign(timing="cuda-event-graph"), st)
    assert sp["sampled_pairs_share"] < 1.0 and sp["per_token_ms"]["transfer"] > 0


def test_records_without_the_new_columns_split_on_the_host_clock():
    coll, st, truth = make_records(steps=200, tp=2, calls=10)
    sp = _split(coll, st)
    assert sp["clock"] == "host" and "host clock" in sp["clock_note"]
    assert sp["per_token_ms"]["compute"] == pytest.approx(truth["compute_us"] / 1e3, rel=0.01)
    rows = rank_steps(align(coll), st)
    assert set(rows["clock"]) == {"host"} and isinstance(rows, pd.DataFrame)


def _graph_sampled(coll, every: int = 8, graph_timing: bool = True):
    """What the hook records with CUDA graphs, TP 2: the all-reduces are in the graph (rows only in sampled steps,
    timing cuda-event-graph; graph timing off: no rows, counted untimed), the logits all-gather runs eagerly in
    every step (a cuda-event-eager row in every step)."""
    ar, sampled = coll["op"] == "all_reduce", coll["step"] % every == 0
    keep = ~ar | (sampled & graph_timing)
    timing = np.where(ar, "cuda-event-graph", "cuda-event-eager")
    return coll.assign(timing=timing)[keep], int(ar[coll["step"] == 0].sum() // coll["rank"].nunique())


@pytest.mark.parametrize("graph_timing", [True, False])
def test_sampled_steps_are_those_whose_graph_collectives_were_read(graph_timing):
    """Issue 27 defect 2: the eager logits gather puts a row in every step. Transfer and wait are means over the
    steps whose sampled graph collectives were read (1 in 8 here), not over every step with a row (which
    diluted them ~8x); with graph timing off they are not measured (before: the logits gather alone)."""
    coll, st, truth = async_records()
    g, n_ar = _graph_sampled(coll, graph_timing=graph_timing)
    if not graph_timing:
        st["untimed_collectives"] = np.where(st["step"] % 8 == 0, n_ar, 0)
    sp = _split(g, st)
    if not graph_timing:
        assert sp["per_token_ms"] is None and "TPCOMM_GRAPH_TIMING=1" in sp["note"]
        return
    assert sp["sampled_pairs_share"] == pytest.approx(1 / 8, abs=0.01)
    assert sp["per_token_ms"]["transfer"] == pytest.approx(truth["transfer_us"] / 1e3, rel=0.05)
    assert sp["per_token_ms"]["wait"] == pytest.approx(truth["wait_us"] / 1e3, rel=0.1)
    # top_sites counts per sampled step: 9 all-reduces and 1 gather per step, per rank
    rows = rank_steps(align(g), st).assign(concurrency=1, repeat=0)
    sites = {s["op"]: s["count_per_step"] for s in top_sites(align(g), rows[rows["kind"] == "decode"])}
    assert sites == {"all_reduce": pytest.approx(n_ar), "all_gather": pytest.approx(1.0)}


def test_selfchecks_graph_item_counts_sampled_steps_as_the_split_does():
    """selfcheck's timer-graph item (hookpath.py) holds the hook's records against split.sampled_mask: on records of
    the shape it makes (an eager gather in every step, graph rows 1 step in 4) it counts the 1 in 4."""
    from tpcomm.selfcheck.hookpath import split_sampled_steps

    n = 24
    coll = {
        "rank": [0] * (n + 6),
        "step": list(range(n)) + list(range(0, n, 4)),
        "duration_us": [5.0] * n + [500.0] * 6,
        "timing": ["cuda-event-eager"] * n + ["cuda-event-graph"] * 6,
    }
    t0 = [1_000_000 * i for i in range(n)]
    steps = {
        "rank": [0] * n,
        "step": list(range(n)),
        "t_start_ns": t0,
        "t_end_ns": [t + 600_000 for t in t0],
        "duration_us": [600.0] * n,
        "kind": ["decode"] * n,
        "untimed_collectives": [0] * n,
    }
    assert split_sampled_steps(coll, steps) == 6
