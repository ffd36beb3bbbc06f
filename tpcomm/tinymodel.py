"""Tiny models generated locally (no model hub): random weights and a
byte-level BPE tokenizer trained on a few sentences.

- ``deepseek_v3`` (the default, the demo's model): MLA attention + MoE with a
  shared expert, layer 0 dense. Shapes follow what vLLM's CPU MLA backend
  accepts (kv_lora_rank + qk_rope_head_dim = 512 + 64, as the real models use)
  and the router keys that give the gate its `e_score_correction_bias`
  (`topk_method: noaux_tc`, `scoring_func: sigmoid`; `num_nextn_predict_layers: 0`).
- ``llama``: a dense Llama (grouped-query attention, SwiGLU MLP) of the same
  width and depth: a second architecture for the attribution tests.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tpcomm.rundir import safefs

MARKER = ".tpcomm-tiny-model"

# Units: sizes are element counts; the model is saved in bfloat16.
TINY_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "q_lora_rank": 128,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}

TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,  # head_dim 64: a size vLLM's CPU attention supports
    "num_key_value_heads": 2,  # one KV head per rank at TP 2
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}
ARCHITECTURES = ("deepseek_v3", "llama")

_CORPUS = [
    "tensor parallel inference splits every layer across several gpus",
    "each decode step issues an all reduce after attention and after the mlp",
    "the interconnect latency caps single stream tokens per second",
    "pcie cards without nvlink pay for every collective in microseconds",
    "the quick brown fox jumps over the lazy dog " * 3,
]


def generate(
    out_dir: str | Path, seed: int = 0, overwrite: bool = False, arch: str = "deepseek_v3", layers: int | None = None
) -> Path:
    """Write config.json, safetensors weights and a tokenizer into ``out_dir``.

    `layers`: decoder layers (default: the architecture's 4; the DeepSeek-V3 one needs 2 or more, its first
    layer dense and the rest MoE). Returns the folder. Skips work when a complete model of that architecture
    and depth is already there.
    """
    base = check(arch, layers)
    depth = "" if layers in (None, base["num_hidden_layers"]) else f", {layers} layers"
    out = Path(out_dir)
    marker = out / MARKER
    if marker.exists() and not overwrite:
        text = marker.read_text()
        # Markers written before the architecture option name none: those models are deepseek_v3.
        if f"({arch}{depth})" in text or (arch == "deepseek_v3" and not depth and "(" not in text):
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built in a private folder beside (0700, a random name: nobody can plant a link in it), then each file is
    # renamed into `out` (safefs: `out` a real folder; a link planted at a file's name is replaced, never
    # followed). transformers and tokenizers write their files themselves, so this is how they stay safe.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _build(tmp, seed, arch, layers or base["num_hidden_layers"], depth)
        _move_into(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check(arch: str, layers: int | None) -> dict:
    """The architecture's base config, or ValueError naming the input and what was expected."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"tiny model architecture {arch!r}: expected one of {', '.join(ARCHITECTURES)}")
    base = TINY_CONFIG if arch == "deepseek_v3" else TINY_LLAMA_CONFIG
    least = base.get("first_k_dense_replace", 0) + 1
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < least):
        raise ValueError(f"tiny model layers {layers!r}: expected an integer of at least {least} for {arch}")
    return base


def _move_into(src: Path, out: Path) -> None:
    """Every file of `src` renamed into `out`, the marker last (a model is complete once it is there); a marker
    already in `out` goes first, so that a rebuild cut short is never taken for the model it replaces."""
    names = sorted(os.listdir(src), key=lambda n: n == MARKER)
    sfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    dfd = safefs.open_dir(out.parent, [out.name])
    try:
        try:
            os.unlink(MARKER, dir_fd=dfd)
        except FileNotFoundError:
            pass
        mask = os.umask(0o022)
        os.umask(mask)
        for name in names:
            # as readable as the umask allows, like every file tpcomm writes (a library may have made it 0600)
            os.chmod(name, 0o666 & ~mask, dir_fd=sfd, follow_symlinks=False)
            os.replace(name, name, src_dir_fd=sfd, dst_dir_fd=dfd)
    finally:
        os.close(sfd)
        os.close(dfd)


def _build(out: Path, seed: int, arch: str, layers: int, depth: str) -> None:
    import torch

    marker = out / MARKER
    torch.manual_seed(seed)
    if arch == "llama":
        _generate_llama(out, marker, layers, depth)
        return
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    skip = ("architectures", "model_type", "torch_dtype")
    cfg = DeepseekV3Config(**{**{k: v for k, v in TINY_CONFIG.items() if k not in skip}, "num_hidden_layers": layers})
    model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Keys that transformers' config class drops but vLLM reads.
    conf = json.loads((out / "config.json").read_text())
    conf.update(
        {k: TINY_CONFIG[k] for k in ("topk_method", "scoring_func", "num_nextn_predict_layers", "architectures")}
    )
    conf["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    _write_tokenizer(out, TINY_CONFIG["vocab_size"])
    marker.write_text(f"generated by tpcomm.tinymodel (deepseek_v3{depth})\n")


def _generate_llama(out: Path, marker: Path, layers: int, depth: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    skip = ("architectures", "model_type", "torch_dtype")
    conf = {**{k: v for k, v in TINY_LLAMA_CONFIG.items() if k not in skip}, "num_hidden_layers": layers}
    model = LlamaForCausalLM(LlamaConfig(**conf))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    conf = json.loads((out / "config.json").read_text())
    conf.update(architectures=TINY_LLAMA_CONFIG["architectures"], torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    _write_tokenizer(out, TINY_LLAMA_CONFIG["vocab_size"])
    marker.write_text(f"generated by tpcomm.tinymodel (llama{depth})\n")
    return out


def _write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "model_max_length": TINY_CONFIG["max_position_embeddings"],
                "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:",
            },
            indent=2,
        )
    )
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))


def main(argv: list[str] | None = None) -> None:
    """`python -m tpcomm.tinymodel OUT_DIR [--arch llama]`: generate a tiny model (random weights, local tokenizer)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tpcomm.tinymodel", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="folder to write config.json, weights and tokenizer into")
    ap.add_argument("--arch", choices=ARCHITECTURES, default="deepseek_v3", help="architecture (default deepseek_v3)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4)")
    ap.add_argument("--overwrite", action="store_true", help="regenerate even if a tiny model is already there")
    a = ap.parse_args(argv)
    try:
        check(a.arch, a.layers)
    except ValueError as e:
        ap.error(str(e))
    print(generate(a.out_dir, seed=a.seed, overwrite=a.overwrite, arch=a.arch, layers=a.layers))


if __name__ == "__main__":
    main()
