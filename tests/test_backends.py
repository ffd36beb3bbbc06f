"""The backend registry (tpcomm/backends/*.json): every file well formed, its facts true of the installed vLLM's
source, its trace rules disjoint, and a new backend one file that the hook, the trace classifier, the levers and
the probe list all pick up."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tpcomm import backends
from tpcomm.backends import BackendError, load
from tpcomm.trace import classify

REG = backends.registry()
TOPO_RULES = Path(backends.__file__).resolve().parents[1] / "topo" / "rules.py"


def vllm_communicators() -> Path:
    import vllm

    return Path(vllm.__file__).parent / "distributed" / "device_communicators"


def test_each_file_is_named_for_its_backend_and_every_fallback_is_a_backend():
    assert len(REG) >= 12
    for name, b in REG.items():
        assert (backends.FOLDER / f"{name}.json").is_file()
        assert b.fallback is None or b.fallback in REG, name
        assert b.label and b.source


def test_every_hook_target_is_a_class_and_method_in_the_installed_vllm():
    """Read vLLM's source rather than import it: most of these modules import only on CUDA builds."""
    folder = vllm_communicators()
    for mod, cls, methods, tag in backends.hook_targets():
        text = (folder / f"{mod}.py").read_text()
        body = re.split(rf"^class {cls}\b", text, flags=re.M)
        assert len(body) == 2, f"{tag}: no class {cls} in {mod}.py"
        for m in methods:
            assert re.search(rf"^    def {m}\(", body[1], flags=re.M), f"{tag}: {cls}.{m} not in {mod}.py"


# The call each backend is reached by in CudaCommunicator.all_reduce, to find vLLM's order in its source.
CALLS = {
    "nccl-symm-mem": "torch.ops.vllm.all_reduce_symmetric_with_copy(",
    "quick-ar": "qr_comm.quick_all_reduce(",
    "flashinfer-pcie-ipc": "fi_pcie_ipc_ar_comm.all_reduce(",
    "flashinfer-ar": "fi_ar_comm.all_reduce(",
    "aiter-ar": "aiter_ar_comm.custom_all_reduce(",
    "custom-ar": "ca_comm.custom_all_reduce(",
    "torch-symm-mem": "symm_mem_comm.all_reduce(",
    "pynccl": "pynccl_comm.all_reduce(",
    "nccl": "torch.distributed.all_reduce(",
}


def test_the_fallback_chain_is_the_order_cuda_communicator_tries_them():
    text = (vllm_communicators() / "cuda_communicator.py").read_text()
    body = text[text.index("    def all_reduce(self, input_)") :]
    body = body[: body.index("\n    def ", 10)]
    # The last place each is called: torch.distributed also stands in for a PyNccl that is off, before it.
    order = sorted(CALLS, key=lambda n: body.rindex(CALLS[n]))
    chain, b = [], REG["nccl-symm-mem"]
    while b is not None:
        chain.append(b.name)
        b = REG.get(b.fallback) if b.fallback else None
    assert chain == order


def test_every_trace_example_matches_its_own_rule_and_no_other():
    """Disjoint rules: the classifier's first match is then the only match, whatever order the files load in."""
    rules = backends.trace_rules()
    for r in rules:
        hits = [o for o in rules if o.timeline == r.timeline and o.pattern.search(r.example)]
        assert hits == [r], (r.example, [h.family for h in hits])
        got = classify.rule_for(r.example, r.timeline)
        assert got is not None and got.family == r.family


def test_topo_names_only_registered_paths_and_the_hook_tags_match_the_fused_rows():
    names = set(re.findall(r'add\(\s*"([a-z0-9-]+)"', TOPO_RULES.read_text()))
    names |= set(re.findall(r'"path": "([a-z0-9-]+)"', TOPO_RULES.read_text()))
    assert names - {"all"} <= set(REG), names - {"all"} - set(REG)
    assert {"custom-ar", "pynccl", "flashinfer-pcie-ipc", "shm", "gloo"} <= names
    from tpcomm.hook import fused, plugin

    assert plugin.SYMM_TAG == REG["nccl-symm-mem"].hook_tag
    fused_families = {r.family for r in REG["flashinfer-fused-ar-rmsnorm"].trace}
    assert fused_families == {fused.BACKEND_PREFIX + w for w in ("trtllm", "mnnvl")}
    # The code path's name: the hook (standard library only inside vLLM), topo and the plan spell the registry's
    from tpcomm.hook.recorder import GROUP_COORDINATOR
    from tpcomm.plan.collectives import Collective
    from tpcomm.topo import fusion

    assert fused.PATH == fusion.PATH == backends.FUSED_PATH
    assert GROUP_COORDINATOR == Collective.__dataclass_fields__["path"].default == backends.GC_PATH


def test_the_probes_implemented_are_the_registrys_and_the_one_shot_set_is_read_from_it():
    """probes/ imports only torch (a node runs it by hand), so it keeps its own list of what it implements:
    the registry names exactly those, in the same order (plain fallback first)."""
    from probes import spec

    assert spec.CPU_BACKENDS == backends.probe_backends("cpu")
    assert spec.GPU_BACKENDS == backends.probe_backends("cuda")
    from tpcomm.judge.levers import ONE_SHOT_PATHS

    assert set(ONE_SHOT_PATHS) == {"nccl-symm-mem", "flashinfer-pcie-ipc", "custom-ar", "torch-symm-mem", "quick-ar"}


NEW = {
    "name": "my-ar",
    "label": "a new one-shot all-reduce",
    "platform": "cuda",
    "hook_tag": "my_ar",
    "hook_targets": [{"module": "my_all_reduce", "class": "MyAllReduce", "methods": ["all_reduce"]}],
    "probe": "my-ar",
    "one_shot": True,
    "fallback": "pynccl",
    "switches": {"MY_AR": "0"},
    "trace": [
        {
            "family": "my_ar",
            "timeline": "device",
            "regex": r"\bmy_oneshot_kernel\b",
            "example": "void my::my_oneshot_kernel<__nv_bfloat16>(...)",
            "source": "a test",
            "op": "all_reduce",
        }
    ],
    "trace_wrappers": ["^_my_ar::"],
    "source": "a test",
}


def test_a_new_backend_is_one_file(tmp_path):
    folder = tmp_path / "backends"
    shutil.copytree(backends.FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / "my-ar.json").write_text(json.dumps(NEW))
    reg = load(folder)
    assert ("my_all_reduce", "MyAllReduce", ("all_reduce",), "my_ar") in backends.hook_targets(reg)
    assert "my-ar" in backends.one_shot_paths(reg)
    assert "my-ar" in backends.probe_backends("cuda", reg)
    assert backends.by_hook_tag("my_ar", reg).name == "my-ar"
    assert any(r.pattern.search(NEW["trace"][0]["example"]) for r in backends.trace_rules(reg))
    assert "^_my_ar::" in backends.trace_wrappers(reg)
    assert "MY_AR" in backends.switches(reg)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"one_shot": "yes"}, "'one_shot' has the wrong type"),
        ({"platform": "tpu"}, "platform must be one of"),
        ({"fallback": "nowhere"}, "fallback 'nowhere' is no backend"),
        ({"hook_tag": "custom_ar"}, "hook_tag 'custom_ar' is also 'custom-ar'"),
        ({"trace": [{"family": "x", "timeline": "gpu", "regex": "a", "example": "a", "source": "s"}]}, "timeline"),
        ({"trace": [{"family": "x", "timeline": "device", "regex": "(", "example": "a", "source": "s"}]}, "regex"),
        ({"colour": "red"}, "unknown keys ['colour']"),
        ({"trace_wrappers": ["_my_ar::"]}, "anchored at the start"),
        ({"trace_wrappers": ["(?i)^_my_ar::"]}, "anchored at the start"),
        ({"trace_wrappers": ["^(?i)_my_ar::"]}, "no inline flags"),
        ({"name": "other"}, "must be the file's name"),
    ],
)
def test_a_malformed_backend_file_is_refused_naming_file_and_field(tmp_path, change, words):
    folder = tmp_path / "backends"
    shutil.copytree(backends.FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / "my-ar.json").write_text(json.dumps({**NEW, **change}))
    with pytest.raises(BackendError) as e:
        load(folder)
    assert words in str(e.value)
    assert "my-ar" in str(e.value)


def test_a_file_that_is_not_json_is_named(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BackendError, match=r"bad\.json: not readable JSON"):
        load(tmp_path)


def test_each_switch_default_is_vllms():
    """envs.py of the installed vLLM: os.getenv("NAME", "default") or env_with_choices("NAME", "default", ...)."""
    import vllm

    text = (Path(vllm.__file__).parent / "envs.py").read_text()
    n = 0
    for b in REG.values():
        for env, default in b.switches:
            m = re.search(rf'(?:os\.getenv|env_with_choices)\(\s*"{env}",\s*"([^"]*)"', text)
            assert m, f"{b.name}: {env} not in vLLM's envs.py"
            assert m.group(1) == default, f"{b.name}: {env} defaults to {m.group(1)!r} in vLLM, not {default!r}"
            n += 1
    assert n >= 7
    from tpcomm.topo.collect import VLLM_ENV

    assert {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "VLLM_USE_NCCL_SYMM_MEM"} <= set(VLLM_ENV)


def test_a_broken_registry_inside_vllm_loses_the_backend_tags_with_a_log_line_and_nothing_else(tmp_path):
    """In a worker the registry is read where the hook tags CUDA backends: an empty or broken folder switches
    that site off (failsafe), the call returns, and the rest of the install goes on."""
    import subprocess
    import sys

    code = f"""
import tpcomm.backends as b
b.FOLDER = b.Path({str(tmp_path)!r})
from tpcomm.hook import failsafe, plugin
plugin._tag_cuda_backends()
print("OFF", failsafe.disabled())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OFF {'backend_tag': 'BackendError:" in r.stdout and "no backend files" in r.stdout, r.stdout
