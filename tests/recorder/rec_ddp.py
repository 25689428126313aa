"""One rank of the two-process gloo/DDP test (run as a subprocess, RANK etc. in the env)."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from rec_helpers import batches, loss_fn, tiny_model
from torch.nn.parallel import DistributedDataParallel as DDP
from tracealyze.recorder import Recorder


def main() -> None:
    run_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    rank = dist.get_rank()
    model = DDP(tiny_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        # Rank 0 comes up last (ranks start at different times in real jobs): the others
        # must not invent their own run.
        time.sleep(1.0)
    data = batches(8, seed=10 + rank)  # different data per rank; DDP averages the grads
    with Recorder(run_dir, model=model, optimizer=opt, flush_interval_s=0.05,
                  system_interval_s=0, profile_start=0, preset="debug",
                  activation_stats_every=2, tensor_stats_every=2,
                  grad_stats_all_ranks=len(sys.argv) > 2 and sys.argv[2] == "all") as rec:
        for x, y in data[:4]:
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    grads = {n: float(p.grad.norm()) for n, p in model.module.named_parameters()}
    print("GRADS", rank, grads, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print("DONE", rank, os.getpid(), flush=True)


if __name__ == "__main__":
    main()
