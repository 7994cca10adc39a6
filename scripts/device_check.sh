#!/usr/bin/env bash
# One call on the device machine (an H200): build kcap with CUDA, run the CUDA tests, and
# benchmark kcap against llama.cpp on the same files. Everything it writes that matters lands
# in $OUT (logs, results JSON and table); the last lines printed are the results table.
#   bash scripts/device_check.sh CARRY_DIR
# CARRY_DIR (carried with the call) holds whl/*.whl (gguf: not in the device image) and
# llama_cpp_src.tar.xz (bench/pack_llama_cpp.sh); scripts/prepare_device_carry.sh makes it and
# says how to call. Switches: SKIP_LLAMA=1, SKIP_TESTS=1,
# SKIP_BENCH=1, BENCH_MODELS=gemma3_270m,smollm2_135m,llama3_8b_q4_k_m, BENCH_DEPTH=4096 (the deep decode's context); WHILE_LLAMA_BUILDS="command" runs
# a command (a profile, say) after kcap's benchmark while llama.cpp still builds.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=$(realpath "${1:-..}")
OUT=${OUT:-/tmp/kcap_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
JOBS=$(nproc)
T0=$(date +%s)
DEADLINE=$(( T0 + ${BUDGET_S:-570} ))  # the device call's limit is 600 s: finish inside it
step() { echo "== $* (+$(( $(date +%s) - T0 ))s)"; }
# budget N: N seconds, or what is left before the deadline if less.
budget() { local left=$(( DEADLINE - $(date +%s) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }

step machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
nvcc --version | tail -1

# llama.cpp's llama-bench (CUDA, sm_90 only) builds in the background while kcap is built and tested.
LLAMA_BIN=/tmp/llama/build/bin/llama-bench
build_llama() {
    mkdir -p /tmp/llama && tar -xJf "$CARRY/llama_cpp_src.tar.xz" -C /tmp/llama || return 1
    local extra=()
    if ! ls /usr/local/cuda/lib64/libcublas.so* > /dev/null 2>&1; then
        # The image's toolkit may lack cuBLAS; the nvidia-cublas Python package has it.
        local dir
        dir=$(python3 -c "import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) if nvidia.cublas.__file__ else list(nvidia.cublas.__path__)[0])" 2>/dev/null)
        if [ -n "$dir" ]; then
            extra+=("-DCUDA_cublas_LIBRARY=$(ls "$dir"/lib/libcublas.so* | head -1)"
                    "-DCUDA_cublasLt_LIBRARY=$(ls "$dir"/lib/libcublasLt.so* | head -1)"
                    "-DCMAKE_CUDA_FLAGS=-I$dir/include" "-DCMAKE_CXX_FLAGS=-I$dir/include")
            echo "cuBLAS from $dir"
        fi
    fi
    cmake -S /tmp/llama/llama.cpp-src -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF "${extra[@]}" &&
        nice -n 5 cmake --build /tmp/llama/build -j "$JOBS" --target llama-bench
}
LLAMA_PID=
if [ "${SKIP_LLAMA:-0}" != 1 ] && [ -f "$CARRY/llama_cpp_src.tar.xz" ]; then
    ( build_llama; echo "llama build rc=$?" ) > "$OUT/llama_build.log" 2>&1 &
    LLAMA_PID=$!
fi

step wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl
export PYTHONPATH=/tmp/site

# The benchmark's synthetic files (tens of GB for the MoE layouts, minutes to write) are made
# beside the build: they need only numpy and gguf.
BENCH_WHICH=${BENCH_MODELS:-gemma3_270m,smollm2_135m,llama3_8b_q4_k_m}
MAKE_PID=
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    nice -n 5 python3 bench/bench_cuda.py --make-only --models /tmp/kcap_models --which "$BENCH_WHICH" \
        > /tmp/make_models.log 2>&1 &
    MAKE_PID=$!
fi

# kcap: the module and the device test, then a smoke check of the engine end to end. If the
# smoke check crashes, its native backtrace is printed (cuda-gdb) and a second toolchain
# variant is tried (no LTO, no -march=native, the system g++ if there is one).
build_kcap() {  # $1: build dir, then extra CMake arguments
    local dir=$1
    shift
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKCAP_CUDA=ON -DKCAP_BUILD_PYTHON=ON \
        -DKCAP_BUILD_TESTS=ON -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" "$@" >> "$OUT/kcap_build.log" 2>&1 &&
        cmake --build "$dir" -j "$JOBS" --target _core >> "$OUT/kcap_build.log" 2>&1 ||
        { grep -E "error|Error" -A5 "$OUT/kcap_build.log" | tail -40; return 1; }
    # The C++ tests' executables only when the tests run.
    [ "${SKIP_TESTS:-0}" = 1 ] ||
        cmake --build "$dir" -j "$JOBS" >> "$OUT/kcap_build.log" 2>&1 || grep -E " error" -A3 "$OUT/kcap_build.log" | head -20
    cp "$dir"/_core*.so python/kcap/
}
smoke() {
    PYTHONPATH=$PWD/python:/tmp/site timeout "$(budget 90)" python3 -X faulthandler bench/cuda_smoke.py 2>&1 | tail -25
    return "${PIPESTATUS[0]}"
}
export PYTHONPATH=$PWD/python:/tmp/site
step build kcap
BUILD=build/device
build_kcap "$BUILD" || exit 1
step smoke
if ! smoke; then
    echo "-- smoke failed: native backtrace"
    PYTHONPATH=$PWD/python:/tmp/site timeout "$(budget 60)" cuda-gdb -q -batch -ex "set pagination off" -ex run \
        -ex bt --args python3 bench/cuda_smoke.py 2>&1 | grep -v "^\[New Thread\|^\[Thread\|Detaching" | tail -40
    alt=(-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF -DKCAP_NATIVE=OFF)
    if [ -x /usr/bin/g++ ] && [ "$(readlink -f /usr/bin/g++)" != "$(readlink -f "$(command -v g++)")" ]; then
        alt+=(-DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++)
    fi
    step rebuild kcap "${alt[@]}"
    BUILD=build/device-alt
    build_kcap "$BUILD" "${alt[@]}" && { step smoke again; smoke; } || echo "-- still failing"
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    step ctest
    # test_cuda_kernels_host runs the kernel bodies on the CPU (no GPU needed: CI runs it); here
    # it would only take time from the device tests. test_cuda_rows runs on its own below.
    timeout "$(budget 60)" ctest --test-dir "$BUILD" --output-on-failure -E "test_cuda_kernels_host|test_cuda_rows" 2>&1 |
        tee "$OUT/ctest.log" | tail -20
    step test_cuda_rows
    # Every CUDA row against the CPU's. Its groups print their case counts and times as they
    # finish; it gets the call's time but the 120 s the model tests need (at most 200 s when a
    # benchmark follows), and says when that cut it short (KCAP_TEST_ROWS=group,group runs only
    # those groups).
    rows_s=$(( DEADLINE - $(date +%s) - 120 ))
    [ "${SKIP_BENCH:-0}" = 1 ] || rows_s=$(( rows_s < 200 ? rows_s : 200 ))
    timeout "$(budget $(( rows_s > 30 ? rows_s : 30 )))" "$BUILD/test_cuda_rows" 2>&1 | tee -a "$OUT/ctest.log" | tail -25
    [ "${PIPESTATUS[0]}" = 124 ] && echo "test_cuda_rows: cut short by the call's time limit, the groups above are what ran"
    step pytest
    (cd tests && timeout "$(budget 120)" python3 -m pytest -q -rs python/test_cuda.py python/test_conformance_cuda.py python/test_long_context_cuda.py 2>&1) | tee "$OUT/pytest.log" | tail -40
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    step wait for the model files
    wait "$MAKE_PID"
    tail -5 /tmp/make_models.log
    step bench kcap
    timeout "$(budget 300)" python3 bench/bench_cuda.py --models /tmp/kcap_models --depth "${BENCH_DEPTH:-4096}" \
        --which "$BENCH_WHICH" --out "$OUT/cuda_h200_kcap.json" \
        --table "$OUT/cuda_h200_kcap.md" 2>&1 | tee "$OUT/bench_kcap.log" | tail -30
    if [ -n "${WHILE_LLAMA_BUILDS:-}" ]; then
        step "$WHILE_LLAMA_BUILDS"
        bash -c "$WHILE_LLAMA_BUILDS" 2>&1 | tail -40
    fi
    if [ -n "$LLAMA_PID" ]; then
        step wait for llama.cpp
        while kill -0 "$LLAMA_PID" 2> /dev/null && [ "$(date +%s)" -lt $(( DEADLINE - 90 )) ]; do sleep 5; done
        kill -0 "$LLAMA_PID" 2> /dev/null && { echo "llama.cpp build not done in time"; tail -3 "$OUT/llama_build.log"; }
        tail -3 "$OUT/llama_build.log"
        if [ -x "$LLAMA_BIN" ]; then
            step bench llama.cpp
            # Re-runs the table with both engines (kcap numbers are re-measured side by side).
            timeout "$(budget 400)" python3 bench/bench_cuda.py --models /tmp/kcap_models --depth "${BENCH_DEPTH:-4096}" \
                --which "$BENCH_WHICH" --llama-bench "$LLAMA_BIN" \
                --skip-kcap --out "$OUT/cuda_h200_llama.json" --table "$OUT/cuda_h200_llama.md" 2>&1 |
                tee "$OUT/bench_llama.log" | tail -20
            # Whichever parts finished (a run cut short by its budget leaves one out).
            python3 bench/bench_cuda.py --depth "${BENCH_DEPTH:-4096}" --merge $(ls "$OUT"/cuda_h200_kcap.json "$OUT"/cuda_h200_llama.json 2>/dev/null) \
                --out "$OUT/cuda_h200.json" --table "$OUT/cuda_h200.md" > /dev/null
        fi
    fi
fi
step done
# At most 8 files come back from a device call: keep the results and the logs that matter.
if [ -f "$OUT/cuda_h200.json" ]; then rm -f "$OUT"/cuda_h200_kcap.* "$OUT"/cuda_h200_llama.*; fi
rm -f "$OUT"/cuda_h200_llama.md
cat "$OUT/kcap_configure.log" >> "$OUT/kcap_build.log" 2> /dev/null && rm -f "$OUT/kcap_configure.log"
if [ -f "$OUT/llama_build.log" ]; then tail -300 "$OUT/llama_build.log" > "$OUT/llama_build.tail" && mv "$OUT/llama_build.tail" "$OUT/llama_build.log"; fi
ls "$OUT"
cat "$OUT/cuda_h200.md" 2>/dev/null || cat "$OUT/cuda_h200_kcap.md" 2>/dev/null
