// Scratch buffers of the CPU kernels.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace kcap {

// Scratch of the GEMMs' tiles on 64-byte boundaries: their 64-byte vector loads and stores
// then never straddle two cache lines (malloc aligns to 16, so where a buffer started would
// decide, run by run, whether every access of a tile is split in two).
template <class T>
struct CacheLineAllocator {
    using value_type = T;
    static constexpr std::align_val_t kAlign{64};
    CacheLineAllocator() = default;
    template <class U>
    CacheLineAllocator(const CacheLineAllocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
    void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
    template <class U>
    bool operator==(const CacheLineAllocator<U>&) const { return true; }
    template <class U>
    bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace kcap
