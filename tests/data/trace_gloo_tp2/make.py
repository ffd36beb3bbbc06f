import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function


def main(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(1024, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for s in range(3):
            with record_function(f"ProfilerStep#{s}"):
                torch.mm(torch.ones(64, 64), torch.ones(64, 64))
                dist.all_reduce(x)
                g = [torch.empty(256) for _ in range(world)]
                dist.all_gather(g, torch.ones(256))
                dist.broadcast(x, 0)
    p.export_chrome_trace(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"gloo_rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(main, args=(2,), nprocs=2)
