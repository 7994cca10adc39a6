"""ctest isa_confined: the instructions a CPU may lack stay in the kernels chosen at run time.

    python3 tests/cpp/isa_confined.py LIBKCAP_CORE.a [--objdump OBJDUMP] [--nm NM]

A portable x86-64 build compiles cpp/core/formats_dot_avx512.cpp and cpp/cpu/matmul_*_avx512.cpp
with AVX-512 and formats_dot_avx2.cpp and cpp/cpu/matmul_*_avx2.cpp with AVX2, a portable AArch64
build formats_dot_neon_dotprod.cpp with the dot product extension (CMakeLists.txt), and picks one at run time. That is only safe if no code
compiled for those instructions can run elsewhere: no other object of the library may use them
(zmm registers for AVX-512, SDOT/UDOT for the Arm dot product), the kernel object must (its
kernels are real), and no such kernel object may define a weak symbol (an inline function the
linker could keep for every caller, compiled for instructions the CPU may lack). The Python
module itself is stripped, so this is checked on the objects of the static library. The
architecture is read from the library (objdump's "file format"); a cross build passes its
toolchain's objdump and nm (llvm-objdump is given --mattr=+dotprod to decode SDOT). Exit 77
(skipped) without objdump or nm, or when that objdump does not know the library's architecture."""
import argparse
import re
import shutil
import subprocess
import sys

# Per architecture: the objects whose kernels need the widest instructions (each must use them,
# no other may), how to spot those instructions in objdump's output and what to call them, and
# the objects compiled for instructions beyond the baseline (none may define a weak symbol).
ARCHITECTURES = {
    "x86-64": ({"formats_dot_avx512.cpp.o", "matmul_q8_avx512.cpp.o", "matmul_f32_avx512.cpp.o"}, re.compile(r"%zmm"),
               "zmm registers (AVX-512)",
               {"formats_dot_avx512.cpp.o", "formats_dot_avx2.cpp.o", "matmul_q8_avx512.cpp.o", "matmul_f32_avx512.cpp.o",
                "matmul_f32_avx2.cpp.o", "matmul_q8_avx2.cpp.o"}),
    "aarch64": ({"formats_dot_neon_dotprod.cpp.o"}, re.compile(r"\s[su]dot\s"), "SDOT/UDOT (dot product)",
                {"formats_dot_neon_dotprod.cpp.o"}),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("library")
    parser.add_argument("--objdump", default="")
    parser.add_argument("--nm", default="")
    args = parser.parse_args()
    objdump = shutil.which(args.objdump or "objdump")
    nm = shutil.which(args.nm or "nm")
    if not objdump or not nm:
        print("isa_confined: objdump or nm (binutils) not found: skipped")
        return 77
    headers = subprocess.run([objdump, "-f", args.library], capture_output=True, text=True, check=True).stdout
    formats = set(re.findall(r"file format (\S+)", headers))
    architecture = ("x86-64" if any("x86-64" in f for f in formats)
                    else "aarch64" if any("aarch64" in f for f in formats) else None)
    if architecture is None:
        print(f"isa_confined: {objdump} reads {sorted(formats)}: no run-time kernels there, or an architecture "
              "this objdump does not know (pass --objdump and --nm of its binutils): skipped")
        return 77
    wide_kernels, wide, what, kernels = ARCHITECTURES[architecture]
    command = [objdump, "-d", "--no-show-raw-insn", args.library]
    version = subprocess.run([objdump, "--version"], capture_output=True, text=True).stdout
    if architecture == "aarch64" and "LLVM" in version:
        command.insert(1, "--mattr=+dotprod")  # llvm-objdump decodes only the features it is given
    disassembly = subprocess.run(command, capture_output=True, text=True)
    if "can't disassemble" in disassembly.stderr:
        print(f"isa_confined: {objdump} cannot disassemble {architecture} (pass --objdump and --nm of its binutils): "
              "skipped")
        return 77
    disassembly.check_returncode()
    code = disassembly.stdout
    member, uses = "?", {}
    for line in code.splitlines():
        if "file format" in line:  # "member.o:  file format ..." (GNU) or "lib.a(member.o): file format" (LLVM)
            member = re.sub(r"^.*\((.*)\)$", r"\1", line.split(":", 1)[0].strip())
        elif wide.search(line):
            uses[member] = uses.get(member, 0) + 1
    failures = [f"{name} uses {what} ({count} instructions)" for name, count in uses.items() if name not in wide_kernels]
    failures += [f"{kernel} has no {what} instruction: its kernels were not compiled"
                 for kernel in sorted(wide_kernels - set(uses))]
    symbols = subprocess.run([nm, "-C", args.library], capture_output=True, text=True, check=True).stdout
    member = "?"
    for line in symbols.splitlines():
        if line.endswith(".o:"):
            member = line[:-1]
        elif member in kernels and len(line.split(maxsplit=2)) == 3 and line.split(maxsplit=2)[1] in ("W", "V", "u"):
            failures.append(f"{member} defines the weak symbol {line.split(maxsplit=2)[2]}")
    for failure in failures:
        print("isa_confined:", failure)
    print(f"isa_confined ({architecture}): {what} in {sorted(uses)}; {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
