"""The collectives vLLM 0.32 issues per decode step, derived from its model code.

Units: `bytes` is the per-rank input buffer of one call (for all_gather the
output is bytes * group size); `count` is calls per decode step on one rank of
that pipeline stage. B = decode batch (sequences, one token each).

Where each one comes from (vLLM 0.32.0, vllm/model_executor/...):
- embedding: VocabParallelEmbedding.forward all-reduces its [B, hidden] output
  over TP (layers/vocab_parallel_embedding.py, reduce_results=True).
- attention: o_proj is a RowParallelLinear with reduce_results=True
  (models/deepseek_v2.py DeepseekV2MLAAttention, llama.py, qwen3.py, ...):
  one [B, hidden] all-reduce per layer. MLA's q_a/kv_a projections are
  replicated, so they need none.
- dense MLP: down_proj is RowParallelLinear(reduce_results=True): one all-reduce.
- MoE (TP, or EP with DP=1): shared experts run with reduce_results=False and
  the routed + shared sum is all-reduced once, late, in
  layers/fused_moe/runner/moe_runner.py (_maybe_reduce_final_output).
- MoE with DP>1 and EP (default all2all backend allgather_reducescatter,
  device_communicators/all2all.py AgRsAll2AllManager): dispatch all_gatherv of
  [hidden_states, router_logits] and combine reduce_scatterv over the DP group,
  plus one DP step-sync all-reduce of an int32 [4, dp] tensor
  (v1/worker/dp_utils.py _run_ar).
- logits: LogitsProcessor._gather_logits all-gathers [B, vocab/tp] (every
  platform's use_all_gather() is True in 0.32).
- PP: each stage boundary sends hidden_states and residual [B, hidden] split
  over TP in one isend_tensor_dict(all_gather_group=tp) call (v1/worker/gpu_worker.py;
  one send_recv of both tensors' bytes, as the hook records the call), then the
  next stage all-gathers them over TP.
- DCP (MLA decode, models/../attention/mla_attention.py + v1/attention/ops/dcp.py
  cp_lse_ag_out_rs): per layer the query is all-gathered over DCP, the LSE
  all-gathered and the output reduce-scattered.
- Families added in issue 19 issue the same per-layer pattern (read from their
  model files): qwen3_5.py (Qwen3-Next/3.5/3.6) all-reduces the Gated DeltaNet
  out_proj (RowParallelLinear, layers/mamba/gdn/qwen_gdn_linear_attn.py) or the
  gated attention's o_proj once per layer, and the MoE block (routed + shared
  expert) once, late; with sequence-parallel MoE it reduce-scatters like
  DeepSeek (use_attn_reduce_scatter_for_moe). qwen2_moe.py: shared expert with
  reduce_results=False, summed into the one late MoE all-reduce. gemma3.py /
  gemma4.py / mistral.py (llama.py): o_proj and down_proj row-parallel;
  sliding-window layers change the KV read, not the collectives.
  gpt_oss.py: o_proj row-parallel, the MoE (FusedMoE, router replicated)
  reduced once, late.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpcomm.models.spec import ModelSpec
from tpcomm.plan.layout import Layout, padded_vocab, pp_partition

VLLM_VERSION_FOLLOWED = "0.32.0"
# The collectives of the vocabulary sharded over TP (an engine that replicates the lm_head issues neither).
EMBED_SITE = "model.embed_tokens"
LOGITS_SITE = "logits_processor (lm_head vocab shards)"


@dataclass(frozen=True)
class Collective:
    op: str  # all_reduce, all_gather, gather, reduce_scatter, all_to_all, send_recv
    group: str  # tp, ep, dp, pp, dcp
    group_size: int
    bytes: int  # per rank per call (input buffer)
    count: int  # calls per decode step (per rank of the stage)
    batch: int
    dtype: str
    site: str  # e.g. model.layers.*.self_attn.o_proj
    pp_stage: int | None = None
    note: str = ""
    # Which vLLM code path issues it: GroupCoordinator, or FlashInfer's fused all-reduce + RMSNorm kernel
    # (SM 9.0/10.x, see tpcomm/topo/fusion.py); the bytes moved are the same either way.
    path: str = "group_coordinator"
    fused: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def decode_collectives(m: ModelSpec, lay: Layout, batch: int) -> list[Collective]:
    """Every distinct collective of one decode step at batch `batch`, all pipeline stages."""
    out: list[Collective] = []
    act = batch * m.hidden_size * m.dtype_bytes  # one [B, hidden] activation
    dt = m.dtype
    parts = pp_partition(m.num_layers, lay.pp)
    start = 0
    for stage, n in enumerate(parts):
        layers = range(start, start + n)
        start += n
        st = stage if lay.pp > 1 else None

        def add(op, group, size, nbytes, count, site, note="", dtype=dt):
            if count > 0 and size > 1:
                out.append(Collective(op, group, size, int(nbytes), int(count), batch, dtype, site, st, note))

        tp = lay.tp
        if stage == 0:
            add("all_reduce", "tp", tp, act, 1, EMBED_SITE, "VocabParallelEmbedding output")
        moe_set = set(m.moe_layers)
        n_moe = sum(1 for i in layers if i in moe_set)
        n_dense = n - n_moe
        sp_moe = lay.ep and lay.dp > 1 and tp > 1  # vLLM's use_sequence_parallel_moe
        if lay.dcp > 1:
            heads_local = m.num_heads // tp * lay.dcp
            add(
                "all_gather",
                "dcp",
                lay.dcp,
                batch * (m.num_heads // tp) * (m.kv_lora_rank + m.qk_rope_head_dim) * m.dtype_bytes,
                n,
                "model.layers.*.self_attn (DCP query gather)",
            )
            add(
                "all_gather",
                "dcp",
                lay.dcp,
                batch * heads_local * 4,
                n,
                "model.layers.*.self_attn (DCP LSE gather)",
                dtype="float32",
            )
            add(
                "reduce_scatter",
                "dcp",
                lay.dcp,
                batch * heads_local * m.kv_lora_rank * m.dtype_bytes,
                n,
                "model.layers.*.self_attn (DCP output combine)",
            )
        if sp_moe and m.family not in ("deepseek_v2", "qwen3_5"):
            # qwen3_moe & co: attention keeps its all-reduce; the MoE input is chunked (no comm) and its output all-gathered.
            add(
                "all_reduce",
                "tp",
                tp,
                act,
                n,
                "model.layers.*.self_attn.o_proj",
                "RowParallelLinear(reduce_results=True)",
            )
            add(
                "all_gather",
                "tp",
                tp,
                _pad(batch, tp) // tp * m.hidden_size * m.dtype_bytes,
                n_moe,
                "model.layers.*.mlp (sequence-parallel MoE output)",
            )
        elif sp_moe:
            # DeepSeek: o_proj unreduced, reduce-scattered over TP, all-gathered back before attention.
            add(
                "all_reduce",
                "tp",
                tp,
                act,
                n - n_moe,
                "model.layers.*.self_attn.o_proj",
                "dense layers keep the all-reduce",
            )
            add(
                "reduce_scatter",
                "tp",
                tp,
                _pad(batch, tp) * m.hidden_size * m.dtype_bytes,
                n_moe,
                "model.layers.*.self_attn.o_proj (sequence-parallel MoE)",
            )
            add(
                "all_gather",
                "tp",
                tp,
                _pad(batch, tp) // tp * m.hidden_size * m.dtype_bytes,
                n_moe,
                "model.layers.*.mlp (sequence-parallel MoE output)",
            )
        else:
            add(
                "all_reduce",
                "tp",
                tp,
                act,
                n,
                "model.layers.*.self_attn.o_proj",
                "RowParallelLinear(reduce_results=True)",
            )
        if m.dense_layers:
            add("all_reduce", "tp", tp, act, n_dense, "model.layers.*.mlp.down_proj", "dense MLP, RowParallelLinear")
        if m.is_moe and n_moe:
            if lay.dp > 1 and lay.ep:
                grp, size = ("ep", lay.ep_size) if sp_moe else ("dp", lay.dp)
                tokens = _pad(batch, tp) // tp if sp_moe else batch
                router_bytes = tokens * m.n_routed_experts * 4  # router logits, float32 for DeepSeek-style gates
                add(
                    "all_gather",
                    grp,
                    size,
                    tokens * m.hidden_size * m.dtype_bytes + router_bytes,
                    n_moe,
                    "model.layers.*.mlp.experts (dispatch: hidden + router logits)",
                    "all_gatherv, allgather_reducescatter backend",
                )
                add(
                    "reduce_scatter",
                    grp,
                    size,
                    tokens * size * m.hidden_size * m.dtype_bytes,
                    n_moe,
                    "model.layers.*.mlp.experts (combine)",
                    "reduce_scatterv, allgather_reducescatter backend",
                )
            else:
                label = "routed + shared experts" if m.n_shared_experts else "routed experts"
                add(
                    "all_reduce",
                    "tp",
                    tp,
                    act,
                    n_moe,
                    "model.layers.*.mlp.experts",
                    f"one late all-reduce of {label}" + (" (EP with DP=1 keeps the all-reduce)" if lay.ep else ""),
                )
        if stage == lay.pp - 1:
            add(
                "all_gather",
                "tp",
                tp,
                batch * (padded_vocab(m.vocab_size) // tp) * m.dtype_bytes,
                1,
                LOGITS_SITE,
                "LogitsProcessor._gather_logits",
            )
        if stage < lay.pp - 1:
            per = act // tp if (tp > 1 and act % tp == 0) else act
            # One isend_tensor_dict per boundary carrying both tensors (gpu_worker.py): one call, their bytes together.
            add(
                "send_recv",
                "pp",
                2,
                2 * per,
                1,
                "pipeline boundary (isend_tensor_dict: hidden_states + residual)",
                f"stage {stage} -> {stage + 1}",
            )
            if tp > 1 and act % tp == 0:
                out.append(
                    Collective(
                        "all_gather",
                        "tp",
                        tp,
                        per,
                        2,
                        batch,
                        dt,
                        "pipeline boundary (receiver re-assembles TP slices)",
                        stage + 1,
                        "isend_tensor_dict(all_gather_group=tp)",
                    )
                )
    if lay.dp > 1:
        out.append(
            Collective(
                "all_reduce",
                "dp",
                lay.dp,
                16 * lay.dp,
                1,
                batch,
                "int32",
                "dp step sync (dp_utils._run_ar)",
                None,
                "CPU gloo or device all-reduce of batch padding metadata",
            )
        )
    return out


def _pad(b: int, n: int) -> int:
    return b + (-b) % n
