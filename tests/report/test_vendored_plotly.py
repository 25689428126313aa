"""The plotly.js bundle inlined into reports is vendored with its licence and version."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

FILES = resources.files("tracealyze.templates")


def test_bundle_licence_and_version_note_are_shipped() -> None:
    js = FILES.joinpath("plotly-cartesian.min.js").read_bytes()
    note = FILES.joinpath("plotly-cartesian.VERSION.txt").read_text()
    licence = FILES.joinpath("plotly-cartesian.LICENSE.txt").read_text()
    assert "MIT License" in licence and "Plotly" in licence
    version = re.search(r"plotly\.js-cartesian-dist-min (\d+\.\d+\.\d+)", note).group(1)
    assert f"plotly.js (cartesian - minified) v{version}".encode() in js[:200]
    assert re.search(r"sha256: ([0-9a-f]{64})", note).group(1) == hashlib.sha256(js).hexdigest()
    assert len(js) < 2 * 2**20  # the reason for the partial bundle: reports stay small
    # it is inlined in a <script>: it must not be able to end it early
    assert b"</script" not in js.lower() and b"<!--" not in js
