"""The report's Model section, from the recorder's ``model_tree`` events: the module tree
(collapsible, with the parameters under each module), the blocks the model splits into
with their share of the parameters and of the gradient, parameters shared across modules,
and buffers that grew during the run.

The blocks are the children of the first module where the parameters split: a wrapper
whose one child holds ≥ ``SPLIT`` of them (``GPT2LMHeadModel`` → ``transformer``, whose
``lm_head`` only reaches the tied embedding; DDP's ``module``) is descended through, so the
shares say something; a container of layers that merely holds most of them is a block.
The gradient share of a block is its part of the summed squared gradient norms over the
last ``GRAD_STEPS`` steps with per-parameter rows (squared norms add up over disjoint
parameters; the total is the squared global norm).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .context import ReportContext

SPLIT = 0.99
GRAD_STEPS = 20
MAX_NODES = 3000
"""Tree nodes rendered (a page stays small; the event keeps up to 5,000 modules)."""


def _events(ctx: ReportContext) -> list[dict[str, Any]]:
    rows = ctx.con.execute(
        "SELECT step, details FROM events WHERE kind = 'model_tree' AND rank = ? "
        "ORDER BY time", [ctx.rank]).fetchall()
    out = []
    for step, details in rows:
        try:
            d = json.loads(details or "{}")
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("modules"), list):
            d["step"] = step
            out.append(d)
    return out


def _num(v: Any) -> int:
    """A count from the (untrusted) event: a finite non-negative number, else 0."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return max(int(v), 0) if ok else 0


def _tree(modules: list[dict[str, Any]]) -> dict[str, Any]:
    """Nested nodes (name, short name, type, own and subtree parameters) from the pre-order
    list; each module's parent is the longest dotted prefix that is a module."""
    nodes: dict[str, dict[str, Any]] = {}
    root: dict[str, Any] | None = None
    for m in modules:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            continue
        name = m["name"]
        node = {"name": name, "short": name.rsplit(".", 1)[-1] or "(model)",
                "type": str(m.get("type") or ""), "own": _num(m.get("params")),
                "trainable": _num(m.get("trainable")), "aliased": _num(m.get("aliased")),
                "dtype": m.get("dtype"), "device": m.get("device"),
                "buffers": _num(m.get("buffers")), "children": [], "cut": False}
        nodes[name] = node
        if name == "":
            root = node
            continue
        parent = name
        while "." in parent:
            parent = parent.rsplit(".", 1)[0]
            if parent in nodes:
                nodes[parent]["children"].append(node)
                break
        else:  # a top-level module (or one whose parent was cut from the list)
            if root is not None:
                root["children"].append(node)
    if root is None:
        root = {"name": "", "short": "(model)", "type": "", "own": 0, "trainable": 0,
                "aliased": 0, "dtype": None, "device": None, "buffers": 0, "cut": False,
                "children": [n for k, n in nodes.items() if "." not in k]}
    _totals(root)
    return root


def _totals(node: dict[str, Any]) -> None:
    stack = [(node, False)]
    while stack:  # post-order without recursion (deep models)
        n, done = stack.pop()
        if done:
            n["total"] = n["own"] + sum(c["total"] for c in n["children"])
            n["total_trainable"] = n["trainable"] + sum(
                c["total_trainable"] for c in n["children"])
            n["frozen"] = n["total"] > 0 and n["total_trainable"] == 0
            continue
        stack.append((n, True))
        stack.extend((c, False) for c in n["children"])


def _blocks(root: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    node = root
    for _ in range(8):
        kids = [c for c in node["children"] if c["total"] > 0]
        big = [c for c in kids if node["total"] and c["total"] >= SPLIT * node["total"]]
        if len(big) == 1 and big[0]["children"]:
            node = big[0]
            continue
        break
    blocks = [c for c in node["children"] if c["total"] > 0]
    return node, blocks


def _grad_share(ctx: ReportContext, blocks: list[dict[str, Any]]) -> dict[str, float]:
    rows = ctx.con.execute(
        "SELECT name, sum(norm * norm) FROM tensor_stats WHERE kind = 'grad' AND rank = ? "
        "AND isfinite(norm) AND step IN (SELECT DISTINCT step FROM tensor_stats WHERE "
        "kind = 'grad' AND rank = ? ORDER BY step DESC LIMIT ?) GROUP BY name",
        [ctx.rank, ctx.rank, GRAD_STEPS]).fetchall()
    total = sum(float(v or 0.0) for _, v in rows)
    if not rows or total <= 0:
        return {}
    share = {}
    for b in blocks:
        prefix = b["name"] + "."
        share[b["name"]] = sum(float(v or 0.0) for n, v in rows
                               if str(n) == b["name"] or str(n).startswith(prefix)) / total
    return share


def _prune(root: dict[str, Any]) -> int:
    """Cut the rendered tree to MAX_NODES (breadth first); the number of nodes left out."""
    kept, queue, cut = 0, [root], 0
    while queue:
        n = queue.pop(0)
        kept += 1
        if kept + len(n["children"]) > MAX_NODES:
            cut += sum(1 for _ in _walk(n)) - 1
            n["children"], n["cut"] = [], True
        queue.extend(n["children"])
    return cut


def _walk(n: dict[str, Any]) -> Any:
    stack = [n]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(x["children"])


def model_section(ctx: ReportContext) -> dict[str, Any] | None:
    """The template's ``model`` (None when the run has no model_tree event)."""
    events = _events(ctx)
    if not events:
        return None
    first, last = events[0], events[-1]
    root = _tree(last["modules"])
    parent, blocks = _blocks(root)
    total = root["total"] or 1
    grads = _grad_share(ctx, blocks)
    block_rows = [{"name": b["name"], "type": b["type"], "params": b["total"],
                   "share": b["total"] / total, "grad_share": grads.get(b["name"]),
                   "frozen": b["frozen"]} for b in blocks]
    before = {b.get("name"): _num(b.get("numel")) for b in first.get("buffers") or []
              if isinstance(b, dict)}
    grown = [{"name": b.get("name"), "first": before[b.get("name")],
              "last": _num(b.get("numel"))}
             for b in last.get("buffers") or [] if isinstance(b, dict)
             and b.get("name") in before and _num(b.get("numel")) > before[b.get("name")]]
    shared = [s for s in last.get("shared") or [] if isinstance(s, dict)][:50]
    cut = _prune(root)
    return {
        "root": root, "blocks": block_rows, "blocks_of": parent["name"] or "(model)",
        "total": _num(last.get("total_params")), "trainable": _num(last.get("trainable_params")),
        "optimizer": (None if last.get("optimizer_params") is None
                      else _num(last.get("optimizer_params"))),
        "modules": _num(last.get("modules_total")) or len(last["modules"]),
        "shared": shared, "counted_twice": _num(last.get("counted_twice")),
        "buffer_elements": _num(last.get("buffer_elements")), "grown": grown,
        "changes": len(events) - 1, "cut": cut,
        "grad_steps": GRAD_STEPS if grads else 0,
    }
