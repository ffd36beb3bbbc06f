"""Model configs: a config.json path, a folder holding one, a built-in preset, or a Hugging Face model id
found in the local Hugging Face cache.

`load_model(arg)` returns a `ModelSpec`. Presets are config files in `presets/`, each naming its source in
`_tpcomm_source`. Every problem of a config is reported at once (one InputError listing them all).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.models.families import spec_from_config
from tpcomm.models.spec import FAMILIES, ModelSpec

__all__ = ["load_model", "load_config", "preset_names", "hf_cache_dirs", "ModelSpec", "FAMILIES"]


def preset_names() -> list[str]:
    return sorted(
        p.name[:-5] for p in resources.files("tpcomm.models").joinpath("presets").iterdir() if p.name.endswith(".json")
    )


def hf_cache_dirs() -> list[Path]:
    """Where huggingface_hub keeps downloaded repos, in its own order: HF_HUB_CACHE, HF_HOME/hub, then
    $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub (huggingface_hub constants.py)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    out.append((Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    seen, uniq = set(), []
    for p in out:
        p = p.expanduser()
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


def _from_hf_cache(model_id: str) -> Path | None:
    """config.json of `org/name` in the local cache: models--org--name/snapshots/<rev>/config.json, the revision
    refs/main points at when it has a config, else the newest snapshot that has one."""
    folder = "models--" + model_id.replace("/", "--")
    for cache in hf_cache_dirs():
        repo = cache / folder
        snaps = repo / "snapshots"
        if not snaps.is_dir():
            continue
        main = repo / "refs" / "main"
        if main.is_file():
            cfg = snaps / main.read_text().strip() / "config.json"
            if cfg.is_file():
                return cfg
        found = sorted((p for p in snaps.glob("*/config.json")), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    return None


def _looks_like_hf_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "~")) and not s.endswith(".json")


def preset_for_hf_id(model_id: str) -> str | None:
    """The preset taken from this Hugging Face id's config.json (its `_tpcomm_source` names the id), if any."""
    want = model_id.strip().lower()
    for name in preset_names():
        cfg = json.loads(resources.files("tpcomm.models").joinpath("presets", name + ".json").read_text())
        src = str(cfg.get("_tpcomm_source", "")).split(" ", 1)[0].lower()
        if src == want:
            return name
    return None


def load_config(arg: str | Path | dict) -> tuple[dict, str, str]:
    """(config dict, display name, source) for a path, folder, preset name, HF model id or dict."""
    if isinstance(arg, dict):
        return arg, str(arg.get("_name_or_path") or arg.get("model_type") or "config"), "dict"
    s = str(arg)
    if s in preset_names():
        text = resources.files("tpcomm.models").joinpath("presets", s + ".json").read_text()
        cfg = json.loads(text)
        return cfg, s, f"preset {s}: {cfg.get('_tpcomm_source', 'no source recorded')}"
    p = Path(s).expanduser()
    if not p.exists() and _looks_like_hf_id(s):
        cached = _from_hf_cache(s)
        preset = preset_for_hf_id(s) if cached is None else None
        if preset:  # not downloaded, but a preset was taken from this very id's config.json
            cfg, _, src = load_config(preset)
            return cfg, preset, f"{src} (for {s}: not in the local Hugging Face cache, its preset used)"
        if cached is None:
            raise InputError(
                f"--model {s}",
                "looks like a Hugging Face model id but is not in the local Hugging Face cache (searched "
                + ", ".join(str(c) for c in hf_cache_dirs())
                + ")",
                "a config.json path, a folder holding one, a preset ("
                + ", ".join(preset_names())
                + "), or a model downloaded with `huggingface-cli download "
                + s
                + " config.json`",
            )
        cfg, _, _ = load_config(cached)
        return cfg, s.split("/")[-1], f"{s} from the Hugging Face cache ({cached})"
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise InputError(f"--model {s}", "folder has no config.json", "a model snapshot folder holding config.json")
        p = p / "config.json"
    if not p.exists():
        raise InputError(
            f"--model {s}",
            "is neither a file, a folder, a preset, nor a Hugging Face model id",
            "a config.json path, a folder holding one, an org/name model id in the local Hugging Face cache, or "
            "one of the presets: " + ", ".join(preset_names()),
        )
    try:
        cfg = json.loads(p.read_text())
    except UnicodeDecodeError:
        raise InputError(str(p), "is not a text file", "a JSON config.json") from None
    except OSError as e:
        raise InputError(str(p), f"cannot be read ({e.strerror})", "a readable config.json") from None
    except json.JSONDecodeError as e:
        raise InputError(
            str(p), f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", "a JSON config.json"
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(str(p), "holds JSON but not an object", "a config.json object")
    name = p.parent.name if p.name == "config.json" else p.stem
    if "snapshots" in p.parts and p.parent.parent.name == "snapshots":
        name = p.parent.parent.parent.name.removeprefix("models--").split("--")[-1]  # HF cache layout
    return cfg, name, str(p)


def load_model(arg: str | Path | dict) -> ModelSpec:
    cfg, name, source = load_config(arg)
    where = f"model config {source.split(':')[0]}"
    return spec_from_config(cfg, name, source, where)
