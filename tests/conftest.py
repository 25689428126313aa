"""The suite's root. Imports need no sys.path edits: pyproject's ``pythonpath`` puts the repo
root (``tests.*``, ``tools``), ``tests/recorder`` (``rec_helpers``, ``reference``) and
``benchmarks`` (the workload builders some tests share with the benchmarks) on the path, under
``pytest`` and ``python -m pytest`` alike. Child processes that tests start are programs of
their own: they put the repo root on their path themselves."""
