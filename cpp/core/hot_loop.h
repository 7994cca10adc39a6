// KCAP_HOT_LOOP marks the CPU backend's hot loops. Where the library targets the x86-64 baseline
// (the default: a wheel for any machine) they are compiled twice, once for AVX2+FMA and once for
// the baseline, and the dynamic loader picks the CPU's copy when the library loads (GCC/Clang
// function multiversioning, KCAP_CPU_CLONES from CMakeLists.txt). A build for the build machine
// (KCAP_NATIVE) compiles them once, for it.
#pragma once

#if defined(KCAP_CPU_CLONES)
#define KCAP_HOT_LOOP __attribute__((target_clones("arch=haswell", "default")))
#else
#define KCAP_HOT_LOOP
#endif
