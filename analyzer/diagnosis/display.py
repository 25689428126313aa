"""Bounded text for display. A run's strings come from strangers: an event message or a kernel
name may be 100 MB (a 49 MB report, 1.58 GB to write it; a summary printing 150 MB). The
tables keep every string whole (``query`` returns them as written); what is shown, in the
summary, its JSON findings and the report, is cut to a length a person reads."""

from __future__ import annotations

from typing import Any

MAX_TEXT = 2000
"""Characters shown of a message, title or advice: several paragraphs."""
MAX_NAME = 500
"""Characters shown of a name (subject, kernel, op, parameter): C++ template kernel names run
to a few hundred characters."""


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    return text if len(text) <= limit else more(text[:limit], len(text))


def more(head: str, total: int) -> str:
    """``head``, the start of a string of ``total`` characters (cut already, e.g. in SQL so
    that the whole is never fetched), and how many more there were."""
    if total <= len(head):
        return head
    return f"{head}… ({total - len(head):,} more characters)"


def clip_tree(value: Any, limit: int = MAX_NAME, depth: int = 0) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string clipped;
    containers past 20 levels are cut (evidence is flat; nothing deeper is shown)."""
    if isinstance(value, str):
        return clip(value, limit)
    if depth > 20:
        return None
    if isinstance(value, dict):
        return {clip(str(k), limit): clip_tree(v, limit, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clip_tree(v, limit, depth + 1) for v in value)
    return value
