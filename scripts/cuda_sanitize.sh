#!/usr/bin/env bash
# compute-sanitizer's four tools over the CUDA code, on the GPU machine:
#   memcheck   out-of-bounds and misaligned device accesses, bad frees, leaks (--leak-check full)
#   racecheck  shared-memory hazards between threads of a block
#   synccheck  barriers and warp syncs that not every thread reaches, or on wrong masks
#   initcheck  device reads of global memory nothing wrote
# each over two kinds of target:
#   rows       tests/cpp/test_cuda_rows: every CUDA row of the capability table against the CPU,
#              its first CASES_PER_ROW cases (KCAP_TEST_CASES_PER_ROW; the smallest K and token
#              counts come first, so every row and kernel runs); the small groups run whole
#   <layout>   scripts/cuda_sanitize_decode.py on a synthetic file of a real layout: prefill
#              (every-position and last logits), decode steps through the captured graphs
#              (logits, greedy, sampling), a prefill over rewritten positions
# and prints a table: the tool's error count per target (racecheck: hazards, as errors and
# warnings), the target's own exit status and seconds. Run from the repository root:
#   bash scripts/cuda_sanitize.sh [WHEELS_DIR]     (WHEELS_DIR: gguf, as for scripts/cuda_suite.sh)
# Settings (environment):
#   TOOLS           "memcheck synccheck initcheck racecheck" (in this order by default; empty:
#                   only the build and the model files)
#   CASES_PER_ROW   1
#   ROWS_GROUPS     KCAP_TEST_ROWS for the rows test (default: every group)
#   LAYOUTS         every real layout kcap benchmarks, with a vocabulary of 8,192 (_v8192) and the
#                   first 2 layers of the deep ones (_2l; every layer shape and format kept):
#                   "gemma3_270m_v8192 llama3_8b_q4_k_m_2l_v8192 qwen3_30b_a3b_q4_k_m_2l_v8192
#                   deepseek_v2_lite_q4_k_m_2l_v8192 gpt_oss_20b_mxfp4_2l_v8192" (files made in
#                   MODELS by bench/cuda_long_context.py make, names as bench_cuda.py's). The
#                   small vocabulary keeps the LM head's tiles the same kernels at a size racecheck
#                   gets through: with the full vocabularies a decode under racecheck ran past
#                   170 s; full-size names (gemma3_270m, llama3_8b_q4_k_m_32k, ...) work too
#   LAYOUTS_<tool>  the layouts for one tool instead (e.g. LAYOUTS_racecheck="gemma3_270m_v8192")
#   DECODE_ARGS     arguments of the decode workload ("--kv f16,f32" by default)
#   DECODE_ARGS_<tool>  the same for one tool; racecheck's default "--kv f16 --prefill 17 --short" (it
#                   follows every shared-memory access: a full workload of 2 layers took more than
#                   90 s, where the other tools take seconds)
#   RUN_TIMEOUT_S   the most one run may take (default 420); a run cut short says so
#   BUDGET_S        every run ends by this many seconds after the script starts (default 3000): a
#                   run's limit is cut to what is left, and none starts with less than 20 s
#   BUILD           the CMake build (default /tmp/kcap_sanitize_build; an up-to-date one costs
#                   seconds); SKIP_BUILD=1 takes BUILD's module and test as they are
# Logs: $OUT/sanitize/<tool>_<target>.log; the table also in $OUT/cuda_h200_sanitize.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-}
OUT=${OUT:-/tmp/kcap_out}
BUILD=${BUILD:-/tmp/kcap_sanitize_build}
MODELS=${MODELS:-/tmp/kcap_models}
TOOLS=${TOOLS-memcheck synccheck initcheck racecheck}
CASES_PER_ROW=${CASES_PER_ROW:-1}
LAYOUTS=${LAYOUTS:-gemma3_270m_v8192 llama3_8b_q4_k_m_2l_v8192 qwen3_30b_a3b_q4_k_m_2l_v8192 deepseek_v2_lite_q4_k_m_2l_v8192 gpt_oss_20b_mxfp4_2l_v8192}
DECODE_ARGS=${DECODE_ARGS:---kv f16,f32}
DECODE_ARGS_racecheck=${DECODE_ARGS_racecheck:---kv f16 --prefill 17 --short}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-420}
T0=$(date +%s)
DEADLINE=$(( T0 + ${BUDGET_S:-3000} ))
LOGS=$OUT/sanitize
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$SANITIZER" ] || { echo "no compute-sanitizer (looked on PATH and in /usr/local/cuda/bin)"; exit 1; }
echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $("$SANITIZER" --version | grep -i version | head -1)"

if [ -n "$WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHEELS"/*.whl
fi
export PYTHONPATH=$PWD/python:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    start=$(date +%s)
    { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKCAP_CUDA=ON -DKCAP_BUILD_PYTHON=ON \
        -DKCAP_BUILD_TESTS=ON -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" &&
      cmake --build "$BUILD" -j "$(nproc)" --target _core test_cuda_rows; } > "$LOGS/build.log" 2>&1 ||
        { grep -E " error|Error" -A3 "$LOGS/build.log" | head -30; exit 1; }
    echo "build: $(( $(date +%s) - start )) s"
fi
cp --remove-destination "$BUILD"/_core*.so python/kcap/ || exit 1

# The model files (made once; the same bytes on every machine).
# shellcheck disable=SC2086
python3 bench/cuda_long_context.py make "$MODELS" $(for t in $TOOLS; do v=LAYOUTS_$t; echo "${!v:-$LAYOUTS}"; done | tr ' ' '\n' | sort -u) \
    > "$LOGS/models.log" 2>&1 || { cat "$LOGS/models.log"; exit 1; }

SUMMARY=$OUT/cuda_h200_sanitize.txt
printf '%-10s %-28s %-52s %-5s %s\n' tool target "sanitizer" "exit" seconds | tee "$SUMMARY"

# The tool's count from its log: "ERROR SUMMARY: N errors"; racecheck prints "RACECHECK SUMMARY:
# N hazards displayed (E errors, W warnings)" instead (compute-sanitizer 2025.3).
count() {
    local log=$1 summary
    summary=$(grep -E "^========= (ERROR|RACECHECK) SUMMARY:" "$log" | tail -1 | sed -E 's/.*SUMMARY: (.*)$/\1/')
    echo "${summary:-no summary (cut short)}"
}

sanitize() {  # tool target command...
    local tool=$1 target=$2 log start rc
    shift 2
    log=$LOGS/${tool}_${target}.log
    local limit=$(( DEADLINE - $(date +%s) ))
    [ "$limit" -gt "$RUN_TIMEOUT_S" ] && limit=$RUN_TIMEOUT_S
    if [ "$limit" -lt 20 ]; then
        printf '%-10s %-28s %-52s %-5s %s\n' "$tool" "$target" "not run (budget)" - - | tee -a "$SUMMARY"
        return
    fi
    local extra=()
    [ "$tool" = memcheck ] && extra+=(--leak-check full)
    start=$(date +%s)
    timeout -k 10 "$limit" "$SANITIZER" --tool "$tool" "${extra[@]}" --print-limit 200 "$@" > "$log" 2>&1
    rc=$?
    [ "$rc" = 124 ] && echo "== cut short after ${limit} s" >> "$log"
    printf '%-10s %-28s %-52s %-5s %s\n' "$tool" "$target" "$(count "$log")" "$rc" "$(( $(date +%s) - start ))" |
        tee -a "$SUMMARY"
}

export KCAP_TEST_CASES_PER_ROW=$CASES_PER_ROW KCAP_TEST_ROWS=${ROWS_GROUPS:-}
for tool in $TOOLS; do
    sanitize "$tool" rows "$BUILD/test_cuda_rows"
    layouts_var=LAYOUTS_$tool
    args_var=DECODE_ARGS_$tool
    for layout in ${!layouts_var:-$LAYOUTS}; do
        # shellcheck disable=SC2086
        sanitize "$tool" "$layout" python3 scripts/cuda_sanitize_decode.py "$MODELS/$layout.gguf" ${!args_var:-$DECODE_ARGS}
    done
done
echo "total $(( $(date +%s) - T0 )) s; logs in $LOGS"
