"""The tiny model's depth (tpcomm.tinymodel `layers`): the real-server tests serve it at 2 layers (conftest
TEST_LAYERS), the demo at 4. A folder holding one depth is never taken for the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpcomm.tinymodel import MARKER, TINY_CONFIG, generate


def _layers(d) -> int:
    return json.loads((d / "config.json").read_text())["num_hidden_layers"]


def test_a_depth_is_generated_named_and_never_mistaken_for_another(tmp_path):
    out = generate(tmp_path / "m", layers=2)
    assert _layers(out) == 2 and "(deepseek_v3, 2 layers)" in (out / MARKER).read_text()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert generate(out, layers=2) == out and (out / "model.safetensors").stat().st_mtime_ns == before  # kept
    generate(out)  # the default depth: built again, not the 2-layer one reused
    assert _layers(out) == TINY_CONFIG["num_hidden_layers"] == 4
    assert (out / MARKER).read_text().strip().endswith("(deepseek_v3)")
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert generate(out, layers=4) == out and (out / "model.safetensors").stat().st_mtime_ns == before  # the same


def test_a_rebuild_cut_short_is_never_taken_for_the_model_it_replaced(tmp_path, monkeypatch):
    """The 4-layer model's folder rebuilt at 2 layers, the process stopped after the first new file landed:
    the old marker is gone, so the half-replaced folder is built again, not reused as the 4-layer model."""
    import tpcomm.tinymodel as tm

    out = generate(tmp_path / "m")
    real, calls = os.replace, []

    def cut(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(tm.os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        generate(out, layers=2)
    monkeypatch.setattr(tm.os, "replace", real)
    assert not (out / MARKER).exists()
    generate(out)
    assert _layers(out) == 4 and (out / MARKER).read_text().strip().endswith("(deepseek_v3)")


def test_a_depth_without_a_moe_layer_is_refused_naming_the_input(tmp_path):
    with pytest.raises(ValueError, match=r"layers 1: expected an integer of at least 2 for deepseek_v3"):
        generate(tmp_path / "m", layers=1)
    with pytest.raises(ValueError, match=r"layers True: expected an integer of at least 1 for llama"):
        generate(tmp_path / "m", arch="llama", layers=True)
    assert not (tmp_path / "m").exists()
    p = subprocess.run(
        [sys.executable, "-m", "tpcomm.tinymodel", str(tmp_path / "m"), "--layers", "0", "--arch", "llama"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "layers 0: expected an integer of at least 1 for llama" in p.stderr
