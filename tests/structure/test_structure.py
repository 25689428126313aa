"""The shape of the code: no import cycle anywhere (every import counts, lazy and
TYPE_CHECKING ones included), small modules, and the format module free of torch and duckdb."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"format": "tracealyze.format", "recorder": "tracealyze.recorder",
            "analyzer": "tracealyze.analyzer", "templates": "tracealyze.templates"}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            rel = f.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every tracealyze module ``name`` imports (anywhere in the file)."""
    is_pkg = path.name == "__init__.py"
    base = name if is_pkg else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def test_import_graph_is_acyclic() -> None:
    mods = modules()
    known = set(mods)
    graph = {m: imports_of(m, p, known) for m, p in mods.items()}
    # a package's __init__ importing its own submodules is not a cycle of code
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    assert sum(len(v) for v in graph.values()) > 50  # the parser sees the imports
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = [*stack[stack.index(t):], t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_parser_finds_a_cycle(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from .b import x\n")
    b.write_text("if TYPE_CHECKING:\n    from .a import y\n")
    known = {"p.a", "p.b"}
    assert imports_of("p.a", a, known) == {"p.b"} and imports_of("p.b", b, known) == {"p.a"}


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_small(name: str) -> None:
    n = len(modules()[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines (at most {MAX_LINES}: split it by job)"


def test_format_imports_neither_torch_nor_duckdb() -> None:
    code = ("import sys, tracealyze.format.parts, tracealyze.format.runmeta, "
            "tracealyze.format.schema\n"
            "bad = sorted(m for m in ('torch', 'duckdb', 'pyarrow', 'jinja2', 'click') "
            "if m in sys.modules)\nprint(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""


# The analyzer's layers, lowest first: a module may import its own layer and the layers
# below it, never one above (a path says what the code is, and no arrow runs back up).
ANALYZER_LAYERS = ["errors", "units", "writes", "sql", "stats", "gpu", "ingest", "run",
                   "diagnosis", "report", "compare", "fleet", "record", "cli"]
"""``units`` and ``errors`` are shared by all; ``writes`` is how every file is written (and
the only module that may: tests/structure/test_writes_structure.py); ``sql`` is how every
query is made safe;
``stats`` holds the robust statistics and the step-time outlier rule that detectors, charts
and ``compare`` share;
``gpu`` analyses the ``trace_events`` table and holds its GPU vocabulary (which ``ingest``
writes with); ``ingest`` turns profiler JSON into ``trace_events``; ``run`` opens run
directories (raw traces in them through ``ingest``); ``diagnosis`` runs the detectors;
``report`` draws a run, ``compare`` two, ``fleet`` many; ``record`` and ``cli`` are the
commands."""
ANALYZER_TOP = {"__init__", "record", "errors", "units", "writes"}


def test_analyzer_top_level_holds_only_its_edges() -> None:
    top = {f.stem for f in (REPO / "analyzer").glob("*.py")}
    assert top <= ANALYZER_TOP, f"modules at analyzer/'s top level: {sorted(top - ANALYZER_TOP)}"
    subs = {d.name for d in (REPO / "analyzer").iterdir()
            if d.is_dir() and (d / "__init__.py").exists()}
    assert subs | (top - {"__init__"}) == set(ANALYZER_LAYERS), sorted(subs)


def upward_imports(package: str, layers: list[str]) -> list[str]:
    """Imports of ``tracealyze.<package>`` modules that point to a later entry of ``layers``
    (its sub-packages and top-level modules, lowest first)."""
    mods = modules()
    known = set(mods)
    rank = {name: i for i, name in enumerate(layers)}

    def layer(mod: str) -> str | None:
        parts = mod.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["tracealyze", package] else None

    bad = []
    for m, p in mods.items():
        src = layer(m)
        if src is None:
            continue
        for t in imports_of(m, p, known):
            dst = layer(t)
            if dst is not None and rank[dst] > rank[src]:
                bad.append(f"{m} -> {t}")
    return sorted(bad)


def test_analyzer_imports_point_only_downward() -> None:
    bad = upward_imports("analyzer", ANALYZER_LAYERS)
    assert not bad, "imports that point up a layer:\n" + "\n".join(bad)


# The recorder's rooms and top-level modules, lowest first (CONTRIBUTING.md's map): a module
# may import its own room and those below it, never one above.
RECORDER_LAYERS = ["config", "capture", "live", "tensors", "training", "write", "stepstate",
                   "lifecycle", "teardown", "recorder", "integrations"]
RECORDER_ROOMS = {"live", "tensors", "training", "write", "integrations"}


def test_recorder_is_in_rooms() -> None:
    top = {f.stem for f in (REPO / "recorder").glob("*.py")} - {"__init__"}
    assert top == set(RECORDER_LAYERS) - RECORDER_ROOMS, sorted(top)
    rooms = {d.name for d in (REPO / "recorder").iterdir()
             if d.is_dir() and (d / "__init__.py").exists()}
    assert rooms == RECORDER_ROOMS, sorted(rooms)
    for room in RECORDER_ROOMS - {"integrations"}:
        face = (REPO / "recorder" / room / "__init__.py").read_text()
        assert "_EXPORTS" in face and '"""' in face, f"recorder/{room}: no face"


def test_recorder_rooms_import_only_downward() -> None:
    bad = upward_imports("recorder", RECORDER_LAYERS)
    assert not bad, "recorder imports that point up a room:\n" + "\n".join(bad)


def test_recorder_room_faces_name_what_exists() -> None:
    import importlib

    for room in RECORDER_ROOMS - {"integrations"}:
        pkg = importlib.import_module(f"tracealyze.recorder.{room}")
        for name in pkg.__all__:
            assert getattr(pkg, name) is not None, f"{room}.{name}"


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation",
                  "cuda_runtime", "cuda_driver")


def test_gpu_categories_are_spelled_only_in_the_vocabulary() -> None:
    quoted = re.compile("'(" + "|".join(GPU_CATEGORIES) + ")'")
    vocabulary = REPO / "analyzer" / "gpu" / "vocabulary.py"
    bad = []
    for f in sorted((REPO / "analyzer").rglob("*.py")):
        if f == vocabulary:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value in GPU_CATEGORIES or quoted.search(node.value)):
                bad.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert not bad, "GPU categories spelled outside gpu/vocabulary.py: " + ", ".join(bad)
    assert quoted.search(ast.literal_eval("'''('kernel')'''"))  # the pattern sees SQL


def _kind_literals(text: str) -> set[str]:
    """Kinds compared in SQL: ``kind = 'x'``, ``kind IN ('x', 'y')``."""
    out = set(re.findall(r"kind\s*=\s*'([a-z_]+)'", text))
    for group in re.findall(r"kind\s+IN\s*\(([^)]*)\)", text):
        out.update(re.findall(r"'([a-z_]+)'", group))
    return out


def test_tensor_and_event_kinds_come_from_the_format_vocabulary() -> None:
    from tracealyze.format.vocabulary import EVENT_KINDS, TENSOR_KINDS

    known = set(TENSOR_KINDS) | set(EVENT_KINDS)
    # the idle analysis classifies idle intervals, not rows of a table: its kinds are its own
    own = {"analyzer/gpu/idle.py": {"host_wait", "kernel_wait", "other"}}
    read = {}
    for f in sorted((REPO / "analyzer").rglob("*.py")):
        rel = f.relative_to(REPO).as_posix()
        for kind in _kind_literals(f.read_text()) - own.get(rel, set()):
            read[kind] = rel
    assert set(read) <= known, {k: v for k, v in read.items() if k not in known}
    assert {"grad", "param", "activation", "nonfinite", "exception"} <= set(read)
    written = set()
    for f in sorted((REPO / "recorder").rglob("*.py")):
        text = f.read_text()
        written.update(re.findall(r'(?:\.event|_info)\(\s*"([a-z_]+)"', text))
        written.update(re.findall(r'event_row\([^,]+,\s*"([a-z_]+)"', text))
        written.update(re.findall(r'kind="([a-z_]+)"', text))
        written.update(re.findall(r'Piece\("([a-z_]+)"', text))
    pieces_only = {"grad_norms", "act_nf", "act_sat", "act_bnf", "loss_scale"}  # routing labels
    user_example = {"checkpoint"}  # rec.event's docstring: a kind of the user's own
    assert written - pieces_only - user_example <= known, written - known - pieces_only
    assert {"param_coverage", "model_structure", "exception"} <= written
