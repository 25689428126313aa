#!/bin/bash
# Every CUDA check in one device call (about 4-6 minutes on an H200), from the repository
# root on the device machine, with .whl and .gpu carried (tools/gpu/wheels.sh makes them):
#   run(command="bash tools/gpu/run_checks.sh 2>&1 | tee $OUT/log.txt",
#       carry=[".whl", ".gpu"], timeout_s=560)
# Writes to $OUT: pytest.txt, probe.jsonl, overhead.json, gpu_samples.tgz, gpu_oom_leak.tgz.
export PYTHONUNBUFFERED=1
R=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# the package without an install: the four folders under the namespace package's name
mkdir -p /tmp/site/tracealyze
for d in format recorder analyzer templates; do ln -sfn "$R/$d" "/tmp/site/tracealyze/$d"; done
export PYTHONPATH=/tmp/site
ta() { python3 -c 'from tracealyze.analyzer.cli import main; main()' "$@"; }
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
T0=$SECONDS
echo "== pytest -m gpu"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 3 -m gpu --timeout 120 \
  tests/recorder/test_recorder_gpu.py tests/recorder/test_gpu_training.py > "$OUT/pytest.txt" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|FAILED" "$OUT/pytest.txt" | tail -8
echo "== allocator counters at $((SECONDS-T0)) s"; timeout 60 python3 tools/gpu/bench_counters.py
if [ -f .gpu/probe.py ]; then
  echo "== probe.py at $((SECONDS-T0)) s"
  mkdir -p /tmp/probe
  timeout 200 python3 .gpu/probe.py /tmp/probe > /tmp/probe/log.txt 2>&1
  cp /tmp/probe/probe.jsonl /tmp/probe/gpu_samples.tgz "$OUT/" 2>/dev/null
  python3 -c "
import json
for l in open('/tmp/probe/probe.jsonl'):
    j = json.loads(l); print(j['check'], j['ok'], json.dumps(j)[:300])"
fi
echo "== overhead at $((SECONDS-T0)) s"
timeout 240 python3 benchmarks/overhead.py --device cuda --workload gpt2,gpt \
  --configs aa,standard,debug --rounds 3 --json "$OUT/overhead.json" 2>&1 | grep -v "Warn\|warn"
echo "== where debug goes at $((SECONDS-T0)) s"
timeout 90 python3 tools/gpu/prof.py cuda gpt2 "bare,standard,debug,debug hist=start,debug act_nf=0,debug guard=0,bare" \
  2>&1 | grep -v "Warn\|warn"
echo "== end at $((SECONDS-T0)) s"
