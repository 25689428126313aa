"""Gradient norms *before* clipping, reused from ``torch.nn.utils.clip_grad_norm_``.

The recorder reads gradients in the optimizer pre-hook, after the training loop clipped them:
with clipping on, every step whose norm was above ``max_norm`` would record exactly
``max_norm`` and an explosion would be invisible. ``clip_grad_norm_`` already computes the
per-parameter norms it needs; this module lets the recorder keep them instead of reading the
gradients again:

* ``torch.nn.utils.clip_grad._get_total_norm`` (what ``clip_grad_norm_`` and the public
  ``get_total_norm`` call, looked up as a module global at call time, so also through
  ``from torch.nn.utils import clip_grad_norm_`` done before the recorder existed) is wrapped.
  When the tensors are exactly the recorded model's gradients, the wrapper computes the
  per-parameter norms with the very op torch uses (``torch._foreach_norm``), hands them to the
  recorder, and returns the total as torch computes it from them (``vector_norm`` of their
  ``stack``): bitwise the same total, so the clip coefficient and training are unchanged.
  Anything else (other tensors, a p-norm other than 2, mixed devices or dtypes,
  ``foreach=False``) goes to torch's function as is.
* ``_clip_grads_with_norm_`` is wrapped to note ``max_norm`` (a Python number; no device
  work).
* both also under their public names in ``torch.nn.utils`` (``get_total_norm``,
  ``clip_grads_with_norm_``), which were bound when torch was imported: accelerate 1.x clips
  through those (looked up at call time), not through ``clip_grad_norm_``.

Frameworks that call ``torch.nn.utils.clip_grad_norm_`` (transformers/accelerate under DDP,
Lightning's precision plugins, nanoGPT) are covered; FSDP's ``model.clip_grad_norm_`` and
DeepSpeed's own clipping are not (their norms are sharded). Wrappers are installed while at
least one Recorder is open and removed with the last; while torch.compile traces they pass
straight through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .hooks import is_compiling

# on_norms(tensors) -> a sink for their per-tensor norms (the 0-d norms and their stack) if
# they are that recorder's gradients (one device and dtype), else None; on_clip(max_norm).
Sink = Callable[[list[torch.Tensor], torch.Tensor], None]
Listener = tuple[Callable[[list[torch.Tensor]], "Sink | None"], Callable[[float], None]]

_lock = threading.Lock()
_listeners: dict[int, Listener] = {}
_originals: dict[str, Any] = {}


def _module() -> Any:
    import torch.nn.utils.clip_grad as clip_grad

    return clip_grad


def _foreach_ok(grads: list[torch.Tensor], foreach: bool | None) -> bool:
    """Whether torch's own ``_get_total_norm`` takes the foreach path for ``grads`` (known
    to be one device and dtype: then its arithmetic is exactly
    ``vector_norm(stack(_foreach_norm(grads)))``). torch's own predicates."""
    if foreach is False:
        return False
    mod = _module()
    dev = grads[0].device
    if foreach is None:
        return bool(mod._has_foreach_support(grads, dev))
    return bool(mod._device_has_foreach_support(dev))


def _total_norm(tensors: Any, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                foreach: bool | None = None) -> torch.Tensor:
    original = _originals["_get_total_norm"]
    if is_compiling() or not _listeners or float(norm_type) != 2.0 or isinstance(
            tensors, torch.Tensor):
        return original(tensors, norm_type, error_if_nonfinite, foreach)
    tensors = list(tensors)
    sink = None
    try:
        for on_norms, _ in list(_listeners.values()):
            sink = on_norms(tensors)  # is it this recorder's gradients?
            if sink is not None:
                break
        if sink is not None and not _foreach_ok(tensors, foreach):
            sink = None
    except Exception:  # never let telemetry change what torch computes
        sink = None
    if sink is None:
        return original(tensors, norm_type, error_if_nonfinite, foreach)
    # torch's own first stage (one foreach launch) and the stack its second stage reduces,
    # made once and shared with the recorder (a second stack of ~200 0-d tensors was
    # ~0.1 ms a step on a CPU) ...
    with torch.no_grad():
        per_tensor = list(torch._foreach_norm(tensors, 2.0))
        stacked = torch.stack(per_tensor)
    try:
        sink(per_tensor, stacked)
    except Exception:
        pass
    if error_if_nonfinite:  # torch's own error: the norms of the norms (|n| = n)
        return original(per_tensor, norm_type, error_if_nonfinite, foreach)
    # ... and its second, as torch writes it: the norm of the stacked norms (one device and
    # dtype here). Not original(per_tensor): that ran _foreach_norm again over every
    # 0-d norm, ~2 us of dispatch each on the CPU (0.3 ms a step for 144 tensors).
    return torch.linalg.vector_norm(stacked, 2.0)


def _clip_with_norm(parameters: Any, max_norm: float, total_norm: torch.Tensor,
                    foreach: bool | None = None) -> None:
    if _listeners and not is_compiling():
        for _, on_clip in list(_listeners.values()):
            try:
                on_clip(float(max_norm))
            except Exception:
                pass
    _originals["_clip_grads_with_norm_"](parameters, max_norm, total_norm, foreach)


PUBLIC = {"get_total_norm": "_get_total_norm", "clip_grads_with_norm_": "_clip_grads_with_norm_"}
"""torch.nn.utils' public names for the two functions, bound to them when torch was
imported: code that calls ``torch.nn.utils.get_total_norm`` and ``clip_grads_with_norm_``
itself (accelerate >= 1.x clips through them, not through ``clip_grad_norm_``) reaches them
there, not through clip_grad's module globals, and is wrapped there too."""


def _wrappers() -> dict[str, Any]:
    return {"_get_total_norm": _total_norm, "_clip_grads_with_norm_": _clip_with_norm}


def install(key: int, on_norms: Callable[[list[torch.Tensor]], Sink | None],
            on_clip: Callable[[float], None]) -> bool:
    """Listen to clipping for one recorder (``key``: its id). False when this torch has no
    ``_get_total_norm``/``_clip_grads_with_norm_`` (torch < 2.6): norms are then read after
    clipping, as before."""
    mod = _module()
    if not (hasattr(mod, "_get_total_norm") and hasattr(mod, "_clip_grads_with_norm_")):
        return False
    import torch.nn.utils as public

    with _lock:
        if not _originals:
            for name, wrapper in _wrappers().items():
                _originals[name] = getattr(mod, name)
                setattr(mod, name, wrapper)
            for pub, name in PUBLIC.items():
                if getattr(public, pub, None) is _originals[name]:  # (not someone else's)
                    _originals[pub] = _originals[name]
                    setattr(public, pub, _wrappers()[name])
        _listeners[key] = (on_norms, on_clip)
    return True


def uninstall(key: int) -> None:
    """Stop listening for ``key``; the last listener puts torch's functions back (unless
    someone else wrapped them over ours meanwhile: then ours stay, passing through)."""
    with _lock:
        _listeners.pop(key, None)
        if _listeners or not _originals:
            return
        import torch.nn.utils as public

        mod = _module()
        put_back = True
        for name, wrapper in _wrappers().items():
            if getattr(mod, name) is wrapper:
                setattr(mod, name, _originals[name])
            put_back &= getattr(mod, name) is not wrapper
        for pub, name in PUBLIC.items():
            if pub in _originals and getattr(public, pub, None) is _wrappers()[name]:
                setattr(public, pub, _originals[pub])
            put_back &= getattr(public, pub, None) is not _wrappers()[name]
        if put_back:
            _originals.clear()
