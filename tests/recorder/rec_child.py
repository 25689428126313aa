"""A small training process for the crash, signal and resume tests (run as a subprocess).

Prints ``READY <next step>`` once the recorder is up and ``STEP <n> <epoch s>`` after every
recorded step, so the parent knows exactly what the recorder was handed before it died.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from rec_helpers import batches, loss_fn, tiny_model
from tracealyze.recorder import Recorder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--flush", type=float, default=0.2)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--no-merge", action="store_true")
    ap.add_argument("--mode", choices=["with", "raise_in_with", "raise_outside"],
                    default="with")
    args = ap.parse_args()

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(args.run_dir, model=model, optimizer=opt, resume=args.resume,
                   flush_interval_s=args.flush, system_interval_s=0, profile_start=0,
                   grad_norm_budget=0.0,  # every step has its norms, whatever the host load
                   merge_on_close=not args.no_merge)
    print("READY", rec.current_step, flush=True)
    data = batches(8)

    def loop() -> None:
        for i in range(args.steps):
            x, y = data[i % len(data)]
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            print("STEP", rec.current_step - 1, time.time(), flush=True)
            if args.mode != "with" and i == 2:
                raise RuntimeError("boom from the training loop")
            if args.sleep:
                time.sleep(args.sleep)

    if args.mode == "raise_outside":
        loop()  # the exception leaves the script: sys.excepthook path
    else:
        with rec:
            loop()
    print("DONE", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
