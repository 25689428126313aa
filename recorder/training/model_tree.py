"""The model as the report shows it: one ``model_tree`` event (info) at the start, and again
whenever the model's parameters or buffers change size.

Details: ``modules`` (pre-order, at most ``MAX_MODULES``): name, type, the parameter
elements the module holds itself and how many of them train (a shared parameter counts
under the first name it is reached by; ``aliased``: elements it reaches under another
name), their dtype and device, its own buffer elements. ``shared``: parameters reachable
under several names (tied embeddings), each alias with the name it is counted under.
``buffers``: name, elements, dtype (at most ``MAX_BUFFERS``). The totals (each parameter
counted once) and the parameter elements the optimizer holds. Everything is read from the
module tree on the host (no tensor is touched, no device work). The re-check is a walk
over ``parameters()`` and ``buffers()`` every ``CHECK_EVERY`` steps: a buffer that grows
(a running list kept in ``register_buffer``) or a model rebuilt mid-run is recorded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

MAX_MODULES = 5000
MAX_BUFFERS = 1000
CHECK_EVERY = 100


def _signature(model: nn.Module) -> tuple[int, int, int]:
    params = list(model.parameters())
    return (len(params), sum(p.numel() for p in params),
            sum(b.numel() for b in model.buffers()))


def describe(model: nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """The ``model_tree`` details of ``model`` (see the module docstring)."""
    first_name: dict[int, str] = {}
    shared: list[dict[str, Any]] = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first_name:
            shared.append({"param": name, "same_as": first_name[id(p)], "numel": p.numel()})
        else:
            first_name[id(p)] = name
    unique = {id(p): p for p in model.parameters()}
    modules = []
    for name, m in model.named_modules():
        if len(modules) >= MAX_MODULES:
            break
        named = list(m.named_parameters(prefix=name, recurse=False, remove_duplicate=False))
        # a shared parameter counts where it is first reached (``aliased`` elsewhere)
        own = [p for n, p in named if first_name[id(p)] == n]
        first = named[0][1] if named else None
        modules.append({
            "name": name, "type": type(m).__name__,
            "params": sum(p.numel() for p in own),
            "trainable": sum(p.numel() for p in own if p.requires_grad),
            "aliased": sum(p.numel() for n, p in named if first_name[id(p)] != n),
            "dtype": str(first.dtype).replace("torch.", "") if first is not None else None,
            "device": str(first.device) if first is not None else None,
            "buffers": sum(b.numel() for b in m.buffers(recurse=False)),
        })
    buffers = [{"name": n, "numel": b.numel(), "dtype": str(b.dtype).replace("torch.", "")}
               for n, b in list(model.named_buffers())[:MAX_BUFFERS]]
    in_opt = None
    if optimizer is not None:
        seen = {id(p): p for g in getattr(optimizer, "param_groups", []) for p in g["params"]}
        in_opt = sum(p.numel() for p in seen.values())
    return {
        "modules": modules, "modules_total": sum(1 for _ in model.modules()),
        "shared": shared[:MAX_MODULES], "buffers": buffers,
        "total_params": sum(p.numel() for p in unique.values()),
        "trainable_params": sum(p.numel() for p in unique.values() if p.requires_grad),
        "counted_twice": sum(s["numel"] for s in shared),
        "buffer_elements": sum(b.numel() for b in model.buffers()),
        "optimizer_params": in_opt,
    }


class ModelWatch:
    """Writes the model's tree now and again when its signature changes."""

    def __init__(self, model: nn.Module, optimizer: Callable[[], Any],
                 emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.model, self.optimizer, self.emit = model, optimizer, emit
        self.error: BaseException | None = None  # a model this cannot read: it stops
        self.sig: tuple[int, int, int] | None = None
        self._check("at the start")

    def step_ended(self, step: int) -> None:
        """Training thread, each committed step: a walk every ``CHECK_EVERY`` steps."""
        if step % CHECK_EVERY == 0 and step and self.error is None:
            self._check(f"changed by step {step}")

    def _check(self, when: str) -> None:
        # a module tree that cannot be walked (an exotic wrapper) must cost the run nothing
        # but this record: never an exception into the constructor or a step
        try:
            sig = _signature(self.model)
            if sig != self.sig:
                self.sig = sig
                self._write(when)
        except Exception as exc:
            self.error = exc
            try:
                self.emit(f"the model's tree could not be read ({when}): "
                          f"{type(exc).__name__}: {exc}", {"error": str(exc)[:1000]})
            except Exception:
                pass

    def _write(self, when: str) -> None:
        d = describe(self.model, self.optimizer())
        shared = (f", {len(d['shared'])} shared ({d['counted_twice']:,} elements counted "
                  "once)" if d["shared"] else "")
        self.emit(f"model {when}: {d['modules_total']:,} modules, {d['total_params']:,} "
                  f"parameters ({d['trainable_params']:,} trainable){shared}, "
                  f"{d['buffer_elements']:,} buffer elements", d)
