"""Detector thresholds: each detector's DEFAULTS, a config file, then ``--set`` overrides.

Config files are TOML (``[memory_leak]`` tables) or JSON (``{"memory_leak": {...}}``).
Every detector also accepts ``enabled`` (default true) to switch it off. Unknown detectors or
keys are errors (a typo must not silently keep the default), and so are values out of range:
every number must be finite and >= 0, a count or window whose default is >= 1 must be >= 1,
and a ``*_frac`` must lie in [0, 1].
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError
from .findings import FORMER_IDS


class Thresholds(Mapping[str, Any]):
    """One detector's effective thresholds, read as attributes (``th.min_steps``). Built by
    :func:`of` as a frozen dataclass per detector whose fields are its ``DEFAULTS`` (plus
    ``enabled``), so a misspelt name is an AttributeError, not a silent default. Also a
    read-only mapping, for code that takes thresholds or a ``DEFAULTS`` dict alike."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)  # type: ignore[attr-defined]


@functools.cache
def dataclass_of(mod: ModuleType) -> type[Thresholds]:
    """The thresholds dataclass of detector module ``mod``: one field per ``DEFAULTS``
    key, typed and defaulted by its value, and ``enabled``."""
    name = "".join(w.title() for w in mod.ID.split("_")) + "Thresholds"
    fields = [("enabled", bool, dataclasses.field(default=True))] + [
        (k, type(v), dataclasses.field(default=v)) for k, v in mod.DEFAULTS.items()]
    return dataclasses.make_dataclass(name, fields, bases=(Thresholds,), frozen=True,
                                      kw_only=True, eq=True)


def of(mod: ModuleType, values: Mapping[str, Any] | None = None) -> Thresholds:
    """Detector ``mod``'s thresholds: its defaults with ``values`` (already checked)."""
    return dataclass_of(mod)(**(values or {}))


def defaults(modules: Iterable[ModuleType]) -> dict[str, dict[str, Any]]:
    """detector id -> copy of its DEFAULTS plus ``enabled: True``."""
    return {mod.ID: {"enabled": True, **mod.DEFAULTS} for mod in modules}


def _aliases(modules: Iterable[ModuleType]) -> dict[str, str]:
    names: dict[str, str] = {}
    for mod in modules:
        names[mod.ID] = mod.ID
        names[mod.__name__.rsplit(".", 1)[-1]] = mod.ID
        for alias in getattr(mod, "ALIASES", ()):
            names[alias] = mod.ID
    ids = set(names.values())
    names.update({old: new for old, new in FORMER_IDS.items() if new in ids})
    return names


def _coerce(value: Any, default: Any, where: str, key: str = "") -> Any:
    """``value`` converted to the type of ``default`` (strings from --set are parsed)."""
    try:
        if isinstance(default, bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, (int, float)):
            f = float(value)
            if isinstance(value, bool) or not math.isfinite(f):
                raise ValueError(value)
            if isinstance(default, int):
                if f != int(f):
                    raise ValueError(value)
                f = int(f)
            _check_range(f, default, where, key)
            return f
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: expected a finite {type(default).__name__}, "
                          f"got {value!r}") from None
    return str(value) if isinstance(default, str) else value


def _check_range(value: float, default: Any, where: str, key: str) -> None:
    if value < 0:
        raise ConfigError(f"{where}: must be >= 0, got {value!r}")
    if isinstance(default, int) and default >= 1 and value < 1:
        raise ConfigError(f"{where}: must be >= 1, got {value!r}")
    if key.endswith("_frac") and value > 1:
        raise ConfigError(f"{where}: a fraction must be between 0 and 1, got {value!r}")


def _apply(th: dict[str, dict[str, Any]], names: dict[str, str], det: str, key: str, value: Any,
           where: str) -> None:
    if det not in names:
        raise ConfigError(f"{where}: unknown detector {det!r} (known: {', '.join(sorted(th))})")
    did = names[det]
    if key not in th[did]:
        raise ConfigError(f"{where}: unknown threshold {did}.{key} "
                          f"(known: {', '.join(sorted(th[did]))})")
    th[did][key] = _coerce(value, th[did][key], where, key)


def load_file(path: Path) -> dict[str, Any]:
    """Parse a TOML or JSON config file into {detector: {key: value}}."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from e
    if str(path).endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path}: invalid JSON: {e}") from e
    else:
        try:
            import tomllib
        except ImportError as e:  # Python 3.10
            raise ConfigError(f"{path}: TOML needs Python 3.11+; use a .json config") from e
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"{path}: expected a table per detector, e.g. [memory_leak]")
    return data


def resolve(modules: Iterable[ModuleType], overrides: Any = None,
            config_file: Path | str | None = None) -> dict[str, Thresholds]:
    """detector id -> its effective :class:`Thresholds`: DEFAULTS, then ``config_file``,
    then ``overrides``.

    ``overrides`` is ``None``, a mapping ``{detector: {key: value}}`` or an iterable of
    ``"detector.key=value"`` strings (as given to ``--set``).
    """
    modules = list(modules)
    values = _values(modules, overrides, config_file)
    return {mod.ID: of(mod, values[mod.ID]) for mod in modules}


def _values(modules: list[ModuleType], overrides: Any,
            config_file: Path | str | None) -> dict[str, dict[str, Any]]:
    th = defaults(modules)
    names = _aliases(modules)
    if config_file is not None:
        for det, values in load_file(Path(config_file)).items():
            for key, value in values.items():
                _apply(th, names, det, key, value, str(config_file))
    if overrides is None:
        return th
    if isinstance(overrides, Mapping):
        for det, values in overrides.items():
            if not isinstance(values, Mapping):
                raise ConfigError(f"override for {det!r} must be a mapping of thresholds")
            for key, value in values.items():
                _apply(th, names, det, key, value, "overrides")
        return th
    for item in overrides:
        text = str(item)
        lhs, sep, value = text.partition("=")
        det, dot, key = lhs.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(f"--set {text!r}: expected DETECTOR.KEY=VALUE, "
                              f"e.g. memory_leak.min_slope_bytes=1048576")
        _apply(th, names, det.strip(), key.strip(), value.strip(), f"--set {text}")
    return th
