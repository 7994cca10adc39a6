// The uniform number of a sampling draw, shared by the device sampler (kernels/sample.h) and the
// CPU's (cpp/core/sampling.cpp), so a seeded run draws the same numbers on every backend.
// Plain integer arithmetic only: it compiles as CUDA, MSL and plain C++ (where KCAP_FN, the
// dialect's function qualifier, is not defined and means inline).
#pragma once

#ifndef KCAP_FN
#define KCAP_FN inline
#endif

// The uniform number in [0, 1) of the draw at `position`: two rounds of a 32-bit integer mix
// (the finalizer of MurmurHash3) over seed and position, top 24 bits.
KCAP_FN unsigned kcap_sample_mix(unsigned h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h + 0x6A09E667u;
}

KCAP_FN float kcap_sample_uniform(unsigned seed, int position) {
    const unsigned h = kcap_sample_mix(kcap_sample_mix(seed ^ (unsigned(position) * 0x9E3779B9u)));
    return float(h >> 8) * (1.0f / 16777216.0f);
}
