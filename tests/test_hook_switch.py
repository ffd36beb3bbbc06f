"""TPCOMM_HOOK=1 switches the hook on through vLLM 0.32's own plugin loader without VLLM_PLUGINS, so the
server keeps every other plugin (issue 22, item 5); VLLM_PLUGINS=tpcomm, an allow-list, drops them (here:
vLLM's own LoRA-resolver general plugins). The real server case is in test_hardening_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# In a fresh interpreter: vLLM's loader as a server process runs it, then what it loaded and patched.
_LOAD = r"""
import json
import vllm.plugins as vp
general = sorted(vp.load_plugins_by_group(vp.DEFAULT_PLUGINS_GROUP))
vp.load_general_plugins()
from vllm.distributed.parallel_state import GroupCoordinator as G
endpoints = [p.name for p in vp.load_endpoint_plugins(None)]
print(json.dumps({
    "general": general,
    "endpoints": endpoints,
    "patched": any(hasattr(getattr(G, n, None), "_tpcomm_original") for n in dir(G)),
}))
"""


def _load(env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "TPCOMM_HOOK")}
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_tpcomm_hook_switches_it_on_and_keeps_the_other_plugins():
    on = _load({"TPCOMM_HOOK": "1"})
    assert on["patched"] and on["endpoints"] == ["tpcomm"], on
    assert {"tpcomm", "lora_filesystem_resolver", "lora_hf_hub_resolver"} <= set(on["general"]), on
    allow = _load({"VLLM_PLUGINS": "tpcomm"})  # the allow-list: the hook, and nothing else
    assert allow["patched"] and allow["endpoints"] == ["tpcomm"] and allow["general"] == ["tpcomm"], allow
    kept = _load({"VLLM_PLUGINS": "tpcomm,lora_filesystem_resolver"})
    assert kept["general"] == ["lora_filesystem_resolver", "tpcomm"] and kept["patched"], kept


def test_without_the_switch_nothing_is_patched_and_no_route_is_added():
    off = _load({})
    assert not off["patched"] and off["endpoints"] == [] and "tpcomm" in off["general"], off
    other = _load({"VLLM_PLUGINS": "lora_filesystem_resolver", "TPCOMM_HOOK": "1"})
    # An allow-list without tpcomm: vLLM never runs tpcomm's code, so the switch cannot act (the docs say so).
    assert not other["patched"] and other["endpoints"] == [] and other["general"] == ["lora_filesystem_resolver"]
