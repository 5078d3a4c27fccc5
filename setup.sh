#!/usr/bin/env bash
# One-step set-up: a virtual environment in .venv with simdist and its dependencies.
# Torch: an existing torch >= 2.2 in the venv is kept. Otherwise, without a GPU, the CPU
# build is installed (torch==2.13.0 here; override with SIMDIST_TORCH="torch==X.Y.Z").
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "${SIMDIST_TORCH:-torch>=2.2}"
  else
    python -m pip install -q "${SIMDIST_TORCH:-torch==2.13.0}"
  fi
fi
# dev: the tests and linters; cluster: Dask for `simdist fuzz --cluster` (small, pure Python), so its test runs
python -m pip install -q -e ".[dev,cluster]"
echo "simdist ready: $(.venv/bin/simdist --help >/dev/null && echo ok) (torch $(python -c 'import torch; print(torch.__version__)'))"
