// A stand-in for the parts of the Metal Shading Language that kcap's .metal files and the
// Metal branch of kernels/dialect.h use, so that every .metal translation unit compiles as
// C++17 (g++ -fsyntax-only) on Linux: scripts/metal_compile_check.sh.
//
// What it gives C++: the address-space qualifiers as nothing (device, threadgroup, constant,
// kernel; `thread` through KCAP_METAL_THREAD_SPACE, see dialect.h; the `[[threadgroup(n)]]`
// argument attribute through KCAP_METAL_THREADGROUP_INDEX, see metal/rows.h), MSL's scalar and vector
// types (uchar .. ulong, half, float2/3/4, uint2/3/4 with their x/y/z/w members), as_type,
// the SIMD-group functions (simd_shuffle_xor, simd_broadcast, simd_sum, simd_max), barriers
// with mem_flags, the precise:: math the dialect calls, and INFINITY.
// What it cannot check: MSL's own rules (address-space conversions, which attributes are
// legal where, function constants, reserved words; metal/check/reserved_words.py covers the
// last heuristically), and nothing here runs: the functions are declarations only.
#pragma once

#if !defined(__METAL_VERSION__)
#error "define __METAL_VERSION__ (the Metal compiler does) to check the Metal branch"
#endif

#include <cmath>  // INFINITY, as metal_stdlib provides it

// Address spaces and function qualifiers: MSL keywords, nothing to a C++ compiler.
#define device
#define threadgroup
#define constant
#define kernel
#define KCAP_METAL_THREAD_SPACE
// `[[threadgroup(0)]]` on a kernel argument (metal/rows.h spells it KCAP_METAL_THREADGROUP_INDEX):
// with `threadgroup` defined away above it would read `[[(0)]]`, so it becomes an attribute
// C++ ignores (-Wno-attributes), still taking its index expression.
#undef KCAP_METAL_THREADGROUP_INDEX  // in case metal/rows.h came first
#define KCAP_METAL_THREADGROUP_INDEX(index) [[kcap_metal_threadgroup(index)]]

namespace metal {

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

// 16-bit float: only what conversions need (construct from float, convert to float).
struct half {
    unsigned short bits;
    half() = default;
    explicit half(float);
    operator float() const;
};

template <class T>
struct vec2 {
    T x, y;
};
template <class T>
struct vec3 {
    T x, y, z;
};
template <class T>
struct vec4 {
    T x, y, z, w;
};
typedef vec2<float> float2;
typedef vec3<float> float3;
typedef vec4<float> float4;
typedef vec2<uint> uint2;
typedef vec3<uint> uint3;
typedef vec4<uint> uint4;
typedef vec2<ushort> ushort2;
typedef vec3<ushort> ushort3;

// Bit reinterpretation between types of one size (MSL's as_type).
template <class To, class From>
To as_type(From from) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
    To to;
    __builtin_memcpy(&to, &from, sizeof(To));
    return to;
}

enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

// SIMD-group functions: every lane of the simd group takes part (as the dialect requires).
template <class T>
T simd_shuffle_xor(T value, ushort mask);
template <class T>
T simd_shuffle(T value, ushort lane);
template <class T>
T simd_broadcast(T value, ushort lane);
template <class T>
T simd_sum(T value);
template <class T>
T simd_max(T value);

float fabs(float x);
float fmax(float a, float b);
float fmin(float a, float b);
namespace precise {
float exp(float x);
float tanh(float x);
float sqrt(float x);
}  // namespace precise

}  // namespace metal
