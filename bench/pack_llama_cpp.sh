#!/usr/bin/env bash
# Packs the llama.cpp source inside llama-cpp-python's sdist down to what a CUDA build of
# llama-bench needs (a few MB), for bench/bench_cuda.py on a device machine with no network:
#   bash bench/pack_llama_cpp.sh SDIST.tar.gz OUT.tar.xz
# Dropped: models/, docs/, tests, examples, the Python side, every ggml backend but CPU and
# CUDA, every tool but llama-bench (tools/CMakeLists.txt is rewritten to build only it).
set -euo pipefail
sdist=${1:-/root/.cache/kcap-bench/sdist/llama_cpp_python-0.3.36.tar.gz}
out=$(realpath -m "${2:-llama_cpp_src.tar.xz}")
work=$(mktemp -d)
tar -xzf "$sdist" -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
cd "$src"
rm -rf models docs tests examples pocs benches media gguf-py conversion app scripts ci skills .devops \
    requirements* convert_*.py grammars licenses flake.nix
find tools -mindepth 1 -maxdepth 1 ! -name llama-bench ! -name CMakeLists.txt -exec rm -rf {} +
cat > tools/CMakeLists.txt <<'CMAKE'
# Stripped for kcap's benchmark (bench/pack_llama_cpp.sh): llama-bench only.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CMAKE
for backend in ggml/src/ggml-*/; do
    case "$(basename "$backend")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$backend" ;; esac
done
echo "$(basename "$(dirname "$(dirname "$src")")")" > KCAP_SOURCE  # the sdist it came from
XZ_OPT=-9 tar -cJf "$out" -C "$(dirname "$src")" --transform 's,^llama\.cpp,llama.cpp-src,' llama.cpp
rm -rf "$work"
ls -la "$out"
