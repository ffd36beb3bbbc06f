"""vLLM's FlashInfer PCIe IPC all-reduce as a probe backend (opt-in in vLLM:
VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1; world sizes 2/4/8 on one PCIe node,
bf16/fp16, inputs shaped [tokens, hidden]). Built the way vLLM's CudaCommunicator
builds it (device_communicators/flashinfer_pcie_ipc_all_reduce.py): the wrapper,
then setup() with the hidden size and the decode batch as the only capture size,
which tunes the kernel against the group, then capture() around graph capture.
Other ops go elsewhere in vLLM (the replay routes them to PyNccl).
"""

from __future__ import annotations

import os
import tempfile

import torch

from probes.backends import Ineligible, NcclBackend, _vllm_cuda_setup


class FlashInferIpcBackend(NcclBackend):
    name = "flashinfer-ipc"
    ops = ("all_reduce",)

    def __init__(self, cpu_group, local_rank, hidden: int, batch: int, dtype=torch.bfloat16):
        mod = _vllm_cuda_setup(
            self,
            cpu_group,
            local_rank,
            "vllm.distributed.device_communicators.flashinfer_pcie_ipc_all_reduce",
            "FlashInfer PCIe IPC all-reduce",
        )
        if not mod._pcie_ipc_available:
            raise Ineligible("this FlashInfer build has no PcieIpcAllReduceWorkspace (or FlashInfer is not installed)")
        if self.world not in mod._SUPPORTED_WORLD_SIZES:
            raise Ineligible(f"world size {self.world} not in {mod._SUPPORTED_WORLD_SIZES}")
        self.hidden = hidden
        # vLLM passes a device (NCCL) group and a CPU tune group; the workspace exchanges IPC handles over the first.

        self.dev_group = self._group("nccl")
        self.comm = mod.FlashInferPcieIpcAllReduce(group=self.dev_group, tune_group=self.group, device=self.device)
        if self.comm.disabled:
            raise Ineligible(
                "vLLM's FlashInferPcieIpcAllReduce disabled itself (not CUDA, or ranks on several nodes; see its log)"
            )
        cache = os.path.join(tempfile.gettempdir(), f"tpcomm-fi-pcie-ipc-tp{self.world}-h{hidden}.json")
        self.comm.setup(hidden_dim=hidden, dtype=dtype, capture_sizes=[batch], tune_cache=cache)
        if self.comm.disabled or not self.comm.initialized:
            raise Ineligible(
                f"FlashInfer PCIe IPC all-reduce did not initialise for dtype {dtype} (vLLM's setup refused)"
            )

    # Not FlashInfer's own all-reduce: its workspace is prepared for [batch, hidden] inputs only
    # (setup's capture sizes; should_use() refuses other shapes), so no tiny op exists on its path.
    # The NCCL group built above (the group vLLM hands it) lines the devices up the way NcclBackend does.
    # (NcclBackend.lineup would use self.group, which here is the gloo tune group.)
    lineup_name = "tiny nccl all_reduce on FlashInfer's device group (device stream)"

    def lineup(self, ctrl):
        import torch.distributed as dist

        dist.all_reduce(self._tiny(), group=self.dev_group)

    def run(self, op, b):
        x = b.inp.view(-1, self.hidden)
        if not self.comm.should_use(x):
            raise Ineligible(f"vLLM's should_use() refuses a {tuple(x.shape)} {x.dtype} input (hidden {self.hidden})")
        return self.comm.all_reduce(x)

    def capture(self):
        return self.comm.capture()

    def _close_comm(self):
        comm = self.__dict__.pop("comm", None)
        if comm is not None:
            comm.destroy()  # vLLM's: frees FlashInfer's IPC workspace
