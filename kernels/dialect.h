// The portable kernel dialect: what kernel bodies in kernels/*.h may use, and nothing else.
//
// A body is written once and compiled three ways:
//   CUDA  (.cu entry files in cuda/, nvcc)          warp = simd group of 32 lanes
//   Metal (.metal entry files in metal/, xcrun metal) simdgroup of 32 lanes
//   host  (tests, any C++17 compiler)                 kernels/dialect_host.h runs each thread of
//                                                     a group as a fiber, so barriers and simd
//                                                     exchanges behave as on a GPU
// so nothing CUDA-only can hide in a body: the host build of the tests would not compile.
//
// What a body gets:
//   KCAP_FN                function qualifier of every helper and body (device inline)
//   KCAP_HOST_FN           a helper a host launcher calls too (host and device inline)
//   KCAP_GLOBAL            address space of device buffers       (Metal: device)
//   KCAP_SHARED            address space of group-shared memory  (Metal: threadgroup)
//   KCAP_PRIVATE           address space of a thread's own arrays (Metal: thread)
//   KcapThread             the thread's indices, filled by the entry point (bodies never read
//                          threadIdx / thread_position_in_grid themselves)
//   kcap_barrier()         all threads of the group            (__syncthreads / threadgroup_barrier)
//   kcap_simd_barrier()    the lanes of one simd group         (__syncwarp / simdgroup_barrier)
//   kcap_simd_sum/max, kcap_simd_shuffle_xor, kcap_simd_broadcast   (all 32 lanes take part)
//   kcap_half_to_float / kcap_float_to_half / kcap_bf16_to_float, kcap_u8_to_float
//   kcap_load_u16 / kcap_load_u32 (4-byte aligned) / kcap_load_u32_a2 (2-byte aligned) /
//   kcap_load_u32x4 (16-byte aligned) / kcap_load_f32x4 / kcap_store_f32x4, kcap_as_float (bits -> float)
//   kcap_load_u32s_a2<N> / kcap_load_u16_u32s_a2<N>: runs of 32-bit words at a 2-byte-aligned
//   address with about one load per word (see the shared section below)
//   kcap_exp / kcap_tanh / kcap_erf / kcap_sqrt / kcap_rsqrt, kcap_prefetch (a hint; may be a no-op)
//   kcap_dot4_i8(a, b, acc): acc + the dot product of the four signed bytes of a and b (dp4a)
//   kcap_byte_perm(a, b, s) (selectors 0..7) / kcap_byte_perm_sx (4-bit selectors, bit 3 the
//   sign-replicating one): CUDA's PRMT
//   kcap_round_to_int: round to nearest, ties to even (the q8_1 activation rows' rounding)
// Integer types: kcap_u8, kcap_i8, kcap_u16, kcap_u32, kcap_i32, kcap_u64 (Metal has no <cstdint>).
#pragma once

#define KCAP_SIMD_WIDTH 32

#if defined(__CUDACC__)
// ---------------------------------------------------------------------------------- CUDA
#include <cuda_fp16.h>

#define KCAP_FN __device__ __forceinline__
#define KCAP_GLOBAL
#define KCAP_SHARED
#define KCAP_PRIVATE
#define KCAP_UNROLL _Pragma("unroll")

typedef unsigned char kcap_u8;
typedef signed char kcap_i8;
typedef unsigned short kcap_u16;
typedef unsigned int kcap_u32;
typedef int kcap_i32;
typedef unsigned long long kcap_u64;

struct KcapThread {
    unsigned index;      // thread index in the group (not `thread`: a Metal keyword)
    unsigned threads;    // threads per group
    unsigned lane;       // index in the simd group
    unsigned simd;       // simd group index in the group
    unsigned simds;      // simd groups per group
    unsigned group_x, group_y, group_z;     // group index in the grid
    unsigned groups_x, groups_y, groups_z;  // groups in the grid
};

KCAP_FN KcapThread kcap_cuda_thread() {
    KcapThread t;
    t.index = threadIdx.x;
    t.threads = blockDim.x;
    t.lane = threadIdx.x & 31u;
    t.simd = threadIdx.x >> 5;
    t.simds = blockDim.x >> 5;
    t.group_x = blockIdx.x;
    t.group_y = blockIdx.y;
    t.group_z = blockIdx.z;
    t.groups_x = gridDim.x;
    t.groups_y = gridDim.y;
    t.groups_z = gridDim.z;
    return t;
}

KCAP_FN void kcap_barrier() { __syncthreads(); }
KCAP_FN void kcap_simd_barrier() { __syncwarp(); }
KCAP_FN float kcap_simd_shuffle_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
KCAP_FN int kcap_simd_shuffle_xor(int v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
KCAP_FN float kcap_simd_broadcast(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
KCAP_FN int kcap_simd_broadcast(int v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }

KCAP_FN float kcap_half_to_float(kcap_u16 h) { return __half2float(__ushort_as_half(h)); }
KCAP_FN kcap_u16 kcap_float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }
KCAP_FN float kcap_bf16_to_float(kcap_u16 h) { return __uint_as_float(unsigned(h) << 16); }
// Byte 0..255 -> float without the slow integer conversion unit: 2^23 + b has b in its
// mantissa (one byte permute), then subtract 2^23 (exact).
KCAP_FN float kcap_u8_to_float(kcap_u32 b) { return __uint_as_float(0x4B000000u | b) - 8388608.0f; }
// Byte `which` (0..3) of word w, as float.
KCAP_FN float kcap_byte_to_float(kcap_u32 w, int which) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, unsigned(which) | 0x7540u)) - 8388608.0f;
}
// The same less `less` (a small integer: 2^23 + less is exact), in one subtraction: codes less
// their bias.
KCAP_FN float kcap_byte_to_float_less(kcap_u32 w, int which, float less) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, unsigned(which) | 0x7540u)) - (8388608.0f + less);
}
// Byte i of the result is byte (s >> 4i) & 7 of b:a (selectors 0..7 only: the sign-replicating
// selectors of PRMT are not used).
KCAP_FN kcap_u32 kcap_byte_perm(kcap_u32 a, kcap_u32 b, kcap_u32 s) { return __byte_perm(a, b, s); }
// PRMT with its whole 4-bit selectors: (s >> 4i) & 7 picks byte i of the result from b:a as above,
// and where bit 3 of that selector is set the byte becomes the sign of the picked byte, 0x00 or
// 0xff (one instruction).
KCAP_FN kcap_u32 kcap_byte_perm_sx(kcap_u32 a, kcap_u32 b, kcap_u32 s) {
    kcap_u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

KCAP_FN kcap_u32 kcap_load_u16(const kcap_u8* p) { return *reinterpret_cast<const unsigned short*>(p); }
KCAP_FN kcap_u32 kcap_load_u32(const kcap_u8* p) { return *reinterpret_cast<const unsigned*>(p); }
KCAP_FN kcap_u32 kcap_load_u32_a2(const kcap_u8* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return unsigned(h[0]) | (unsigned(h[1]) << 16);
}
KCAP_FN float4 kcap_load_f32x4(const float* p) { return *reinterpret_cast<const float4*>(p); }
KCAP_FN void kcap_store_f32x4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
KCAP_FN uint4 kcap_load_u32x4(const kcap_u8* p) { return *reinterpret_cast<const uint4*>(p); }
KCAP_FN float kcap_as_float(kcap_u32 bits) { return __uint_as_float(bits); }
KCAP_FN void kcap_prefetch(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// For the a2 word runs below: the low address bits of p, and the 32 bits of hi:lo starting at
// bit shift (0, 16 or 32; one SHF.R.U32.HI, which clamps a shift of 32 to `hi`).
KCAP_FN kcap_u32 kcap_address_bits(const kcap_u8* p) { return kcap_u32(reinterpret_cast<unsigned long long>(p)); }
KCAP_FN kcap_u32 kcap_funnel_r(kcap_u32 lo, kcap_u32 hi, kcap_u32 shift) { return __funnelshift_rc(lo, hi, shift); }

KCAP_FN float kcap_exp(float x) { return expf(x); }
KCAP_FN float kcap_tanh(float x) { return tanhf(x); }
KCAP_FN float kcap_erf(float x) { return erff(x); }
KCAP_FN float kcap_sqrt(float x) { return sqrtf(x); }
KCAP_FN float kcap_rsqrt(float x) { return 1.0f / sqrtf(x); }
KCAP_FN float kcap_fmax(float a, float b) { return fmaxf(a, b); }
KCAP_FN int kcap_dot4_i8(int a, int b, int acc) { return __dp4a(a, b, acc); }
KCAP_FN int kcap_round_to_int(float x) { return __float2int_rn(x); }
#define KCAP_NEG_INFINITY (-__int_as_float(0x7f800000))

#elif defined(__METAL_VERSION__)
// ---------------------------------------------------------------------------------- Metal
#include <metal_stdlib>
using namespace metal;

#define KCAP_FN inline
#define KCAP_GLOBAL device
#define KCAP_SHARED threadgroup
// The thread address space goes through KCAP_METAL_THREAD_SPACE so the Linux compile check
// (metal/check/metal_stand_in.h) can spell it as nothing; `thread` is reserved in MSL, so no
// name in the bodies may be `thread` (KcapThread's index member is `index`), which
// metal/check/reserved_words.py enforces.
#ifndef KCAP_METAL_THREAD_SPACE
#define KCAP_METAL_THREAD_SPACE thread
#endif
#define KCAP_PRIVATE KCAP_METAL_THREAD_SPACE
#define KCAP_UNROLL _Pragma("unroll")

typedef uchar kcap_u8;
typedef char kcap_i8;
typedef ushort kcap_u16;
typedef uint kcap_u32;
typedef int kcap_i32;
typedef ulong kcap_u64;

struct KcapThread {
    uint index, threads, lane, simd, simds;
    uint group_x, group_y, group_z;
    uint groups_x, groups_y, groups_z;
};

// What every .metal entry point takes to build its KcapThread (1-D threadgroups, 2-D/3-D grids
// of groups, as the CUDA launches): KCAP_METAL_THREAD_ARGS in the parameter list, then
// `const KcapThread t = KCAP_METAL_THREAD();` first thing in the body.
#define KCAP_METAL_THREAD_ARGS                                                                              \
    uint3 kcap_tid [[thread_position_in_threadgroup]], uint3 kcap_tpg [[threads_per_threadgroup]],        \
        uint3 kcap_gid [[threadgroup_position_in_grid]], uint3 kcap_ngroups [[threadgroups_per_grid]],     \
        uint kcap_lane [[thread_index_in_simdgroup]], uint kcap_simd [[simdgroup_index_in_threadgroup]], \
        uint kcap_simds [[simdgroups_per_threadgroup]]
#define KCAP_METAL_THREAD() kcap_metal_thread(kcap_tid, kcap_tpg, kcap_gid, kcap_ngroups, kcap_lane, kcap_simd, kcap_simds)

KCAP_FN KcapThread kcap_metal_thread(uint3 tid, uint3 tpg, uint3 gid, uint3 ngroups, uint lane, uint simd, uint simds) {
    KcapThread t;
    t.index = tid.x;
    t.threads = tpg.x;
    t.lane = lane;
    t.simd = simd;
    t.simds = simds;
    t.group_x = gid.x;
    t.group_y = gid.y;
    t.group_z = gid.z;
    t.groups_x = ngroups.x;
    t.groups_y = ngroups.y;
    t.groups_z = ngroups.z;
    return t;
}

KCAP_FN void kcap_barrier() { threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device); }
KCAP_FN void kcap_simd_barrier() { simdgroup_barrier(mem_flags::mem_threadgroup); }
KCAP_FN float kcap_simd_shuffle_xor(float v, int mask) { return simd_shuffle_xor(v, ushort(mask)); }
KCAP_FN int kcap_simd_shuffle_xor(int v, int mask) { return simd_shuffle_xor(v, ushort(mask)); }
KCAP_FN float kcap_simd_broadcast(float v, int lane) { return simd_broadcast(v, ushort(lane)); }
KCAP_FN int kcap_simd_broadcast(int v, int lane) { return simd_broadcast(v, ushort(lane)); }

KCAP_FN float kcap_half_to_float(kcap_u16 h) { return float(as_type<half>(h)); }
KCAP_FN kcap_u16 kcap_float_to_half(float f) { return as_type<ushort>(half(f)); }
KCAP_FN float kcap_bf16_to_float(kcap_u16 h) { return as_type<float>(uint(h) << 16); }
KCAP_FN float kcap_u8_to_float(kcap_u32 b) { return float(b); }
KCAP_FN float kcap_byte_to_float(kcap_u32 w, int which) { return float((w >> (8 * which)) & 0xffu); }
KCAP_FN float kcap_byte_to_float_less(kcap_u32 w, int which, float less) {
    return float((w >> (8 * which)) & 0xffu) - less;
}
KCAP_FN kcap_u32 kcap_byte_perm(kcap_u32 a, kcap_u32 b, kcap_u32 s) {
    kcap_u32 r = 0u;
    for (int i = 0; i < 4; ++i) {
        const kcap_u32 sel = (s >> (4 * i)) & 7u;
        r |= (((sel < 4u ? a : b) >> (8u * (sel & 3u))) & 0xffu) << (8 * i);
    }
    return r;
}
KCAP_FN kcap_u32 kcap_byte_perm_sx(kcap_u32 a, kcap_u32 b, kcap_u32 s) {
    kcap_u32 r = 0u;
    for (int i = 0; i < 4; ++i) {
        const kcap_u32 sel = (s >> (4 * i)) & 15u;
        kcap_u32 byte = ((sel & 7u) < 4u ? a : b) >> (8u * (sel & 3u)) & 0xffu;
        if (sel & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        r |= byte << (8 * i);
    }
    return r;
}

KCAP_FN kcap_u32 kcap_load_u16(const device kcap_u8* p) { return *reinterpret_cast<const device ushort*>(p); }
KCAP_FN kcap_u32 kcap_load_u32(const device kcap_u8* p) { return *reinterpret_cast<const device uint*>(p); }
KCAP_FN kcap_u32 kcap_load_u32_a2(const device kcap_u8* p) {
    const device ushort* h = reinterpret_cast<const device ushort*>(p);
    return uint(h[0]) | (uint(h[1]) << 16);
}
KCAP_FN float4 kcap_load_f32x4(const device float* p) { return *reinterpret_cast<const device float4*>(p); }
KCAP_FN void kcap_store_f32x4(device float* p, float4 v) { *reinterpret_cast<device float4*>(p) = v; }
KCAP_FN uint4 kcap_load_u32x4(const device kcap_u8* p) { return *reinterpret_cast<const device uint4*>(p); }
KCAP_FN float kcap_as_float(kcap_u32 bits) { return as_type<float>(bits); }
KCAP_FN void kcap_prefetch(const device void*) {}

KCAP_FN float kcap_exp(float x) { return precise::exp(x); }
KCAP_FN float kcap_tanh(float x) { return precise::tanh(x); }
KCAP_FN float kcap_erf(float x) {
    // Metal has no erf: Abramowitz-Stegun 7.1.26 is 1.5e-7 absolute, below f32 GELU noise.
    const float s = x < 0.0f ? -1.0f : 1.0f;
    const float a = fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    const float y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t - 0.284496736f) * t +
                            0.254829592f) * t * precise::exp(-a * a);
    return s * y;
}
KCAP_FN float kcap_sqrt(float x) { return precise::sqrt(x); }
KCAP_FN float kcap_rsqrt(float x) { return 1.0f / precise::sqrt(x); }
KCAP_FN float kcap_fmax(float a, float b) { return fmax(a, b); }
KCAP_FN int kcap_dot4_i8(int a, int b, int acc) {  // Metal has no dp4a instruction
    for (int i = 0; i < 32; i += 8) acc += ((a << (24 - i)) >> 24) * ((b << (24 - i)) >> 24);  // signed bytes
    return acc;
}
KCAP_FN int kcap_round_to_int(float x) { return int(rint(x)); }
#define KCAP_NEG_INFINITY (-INFINITY)

#else
// ---------------------------------------------------------------------------------- host
#include "kernels/dialect_host.h"
#endif

// ------------------------------------------------------------------ shared by every target
// KCAP_HOST_FN: a helper that a host launcher and the kernels both call (a geometry both must
// agree on).
#if defined(__CUDACC__)
#define KCAP_HOST_FN __host__ __device__ inline
#else
#define KCAP_HOST_FN inline
#endif

// Butterfly reductions: every lane ends with the result (same order on every target).
KCAP_FN float kcap_simd_sum(float v) {
    for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1) v += kcap_simd_shuffle_xor(v, offset);
    return v;
}
KCAP_FN float kcap_simd_max(float v) {
    for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1) v = kcap_fmax(v, kcap_simd_shuffle_xor(v, offset));
    return v;
}

// Runs of 32-bit words at a 2-byte-aligned address p (blocks of 18, 22, 34, 110, 210 bytes).
// kcap_load_u32_a2 pays two 16-bit loads per word; these load the 4-aligned words around the
// run instead and rebuild each word from two neighbours with one funnel shift, chosen by
// bit 1 of p (uniform code, no branch: the two cases differ only in the shift amount and in the
// address or predicate of the one 16-bit load).
// Neither ever reads a byte outside the range it documents: a block at the end of a weight
// tensor is the end of a device allocation.
//
// kcap_load_u32s_a2<N>: out[i] = the word at p + 4i, i < N. p % 4 == 0: N loads, exactly the
// run. p % 4 == 2: N + 1 loads, the 16 bits at p then the N aligned words from p + 2, so it
// also reads the 2 bytes after the run, [p + 4N, p + 4N + 2): the caller must own them (they
// must be in the same block).
// kcap_load_u16_u32s_a2<N>: returns the 16 bits at p and sets out[i] = the word at p + 2 + 4i;
// reads exactly [p, p + 2 + 4N) with N + 1 loads (N aligned words from whichever of p, p + 2 is
// 4-aligned and one 16-bit load of the 2 bytes they miss): a whole Q4_0/Q5_0/Q8_0 block.
#if defined(__METAL_VERSION__)
// MSL offers no pointer-to-integer conversion to test p's alignment: 16-bit loads as before
// (the same values, from exactly the bytes of the run).
template <int N>
KCAP_FN void kcap_load_u32s_a2(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    KCAP_UNROLL for (int i = 0; i < N; ++i) out[i] = kcap_load_u32_a2(p + 4 * i);
}
template <int N>
KCAP_FN kcap_u32 kcap_load_u16_u32s_a2(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    KCAP_UNROLL for (int i = 0; i < N; ++i) out[i] = kcap_load_u32_a2(p + 2 + 4 * i);
    return kcap_load_u16(p);
}
#else
template <int N>
KCAP_FN void kcap_load_u32s_a2(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    const kcap_u32 odd = kcap_address_bits(p) & 2u;  // 2 where p % 4 == 2
    const KCAP_GLOBAL kcap_u8* a = p + odd;          // the first 4-aligned address at or after p
    // p % 4 == 2: word i = high half of the aligned word before it : low half of aligned word i,
    // the "word before" word 0 being the 16 bits at p (loaded only then). p % 4 == 0: word i.
    kcap_u32 prev = 0u;
    if (odd) prev = kcap_load_u16(p) << 16;
    const kcap_u32 shift = odd ? 16u : 32u;
    KCAP_UNROLL for (int i = 0; i < N; ++i) {
        const kcap_u32 w = kcap_load_u32(a + 4 * i);
        out[i] = kcap_funnel_r(prev, w, shift);
        prev = w;
    }
}
template <int N>
KCAP_FN kcap_u32 kcap_load_u16_u32s_a2(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    const kcap_u32 odd = kcap_address_bits(p) & 2u;
    const KCAP_GLOBAL kcap_u8* a = p + odd;  // 4-aligned: N words cover [a, a + 4N)
    // The 2 bytes of [p, p + 2 + 4N) that those words miss: the first two, or the last two.
    const kcap_u32 tail = kcap_load_u16(p + (odd ? 0u : 4u * N));
    kcap_u32 w[N];
    KCAP_UNROLL for (int i = 0; i < N; ++i) w[i] = kcap_load_u32(a + 4 * i);
    // p % 4 == 2: the words are out[] as loaded; p % 4 == 0: out[i] straddles w[i] and w[i + 1]
    // (for the last word, tail).
    const kcap_u32 shift = 16u - 8u * odd;
    KCAP_UNROLL for (int i = 0; i < N; ++i) out[i] = kcap_funnel_r(w[i], i + 1 < N ? w[i + 1] : tail, shift);
    return odd ? tail : (w[0] & 0xffffu);
}
#endif

// kcap_load_u8_u32s_a1<N>: returns the byte at p and sets out[i] = the word at p + 1 + 4i, for p
// at any alignment (MXFP4's 17-byte blocks). CUDA: the N + 1 aligned words that hold
// [p, p + 1 + 4N), each word rebuilt from two of them with one funnel shift (N + 1 loads where
// byte loads took 4N + 1). It reads the bytes before p and after the run that share an aligned
// word with the run's first and last bytes: the CUDA backend pads every weight allocation to a
// multiple of 16 bytes (and zeroes the padding), so those words lie inside it. Elsewhere (Metal
// has no pointer-to-integer conversion; the host tests check that a decoder reads only its
// block): byte loads of exactly the run.
#if defined(__CUDACC__)
template <int N>
KCAP_FN kcap_u32 kcap_load_u8_u32s_a1(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    const kcap_u32 off = kcap_address_bits(p) & 3u;
    const KCAP_GLOBAL kcap_u8* a = p - off;  // 4-aligned
    kcap_u32 w[N + 1];
    KCAP_UNROLL for (int i = 0; i <= N; ++i) w[i] = kcap_load_u32(a + 4 * i);
    // Byte p + 1 + 4i is byte off + 1 of w[i]:w[i + 1] (a shift of 32: w[i + 1] itself).
    const kcap_u32 shift = 8u * (off + 1u);
    KCAP_UNROLL for (int i = 0; i < N; ++i) out[i] = kcap_funnel_r(w[i], w[i + 1], shift);
    return (w[0] >> (8u * off)) & 0xffu;
}
#else
template <int N>
KCAP_FN kcap_u32 kcap_load_u8_u32s_a1(const KCAP_GLOBAL kcap_u8* p, KCAP_PRIVATE kcap_u32* out) {
    KCAP_UNROLL for (int i = 0; i < N; ++i)
        out[i] = kcap_u32(p[1 + 4 * i]) | (kcap_u32(p[2 + 4 * i]) << 8) | (kcap_u32(p[3 + 4 * i]) << 16) |
                 (kcap_u32(p[4 + 4 * i]) << 24);
    return p[0];
}
#endif
