#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one call of at most 8 minutes on a machine with a CUDA GPU, torch, transformers and
# pytest, and no network. Run from anywhere:
#
#   bench/gpu/check.sh RESULTS             install the project (pip --no-deps -e ., over the machine's own torch and
#                                          transformers; wheels it lacks from $SPECBENCH_WHEELS), then the CUDA tests
#                                          and the cost curves: python -m bench.measure.gpu_check RESULTS
#   bench/gpu/check.sh RESULTS --dry-run   no install; the CPU, tiny configs, few shapes: the same commands run
#                                          (tests/test_gpu_check.py runs this)
#
# Writes at most 9 files under RESULTS, each naming the GPU (bench/measure/gpu_check.py lists them), and check.log.
# A copied tree names its commit in $SPECBENCH_COMMIT (environment.json records it; else git's HEAD). The driver's
# time limit is $SPECBENCH_CHECK_TIMEOUT_S (default 450 s: with the install, within 8 minutes).
set -euo pipefail
results=${1:?usage: bench/gpu/check.sh RESULTS [--dry-run] [python -m bench.measure.gpu_check options]}
shift
python=${PYTHON:-python}
mkdir -p "$results"
results=$(cd "$results" && pwd)
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ " $* " != *" --dry-run "* ]]; then
  if [[ -n "${SPECBENCH_WHEELS:-}" ]] && compgen -G "$SPECBENCH_WHEELS/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps "$SPECBENCH_WHEELS"/*.whl || echo "some wheels in $SPECBENCH_WHEELS did not install"
  fi
  # No build isolation: it would fetch setuptools. The source tree on PYTHONPATH runs the check if this fails.
  "$python" -m pip install -q --no-deps --no-build-isolation -e . || echo "pip install -e . failed: running from the source tree"
fi
# 450 s here + the install: within 8 minutes. The driver stops starting measurements at its own --budget-s.
timeout "${SPECBENCH_CHECK_TIMEOUT_S:-450}" "$python" -m bench.measure.gpu_check "$results" "$@" 2>&1 | tee "$results/check.log"
