// KCAP_HOT_LOOP marks the CPU backend's hot loops. Where the library targets the x86-64 baseline
// (the default: a wheel for any machine) they are compiled twice, once for AVX2+FMA and once for
// the baseline, and the dynamic loader picks the CPU's copy, by its features, when the library
// loads (GCC/Clang function multiversioning, KCAP_CPU_CLONES from CMakeLists.txt). A build for
// the build machine (KCAP_NATIVE) compiles them once, for it.
#pragma once

#if defined(KCAP_CPU_CLONES) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
// x86-64-v3 (AVX2, FMA, F16C, BMI): GCC's dispatcher tests the CPU's features for an x86-64-v*
// level. ("arch=haswell" would test the CPU's model, and so run the baseline copy on every CPU
// but a Haswell: an AMD Zen 4 and an Intel Skylake alike.)
#define KCAP_HOT_LOOP __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(KCAP_CPU_CLONES)
// Compilers without the x86-64-v* levels in target_clones: a copy with AVX2 alone, chosen by
// that feature.
#define KCAP_HOT_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define KCAP_HOT_LOOP
#endif
