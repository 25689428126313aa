"""Every file the analyzer writes goes through ``analyzer/writes.py`` (issue 42): no other
module of ``analyzer/`` may create, replace, rename or link a file or folder by name. The
check reads the code (AST), so a new write path cannot slip in unnoticed."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ONLY_WRITER = "analyzer/writes.py"

FORBIDDEN_CALLS = {
    # by name: follows links, replaces whatever is there, or creates by a guessable name
    "os": {"replace", "rename", "renames", "link", "symlink", "mkdir", "makedirs", "open",
           "truncate", "mkfifo", "mknod"},
    "shutil": {"copy", "copy2", "copyfile", "copytree", "copyfileobj", "move"},
    "tempfile": {"mkstemp", "NamedTemporaryFile", "SpooledTemporaryFile"},
}
FORBIDDEN_METHODS = {"write_text", "write_bytes", "mkdir", "touch", "symlink_to",
                     "hardlink_to", "link_to"}
"""``Path`` methods that create or replace by name."""
FILE_WRITERS = {"ParquetWriter", "write_table", "ZipFile", "write_to_dataset"}
"""Library writers that take a path: allowed only where a file below says why."""
PRIVATE_ONLY = {
    "analyzer/ingest/stream.py": "the first pass writes into the import's private staging "
                                 "folder (writes.private_dir: mkdtemp, mode 0700, random name)",
    "analyzer/ingest/steps.py": "the second pass writes into the same private folder",
    "analyzer/fleet/engines.py": "the Spark zip is written into a fresh mkdtemp folder",
    "analyzer/fleet/index.py": "pq.write_table into an in-memory buffer (pa.BufferOutputStream)"
                               " whose bytes go to writes.Dir.write_atomic",
    "analyzer/run/trace_cache.py": "pq.write_table into an in-memory buffer, written through "
                                   "writes.Dir.write_atomic",
}


def _write_mode(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and \
        any(c in mode.value for c in "wax+")


def violations(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        what = None
        if isinstance(f, ast.Name) and f.id == "open" and _write_mode(node):
            what = "open(..., write mode)"
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if base in FORBIDDEN_CALLS and f.attr in FORBIDDEN_CALLS[base]:
                what = f"{base}.{f.attr}"
            elif f.attr in FORBIDDEN_METHODS:
                what = f".{f.attr}()"
            elif f.attr == "open" and _write_mode(node):
                what = ".open(..., write mode)"
            elif f.attr in FILE_WRITERS and rel not in PRIVATE_ONLY:
                what = f.attr
        elif isinstance(f, ast.Name) and f.id in FILE_WRITERS and rel not in PRIVATE_ONLY:
            what = f.id
        if what:
            out.append(f"{rel}:{node.lineno}: {what}")
    return out


def test_only_writes_py_writes_files_in_the_analyzer() -> None:
    bad = [v for f in sorted((REPO / "analyzer").rglob("*.py"))
           if f.relative_to(REPO).as_posix() != ONLY_WRITER for v in violations(f)]
    assert not bad, "writes outside analyzer/writes.py (use its Dir / write_file):\n" + \
        "\n".join(bad)


def test_the_check_sees_each_kind_of_write(tmp_path: Path) -> None:
    """The rule is not vacuous: each forbidden shape in a module of analyzer/ is caught."""
    snippets = ['open(p, "w")', 'open(p, mode="ab")', "os.replace(a, b)", "p.write_text(t)",
                "p.mkdir(parents=True)", "shutil.copyfile(a, b)", "tempfile.mkstemp()",
                "os.open(p, os.O_CREAT)", "pq.write_table(t, p)"]
    fake = REPO / "analyzer" / "_probe_for_the_structure_test.py"
    try:
        fake.write_text("\n".join(snippets) + '\nopen(p)\nopen(p, "rb")\n"a".replace("a", "b")\n')
        found = violations(fake)
    finally:
        fake.unlink()
    assert len(found) == len(snippets), found


def test_exemptions_name_existing_files() -> None:
    for rel in PRIVATE_ONLY:
        assert (REPO / rel).is_file(), rel
