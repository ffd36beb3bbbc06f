"""Which modules a checkpoint quantizes, and how many bits each weight costs.

Units: bits per weight *including* scale overhead (e.g. INT4 with a BF16 scale
per 32 weights = 4 + 16/32 = 4.5 bits). Module names follow Hugging Face /
vLLM naming (`model.layers.3.mlp.experts.7.down_proj`).

Recognised `quantization_config` formats: compressed-tensors (config_groups +
ignore, `re:` regexes), ModelOpt (NVFP4/FP8, `ignore` or `exclude_modules`
globs), block FP8 (`quant_method: fp8`, DeepSeek style: every Linear except the
router and lm_head), AWQ and GPTQ (AutoAWQ / AutoGPTQ / GPTQModel checkpoints:
`bits`, `group_size`, `modules_to_not_convert`; every decoder Linear but the
router and lm_head), MXFP4 (`quant_method: mxfp4`, GPT-OSS: the experts only),
and none (the model dtype).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from tpcomm.errors import InputError

_DTYPE_BITS = {
    "bfloat16": 16,
    "float16": 16,
    "half": 16,
    "float32": 32,
    "float": 32,
    "float8_e4m3fn": 8,
    "float8_e8m0fnu": 8,
    "fp8": 8,
    "e4m3": 8,
}


def dtype_bits(name: str | None, default: int = 16) -> int:
    return _DTYPE_BITS.get(str(name).lower(), default) if name else default


@dataclass(frozen=True)
class QuantScheme:
    """Bits per weight for quantized Linear modules; everything else stays in `base_bits`."""

    method: str = "none"
    weight_bits: float = 16.0  # incl. scale overhead, for quantized modules
    base_bits: float = 16.0  # the model dtype, for everything not quantized
    activations: str = "unquantized"  # e.g. "fp4 (W4A4)"
    ignore: tuple[str, ...] = ()  # patterns: "re:<regex>", globs, or exact names
    router_quantized: bool = False
    description: str = "unquantized"
    notes: tuple[str, ...] = field(default=())

    def bits_for(self, module: str, linear: bool = True) -> float:
        """Bits per weight of `module` (a representative name such as model.layers.1.mlp.experts.0.up_proj)."""
        if self.method == "none" or not linear or self._ignored(module):
            return self.base_bits
        return self.weight_bits

    def _ignored(self, module: str) -> bool:
        names = (module, "language_model." + module, "model.language_model." + module.removeprefix("model."))
        for pat in self.ignore:
            for name in names:
                if pat.startswith("re:"):
                    if re.match(pat[3:], name):
                        return True
                elif any(c in pat for c in "*?["):
                    # A glob names a module or a prefix of it ("model.layers.*.self_attn" covers its q/k/v/o).
                    if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, pat + ".*"):
                        return True
                elif name == pat or name.endswith("." + pat):
                    return True
        return False


def parse_quantization(qc: dict | None, base_bits: float, where: str) -> QuantScheme:
    """Turn a config's `quantization_config` into a QuantScheme (see module docstring)."""
    if not qc:
        return QuantScheme(base_bits=base_bits, weight_bits=base_bits, description=f"unquantized ({base_bits:g}-bit)")
    if not isinstance(qc, dict):
        raise InputError(where, "quantization_config is not an object", "a JSON object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block:
            bits = 8 + 32 / (block[0] * block[1])  # one FP32 scale per block
            desc = f"FP8 E4M3, block {block[0]}x{block[1]} FP32 scales ({bits:.3f} bits/weight), every Linear but router and lm_head"
        else:
            bits = 8.0
            desc = "FP8 E4M3 per-tensor/channel (8 bits/weight), every Linear but router and lm_head"
        ignore = ("lm_head",) + tuple(qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ())
        return QuantScheme("fp8", bits, base_bits, "fp8 dynamic", ignore, False, desc)
    if method in ("compressed-tensors", "modelopt"):
        groups = qc.get("config_groups") or {}
        if method == "modelopt" and not groups:
            algo = str(qc.get("quant_algo", "")).upper()
            gs = int(qc.get("group_size", 16))
            if algo == "NVFP4":
                groups = {
                    "g": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 4, "type": "float", "group_size": gs, "scale_dtype": "float8_e4m3fn"},
                        "input_activations": {"num_bits": 4, "type": "float"},
                    }
                }
            elif algo == "FP8":
                groups = {
                    "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
                }
            else:
                raise InputError(where, f"unsupported ModelOpt quant_algo {algo!r}", "NVFP4 or FP8")
        if not groups:
            raise InputError(
                where, f"{method} quantization_config has no config_groups", "config_groups with weights.num_bits"
            )
        if len(groups) > 1:
            notes = (f"{len(groups)} config groups: the first one's bits are used for every quantized Linear",)
        else:
            notes = ()
        g = next(iter(groups.values()))
        w = g.get("weights") or {}
        if "num_bits" not in w:
            raise InputError(where, "quantization config group has no weights.num_bits", "an integer bit width")
        nb = float(w["num_bits"])
        gsz = w.get("group_size")
        strategy = w.get("strategy") or ("group" if gsz else "tensor")
        default_scale = "float8_e4m3fn" if (w.get("type") == "float" and nb == 4) else "bfloat16"
        sbits = dtype_bits(w.get("scale_dtype") or default_scale)
        bits = nb + (sbits / gsz if strategy == "group" and gsz else 0.0)
        if strategy == "group" and gsz and w.get("symmetric") is False:
            bits += nb / gsz  # a zero point per group
        kind = "FP" if w.get("type") == "float" else "INT"
        a = g.get("input_activations")
        acts = (
            f"{kind.lower()}{int(a['num_bits'])} (W{int(nb)}A{int(a['num_bits'])})"
            if a
            else "unquantized (weight-only)"
        )
        ignore = tuple(qc.get("ignore") or qc.get("exclude_modules") or ())
        scale_txt = f", a {w.get('scale_dtype') or default_scale} scale per {gsz}" if gsz else ""
        desc = f"{kind}{int(nb)}{scale_txt} = {bits:g} bits/weight ({method}); activations {acts}"
        return QuantScheme(method, bits, base_bits, acts, ignore, False, desc, notes)
    if method in ("awq", "gptq"):
        return _int_group(qc, method, base_bits, where)
    if method == "mxfp4":
        # OCP MX: E2M1 weights, one E8M0 scale per 32 (4 + 8/32 bits). GPT-OSS quantizes the experts only
        # (modules_to_not_convert: attention, router, embeddings, lm_head).
        ignore = tuple(qc.get("modules_to_not_convert") or ("self_attn", "router", "embed_tokens", "lm_head"))
        desc = "MXFP4, an E8M0 scale per 32 = 4.25 bits/weight (mxfp4); activations unquantized (weight-only)"
        return QuantScheme("mxfp4", 4.25, base_bits, "unquantized (weight-only)", ignore, False, desc)
    raise InputError(
        where,
        f"unsupported quant_method {method!r}",
        "compressed-tensors, modelopt, fp8, awq, gptq, mxfp4, or no quantization_config",
    )


def _int_group(qc: dict, method: str, base_bits: float, where: str) -> QuantScheme:
    """AWQ / GPTQ: integer weights, an FP16 scale and a packed zero point per group of `group_size` inputs."""
    try:
        nb = int(qc.get("bits", qc.get("w_bit", 4)))
        gsz = int(qc.get("group_size", qc.get("q_group_size", 128)))
    except (TypeError, ValueError):
        raise InputError(where, f"{method} bits/group_size are not integers", "e.g. bits 4, group_size 128") from None
    if nb not in (2, 3, 4, 8) or gsz == 0:
        raise InputError(where, f"{method} has bits {nb}, group_size {gsz}", "bits 2/3/4/8 and a group_size")
    per = gsz if gsz > 0 else None  # group_size -1: one scale per output channel
    bits = nb + (
        (16 + nb) / per if per else 0.0
    )  # FP16 scale + a packed zero point per group (GPTQ stores qzeros always)
    ignore = tuple(qc.get("modules_to_not_convert") or ()) + ("lm_head",)
    desc = f"INT{nb}, an fp16 scale and zero point per {gsz if per else 'channel'} = {bits:.3g} bits/weight ({method}); activations unquantized (weight-only)"
    return QuantScheme(method, bits, base_bits, "unquantized (weight-only)", ignore, False, desc)
