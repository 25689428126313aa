"""The ``grads`` view: per-layer gradient norms where a user looks first (#26)."""

from __future__ import annotations

from tracealyze.analyzer.run.catalog import open_run

from tests.runfactory import make_run


def test_grads_view_is_one_row_per_step_and_parameter(tmp_path):
    run = make_run(tmp_path, steps=30, tensors=4)
    with open_run(run) as r:
        _, rows = r.query("SELECT count(*), count(DISTINCT name), count(DISTINCT step), "
                          "min(norm) > 0 FROM grads")
        _, ref = r.query("SELECT count(*) FROM tensor_stats WHERE kind = 'grad'")
        cols, _ = r.query("SELECT * FROM grads LIMIT 0")
    assert rows[0] == (30 * 4, 4, 30, True) and ref[0][0] == 30 * 4
    assert cols[:4] == ["rank", "step", "name", "norm"]
