"""Which collectives cross nodes (tpcomm/plan/nodes.py), against vLLM's rank layout (TP innermost, then PP, then
DP; consecutive ranks per node under --nnodes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpcomm.cli import cli
from tpcomm.errors import InputError
from tpcomm.plan.layout import Layout
from tpcomm.plan.nodes import groups


def test_tp_inside_nodes_and_pp_across_them():
    g = groups(Layout(tp=8, pp=2), 2)  # 16 ranks, 8 per node: each stage on its own node
    assert g["tp"] == {"groups": 2, "crossing": 0, "max_nodes": 1}
    assert g["pp"] == {"groups": 1, "crossing": 1, "max_nodes": 2}


def test_tp_across_nodes():
    assert groups(Layout(tp=16), 2)["tp"] == {"groups": 1, "crossing": 1, "max_nodes": 2}
    # PP 4 over 2 nodes of 8: stages 0-1 on node 0, 2-3 on node 1: one of three boundaries crosses.
    assert groups(Layout(tp=4, pp=4), 2)["pp"] == {"groups": 3, "crossing": 1, "max_nodes": 2}


def test_dp_ep_spans_the_nodes_its_block_covers():
    g = groups(Layout(tp=4, dp=4, ep=True), 2)
    assert g["tp"]["crossing"] == 0 and g["ep"] == {"groups": 1, "crossing": 1, "max_nodes": 2}


def test_a_node_count_that_does_not_divide_the_world_is_refused():
    with pytest.raises(InputError, match="--nnodes 3"):
        groups(Layout(tp=8), 3)
    r = CliRunner().invoke(cli, ["plan", "--model", "deepseek-v3", "--tp", "8", "--nnodes", "3"])
    assert r.exit_code == 2 and "--nnodes 3" in r.output


def test_plan_json_marks_the_crossing_calls():
    r = CliRunner().invoke(cli, ["plan", "--model", "deepseek-v3", "--tp", "8", "--pp", "2", "--nnodes", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    crossing = {(c["op"], c["group"]) for c in doc["collectives"] if c["crosses_nodes"]}
    assert crossing == {("send_recv", "pp")} and doc["nodes"]["ranks_per_node"] == 8
