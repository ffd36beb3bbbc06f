"""Which engine steps the hook records as decode (issue 27 defect 4): under speculative decoding (MTP,
EAGLE) a decode step schedules 1 + the request's draft tokens, listed in vLLM 0.32's
SchedulerOutput.scheduled_spec_decode_tokens; before, any step with more than one token per request was
taken as prefill, so no step counted as decode and the split had nothing to split."""

from __future__ import annotations

import pytest

from tpcomm.hook.core import Hook


class _Req:
    def __init__(self, rid: str) -> None:
        self.req_id = rid


class _Sched:
    """The fields of vllm.v1.core.sched.output.SchedulerOutput the hook reads."""

    def __init__(self, per_req: dict[str, int], spec: dict[str, list[int]] | None = None, new=()) -> None:
        self.num_scheduled_tokens = per_req
        self.total_num_scheduled_tokens = sum(per_req.values())
        self.scheduled_spec_decode_tokens = spec or {}
        self.scheduled_new_reqs = [_Req(r) for r in new]


def _kinds(*scheds) -> list[str]:
    h = Hook()
    h.start()
    for s in scheds:
        h.step_begin(s)
        h.step_end(object())
    steps = h.rec.columns(0)["steps"]
    return list(steps["kind"]), list(steps["num_tokens"])


@pytest.mark.parametrize("drafts", [1, 3])
def test_a_step_of_one_token_plus_its_drafts_is_decode(drafts):
    kinds, tokens = _kinds(
        _Sched({"a": 1 + drafts, "b": 1 + drafts}, {"a": [7] * drafts, "b": [8] * drafts}),
        _Sched({"a": 1 + drafts, "b": 1}, {"a": [7] * drafts}),  # b had no draft this step
    )
    assert kinds == ["decode", "decode"] and tokens == [2 + 2 * drafts, 2 + drafts]


def test_more_than_the_drafts_or_a_new_request_is_still_prefill_or_mixed():
    kinds, _ = _kinds(
        _Sched({"a": 5}, {"a": [1, 2]}),  # 5 > 1 + 2 drafts: a chunk of prefill
        _Sched({"a": 3, "b": 1}, {"a": [1, 2]}, new=["b"]),  # b is new: mixed
        _Sched({"a": 1, "b": 1}),  # plain decode, no speculation
    )
    assert kinds == ["prefill", "mixed", "decode"]
