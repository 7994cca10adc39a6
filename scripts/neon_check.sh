#!/usr/bin/env bash
# The AArch64 build of the CPU kernels, checked on an x86-64 machine: cross-compiles the C++
# core and its tests for aarch64 (a portable build, as a wheel is: no -march=native) and runs
# them under qemu-aarch64, once on an emulated CPU with the dot product instructions (SDOT: the
# NEON kernels plus the SDOT q8_1 ones) and once on one without (only the NEON kernels may run).
#   - test_formats on both CPUs: every build of dot_row / dot_row_q8_1 against the f64 reference
#     (tests/cpp/test_formats.cpp), and which kernels the run-time dispatch picked;
#   - test_engine, test_rows_table and isa_confined (SDOT only in formats_dot_neon_dotprod.cpp);
#   - that the emulated CPU without SDOT really lacks it (calling the SDOT kernel there must die
#     of SIGILL), so the second run is a real test of the fallback;
#   - bench/cpu_dot_rows on both CPUs, a sanity check that every build runs long rows and agrees
#     with the portable one. Emulated times say nothing about the speed of Arm hardware.
# Installs nothing. It needs (Debian/Ubuntu: apt-get install g++-aarch64-linux-gnu qemu-user):
# aarch64-linux-gnu-g++ (or ARM_CXX=clang++ with that package's libraries), qemu-aarch64, cmake,
# ninja or make, python3.
#   bash scripts/neon_check.sh                  (BUILD=/tmp/kcap-neon-check JOBS=2 by default)
#   ARM_CXX=clang++ bash scripts/neon_check.sh  (the same with clang)
#   CPU_WITH_DOTPROD=neoverse-n1 CPU_WITHOUT_DOTPROD=cortex-a57 bash scripts/neon_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=$(pwd)
BUILD=${BUILD:-/tmp/kcap-neon-check}
JOBS=${JOBS:-2}
ARM_CXX=${ARM_CXX:-aarch64-linux-gnu-g++}
SYSROOT=${ARM_SYSROOT:-/usr/aarch64-linux-gnu}  # the aarch64 libc and libstdc++ qemu loads
CPU_WITH_DOTPROD=${CPU_WITH_DOTPROD:-max}
CPU_WITHOUT_DOTPROD=${CPU_WITHOUT_DOTPROD:-cortex-a53}
PY=${PYTHON:-python3}

missing=()
command -v "$ARM_CXX" > /dev/null || missing+=("$ARM_CXX (the aarch64 cross compiler)")
command -v aarch64-linux-gnu-g++ > /dev/null || missing+=("aarch64-linux-gnu-g++ (its libstdc++ and binutils, also for clang)")
command -v qemu-aarch64 > /dev/null || missing+=("qemu-aarch64 (the user-mode emulator)")
command -v cmake > /dev/null || missing+=("cmake")
command -v "$PY" > /dev/null || missing+=("$PY")
[ -d "$SYSROOT/lib" ] || missing+=("$SYSROOT/lib (the aarch64 C library: libc6-arm64-cross)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "neon_check: missing:" >&2
    printf '  %s\n' "${missing[@]}" >&2
    echo "neon_check: on Debian/Ubuntu: apt-get install g++-aarch64-linux-gnu qemu-user cmake" >&2
    exit 2
fi
GENERATOR=()
command -v ninja > /dev/null && GENERATOR=(-G Ninja)

EMULATE=(qemu-aarch64 -L "$SYSROOT")
mkdir -p "$BUILD"
# A cross build: CMake runs every test executable through the emulator.
{
    echo "set(CMAKE_SYSTEM_NAME Linux)"
    echo "set(CMAKE_SYSTEM_PROCESSOR aarch64)"
    echo "set(CMAKE_CXX_COMPILER $ARM_CXX)"
    if [[ "$ARM_CXX" == *clang* ]]; then
        echo "set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)"
        echo "set(CMAKE_EXE_LINKER_FLAGS_INIT -fuse-ld=$(command -v aarch64-linux-gnu-ld))"
        echo "set(CMAKE_SHARED_LINKER_FLAGS_INIT -fuse-ld=$(command -v aarch64-linux-gnu-ld))"
    fi
    # GNU binutils for aarch64 (ctest isa_confined disassembles with them; llvm-objdump would need
    # --mattr=+dotprod to decode SDOT).
    echo "set(CMAKE_OBJDUMP $(command -v aarch64-linux-gnu-objdump))"
    echo "set(CMAKE_NM $(command -v aarch64-linux-gnu-nm))"
    echo "set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;$SYSROOT;-cpu;$CPU_WITH_DOTPROD)"
} > "$BUILD/toolchain.cmake"
BENCH_CXX=("$ARM_CXX")
[[ "$ARM_CXX" == *clang* ]] && BENCH_CXX+=(--target=aarch64-linux-gnu "-fuse-ld=$(command -v aarch64-linux-gnu-ld)")

echo "== $("$ARM_CXX" --version | head -1); $(qemu-aarch64 --version | head -1)"
echo "== configure $BUILD (aarch64, portable: KCAP_NATIVE=OFF, no CUDA, no Python module)"
cmake -S "$SOURCE" -B "$BUILD/build" "${GENERATOR[@]}" -DCMAKE_TOOLCHAIN_FILE="$BUILD/toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DKCAP_CUDA=OFF -DKCAP_NATIVE=OFF -DKCAP_BUILD_PYTHON=OFF -DKCAP_INSTALL_CPP=OFF \
    -DKCAP_BUILD_TESTS=ON -DKCAP_TEST_PYTHON="$(command -v "$PY")" > "$BUILD/configure.log" \
    || { cat "$BUILD/configure.log"; exit 1; }
echo "== build kcap_core and the tests ($JOBS jobs)"
cmake --build "$BUILD/build" -j "$JOBS" --target kcap_core test_formats test_engine test_rows_table > "$BUILD/build.log" 2>&1 \
    || { tail -40 "$BUILD/build.log"; exit 1; }
"${BENCH_CXX[@]}" -O2 -std=c++17 -Wall -Wextra -Icpp/include -Icpp -I. bench/cpu_dot_rows.cpp \
    "$BUILD/build/libkcap_core.a" -lpthread -o "$BUILD/cpu_dot_rows"
grep -rqs -- "-march=armv8.2-a+dotprod" "$BUILD/build/build.ninja" "$BUILD/build/CMakeFiles/kcap_core.dir" \
    && echo "   formats_dot_neon_dotprod.cpp is compiled with -march=armv8.2-a+dotprod, the rest for the compiler's default"

status=0
fail() { echo "neon_check: FAIL: $*"; status=1; }

for cpu in "$CPU_WITH_DOTPROD" "$CPU_WITHOUT_DOTPROD"; do
    expected=$([ "$cpu" = "$CPU_WITH_DOTPROD" ] && echo "neon+dotprod" || echo "neon")
    echo
    echo "== ${EMULATE[*]} -cpu $cpu $BUILD/build/test_formats (expects kernels $expected)"
    if output=$("${EMULATE[@]}" -cpu "$cpu" "$BUILD/build/test_formats"); then :; else fail "test_formats on $cpu"; fi
    echo "$output" | grep -E "^(note|neon|cpu kernels|cap |FAIL)|passed|dot_row(_q8_1)? \(cap" || true
    echo "$output" | grep -q "^cpu kernels in use: $expected\$" || fail "test_formats on $cpu did not pick $expected"
done

echo
echo "== ctest test_engine test_rows_table isa_confined (through ${EMULATE[*]} -cpu $CPU_WITH_DOTPROD)"
ctest --test-dir "$BUILD/build" -R '^(test_engine|test_rows_table|isa_confined)$' --output-on-failure || fail "ctest"
"$PY" tests/cpp/isa_confined.py "$BUILD/build/libkcap_core.a" --objdump aarch64-linux-gnu-objdump \
    --nm aarch64-linux-gnu-nm || fail "isa_confined"

echo
echo "== the SDOT kernel called anyway: must run on -cpu $CPU_WITH_DOTPROD and die of SIGILL on -cpu $CPU_WITHOUT_DOTPROD"
"${EMULATE[@]}" -cpu "$CPU_WITH_DOTPROD" "$BUILD/cpu_dot_rows" --call-sdot || fail "SDOT on $CPU_WITH_DOTPROD"
set +e
"${EMULATE[@]}" -cpu "$CPU_WITHOUT_DOTPROD" "$BUILD/cpu_dot_rows" --call-sdot 2>&1
code=$?
set -e
if [ "$code" -eq 132 ]; then
    echo "   exit 132 (SIGILL): -cpu $CPU_WITHOUT_DOTPROD has no SDOT, so its test_formats run above used the fallback"
else
    fail "SDOT on $CPU_WITHOUT_DOTPROD exited $code, not 132 (SIGILL): that CPU may not lack SDOT"
fi

for cpu in "$CPU_WITH_DOTPROD" "$CPU_WITHOUT_DOTPROD"; do
    echo
    echo "== ${EMULATE[*]} -cpu $cpu $BUILD/cpu_dot_rows 4096 300 Q4_0,Q8_0,Q4_K,Q6_K"
    echo "   (emulated: the times are qemu's translation of each loop, not the speed of an Arm CPU)"
    "${EMULATE[@]}" -cpu "$cpu" "$BUILD/cpu_dot_rows" 4096 300 Q4_0,Q8_0,Q4_K,Q6_K || fail "cpu_dot_rows on $cpu"
done

echo
[ "$status" -eq 0 ] && echo "neon_check: all passed" || echo "neon_check: failures above"
exit "$status"
