#!/usr/bin/env bash
# An A/B measurement of a change in one device call, "base" against "new": the carried checkout
# (new) against a copy of it with CARRY/change.patch reversed (base; BASE_REV=<rev>
# scripts/prepare_device_carry.sh writes the patch), both built at once while the synthetic files
# are written beside them. Then
#   1. with AB_ROWS=group,group (KCAP_TEST_ROWS names), the new tree's test_cuda_rows for those
#      groups (a build of the test too), first, so that a call its limit cuts short still says
#      whether the change is correct;
#   2. (AB_NCU=1, the default) Nsight Compute per launch (time, instructions, issue, registers) of
#      one prefill and its decode steps (bench/cuda_ncu_step.py), base and new side by side
#      (bench/ncu_compare.py);
#   3. pp512 (AB_TG=1: and tg128) from bench/cuda_sweep.py, alternating base, new, base, new, so
#      drift between rounds shows next to the difference.
# The same machine, clocks and files for both, which separate calls do not give (llama.cpp's
# figures move by 10-20% between calls; kcap's by a few %).
#
# Here:    BASE_REV=HEAD LLAMA=0 bash scripts/prepare_device_carry.sh .kcap_cuda_carry
# Device:  (carry [".kcap_cuda_carry"])
#          bash scripts/device_ab.sh .kcap_cuda_carry > $OUT/ab.txt 2>&1
# About 2.5 minutes warm. Settings (environment):
#   AB_MODELS       synthetic files to make and time (bench/bench_cuda.py make_models names),
#                   default llama3_8b_q4_k_m,gemma3_270m,smollm2_135m; ncu runs on the first
#   AB_ACTIVATIONS  f32, q8_1 or bf16, or several separated by commas (default q8_1; ncu takes the first)
#   AB_NCU          0 skips Nsight Compute
#   AB_KERNELS      ncu kernel regex (default mma_q8: the int8 tiles); AB_LAUNCHES (default 24);
#                   AB_LAUNCH_SKIP matching launches to pass over first (default 0; the decode
#                   steps' launches come after the prefill's, each decode kernel once a layer)
#   AB_NCU_SECTIONS Nsight Compute sections (e.g. "SpeedOfLight WarpStateStats SchedulerStats
#                   Occupancy MemoryWorkloadAnalysis"): instead of the metrics table, each arm's
#                   details page for those sections, printed in full
#   AB_ROUNDS       sweep rounds (default 2); AB_TG=1 also times tg128; AB_MODES (pp512, tg128,
#                   tg128d: tg128 after AB_DEPTH tokens of context, default 4096) replaces that choice
#   AB_ROWS         test_cuda_rows groups to run on the new tree (none by default);
#                   AB_ROWS_TIMEOUT its limit in seconds (default 300)
#   AB_ARMS         the arms the sweeps time, in turn (default "base new"); an arm new+VAR=VALUE
#                   runs the new tree with VAR=VALUE in its environment (a probe's switch), so
#                   one build times several variants; without base in it the base is neither
#                   made nor built (and change.patch is not needed)
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=$(cd "${1:-.kcap_cuda_carry}" && pwd)
SRC=$PWD
BASE=/tmp/ab_base
ARMS=${AB_ARMS:-base new}
WITH_BASE=$([[ " $ARMS " == *" base "* ]] && echo 1 || echo 0)
if [ "$WITH_BASE" = 1 ]; then
    [ -f "$CARRY/change.patch" ] || { echo "no $CARRY/change.patch: BASE_REV=<rev> scripts/prepare_device_carry.sh"; exit 1; }
    # The base: the checkout without its test data (the base is only built and timed) and with the
    # change reversed.
    rm -rf "$BASE" && mkdir -p "$BASE"
    tar -cf - --exclude=./tests/goldens --exclude=./tests/fixtures --exclude=./build --exclude=./.git \
        --exclude="./$(basename "$CARRY")" . | tar -xf - -C "$BASE"
    (cd "$BASE" && patch -s -R -p1 < "$CARRY/change.patch") || { echo "change.patch does not reverse on the checkout"; exit 1; }
fi
BASE_TREE=$BASE
MODELS=${AB_MODELS:-llama3_8b_q4_k_m,gemma3_270m,smollm2_135m}
ACTIVATIONS=${AB_ACTIVATIONS:-q8_1}
T0=$(date +%s)
step() { echo "== $* (+$(( $(date +%s) - T0 ))s)"; }

step wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl

# build TREE TARGETS...: the tree's build in /tmp/ab_build_<tree name>, _core copied into its python/kcap.
build() {
    local tree=$1 name
    shift
    name=$([ "$tree" = "$SRC" ] && echo src || echo base)
    (cd "$tree" &&
        cmake -S . -B "/tmp/ab_build_$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKCAP_CUDA=ON -DKCAP_BUILD_PYTHON=ON \
            -DKCAP_BUILD_TESTS="$([ -n "${AB_ROWS:-}" ] && [ "$tree" = "$SRC" ] && echo ON || echo OFF)" \
            -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" > "/tmp/ab_build_$name.log" 2>&1 &&
        cmake --build "/tmp/ab_build_$name" -j "$JOBS" --target "$@" >> "/tmp/ab_build_$name.log" 2>&1 &&
        cp "/tmp/ab_build_$name"/_core*.so python/kcap/ && echo "built $name" ||
        { echo "build $name failed"; grep -E " error|Error" -A3 "/tmp/ab_build_$name.log" | head -20; })
}
# The synthetic files beside the build (synth needs only numpy and gguf; each file is written as
# .part and renamed when complete).
PYTHONPATH=/tmp/site nice -n 5 python3 "$SRC/bench/bench_cuda.py" --make-only --models /tmp/kcap_models \
    --which "$MODELS" > /tmp/ab_make_models.log 2>&1 &
MAKE_PID=$!
step build
targets=(_core)
[ -n "${AB_ROWS:-}" ] && targets+=(test_cuda_rows)
if [ "$WITH_BASE" = 1 ]; then
    JOBS=$(( $(nproc) / 2 ))
    build "$BASE" _core &
    build "$SRC" "${targets[@]}" &
    wait
    ls "$BASE_TREE"/python/kcap/_core*.so > /dev/null || exit 1
else
    JOBS=$(nproc)
    build "$SRC" "${targets[@]}"
fi
ls "$SRC"/python/kcap/_core*.so > /dev/null || exit 1

# The row tests first: a call cut short by its limit still brings back whether the change is correct.
if [ -n "${AB_ROWS:-}" ]; then
    step "test_cuda_rows $AB_ROWS"
    KCAP_TEST_ROWS=$AB_ROWS timeout "${AB_ROWS_TIMEOUT:-300}" /tmp/ab_build_src/test_cuda_rows > /tmp/ab_rows.log 2>&1
    echo "test_cuda_rows rc=$?"
    grep FAIL /tmp/ab_rows.log | head -20
    tail -n 1 /tmp/ab_rows.log
fi

step models
wait "$MAKE_PID"
tail -3 /tmp/ab_make_models.log

# tree NAME: base's or new's tree (an arm new+VAR=VALUE: new's). run NAME COMMAND...: COMMAND
# with that tree on PYTHONPATH (and the arm's VAR=VALUE in its environment).
tree() { if [[ "$1" == new* ]]; then echo "$SRC"; else echo "$BASE_TREE"; fi; }
run() {
    local name=$1 extra=()
    shift
    [[ "$name" == new+* ]] && extra=("${name#new+}")
    env PYTHONPATH="$(tree "$name")/python:/tmp/site" "${extra[@]}" "$@"
}

FIRST=/tmp/kcap_models/${MODELS%%,*}.gguf
METRICS=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
# Nsight Compute on base and new (on new alone where base is not an arm): the metrics table
# (CSV, compared by ncu_compare.py), or with AB_NCU_SECTIONS those sections' details pages.
REPORT=(--csv --page raw --metrics "$METRICS") EXT=csv
if [ -n "${AB_NCU_SECTIONS:-}" ]; then
    REPORT=() EXT=txt
    for section in $AB_NCU_SECTIONS; do REPORT+=(--section "$section"); done
fi
for name in $([ "${AB_NCU:-1}" = 1 ] && { [ "$WITH_BASE" = 1 ] && echo base new || echo new; }); do
    step "ncu $name"
    run "$name" timeout 300 ncu --clock-control none -k "regex:${AB_KERNELS:-mma_q8}" \
        --launch-skip "${AB_LAUNCH_SKIP:-0}" --launch-count "${AB_LAUNCHES:-24}" "${REPORT[@]}" \
        python3 "$(tree "$name")/bench/cuda_ncu_step.py" "$FIRST" "${ACTIVATIONS%%,*}" > "/tmp/ab_ncu_$name.$EXT" 2> "/tmp/ab_ncu_$name.err" ||
        tail -5 "/tmp/ab_ncu_$name.err"
    [ "$EXT" = txt ] && grep -v "^==PROF==" "/tmp/ab_ncu_$name.txt"
done
[ "${AB_NCU:-1}" = 1 ] && [ "$EXT" = csv ] && [ "$WITH_BASE" = 1 ] &&
    python3 "$SRC/bench/ncu_compare.py" /tmp/ab_ncu_base.csv /tmp/ab_ncu_new.csv --names base,new

for round in $(seq "${AB_ROUNDS:-2}"); do
    for activations in ${ACTIVATIONS//,/ }; do
        for name in $ARMS; do
            for mode in ${AB_MODES:-pp512 ${AB_TG:+tg128}}; do
                step "$mode $activations $name round $round"
                flags=()
                [ "$mode" = pp512 ] && flags=(--pp)
                [ "$mode" = tg128d ] && flags=(--depth "${AB_DEPTH:-4096}")
                run "$name" timeout 200 python3 "$(tree "$name")/bench/cuda_sweep.py" "${flags[@]}" \
                    --activations "$activations" --models /tmp/kcap_models --which "$MODELS" --repeats 1 2>&1 |
                    grep -E "^\| [a-z0-9]" | grep -v "^| model" | sed "s/^/$name $activations /"
            done
        done
    done
done

step "done"
