"""Analyses several consumers need once per analysis run (detectors, the summary's
``gpu_time`` rows): ``shared(cache, con, analysis)`` keys the result by the function itself,
so no two modules spell the same cache key differently."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def shared(cache: dict[str, Any] | None, con: Any, analysis: Callable[[Any], T]) -> T:
    """``analysis(con)``, computed once per ``cache`` (``detectors.base.Context.cache``);
    every time when there is no cache."""
    if cache is None:
        return analysis(con)
    key = f"{analysis.__module__}.{analysis.__qualname__}"
    if key not in cache:
        cache[key] = analysis(con)
    return cache[key]
