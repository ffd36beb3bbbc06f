"""The replay's schedule (from the plan), its input checks and its split
arithmetic, without ranks. The real-rank runs are in test_replay_dist.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpcomm.errors import InputError
from tpcomm.plan import build_plan
from tpcomm.plan.weights import weight_bytes_per_gpu
from tpcomm.probe.replay import ReplayConfig, build_replay_spec
from tpcomm.probe.replay_results import record_frames, step_table, summarize
from tpcomm.probe.schedule import SITE_ATTN, SITE_DENSE, SITE_EMBED, SITE_LOGITS, SITE_MOE, build_schedule


def test_kimi_tp8_schedule_is_the_plan_in_vllm_order():
    s = build_schedule("kimi-k2.5", tp=8, batch=1, context=0, work_scale=1.0)
    assert s["counts"] == {"all_reduce": 123, "all_gather": 1}
    sites = [x["site"] for x in s["slots"]]
    # embedding, layer 0 (dense: attention, MLP), layers 1..60 (attention, MoE), logits
    assert sites[:3] == [SITE_EMBED, SITE_ATTN, SITE_DENSE]
    assert sites[3:5] == [SITE_ATTN, SITE_MOE] and sites[-1] == SITE_LOGITS
    assert sites.count(SITE_MOE) == 60 and sites.count(SITE_ATTN) == 61
    assert [x["layer"] for x in s["slots"][1:-1:2]] == list(range(61))
    assert {x["bytes"] for x in s["slots"] if x["op"] == "all_reduce"} == {7168 * 2}
    assert s["slots"][-1]["bytes"] == 163840 // 8 * 2
    # every weight byte the plan says a GPU reads is streamed once per step (context 0: no KV)
    plan = build_plan("kimi-k2.5", tp=8, batches=[1])
    assert s["work_bytes_per_rank"] == pytest.approx(weight_bytes_per_gpu(plan.model, plan.layout, 1), rel=1e-6)


def test_work_scale_and_kv_context_scale_the_bytes():
    base = build_schedule("deepseek-v3", tp=2, batch=1, context=0, work_scale=1.0)
    ctx = build_schedule("deepseek-v3", tp=2, batch=1, context=4096, work_scale=1.0)
    kv_layer = build_plan("deepseek-v3", tp=2).to_dict()["kv_cache"]["bytes_per_token_per_layer"]
    assert ctx["work_bytes_per_rank"] - base["work_bytes_per_rank"] == pytest.approx(61 * 4096 * kv_layer, rel=1e-6)
    half = build_schedule("deepseek-v3", tp=2, batch=1, context=4096, work_scale=0.5)
    assert half["work_bytes_per_rank"] == pytest.approx(ctx["work_bytes_per_rank"] / 2, rel=1e-5)
    assert build_schedule("deepseek-v3", tp=2, work_scale=0)["work_bytes_per_rank"] == 0


def test_world_size_one_keeps_the_schedule():
    s = build_schedule("kimi-k2.5", tp=1, batch=2)
    assert s["counts"] == {"all_reduce": 123, "all_gather": 1}
    assert s["slots"][0]["bytes"] == 2 * 7168 * 2 and s["slots"][-1]["bytes"] == 2 * 163840 * 2


@pytest.mark.parametrize(
    "cfg, world, what",
    [
        (ReplayConfig(tp=4), 2, "--tp 4"),
        (ReplayConfig(model="deepseek-v3", work_scale=1.0), 2, "--work-scale 1"),
        (ReplayConfig(skew_rank=5, work_scale=1e-3), 2, "--skew-rank 5"),
        (ReplayConfig(backends=["nvlink"], work_scale=1e-3), 2, "--backend"),
    ],
)
def test_bad_replay_input_names_the_input(cfg, world, what):
    with pytest.raises(InputError) as e:
        build_replay_spec(cfg, world, cuda=False)
    assert str(e.value).startswith(what)


def test_cli_refuses_bad_input_in_one_line():
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "probe", "--replay", "--gpus", "2", "--model", "deepseek-v3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    err = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(err) == 1 and "--work-scale 1" in err[0] and "GB per step" in err[0], p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "probe", "--replay", "--sizes", "1K"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "--sizes" in p.stderr


def _record(timing: str, durs: dict[int, list[float]], step_us: dict[int, list[float]], ncoll: int) -> dict:
    ranks = []
    for r in durs:
        nsteps = len(step_us[r])
        ranks.append(
            {
                "rank": r,
                "step_t0_ns": [i * 10**6 for i in range(nsteps)],
                "step_us": step_us[r],
                "coll_t0_ns": [i * 1000 for i in range(len(durs[r]))],
                "coll_us": durs[r],
            }
        )
    return {
        "kind": "replay",
        "backend": "gloo",
        "mode": "eager",
        "timing": timing,
        "world_size": len(durs),
        "steps": len(step_us[0]),
        "collectives_per_step": ncoll,
        "ranks": ranks,
    }


def test_split_is_attributes_min_over_ranks_and_sums_to_the_step():
    slots = [
        {"site": SITE_ATTN, "layer": 0, "op": "all_reduce", "bytes": 512, "dtype": "bfloat16", "work_bytes": 0},
        {"site": SITE_LOGITS, "layer": None, "op": "all_gather", "bytes": 256, "dtype": "bfloat16", "work_bytes": 0},
    ]
    full = _record(
        "full", {0: [10.0, 20.0, 12.0, 20.0], 1: [4.0, 25.0, 12.0, 30.0]}, {0: [100.0, 90.0], 1: [110.0, 95.0]}, 2
    )
    comp = _record("compute", {0: [], 1: []}, {0: [60.0, 62.0], 1: [70.0, 64.0]}, 0)
    frames = [record_frames(r, slots) for r in (full, comp)]
    import pandas as pd

    coll = pd.concat([frames[0][0]], ignore_index=True)
    steps = step_table(coll, pd.concat([f[1] for f in frames], ignore_index=True))
    c0 = coll[(coll["rank"] == 0) & (coll["step"] == 0)].sort_values("call_idx")
    assert c0["transfer_us"].tolist() == [4.0, 20.0] and c0["wait_us"].tolist() == [6.0, 0.0]
    f = steps[steps["timing"] == "full"]
    assert ((f["compute_us"] + f["transfer_us"] + f["wait_us"] - f["step_us"]).abs() < 1e-9).all()
    assert f["step_us"].tolist() == [105.0, 92.5] and f["step_us_max"].tolist() == [110.0, 95.0]
    (e,) = summarize(steps, coll, batch=1)
    assert e["interconnect_cost_us_per_token"] == pytest.approx(98.75 - 64.0)
    ar = next(o for o in e["ops"] if o["op"] == "all_reduce")
    assert ar["count_per_step"] == 1 and ar["transfer_us_p50"] == 8.0
