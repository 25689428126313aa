"""The memory chart of a heap leak (#26): the heap is plotted, and the leak's fit lies on the
heap line it is about, labelled so (it was labelled RSS and drawn far below the RSS curve)."""

from __future__ import annotations

import numpy as np
from tracealyze.analyzer.report.page import write_report

from tests.report.test_report import chart, page
from tests.runfactory import make_run


def test_heap_leak_fit_sits_on_the_heap_line(tmp_path):
    s = np.arange(300)
    heap = 150e6 + np.where(s >= 100, (s - 100) * 200e3, 0.0)  # 200 kB a step from 100
    run = make_run(tmp_path, steps=300, rss=1.2e9 + 0 * s, heap=heap)
    out = write_report(run, tmp_path / "r.html")
    mem = chart(page(out), "memory")
    data = {t["name"]: t for t in mem["figure"]["data"]}
    assert "heap in use (host)" in data and "RSS (host)" in data
    fit = data["leak fit (heap in use (host))"]
    heap_line = data["heap in use (host)"]
    # the fit's end is on the heap line's end (chart units), not hundreds of MiB away
    assert abs(fit["y"][-1] - heap_line["y"][-1]) < 0.05 * heap_line["y"][-1]
