#!/usr/bin/env bash
# Create a virtualenv with the ORIGINAL smdebug 1.0.34 (it is also imported as `smdebug`,
# so it cannot share an environment with ours) and print its python's path.
#
#   bash benchmarks/original_env.sh [DIR]          # default DIR: .tox-original-dev
#   python benchmarks/bench_trial.py --smdebug-python "$(bash benchmarks/original_env.sh | tail -1)"
#   SMDEBUG_ORIGINAL_PYTHON=.tox-original-dev/bin/python python -m pytest tests/compat
#
# The pins are what it needs to work at all (docs/format.md 9.1-9.3) and match tox.ini's
# [testenv:original]; torch is the CPU wheel, pinned (an unpinned torch pulls CUDA builds).
set -euo pipefail
dir="${1:-.tox-original-dev}"
python="${PYTHON:-python3}"
if [ ! -x "$dir/bin/python" ]; then
    "$python" -m venv "$dir"
fi
"$dir/bin/pip" install --quiet smdebug==1.0.34 "numpy<2" "pandas<3" "protobuf<4" requests psutil \
    "setuptools<81" "torch==2.13.0+cpu"
"$dir/bin/python" -c "import smdebug, sys; sys.exit(smdebug.__version__ != '1.0.34')"
echo "$(cd "$dir" && pwd)/bin/python"
