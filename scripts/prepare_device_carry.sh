#!/usr/bin/env bash
# Prepares the folder a device call carries for scripts/device_check.sh and scripts/device_ab.sh
# (the device machine has no network; the call copies the checkout itself, tracked files and
# untracked ones git does not ignore, and the carried folder, at most 64 MiB in all):
#   bash scripts/prepare_device_carry.sh [CARRY_DIR]      (default: .kcap_cuda_carry)
# CARRY_DIR gets
#   whl/gguf-*.whl          gguf (not in the device image), downloaded once
#   llama_cpp_src.tar.xz    llama.cpp stripped for a CUDA llama-bench (bench/pack_llama_cpp.sh),
#                           made once from llama-cpp-python's sdist (LLAMA=0 leaves it out: 2.3 MB
#                           that the checkout may not leave room for; a call without llama.cpp
#                           needs none)
#   change.patch            with BASE_REV=<rev>: `git diff <rev>` of the checkout (tracked files),
#                           which scripts/device_ab.sh reverses on a copy of the checkout to build
#                           the base beside the change in one device call
# Add CARRY_DIR to .git/info/exclude so it is not tracked, then call the device with
# carry [CARRY_DIR] and, for example:
#   SKIP_TESTS=1 BENCH_MODELS=qwen3_30b_a3b_q4_k_m bash scripts/device_check.sh CARRY_DIR \
#       > $OUT/check.txt 2>&1; tail -14 $OUT/check.txt
#   AB_MODELS=gemma3_270m AB_ROWS=matmul bash scripts/device_ab.sh CARRY_DIR > $OUT/ab.txt 2>&1
# (SKIP_LLAMA=1 skips llama.cpp; the full run with llama.cpp takes about 7 of the 10 minutes.)
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${1:-.kcap_cuda_carry}
mkdir -p "$carry/whl"
rm -rf "$carry/src" "$carry/base" "$carry/change.patch"
if [ -n "${BASE_REV:-}" ]; then
    git diff --binary "$BASE_REV" -- . ":(exclude)$carry" > "$carry/change.patch"
    untracked=$(git ls-files -o --exclude-standard | grep -v "^${carry}/" || true)
    [ -z "$untracked" ] || echo "prepare_device_carry: untracked files are not in change.patch (git add -N them): $untracked" >&2
fi
if ! ls "$carry"/whl/gguf-*.whl > /dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$carry/whl" gguf
fi
if [ "${LLAMA:-1}" = 0 ]; then
    rm -f "$carry/llama_cpp_src.tar.xz"
elif [ ! -f "$carry/llama_cpp_src.tar.xz" ]; then
    sdist_dir=$(mktemp -d)
    # --no-binary for this package only, no build isolation: pip reads the sdist's metadata with
    # the scikit-build-core already installed instead of building its build tools (cmake among
    # them) from source first.
    python3 -m pip download -q --no-deps --no-binary=llama-cpp-python --no-build-isolation -d "$sdist_dir" \
        llama-cpp-python==0.3.36
    bash bench/pack_llama_cpp.sh "$sdist_dir"/llama_cpp_python-*.tar.gz "$carry/llama_cpp_src.tar.xz"
fi
du -sh "$carry"/*
total=$(( $(git ls-files -co --exclude-standard | grep -v "^${carry}/" | tr '\n' '\0' | xargs -0 cat 2> /dev/null | wc -c) +
          $(find "$carry" -type f -print0 | xargs -0 cat | wc -c) ))
echo "checkout and carry: $(( total / 1048576 )) MiB of the call's 64"
