// The host target of the kernel dialect (see dialect.h): runs kernel bodies on the CPU so the
// test-suite can check every shared body against the CPU reference on a machine with no GPU.
//
// Each thread of a group is a fiber (ucontext); a group's fibers run round-robin on one OS
// thread and switch only at barriers and simd exchanges, so group-shared memory, barriers and
// shuffles behave as on a GPU. A barrier that not every thread reaches (a divergent barrier)
// is reported as a deadlock instead of hanging. Slow by design: tests keep sizes modest.
//
//   kcap_sim::launch(groups, threads_per_group, shared_bytes,
//                    [&](const KcapThread& t, void* shared) { body(t, ...); });
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kcap/formats.h"

#define KCAP_FN inline
#define KCAP_GLOBAL
#define KCAP_SHARED
#define KCAP_PRIVATE
#define KCAP_UNROLL

typedef unsigned char kcap_u8;
typedef signed char kcap_i8;
typedef unsigned short kcap_u16;
typedef unsigned int kcap_u32;
typedef int kcap_i32;
typedef unsigned long long kcap_u64;

struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};

struct KcapThread {
    unsigned index, threads, lane, simd, simds;
    unsigned group_x, group_y, group_z;
    unsigned groups_x, groups_y, groups_z;
};

namespace kcap_sim {

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct Group {
    unsigned threads = 0;
    std::vector<ucontext_t> contexts;
    std::vector<bool> done;
    ucontext_t scheduler;
    unsigned current = 0;
    // Group barrier and one barrier per simd group, each a count and a generation.
    unsigned barrier_count = 0, barrier_generation = 0;
    std::vector<unsigned> simd_count, simd_generation;
    std::vector<uint32_t> exchange;  // one word per thread for simd shuffles
    unsigned long progress = 0;      // arrivals, releases and returns: a round without any is a deadlock
};

inline Group*& current_group() {
    static thread_local Group* group = nullptr;
    return group;
}

inline void yield() {
    Group* g = current_group();
    swapcontext(&g->contexts[g->current], &g->scheduler);
}

inline void group_barrier() {
    Group* g = current_group();
    const unsigned generation = g->barrier_generation;
    ++g->progress;
    if (++g->barrier_count == g->threads) {
        g->barrier_count = 0;
        ++g->barrier_generation;
        return;
    }
    while (g->barrier_generation == generation) yield();
}

inline void simd_barrier() {
    Group* g = current_group();
    const unsigned simd = g->current / 32;
    const unsigned generation = g->simd_generation[simd];
    ++g->progress;
    if (++g->simd_count[simd] == 32) {
        g->simd_count[simd] = 0;
        ++g->simd_generation[simd];
        return;
    }
    while (g->simd_generation[simd] == generation) yield();
}

inline uint32_t shuffle_word(uint32_t value, unsigned source_lane_xor, bool absolute) {
    Group* g = current_group();
    const unsigned me = g->current;
    const unsigned base = me & ~31u;
    g->exchange[me] = value;
    simd_barrier();
    const unsigned lane = absolute ? source_lane_xor : ((me & 31u) ^ source_lane_xor);
    const uint32_t got = g->exchange[base + (lane & 31u)];
    simd_barrier();
    return got;
}

struct FiberArgs {
    const std::function<void(const KcapThread&, void*)>* body;
    KcapThread thread;
    void* shared;
    Group* group;
};

inline void fiber_entry(unsigned lo, unsigned hi) {
    FiberArgs* args = reinterpret_cast<FiberArgs*>((uintptr_t(hi) << 32) | uintptr_t(lo));
    (*args->body)(args->thread, args->shared);
    args->group->done[args->thread.index] = true;
    ++args->group->progress;
    // Returning switches to uc_link (the scheduler).
}

// Runs body once per thread of every group; groups run one after another.
// (gcc warns that swapcontext may clobber locals, as for setjmp; the scheduler's locals are
// not modified between the switch out and the switch back, so the warning does not apply.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wclobbered"
#endif
inline void launch(Dim3 groups, unsigned threads, size_t shared_bytes,
                   const std::function<void(const KcapThread&, void*)>& body) {
    if (threads == 0 || threads % 32 != 0 || threads > 1024)
        throw std::runtime_error("kcap_sim::launch: threads per group must be a multiple of 32 in [32, 1024]");
    constexpr size_t kStack = 128 * 1024;
    std::vector<std::unique_ptr<char[]>> stacks(threads);
    for (auto& s : stacks) s.reset(new char[kStack]);
    std::vector<unsigned char> shared(shared_bytes + 16);
    std::vector<FiberArgs> args(threads);
    for (unsigned gz = 0; gz < groups.z; ++gz)
        for (unsigned gy = 0; gy < groups.y; ++gy)
            for (unsigned gx = 0; gx < groups.x; ++gx) {
                Group g;
                g.threads = threads;
                g.contexts.resize(threads);
                g.done.assign(threads, false);
                g.simd_count.assign(threads / 32, 0);
                g.simd_generation.assign(threads / 32, 0);
                g.exchange.assign(threads, 0);
                // Poison shared memory: a body must not read what it did not write.
                std::memset(shared.data(), 0xff, shared.size());
                current_group() = &g;
                for (unsigned i = 0; i < threads; ++i) {
                    KcapThread& t = args[i].thread;
                    t.index = i;
                    t.threads = threads;
                    t.lane = i & 31u;
                    t.simd = i >> 5;
                    t.simds = threads >> 5;
                    t.group_x = gx, t.group_y = gy, t.group_z = gz;
                    t.groups_x = groups.x, t.groups_y = groups.y, t.groups_z = groups.z;
                    args[i].body = &body;
                    args[i].shared = shared.data();
                    args[i].group = &g;
                    getcontext(&g.contexts[i]);
                    g.contexts[i].uc_stack.ss_sp = stacks[i].get();
                    g.contexts[i].uc_stack.ss_size = kStack;
                    g.contexts[i].uc_link = &g.scheduler;
                    const uintptr_t p = reinterpret_cast<uintptr_t>(&args[i]);
                    makecontext(&g.contexts[i], reinterpret_cast<void (*)()>(fiber_entry), 2, unsigned(p & 0xffffffffu),
                                unsigned(p >> 32));
                }
                unsigned alive = threads;
                while (alive > 0) {
                    const unsigned long before = g.progress;
                    for (unsigned i = 0; i < threads; ++i) {
                        if (g.done[i]) continue;
                        g.current = i;
                        swapcontext(&g.scheduler, &g.contexts[i]);
                    }
                    alive = 0;
                    for (unsigned i = 0; i < threads; ++i) alive += g.done[i] ? 0 : 1;
                    if (alive > 0 && g.progress == before) {
                        std::fprintf(stderr,
                                     "kcap_sim: deadlock in group (%u,%u,%u): %u of %u threads wait on a barrier "
                                     "that the others never reach\n",
                                     gx, gy, gz, alive, threads);
                        std::abort();
                    }
                }
                current_group() = nullptr;
            }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace kcap_sim

inline void kcap_barrier() { kcap_sim::group_barrier(); }
inline void kcap_simd_barrier() { kcap_sim::simd_barrier(); }
inline float kcap_simd_shuffle_xor(float v, int mask) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = kcap_sim::shuffle_word(bits, unsigned(mask), false);
    std::memcpy(&v, &bits, 4);
    return v;
}
inline int kcap_simd_shuffle_xor(int v, int mask) { return int(kcap_sim::shuffle_word(uint32_t(v), unsigned(mask), false)); }
inline float kcap_simd_broadcast(float v, int lane) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits = kcap_sim::shuffle_word(bits, unsigned(lane), true);
    std::memcpy(&v, &bits, 4);
    return v;
}
inline int kcap_simd_broadcast(int v, int lane) { return int(kcap_sim::shuffle_word(uint32_t(v), unsigned(lane), true)); }

inline float kcap_half_to_float(kcap_u16 h) { return kcap::f16_to_f32(h); }
inline kcap_u16 kcap_float_to_half(float f) { return kcap::f32_to_f16(f); }
inline float kcap_bf16_to_float(kcap_u16 h) { return kcap::bf16_to_f32(h); }
inline float kcap_u8_to_float(kcap_u32 b) { return float(b); }
inline float kcap_byte_to_float(kcap_u32 w, int which) { return float((w >> (8 * which)) & 0xffu); }
inline float kcap_byte_to_float_less(kcap_u32 w, int which, float less) {
    return float((w >> (8 * which)) & 0xffu) - less;
}
// CUDA's __byte_perm for selectors 0..7: byte i of the result is byte (s >> 4i) & 7 of b:a.
inline kcap_u32 kcap_byte_perm(kcap_u32 a, kcap_u32 b, kcap_u32 s) {
    kcap_u32 r = 0u;
    for (int i = 0; i < 4; ++i) {
        const kcap_u32 sel = (s >> (4 * i)) & 7u;
        r |= (((sel < 4u ? a : b) >> (8u * (sel & 3u))) & 0xffu) << (8 * i);
    }
    return r;
}
// PRMT with 4-bit selectors: where bit 3 of byte i's selector is set, byte i is the sign of the
// picked byte (0x00 or 0xff).
inline kcap_u32 kcap_byte_perm_sx(kcap_u32 a, kcap_u32 b, kcap_u32 s) {
    kcap_u32 r = 0u;
    for (int i = 0; i < 4; ++i) {
        const kcap_u32 sel = (s >> (4 * i)) & 15u;
        kcap_u32 byte = (((sel & 7u) < 4u ? a : b) >> (8u * (sel & 3u))) & 0xffu;
        if (sel & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
        r |= byte << (8 * i);
    }
    return r;
}

// Tests may name the only bytes that loads may touch (say, one weight block copied to a buffer
// of its exact size): kcap_sim::Readable guard(begin, end). The multi-byte loads check it.
namespace kcap_sim {
struct ReadableRange {
    const unsigned char* begin = nullptr;
    const unsigned char* end = nullptr;
};
inline ReadableRange& readable_range() {
    static thread_local ReadableRange range;
    return range;
}
struct Readable {
    ReadableRange saved;
    Readable(const void* begin, const void* end) : saved(readable_range()) {
        readable_range() = {static_cast<const unsigned char*>(begin), static_cast<const unsigned char*>(end)};
    }
    ~Readable() { readable_range() = saved; }
    Readable(const Readable&) = delete;
    Readable& operator=(const Readable&) = delete;
};
inline void check_readable(const void* p, size_t n, const char* what) {
    const ReadableRange& r = readable_range();
    const unsigned char* b = static_cast<const unsigned char*>(p);
    if (r.begin && (b < r.begin || b + n > r.end)) {
        char message[160];
        std::snprintf(message, sizeof message, "%s: bytes [%td, %td) outside the readable [0, %td)", what, b - r.begin,
                      b + n - r.begin, r.end - r.begin);
        throw std::runtime_error(message);
    }
}
}  // namespace kcap_sim

inline kcap_u32 kcap_load_u16(const kcap_u8* p) {
    if (reinterpret_cast<uintptr_t>(p) % 2) throw std::runtime_error("kcap_load_u16: misaligned");
    kcap_sim::check_readable(p, 2, "kcap_load_u16");
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline kcap_u32 kcap_load_u32(const kcap_u8* p) {
    if (reinterpret_cast<uintptr_t>(p) % 4) throw std::runtime_error("kcap_load_u32: misaligned");
    kcap_sim::check_readable(p, 4, "kcap_load_u32");
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline kcap_u32 kcap_load_u32_a2(const kcap_u8* p) {
    if (reinterpret_cast<uintptr_t>(p) % 2) throw std::runtime_error("kcap_load_u32_a2: misaligned");
    kcap_sim::check_readable(p, 4, "kcap_load_u32_a2");
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline float4 kcap_load_f32x4(const float* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16) throw std::runtime_error("kcap_load_f32x4: misaligned");
    kcap_sim::check_readable(p, 16, "kcap_load_f32x4");
    float4 v;
    std::memcpy(&v, p, 16);
    return v;
}
inline void kcap_store_f32x4(float* p, float4 v) {
    if (reinterpret_cast<uintptr_t>(p) % 16) throw std::runtime_error("kcap_store_f32x4: misaligned");
    std::memcpy(p, &v, 16);
}
inline uint4 kcap_load_u32x4(const kcap_u8* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16) throw std::runtime_error("kcap_load_u32x4: misaligned");
    kcap_sim::check_readable(p, 16, "kcap_load_u32x4");
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}
inline float kcap_as_float(kcap_u32 bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline void kcap_prefetch(const void*) {}
// The a2 word runs of dialect.h: the same aligned loads as on CUDA (kcap_load_u16/u32 above
// check their alignment and the readable range), shifts for CUDA's funnel shift.
inline kcap_u32 kcap_address_bits(const kcap_u8* p) { return kcap_u32(reinterpret_cast<uintptr_t>(p)); }
inline kcap_u32 kcap_funnel_r(kcap_u32 lo, kcap_u32 hi, kcap_u32 shift) {
    return shift >= 32 ? hi : kcap_u32(((kcap_u64(hi) << 32) | lo) >> shift);
}

inline float kcap_exp(float x) { return std::exp(x); }
inline float kcap_tanh(float x) { return std::tanh(x); }
inline float kcap_erf(float x) { return std::erf(x); }
inline float kcap_sqrt(float x) { return std::sqrt(x); }
inline float kcap_rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float kcap_fmax(float a, float b) { return std::fmax(a, b); }
inline int kcap_dot4_i8(int a, int b, int acc) {
    for (int i = 0; i < 4; ++i) acc += int(int8_t(uint32_t(a) >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
    return acc;
}
inline int kcap_round_to_int(float x) { return int(std::nearbyint(x)); }  // the default mode: ties to even
#define KCAP_NEG_INFINITY (-HUGE_VALF)
