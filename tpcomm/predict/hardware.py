"""Hardware profiles: built-in JSON files in profiles/, or a user profile file.

A profile holds: memory_bandwidth_GBps, memory_GB, bf16_tflops, link {type
(pcie|nvlink|shm), p2p (bool), p2p_GBps per direction, nvlink_GBps}, and
optionally kernel_overhead_us and memory_efficiency; `sources` names where each
figure comes from. GB = 1e9 bytes.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tpcomm.errors import InputError

REQUIRED = ("memory_bandwidth_GBps", "memory_GB", "bf16_tflops", "link")
LINK_TYPES = ("pcie", "nvlink", "shm")


def profile_names() -> list[str]:
    return sorted(
        p.name[:-5]
        for p in resources.files("tpcomm.predict").joinpath("profiles").iterdir()
        if p.name.endswith(".json")
    )


def _profiles() -> dict[str, dict]:
    return {
        n: json.loads(resources.files("tpcomm.predict").joinpath("profiles", n + ".json").read_text())
        for n in profile_names()
    }


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(" ", "-")


def _builtin(name: str) -> dict | None:
    key = _key(name)
    for n, prof in _profiles().items():
        if key == n or key in prof.get("aliases", []):
            return prof
    return None


def _refusal(name: str) -> InputError:
    """A name that is not a profile: ambiguous (several profiles contain it) or unknown (a close match offered)."""
    import difflib

    key = _key(name)
    names = profile_names()
    holders = [n for n, p in _profiles().items() if any(key in x for x in [n, *p.get("aliases", [])])]
    choices = "one of " + ", ".join(names) + ", or a JSON profile file"
    if len(holders) > 1:
        return InputError(f"--gpu {name}", "is ambiguous: it could be " + " or ".join(holders), "say which: " + choices)
    close = holders or difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return InputError(f"--gpu {name}", "is neither a built-in profile nor a profile file" + hint, choices)


FITTED_KEYS = ("memory_efficiency", "ramp_us", "kv_efficiency", "kernel_overhead_us")


def _with_builtin_ranges(prof: dict) -> dict:
    """A user profile of a GPU that has a built-in profile (same name, or its `profile` key / file name is a built-in
    name or alias) takes the built-in's efficiency and ramp values and ranges for the keys it does not give, so one
    GPU gets one set of ranges whichever way it is named."""
    by_name = {p["name"].lower(): p for p in _profiles().values()}
    base = by_name.get(str(prof.get("name", "")).lower()) or _builtin(str(prof.get("profile", "")))
    if base is None:
        return prof
    prof = dict(prof)
    sources = dict(prof.get("sources") or {})
    taken = []
    for key in FITTED_KEYS:
        if key in prof or f"{key}_range" in prof or key not in base:
            continue
        prof[key] = base[key]
        if f"{key}_range" in base:
            prof[f"{key}_range"] = list(base[f"{key}_range"])
        sources[key] = f"from the built-in profile {base['profile']} (same GPU): " + base.get("sources", {}).get(
            key, ""
        )
        taken.append(key)
    if taken:
        prof["sources"] = sources
        prof.setdefault("notes", [])
        prof["notes"] = [*prof["notes"], f"{', '.join(taken)} taken from the built-in profile {base['profile']}"]
    return prof


def load_profile(name_or_path: str | None) -> dict:
    if not name_or_path:
        raise InputError("--gpu", "is required (the model has no default GPU)", "one of " + ", ".join(profile_names()))
    prof = _builtin(name_or_path)
    if prof is None:
        p = Path(name_or_path).expanduser()
        if not p.is_file():
            raise _refusal(name_or_path)
        try:
            prof = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(str(p), f"is not valid JSON ({e})", "a JSON hardware profile") from None
        if not isinstance(prof, dict):
            raise InputError(str(p), "is not a JSON object", "a JSON hardware profile")
        prof.setdefault("profile", p.stem)
        prof.setdefault("name", p.stem)
        prof.setdefault("sources", {"*": f"user profile {p}"})
        prof = _with_builtin_ranges(prof)
    missing = [k for k in REQUIRED if k not in prof]
    if missing:
        raise InputError(
            f"hardware profile {prof.get('profile', name_or_path)}",
            "missing fields: " + ", ".join(missing),
            "memory_bandwidth_GBps, memory_GB, bf16_tflops and link {type, p2p, p2p_GBps}",
        )
    for k in ("memory_bandwidth_GBps", "memory_GB", "bf16_tflops"):
        if not isinstance(prof[k], (int, float)) or prof[k] <= 0:
            raise InputError(f"hardware profile {prof['profile']}", f"{k} is {prof[k]!r}", "a positive number")
    link = prof["link"]
    if (
        not isinstance(link, dict)
        or link.get("type") not in LINK_TYPES
        or not isinstance(link.get("p2p_GBps"), (int, float))
        or link["p2p_GBps"] <= 0
    ):
        raise InputError(
            f"hardware profile {prof['profile']}",
            f"link is {link!r}",
            "link {type: pcie|nvlink|shm, p2p: bool, p2p_GBps: > 0}",
        )
    return prof


def with_interconnect(prof: dict, interconnect: str | None) -> dict:
    """A copy of `prof` with its link replaced: nvlink4, pcie4, pcie5, pcie-no-p2p."""
    if not interconnect:
        return prof
    p = json.loads(json.dumps(prof))
    presets = {
        "nvlink4": {"type": "nvlink", "generation": 4, "p2p": True, "p2p_GBps": 450, "nvlink_GBps": 450},
        "nvlink5": {"type": "nvlink", "generation": 5, "p2p": True, "p2p_GBps": 900, "nvlink_GBps": 900},
        "nvlink3": {"type": "nvlink", "generation": 3, "p2p": True, "p2p_GBps": 300, "nvlink_GBps": 300},
        "pcie4": {"type": "pcie", "generation": 4, "p2p": True, "p2p_GBps": 25, "nvlink_GBps": None},
        "pcie5": {"type": "pcie", "generation": 5, "p2p": True, "p2p_GBps": 53, "nvlink_GBps": None},
    }
    if interconnect == "pcie-no-p2p":
        p["link"] = {**p["link"], "type": "pcie", "p2p": False}
    elif interconnect in presets:
        p["link"] = presets[interconnect]
    else:
        raise InputError(
            f"--interconnect {interconnect}", "is not known", "nvlink3, nvlink4, nvlink5, pcie4, pcie5 or pcie-no-p2p"
        )
    p["interconnect_override"] = interconnect
    return p


INTERCONNECTS = ("nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "pcie-no-p2p")
