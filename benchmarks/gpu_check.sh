#!/usr/bin/env bash
# GPU check: the two-tenant canary test and the transfer benchmark with the KV pools on CUDA.
# Run from anywhere on a machine with a CUDA build of torch:  benchmarks/gpu_check.sh
# Exit status: non-zero when CUDA is missing, the canary test fails, or the benchmark fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PYCHECK'
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False: not a usable GPU machine"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: {torch.cuda.get_device_name(0)}")
PYCHECK

echo "== canary test (reference isolates, incident leaks) on cuda"
KVHANDOFF_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider tests/impl/test_canary_isolation.py

echo "== transfer benchmark on cuda"
"$PY" benchmarks/transfer.py --device cuda --repeats 10
"$PY" benchmarks/transfer.py --device cuda --repeats 10 --json
