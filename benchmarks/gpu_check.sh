#!/usr/bin/env bash
# The GPU check (issue 44): on one CUDA device, in at most 8 minutes,
#   1. the CUDA tests of every adapter that has them (pytest -k cuda in its test folder);
#   2. the overhead table (benchmarks/gpu_overhead.py): the S2-like MLP, ~400 small tensors,
#      the health reductions, budgets 2% and 5%, with host syncs counted per saved step;
#   3. FSDP2 (tests/pytorch/test_fsdp2.py and benchmarks/bench_fsdp.py) where two devices exist.
# Without a CUDA device, or with --smoke, it runs the same steps on the CPU at smoke size
# (CI: tests/pytorch/test_gpu_check_smoke.py), so that it cannot rot.
#
#   bash benchmarks/gpu_check.sh            # PYTHON=/path/to/python to pick the interpreter
#   bash benchmarks/gpu_check.sh --smoke
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
SMOKE=0
[[ "${1:-}" == "--smoke" ]] && SMOKE=1
DEVICES=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
[[ "$DEVICES" == "0" ]] && SMOKE=1
LIMIT=480
[[ $SMOKE == 1 ]] && LIMIT=240
echo "== gpu_check: $DEVICES CUDA device(s); $([[ $SMOKE == 1 ]] && echo 'smoke size on the CPU' || echo 'full size')"

echo "== 1. CUDA tests of each adapter"
for folder in tests/pytorch tests/tensorflow tests/mxnet tests/keras_jax; do
  # the test files that ask for a device; their tests named cuda/gpu (skipped without one)
  files=$(grep -rlE "cuda\.is_available|list_physical_devices\(.GPU|mx\.gpu" "$folder" --include="test_*.py" 2>/dev/null || true)
  [[ -z "$files" ]] && continue
  # rc 5: nothing collected (the framework is not installed here)
  timeout "$LIMIT" "$PY" -m pytest -q -p no:cacheprovider -k "cuda or gpu" $files || [[ $? == 5 ]]
done

echo "== 2. overhead table"
if [[ $SMOKE == 1 ]]; then
  timeout "$LIMIT" "$PY" benchmarks/gpu_overhead.py --smoke --steps 8 --device cpu
else
  timeout "$LIMIT" "$PY" benchmarks/gpu_overhead.py --steps 96
fi

echo "== 3. FSDP2"
if [[ "$DEVICES" -ge 2 ]]; then
  timeout "$LIMIT" "$PY" -m pytest -q -p no:cacheprovider tests/pytorch/test_fsdp2.py
  timeout "$LIMIT" "$PY" benchmarks/bench_fsdp.py --steps 40
else
  echo "skipped: needs two CUDA devices, $DEVICES here"
fi
echo "== gpu_check: done"
