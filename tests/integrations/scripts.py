"""Training scripts that know nothing of tracealyze, for ``tracealyze record``. Each writes
the values its training step computed (the reference) to the JSON file named by its first
argument."""

PLAIN = '''
import json, sys, torch
sys.path.insert(0, {root!r})
from tests.matrix.models import MODELS

spec = MODELS[sys.argv[3] if len(sys.argv) > 3 else "nanogpt"]
model = spec.build(0)
opt = spec.optimizer(model, spec.lr * 3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
draw = spec.data(0)
batches = [draw(i) for i in range(6)]
loader = torch.utils.data.DataLoader(batches, batch_size=None)
ref = []
for batch in loader:
    loss = spec.loss(model, batch)
    opt.zero_grad()
    loss.backward()
    norms = {{n: float(p.grad.double().norm()) for n, p in model.named_parameters()
             if p.grad is not None}}
    ref.append({{"loss": float(loss), "lr": opt.param_groups[0]["lr"], "norms": norms}})
    opt.step()
    sched.step()
    with torch.no_grad():  # an evaluation pass: not a step
        for b in torch.utils.data.DataLoader(batches[:2], batch_size=None):
            spec.loss(model, b)
json.dump(ref, open(sys.argv[1], "w"))
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
'''

HF = '''
import json, sys, torch, transformers
sys.path.insert(0, {root!r})
from tests.matrix.models import hf_gpt2, token_batches

draw = token_batches(0, 1)
rows = [draw(i)[0] for i in range(48)]
ds = [{{"input_ids": r, "labels": r}} for r in rows]
args = transformers.TrainingArguments(
    output_dir=sys.argv[2], max_steps=6, per_device_train_batch_size=4,
    gradient_accumulation_steps=2, learning_rate=2e-3, max_grad_norm=0.5, logging_steps=1,
    report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
trainer = transformers.Trainer(model=hf_gpt2(0), args=args, train_dataset=ds)
trainer.train()
json.dump([h for h in trainer.state.log_history if "loss" in h], open(sys.argv[1], "w"))
'''

LIGHTNING = '''
import json, sys, torch
import lightning.pytorch as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.ref = []

    def training_step(self, batch, i):
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.ref.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
module = Tiny()
L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False,
          default_root_dir=sys.argv[2]).fit(module, torch.utils.data.DataLoader(data, batch_size=8))
json.dump(module.ref, open(sys.argv[1], "w"))
'''

DDP = '''
import os, sys, torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                          nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(5):
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 1, generator=g)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
dist.destroy_process_group()
'''

SLEEPER = '''
import sys, time, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
print("READY", flush=True)
time.sleep(60)
'''
