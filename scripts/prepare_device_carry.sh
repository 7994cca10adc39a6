#!/usr/bin/env bash
# Prepares the folder a device call carries for scripts/device_check.sh (the device machine has
# no network and the call copies at most 64 MiB of the checkout):
#   bash scripts/prepare_device_carry.sh [CARRY_DIR]      (default: .kcap_cuda_carry)
# CARRY_DIR gets
#   src/                    the tracked and untracked-not-ignored sources of this checkout, without
#                           the large goldens and fixtures (the checkout itself travels too: the
#                           device command copies tests/fixtures/conformance and
#                           tests/goldens/conformance from it into src/ when it needs them)
#   whl/gguf-*.whl          gguf (not in the device image), downloaded once
#   llama_cpp_src.tar.xz    llama.cpp stripped for a CUDA llama-bench (bench/pack_llama_cpp.sh),
#                           made once from llama-cpp-python's sdist
# Add CARRY_DIR to .git/info/exclude so it is not tracked, then call the device with
# carry [CARRY_DIR] and, for example:
#   cp -r tests/fixtures/conformance CARRY/src/tests/fixtures/ && mkdir -p CARRY/src/tests/goldens &&
#   cp -r tests/goldens/conformance CARRY/src/tests/goldens/ && cd CARRY/src &&
#   BUDGET_S=495 bash scripts/device_check.sh .. > $OUT/check.txt 2>&1; tail -14 $OUT/check.txt
# (SKIP_LLAMA=1 skips llama.cpp; the full run with llama.cpp takes about 7 of the 10 minutes.)
# BASE_REV=<rev> also writes CARRY_DIR/base/: that revision's sources, the same way, for an A/B
# of a change against it in one device call (scripts/device_ab.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${1:-.kcap_cuda_carry}
mkdir -p "$carry/whl"
rm -rf "$carry/src" && mkdir -p "$carry/src"
git ls-files -co --exclude-standard | grep -v -E "^tests/goldens/|^tests/fixtures/conformance/|^build/|^${carry}/" |
    tar -cf - -T - | tar -xf - -C "$carry/src"
rm -rf "$carry/base"
if [ -n "${BASE_REV:-}" ]; then
    mkdir -p "$carry/base"
    git archive "$BASE_REV" | tar -xf - -C "$carry/base" --exclude=tests/goldens --exclude=tests/fixtures/conformance
fi
if ! ls "$carry"/whl/gguf-*.whl > /dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$carry/whl" gguf
fi
if [ ! -f "$carry/llama_cpp_src.tar.xz" ]; then
    sdist_dir=$(mktemp -d)
    # --no-binary for this package only, no build isolation: pip reads the sdist's metadata with
    # the scikit-build-core already installed instead of building its build tools (cmake among
    # them) from source first.
    python3 -m pip download -q --no-deps --no-binary=llama-cpp-python --no-build-isolation -d "$sdist_dir" \
        llama-cpp-python==0.3.36
    bash bench/pack_llama_cpp.sh "$sdist_dir"/llama_cpp_python-*.tar.gz "$carry/llama_cpp_src.tar.xz"
fi
du -sh "$carry"/*
