"""Forward hooks on the user's modules that live outside them.

``module.register_forward_hook(fn)`` stores ``fn`` in the module's own ``_forward_hooks``:
``torch.save(model)`` (or any pickling of the model: ``multiprocessing``, a framework's
checkpoint of the whole module) then pickles the recorder's callables with it. Closures
cannot be pickled (the save fails: training stops), and a picklable recorder object would
make the checkpoint unloadable where tracealyze is not installed. So the recorder hooks
modules through torch's process-wide module hooks (``register_module_forward_pre_hook`` /
``register_module_forward_hook``), one pair for all its hooks, dispatching by module
identity: the user's modules keep exactly the state they had.

Cost: while any hook is registered every module call in the process goes through the
dispatch (a dict lookup, ~1 µs); the standard preset's hooks live for the first steps only.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

Entry = tuple[weakref.ref[nn.Module], Callable[..., Any]]
_pre: dict[int, list[Entry]] = {}
_post: dict[int, list[Entry]] = {}
_handles: list[Any] = []


def is_compiling() -> bool:
    """Whether torch.compile is tracing (hooks then return at once: no graph break)."""
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:
        return False


class Handle:
    """``remove()`` takes one hook off (the process-wide pair goes with the last one)."""

    def __init__(self, table: dict[int, list[Entry]], key: int, entry: Entry) -> None:
        self.table, self.key, self.entry = table, key, entry

    def remove(self) -> None:
        fns = self.table.get(self.key)
        if fns is not None and self.entry in fns:
            fns.remove(self.entry)
            if not fns:
                del self.table[self.key]
        if not _pre and not _post:
            for h in _handles:
                h.remove()
            _handles.clear()


def forward_pre(module: nn.Module, fn: Callable[[nn.Module, Any], Any], *,
                prepend: bool = False) -> Handle:
    """``fn(module, args)`` before ``module``'s forward (its return value is ignored)."""
    return _add(_pre, module, fn, prepend)


def forward(module: nn.Module, fn: Callable[[nn.Module, Any, Any], Any]) -> Handle:
    """``fn(module, args, output)`` after ``module``'s forward (its return is ignored)."""
    return _add(_post, module, fn, False)


def _add(table: dict[int, list[Entry]], module: nn.Module, fn: Callable[..., Any],
         prepend: bool) -> Handle:
    if not _handles:
        _handles.append(_module.register_module_forward_pre_hook(_dispatch_pre))
        _handles.append(_module.register_module_forward_hook(_dispatch_post))
    entry: Entry = (weakref.ref(module), fn)
    fns = table.setdefault(id(module), [])
    fns.insert(0, entry) if prepend else fns.append(entry)
    return Handle(table, id(module), entry)


def _dispatch_pre(module: nn.Module, args: Any) -> None:
    if is_compiling():  # (telemetry never enters a compiled graph)
        return
    fns = _pre.get(id(module))
    if fns:
        _run(fns, module, (module, args))


def _dispatch_post(module: nn.Module, args: Any, output: Any) -> None:
    if is_compiling():
        return
    fns = _post.get(id(module))
    if fns:
        _run(fns, module, (module, args, output))


def _run(fns: list[Entry], module: nn.Module, call: tuple[Any, ...]) -> None:
    for ref, fn in list(fns):
        if ref() is not module:  # (a dead module's id reused by another)
            continue
        try:
            fn(*call)
        except Exception:  # a probe never breaks the user's forward
            pass
