"""Where a NaN made in the *backward* pass comes from (debug preset, with the forward NaN
probes): the gradient of ``sqrt`` or ``log`` at 0, a custom ``autograd.Function`` with a bad
backward, the norm of a zero vector, a loss whose value is finite but whose gradient is not.
Forward probes see only finite values there.

In each probed module's forward hook, a tensor hook goes on its output and on its input
(once per tensor: a module's input is usually the output of the module before it). Tensor
hooks do not change the graph (module backward hooks wrap the module's inputs and outputs,
and in-place ops on those then fail). A tensor's hook receives the gradient of that tensor,
which the backward of the module that *consumed* it (the one whose input it is) produced.

Batched, as the forward probes are: a hook only keeps a reference to the gradient, in the
order autograd fires them; the kept gradients are reduced together (one ``_foreach_norm``
per dtype, float32 norms left on the device, NaN/Inf propagate, no host sync) when the
backward pass ends (a callback queued on autograd's engine), or earlier once
``MAX_HELD`` gradients or :func:`held_limit` bytes are kept. One norm launch per probed module
cost GPT-2 small +31% on an H200 (launch-bound); this is a few launches per backward. The
bound is memory: a kept gradient would otherwise be freed as backward moves on, so no more
than :func:`held_limit` bytes of them are held at once. The step's norms are joined at commit and
read on the writer thread.

The origin, in firing order (backward runs from the loss towards the input): the first
nonfinite gradient was made by its tensor's consumer module, whose own output's gradient
was finite (direction ``backward``). A hook sees the sum of the gradients of every consumer
of its tensor: a tensor that is also an ancestor module's input may have been made
nonfinite by plain code there, so that ancestor is named (it holds the origin either way);
when no probed module consumed it, by plain code: the loss's backward for the model's
output, else the forward code of the producer's parent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .stats import norms

MODEL_OUTPUT = "<output>"
"""The role label of the forward pass's last module output (the model's output)."""
MAX_HELD = 256
"""Gradients kept before they are reduced (launches a backward: ~probes / MAX_HELD)."""
MAX_HELD_BYTES = 64 << 20
"""Bytes of gradients kept alive past their use before they are reduced, at least: the memory
the batching may add to the backward's peak (host memory, and any device's floor)."""
DEVICE_SHARE = 0.02
"""On a GPU the bound is this share of the device's memory when that is more than
``MAX_HELD_BYTES``. A fixed 64 MiB flushed GPT-2 small's backward 52 times a step on an H200
(its activation gradients are 12-50 MB each: two or three a flush, each flush a reduction
and a stack, +20 ms a step); 2% of the device (2.8 GB there, 1.6 GB on an 80 GB card) takes
it in one or two. 2% is below the step-to-step spread of a training process's own reserved
memory (the caching allocator's rounding and fragmentation), and the preset that probes
backward is the one a user runs to find a NaN, not the one left on at the edge of memory."""

_held_limit: dict[Any, int] = {}


def held_limit(device: torch.device) -> int:
    """Bytes of gradients kept on ``device`` before they are reduced (see DEVICE_SHARE)."""
    limit = _held_limit.get(device)
    if limit is None:
        limit = MAX_HELD_BYTES
        if device.type == "cuda":
            try:  # host-side properties, cached by torch: no device work
                total = torch.cuda.get_device_properties(device).total_memory
                limit = max(limit, int(total * DEVICE_SHARE))
            except Exception:
                pass
        limit = _held_limit[device] = limit
    return limit


class GradProbes:
    """The tensor hooks of one forward pass (``acc_of()``: the step they report to)."""

    def __init__(self, acc_of: Callable[[], Any]) -> None:
        self.acc_of = acc_of
        self.roles: dict[int, list[str]] = {}  # id(tensor) -> ["out:<mod>", "in:<mod>"]
        self.last_out: int | None = None

    def module_called(self, name: str, out: torch.Tensor | None,
                      inp: torch.Tensor | None) -> None:
        if out is not None:
            self._role(out, f"out:{name}")
            self.last_out = id(out) if _hookable(out) else self.last_out
        if inp is not None:
            self._role(inp, f"in:{name}")

    def forward_ended(self) -> None:
        """The last output of the pass is the model's (the loss consumes it)."""
        if self.last_out is not None and self.last_out in self.roles:
            self.roles[self.last_out].append(MODEL_OUTPUT)
        self.roles, self.last_out = {}, None  # (the hooks keep their own role lists)

    def _role(self, t: torch.Tensor, role: str) -> None:
        if not _hookable(t):
            return
        roles = self.roles.get(id(t))
        if roles is None:
            roles = self.roles[id(t)] = []
            t.register_hook(_probe(self.acc_of, roles))
        roles.append(role)


def _hookable(t: torch.Tensor) -> bool:
    return t.requires_grad and t.is_floating_point()


def _probe(acc_of: Callable[[], Any], roles: list[str]) -> Callable[[torch.Tensor], None]:
    def hook(grad: torch.Tensor) -> None:
        try:
            acc = acc_of()
            held = acc.grad_held
            if not held:  # the first of this backward: reduce the rest when it ends
                _at_backward_end(lambda: flush(acc))
            held.append(("|".join(roles), grad))
            acc.grad_held_bytes += grad.numel() * grad.element_size()
            if len(held) >= MAX_HELD or acc.grad_held_bytes >= held_limit(grad.device):
                flush(acc)
        except Exception:  # a probe must never break the user's backward
            pass
    return hook


def _at_backward_end(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the running backward pass ends (DDP and FSDP use the same call).
    Where the engine cannot take it, the step's commit reduces what is kept (join_pieces)."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(fn)
    except Exception:
        pass


def flush(acc: Any) -> None:
    """Reduce the gradients ``acc`` keeps into one block of norms (firing order) and drop
    them. One ``_foreach_norm`` per dtype and device, then one stack: no host sync."""
    held, acc.grad_held, acc.grad_held_bytes = acc.grad_held, [], 0
    if not held:
        return
    labels = tuple(label for label, _ in held)
    grads = [g for _, g in held]
    with torch.no_grad():
        first = grads[0]
        if all(g.dtype == first.dtype and g.device == first.device for g in grads):
            # the usual case, one dtype on one device: one fused reduction, in order
            acc.grad_probes.append((labels, norms(grads)))
            return
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, g in enumerate(grads):
            groups.setdefault((g.device, g.dtype), []).append(i)
        out: list[Any] = [None] * len(grads)
        for (dev, dtype), idx in groups.items():
            # one fused reduction per dtype and device, its values put back in firing order
            # (a model split over devices: non-blocking copies to the first one)
            ts = [grads[i] for i in idx]
            vals = ([v.float() for v in torch._foreach_norm(ts, 2)]
                    if dtype in (torch.float64, torch.complex128)
                    else torch._foreach_norm(ts, 2, dtype=torch.float32))
            for i, v in zip(idx, vals, strict=True):
                out[i] = v if dev == first.device else v.to(first.device, non_blocking=True)
        acc.grad_probes.append((labels, torch.stack(out)))


def origin(labels: tuple[str, ...], bad: Any) -> tuple[str, str] | None:
    """(subject, how) of a step's first nonfinite gradient, from its probes in firing order
    (``labels[i]``: the roles of probe i's tensor; ``bad[i]``: its gradient nonfinite)."""
    finite_out: set[str] = set()
    for label, b in zip(labels, bad, strict=True):
        roles = label.split("|")
        outs = [r[4:] for r in roles if r.startswith("out:")]
        ins = [r[3:] for r in roles if r.startswith("in:")]
        if not b:
            finite_out.update(outs)
            continue
        if ins:
            m = ins[0]  # the innermost consumer (a child's hook runs before its parent's)
            outer = ins[-1]
            if outer != m and m.startswith(outer + "."):
                # the tensor is also its ancestor's input: the gradient a hook sees is the
                # sum over every consumer, and plain code in that ancestor may be one
                return outer, (f"the gradient of the input of {m}, which {outer} also "
                               f"takes, went nonfinite: the backward of {m} or plain code "
                               f"in the forward of {outer} made it")
            if m in finite_out:
                return m, f"the backward of module {m} turned finite gradients nonfinite"
            return m, f"the gradient leaving module {m} went nonfinite"
        if MODEL_OUTPUT in roles or not outs:
            return "loss", ("the gradient reaching the model's output was already "
                            "nonfinite: the loss's backward made it")
        parent = outs[0].rpartition(".")[0] or "<model>"
        return parent, (f"the gradient reaching the output of {outs[0]} was already "
                        f"nonfinite: plain code in the forward of {parent} made it")
    return None
