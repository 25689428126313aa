"""One rank of the FSDP2 test (run by torchrun, gloo on CPU): nanoGPT sharded with
``fully_shard`` per block and at the root, recorded; rank 0 also trains an unsharded copy on
the ranks' concatenated batches (the same gradients as the sharded model's mean over ranks)
and writes its per-parameter gradient norms, before clipping, to argv[2]."""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from torch.distributed.fsdp import fully_shard
from tracealyze.recorder import Recorder

from tests.matrix.models import NanoGPT, nanogpt_loss, token_batches

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = NanoGPT(0)
reference = copy.deepcopy(model) if rank == 0 else None
for block in model.transformer.h:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5) if reference is not None else None
draws = [token_batches(r, 4) for r in range(world)]
ref_norms = []
knobs = dict(system_interval_s=0, grad_norm_budget=0.0, flush_interval_s=0.05,
             profile_start=0, tensor_stats_every=2)
with Recorder(sys.argv[1], model=model, optimizer=opt, **knobs) as rec:
    for step in range(4):
        loss = nanogpt_loss(model, draws[rank](step))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        rec.step(loss=loss)
        if reference is not None:
            ref_loss = nanogpt_loss(reference, torch.cat([d(step) for d in draws]))
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_norms.append({n: float(p.grad.double().norm())
                              for n, p in reference.named_parameters()})
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
            ref_opt.step()
if rank == 0:
    Path(sys.argv[2]).write_text(json.dumps(ref_norms))
dist.destroy_process_group()
