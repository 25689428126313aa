"""The detector registry is the detectors folder: every file there runs, is named after the
finding id it reports, and says what data it needs."""

from __future__ import annotations

from pathlib import Path

from tracealyze.analyzer.diagnosis import coverage
from tracealyze.analyzer.diagnosis.detectors import base
from tracealyze.analyzer.diagnosis.findings import FINDING_IDS, _detector_ids

DETECTORS = Path(base.__file__).parent


def test_every_detector_file_is_registered_and_follows_the_protocol() -> None:
    files = sorted(p.stem for p in DETECTORS.glob("*.py")
                   if not p.stem.startswith("_") and p.stem != "base")
    assert list(FINDING_IDS) == files
    mods, errors = base.discover()
    assert errors == []
    assert [m.ID for m in mods] == files


def test_a_new_file_is_a_new_detector(tmp_path: Path) -> None:
    for name in ("lr_zero.py", "_helpers.py", "base.py", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "subdir").mkdir()
    assert _detector_ids(tmp_path) == ("lr_zero",)


def test_needs_name_known_checks_and_every_check_has_a_detector() -> None:
    mods, _ = base.discover()
    used = {c for m in mods for c in m.NEEDS}
    assert used <= set(coverage.CHECKS), used - set(coverage.CHECKS)
    assert used == set(coverage.CHECKS)


def test_aliases_never_shadow_another_detector() -> None:
    mods, _ = base.discover()
    names: dict[str, str] = {}
    for m in mods:
        for name in (m.ID, *getattr(m, "ALIASES", ())):
            assert name not in names, f"{name}: {m.ID} and {names.get(name)}"
            names[name] = m.ID


def test_a_detector_without_needs_is_reported_broken(monkeypatch) -> None:
    import importlib

    real = importlib.import_module

    def load(name: str, *a, **k):
        mod = real(name, *a, **k)
        if name.endswith(".top_ops"):
            monkeypatch.delattr(mod, "NEEDS")
        return mod

    monkeypatch.setattr(base.importlib, "import_module", load)
    _, errors = base.discover()
    assert [e.module for e in errors] == ["top_ops"]
    assert "NEEDS" in errors[0].error
