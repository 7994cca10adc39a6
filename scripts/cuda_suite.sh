#!/usr/bin/env bash
# The whole CUDA test-suite in one device call (an H200 runs it in a few minutes): builds kcap's
# module and the C++ tests with CUDA, then runs each part and prints its time and result:
#   test_cuda_rows          every CUDA row of the capability table against the CPU rows
#   test_cuda_kernels_host  the shared kernel bodies on the host, the table's refusals
#   test_rows_table         every row of every backend: legal and just-illegal dims, token ranges
#   pytest                  test_cuda.py, test_conformance_cuda.py, test_trace_cuda.py,
#                           test_long_context_cuda.py, in random order (pytest-random-order), so no
#                           test leans on another's state
# Run from the repository root on the device:
#   KCAP_SUPPORT_COMMIT=<commit> KCAP_SUPPORT_RECORD=/tmp/support.json bash scripts/cuda_suite.sh WHEELS_DIR \
#       > $OUT/suite.txt 2>&1; tail -20 $OUT/suite.txt
# (the record, copied back into tests/results/support.json's "cuda" entry, feeds the README's
# support matrix: scripts/support_matrix.py)
# WHEELS_DIR holds the wheels the device image lacks (gguf, pytest-random-order):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d WHEELS_DIR gguf pytest-random-order
# Logs of every part land in $OUT (default /tmp/kcap_out). Exit status: the number of failed parts.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=$(realpath "${1:-.whl}")
OUT=${OUT:-/tmp/kcap_out}
BUILD=${BUILD:-/tmp/kcap_suite_build}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
failed=0

# part NAME COMMAND...: runs COMMAND into $OUT/NAME.log and prints its status, time and last line.
part() {
    local name=$1 start rc
    shift
    start=$(date +%s)
    "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || failed=$(( failed + 1 ))
    printf '%-24s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$(tail -n 1 "$OUT/$name.log")"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# KCAP_SUPPORT_COMMIT: the commit of the tree that travelled (a device's copy may carry no history).
echo "commit ${KCAP_SUPPORT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHEELS"/*.whl
export PYTHONPATH=/tmp/site:$PWD/python

build() {
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKCAP_CUDA=ON -DKCAP_BUILD_PYTHON=ON \
        -DKCAP_BUILD_TESTS=ON -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" &&
        cmake --build "$BUILD" -j "$(nproc)" && cp "$BUILD"/_core*.so python/kcap/
}
part build build
[ "$failed" = 0 ] || { grep -E " error" -A3 "$OUT/build.log" | head -30; exit 1; }
part test_cuda_rows "$BUILD/test_cuda_rows"
grep -E "cases|FAIL|coverage" "$OUT/test_cuda_rows.log" | tail -20
part test_cuda_kernels_host "$BUILD/test_cuda_kernels_host"
[ -x "$BUILD/test_rows_table" ] && part test_rows_table "$BUILD/test_rows_table"
part pytest bash -c "cd tests && python3 -m pytest -q -p random_order --random-order -p no:cacheprovider \
    python/test_cuda.py python/test_conformance_cuda.py python/test_trace_cuda.py python/test_long_context_cuda.py"
grep -E "random-order|passed|failed" "$OUT/pytest.log" | head -5
echo "suite: $failed failed parts, $(( $(date +%s) - T0 ))s"
exit "$failed"
