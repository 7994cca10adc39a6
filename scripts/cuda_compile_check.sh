#!/usr/bin/env bash
# CI step for the CUDA backend on machines without a GPU: configures a separate build with
# CUDA on, compiles every CUDA source (cuda/*.cu: sm_90 machine code + sm_80 PTX, which runs the
# compiler's front end for the oldest GPUs kcap supports; CUDA_ARCHS to change: a build's default,
# every generation's machine code, takes four times as long) and the C++
# tests, and runs the CUDA tests that need no GPU (the kernel bodies on the CPU through the
# kernel dialect's host target; the device parity test reports itself skipped).
# Without nvcc it says so and succeeds: the CUDA rows are still declared and checked by the
# ordinary build (tests/python/test_cuda.py, test_cuda_kernels_host).
#   bash scripts/cuda_compile_check.sh        (JOBS=N to limit parallel compiles)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${CUDACXX:-$(command -v nvcc || true)}
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; } || true
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
    echo "cuda_compile_check: no nvcc on this machine; CUDA sources not compiled (nothing to check)"
    exit 0
fi
echo "== CUDA compile check with $NVCC ($("$NVCC" --version | tail -1))"
cmake -S . -B build/cuda-check -G Ninja -DKCAP_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DKCAP_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90-real;80-virtual}" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/cuda-check -j "${JOBS:-$(nproc)}"
ctest --test-dir build/cuda-check --output-on-failure -R test_cuda
