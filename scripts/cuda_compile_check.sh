#!/usr/bin/env bash
# CI step for the CUDA backend on machines without a GPU: configures a separate build with
# CUDA on, compiles every CUDA source (cuda/*.cu, for the architectures a build on a machine
# without a GPU takes: sm_80, 86, 89 and 90 machine code and sm_90 PTX; CUDA_ARCHS to change)
# and the C++
# tests, and runs the CUDA tests that need no GPU (the host-simulated bodies' table check;
# the device parity test reports itself skipped).
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
    ${CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"} -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/cuda-check -j "${JOBS:-$(nproc)}"
# The host-simulated kernel bodies are the same code in both builds and ran in the ordinary
# ctest: here only their table check, which differs (every CUDA row has its kernel).
KCAP_HOST_ONLY=test_table ctest --test-dir build/cuda-check --output-on-failure -R test_cuda
