#!/usr/bin/env bash
# The C++ and Python test-suites under AddressSanitizer and UndefinedBehaviorSanitizer (CPU
# backend): builds kcap with KCAP_SANITIZE=address,undefined in build/sanitize, runs ctest
# (test_cuda_kernels_host included: the GPU kernel bodies on the host), then pytest with the
# sanitized module (Python itself is not instrumented, so libasan is preloaded; leak checks are
# off because the interpreter's own allocations would drown them). Any report fails the run
# (UBSan aborts on its first: -fno-sanitize-recover=undefined).
#   bash scripts/sanitize.sh [PYTEST ARGS...]      (about 25 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/sanitize
JOBS=$(nproc)
PYBIND_DIR=$(python3 -m pybind11 --cmakedir)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKCAP_SANITIZE=address,undefined \
    -DKCAP_BUILD_TESTS=ON -DKCAP_BUILD_PYTHON=ON -DKCAP_CUDA=OFF -Dpybind11_DIR="$PYBIND_DIR" > /dev/null
cmake --build "$BUILD" -j "$JOBS"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== ctest (sanitized)"
ctest --test-dir "$BUILD" --output-on-failure
echo "== pytest (sanitized module)"
MODULE_DIR=$(mktemp -d)
cp -r python/kcap "$MODULE_DIR/"
rm -f "$MODULE_DIR"/kcap/_core*.so
cp "$BUILD"/_core*.so "$MODULE_DIR/kcap/"
(cd tests && LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
    PYTHONPATH="$MODULE_DIR" python3 -m pytest -q -p no:cacheprovider python "$@")
echo "sanitize: clean"
