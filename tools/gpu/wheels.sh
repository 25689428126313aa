#!/bin/bash
# The analyzer's packages that the device image lacks (duckdb, orjson, msgspec, ijson), as
# x86-64 CPython 3.12 wheels in .whl/ (git-ignored through .git/info/exclude), versions as
# installed here. Run once on the development machine, from the repository root.
set -e
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
for name in duckdb orjson msgspec ijson; do
  ver=$(python -m pip show "$name" | awk '/^Version:/ {print $2}')
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$name==$ver" \
    || python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$name"
done
# the GPU probes live beside the shared fixtures, which do not travel to the device
mkdir -p .gpu && cp ../shared/gpu-runs/probe.py ../shared/gpu-runs/oom_probe.py .gpu/
ls -la .whl .gpu
