"""ctest isa_confined: the wide x86 instructions stay in the kernels chosen at run time.

    python3 tests/cpp/isa_confined.py LIBKCAP_CORE.a

A portable x86-64 build compiles cpp/core/formats_dot_avx512.cpp with AVX-512 and
formats_dot_avx2.cpp with AVX2 (CMakeLists.txt) and picks one at run time. That is only safe if
no code compiled for those instructions can run elsewhere: no other object of the library may
use zmm registers (AVX-512), the AVX-512 object must (its kernels are real), and neither kernel
object may define a weak symbol (an inline function the linker could keep for every caller,
compiled for instructions the CPU may lack). The Python module itself is stripped, so this is
checked on the objects of the static library. Exit 77 (skipped) without objdump or nm."""
import shutil
import subprocess
import sys

KERNELS = {"formats_dot_avx512.cpp.o", "formats_dot_avx2.cpp.o"}


def main() -> int:
    library = sys.argv[1]
    objdump, nm = shutil.which("objdump"), shutil.which("nm")
    if not objdump or not nm:
        print("isa_confined: objdump or nm (binutils) not found: skipped")
        return 77
    code = subprocess.run([objdump, "-d", "--no-show-raw-insn", library], capture_output=True, text=True,
                          check=True).stdout
    member, zmm = "?", {}
    for line in code.splitlines():
        if "file format" in line:
            member = line.split(":", 1)[0].strip()
        elif "%zmm" in line:
            zmm[member] = zmm.get(member, 0) + 1
    failures = [f"{name} uses zmm registers ({count} instructions)" for name, count in zmm.items()
                if name != "formats_dot_avx512.cpp.o"]
    if "formats_dot_avx512.cpp.o" not in zmm:
        failures.append("formats_dot_avx512.cpp.o has no AVX-512 instruction: its kernels were not compiled")
    symbols = subprocess.run([nm, "-C", library], capture_output=True, text=True, check=True).stdout
    member = "?"
    for line in symbols.splitlines():
        if line.endswith(".o:"):
            member = line[:-1]
        elif member in KERNELS and len(line.split(maxsplit=2)) == 3 and line.split(maxsplit=2)[1] in ("W", "V", "u"):
            failures.append(f"{member} defines the weak symbol {line.split(maxsplit=2)[2]}")
    for failure in failures:
        print("isa_confined:", failure)
    print(f"isa_confined: zmm in {sorted(zmm)}; {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
