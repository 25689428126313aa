"""The attacker's pass (issue 42), as data: hostile run directories and fleet roots built on
disk, every CLI command run over them, and the checks each command must pass. Shared by
``tests/analyzer/test_trust_property.py`` (hypothesis picks the features) and
``benchmarks/hostile_inputs.py`` (a seeded random pick, hundreds of cases).

A case lives in one temporary folder ``base``::

    base/honeypot          a file no command may change (every planted link points here)
    base/honeydir/         a folder no command may write into (folder links point here)
    base/here/             the working directory (report RUN writes ./<run-name>.html)
    base/home/ base/cache/ HOME; XDG_CACHE_HOME and TRACEALYZE_CACHE_DIR (caches may land)
    base/declared/         where -o outputs go
    base/outside/          a run outside the fleet root, full of SECRET: never to be read
    base/fleet/            the fleet root: RUN, OTHER and the planted features

Each command is checked for: (a) nothing created, changed or removed under ``base`` except
its declared outputs (and the honeypot's bytes and mtime as they were), (b) exit 0 or 2,
(c) for 2 exactly one stderr line, and no traceback ever, (d) its wall time under
:data:`BOUND_S`, and (e) SECRET in none of its output nor its declared files. Where the
expected behaviour is known (a planted link at the output is refused; a write in SQL is
refused; a healthy run is read), the exit code itself is checked too.
"""

from .cases import *  # noqa: F403
from .commands import *  # noqa: F403
from .snapshots import *  # noqa: F403
