"""Generated torch-profiler traces with the structure of a vLLM GPU worker's, for the trace import's benchmark
(benchmarks/bench_trace_import.py) and tests (tests/test_trace_scale.py). Not a fake of anything the tests
run: the input a GPU server would hand `tpcomm trace`, at a size and with answers known in advance.

What a vLLM 0.32 GPU worker's Kineto trace holds (profiler on, with_stack as vLLM's default):
- per `execute_model` a host `user_annotation` `execute_context_<n>(<tok>)_generation_<n>(<tok>)`
  (Worker.annotate_profile) and the same name as a `gpu_user_annotation` over the step's GPU work;
- a prefill step run eagerly: every kernel launched by a `cudaLaunchKernel` (`cuda_runtime`, correlation id)
  inside a `cpu_op`; its all-reduces under `vllm::all_reduce` > `record_param_comms` (Collective name,
  In msg nelems, dtype, Group size);
- decode steps replayed from a CUDA graph: one `cudaGraphLaunch` whose correlation id every kernel of the graph
  carries (CUPTI gives graph kernels the launch's correlation id), and no CPU op around any of them;
- async scheduling: the host range of step n+1 runs while the GPU still runs step n (the host stays one step
  ahead); `sample_tokens` after the range;
- `python_function` events (with_stack) several per kernel: most of the file;
- per layer two all-reduces, alternately NCCL (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`) and vLLM's custom
  all-reduce (`cross_device_reduce_1stage`), between compute kernels.

`truth` returned by `write_rank` is what the split must find, computed from the generated numbers directly.
Time: integer ns internally; the file holds Kineto's float microseconds with 3 decimals (exact).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

BASE_NS = 1_790_000_000_000_000_000  # baseTimeNanoseconds: a Unix time in 2026
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CUSTOM = (
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
    "__nv_bfloat16*, int, int)"
)
COMPUTE = (
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(Params)",
    "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, long, long, float, int)",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false>, true>(Params)",
    "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(c10::BFloat16*)",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::AddFunctor>>()",
    "void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, int)",
)


@dataclass
class Shape:
    layers: int = 61
    compute_per_layer: int = 6  # compute kernels per layer (2 all-reduces between them)
    py_per_kernel: int = 8  # python_function events per kernel on the host (with_stack)
    seqs: int = 8  # sequences per decode step
    compute_ns: int = 9_000
    ar_ns: int = 14_000  # an all-reduce's transfer (the fastest rank's duration)
    ar_wait_ns_per_rank: int = 2_000  # rank r's all-reduce lasts ar_ns + r * this (its wait)
    dev_idle_ns: int = 40_000  # GPU idle between two decode steps
    host_step_ns: int = 3_000_000  # host range of a decode step (shorter than its GPU work: the host runs ahead)
    prefill: bool = True  # step 0 eager (cudaLaunchKernel each), the rest graph-replayed decode steps
    graph_launches: bool = True  # False: the cudaGraphLaunch records are missing (the kernels have no launch)
    gpu_ranges: bool = True  # the gpu_user_annotation step ranges

    @property
    def kernels_per_step(self) -> int:
        return self.layers * (self.compute_per_layer + 2)

    @property
    def events_per_step(self) -> int:
        # kernels + python functions + step ranges (host, GPU) + sample_tokens + launch
        return self.kernels_per_step * (1 + self.py_per_kernel) + 4


def steps_for(events: int, shape: Shape) -> int:
    return max(3, events // shape.events_per_step)


def _ev(cat, name, tid, t0, dur, args="", pid=1) -> str:
    a = f', "args": {{{args}}}' if args else ""
    return (
        f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid}, '
        f'"ts": {t0 // 1000}.{t0 % 1000:03d}, "dur": {dur // 1000}.{dur % 1000:03d}{a}}}'
    )


def write_rank(path, rank: int, world: int, steps: int, shape: Shape | None = None, repeat: int = 1) -> dict:
    """One rank's gzipped trace of `steps` steps (the whole window written `repeat` times, each copy after the
    previous: the repeated-trace property). Returns the truth per decode step: span_ns, coll_ns, wait_ns,
    transfer_ns, and the gap to the next step, and the event count."""
    sh = shape or Shape()
    tid, stream = 1000 + rank, 7
    n_events = 0
    corr = 1_000_000  # a long-running server's CUDA correlation ids are large (HTA 0.5 + pandas 3 fail on small ones)
    truth: list[dict] = []
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],\n'
            f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}},\n'
            f'  "host_name": "gpu-node-0",\n  "traceEvents": [\n'
        )
        sep = ""
        host_t = 1_000_000 + 1_000 * rank  # ranks start a little apart
        gpu_end_prev = 0
        gpu_end_prevprev = 0
        for copy in range(repeat):
            for s in range(steps):
                step_no = copy * steps + s
                prefill = sh.prefill and s == 0
                name = (
                    f"execute_context_{sh.seqs}({sh.seqs * 16})_generation_0(0)"
                    if prefill
                    else f"execute_context_0(0)_generation_{sh.seqs}({sh.seqs})"
                )
                out = []
                # Async scheduling: the host starts step n+1 once the GPU finished step n-1.
                h0 = max(host_t, gpu_end_prevprev)
                h1 = h0 + sh.host_step_ns
                out.append(_ev("user_annotation", name, tid, h0, h1 - h0, f'"External id": {corr}'))
                gpu_t = max(h0 + sh.host_step_ns // 10 + 10_000, gpu_end_prev + sh.dev_idle_ns)  # after the launch
                g0 = gpu_t
                coll = wait = 0
                kernels = []
                for layer in range(sh.layers):
                    for j in range(sh.compute_per_layer + 2):
                        ar = j in (2, sh.compute_per_layer + 1)
                        if ar:
                            kn = NCCL if (layer + j) % 2 else CUSTOM
                            d = sh.ar_ns + rank * sh.ar_wait_ns_per_rank
                            coll += d
                            wait += rank * sh.ar_wait_ns_per_rank
                        else:
                            kn, d = COMPUTE[j % len(COMPUTE)], sh.compute_ns
                        kernels.append((kn, gpu_t, d, ar))
                        gpu_t += d + 1_000  # 1 us between kernels in the stream
                g1 = gpu_t - 1_000
                nk = len(kernels)
                # host: python functions spread over the range, then the launch(es)
                if prefill:
                    step = (h1 - h0) // 2 // max(nk, 1)
                    for q, (kn, t, d, ar) in enumerate(kernels):
                        c = corr + 1 + q
                        lt = h0 + sh.host_step_ns // 4 + q * step
                        if ar:
                            out.append(_ev("cpu_op", "vllm::all_reduce", tid, lt - 8_000, 12_000))
                            out.append(
                                _ev(
                                    "cpu_op",
                                    "record_param_comms",
                                    tid,
                                    lt - 6_000,
                                    9_000,
                                    f'"External id": {c}, "Collective name": "allreduce", "In msg nelems": 57344, '
                                    f'"dtype": "BFloat16", "Group size": {world}, "Process Group Name": "0"',
                                )
                            )
                        out.append(_ev("cuda_runtime", "cudaLaunchKernel", tid, lt, 3_000, f'"correlation": {c}'))
                        ka = f'"External id": {c}, "device": {rank}, "stream": {stream}, "correlation": {c}'
                        out.append(_ev("kernel", kn, stream, t, d, ka, pid=0))
                    corr += nk + 1
                else:
                    lt = h0 + sh.host_step_ns // 10
                    if sh.graph_launches:
                        out.append(_ev("cuda_runtime", "cudaGraphLaunch", tid, lt, 20_000, f'"correlation": {corr}'))
                    for q, (kn, t, d, _) in enumerate(kernels):
                        ka = (
                            f'"device": {rank}, "stream": {stream}, "correlation": {corr}, "graph id": 1, '
                            f'"graph node id": {q + 1}'
                        )
                        out.append(_ev("kernel", kn, stream, t, d, ka, pid=0))
                    corr += 1
                if sh.gpu_ranges:
                    out.append(_ev("gpu_user_annotation", name, stream, g0, g1 - g0, pid=0))
                pstep = (h1 - h0) // max(nk * sh.py_per_kernel, 1)
                for q in range(nk * sh.py_per_kernel):
                    out.append(
                        _ev(
                            "python_function",
                            f"vllm/model_executor/layers/linear.py(4{q % 97}): forward",
                            tid,
                            h0 + q * pstep,
                            max(pstep - 100, 1),
                        )
                    )
                out.append(_ev("cpu_op", "sample_tokens", tid, h1 + 5_000, 100_000))
                f.write(sep + ",\n".join(out))
                sep = ",\n"
                n_events += len(out)
                truth.append(
                    {
                        "step": step_no,
                        "kind": "prefill" if prefill else "decode",
                        "span_ns": g1 - g0,
                        "coll_ns": coll,
                        "wait_ns": wait,
                        "g0": g0,
                        "g1": g1,
                        "n_coll": 2 * sh.layers,
                    }
                )
                host_t = h1 + 120_000
                gpu_end_prevprev, gpu_end_prev = gpu_end_prev, g1
        f.write(f'\n  ],\n  "traceName": "rank{rank}",\n  "baseTimeNanoseconds": {BASE_NS}\n}}\n')
    for a, b in zip(truth, truth[1:], strict=False):
        a["next_g0"] = b["g0"]
    return {"steps": truth, "events": n_events}


def expected_split(truths: dict[int, dict], shape: Shape) -> dict:
    """The per-token split (ms) computed by hand from the generated numbers: per rank, over pairs of consecutive
    decode steps, span / collective / wait / device idle to the next step; transfer = the fastest rank's
    all-reduce time (rank 0's); then the mean over ranks."""
    per = {}
    for r, t in truths.items():
        pairs = [x for x, y in zip(t["steps"], t["steps"][1:], strict=False) if x["kind"] == y["kind"] == "decode"]
        n = len(pairs)
        span = sum(x["span_ns"] for x in pairs) / n
        wait = sum(x["wait_ns"] for x in pairs) / n
        coll = sum(x["coll_ns"] for x in pairs) / n
        gap = sum(x["next_g0"] - x["g1"] for x in pairs) / n
        per[r] = {
            "compute": (span - coll) / 1e6,
            "transfer": (coll - wait) / 1e6,
            "wait": wait / 1e6,
            "host_gap": gap / 1e6,
        }
    return {k: sum(p[k] for p in per.values()) / len(per) for k in ("compute", "transfer", "wait", "host_gap")}
