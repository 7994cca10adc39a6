#!/usr/bin/env bash
# CI step for the Metal backend on machines without Metal (Linux): every metal/*.metal
# translation unit, with the shared kernel bodies it includes and the Metal branch of
# kernels/dialect.h, must compile as C++17 under metal/check/metal_stand_in.h (which stands in
# for <metal_stdlib>: address-space qualifiers, vector types, SIMD-group functions). Template
# entry points are instantiated for every format, so each body is type-checked per format.
# Then metal/check/reserved_words.py looks for MSL-reserved words used as names, which C++
# accepts. What this does not check: MSL semantics and address-space rules, attribute
# validity, and the Objective-C++ host (metal/*.mm), which only compiles on macOS.
#   bash scripts/metal_compile_check.sh      (CXX=clang++ to use another compiler)
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-$(command -v g++ || command -v clang++ || true)}
[ -n "$CXX" ] || { echo "metal_compile_check: no C++ compiler found" >&2; exit 1; }
PY=${PYTHON:-python3}
FLAGS=(-std=c++17 -x c++ -D__METAL_VERSION__=310 -Imetal/check -I. -Wall -Wextra -Werror -Wno-attributes
       -Wno-unknown-pragmas)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
status=0
count=0
for source in metal/*.metal; do
    count=$((count + 1))
    if "$CXX" "${FLAGS[@]}" -fsyntax-only "$source"; then
        "$CXX" "${FLAGS[@]}" -E "$source" -o "$OUT/$(basename "$source").i"
    else
        echo "metal_compile_check: $source does not compile under the stand-in" >&2
        status=1
    fi
done
[ "$count" -gt 0 ] || { echo "metal_compile_check: no metal/*.metal files" >&2; exit 1; }
if ls "$OUT"/*.i > /dev/null 2>&1; then
    "$PY" metal/check/reserved_words.py "$OUT"/*.i || status=1
fi
[ "$status" -eq 0 ] && echo "metal_compile_check: $count .metal files compile as C++ under the stand-in"
exit "$status"
