// What the GPU backends' row declarations (cuda/rows.cpp, metal/rows.cpp) share. Their rows
// run the same kernel bodies (kernels/), so the legal dims those bodies impose are stated
// here once, not once per backend.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "dispatch/capability.h"
#include "kernels/formats_list.h"

namespace kcap {

inline std::string lowercase(std::string s) {
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

inline Row gpu_row(Backend backend, const std::string& kernel, Op op, KernelFn fn, Geometry geometry) {
    Row row;
    row.kernel = kernel;
    row.op = op;
    row.backend = backend;
    row.fn = fn;
    row.geometry = geometry;
    return row;
}

inline bool is_float_format(Format format) {
    return format == Format::F32 || format == Format::F16 || format == Format::BF16;
}

// K of the exact bodies (matvec, few-token walk, embed, PLE): they walk rows in 32-element
// runs and read a float format's last k % 32 elements one by one (the tail), so float rows
// take any K that keeps rows and activations 16-byte aligned for the vector loads, a multiple
// of 4; block formats need whole blocks.
inline int64_t exact_k_multiple(Format format) {
    return is_float_format(format) ? 4 : std::max<int64_t>(32, format_info(format).block_elems);
}

// K of bodies with no tail (tensor-core tiles): whole 32-element runs even for float formats.
inline int64_t run_k_multiple(Format format) { return std::max<int64_t>(32, format_info(format).block_elems); }

// Every format the GPU decoders know (KCAP_WEIGHT_FORMATS).
inline std::vector<Format> gpu_weight_formats() {
    std::vector<Format> formats;
#define KCAP_LIST_FORMAT(NAME, DECODER) formats.push_back(Format::NAME);
    KCAP_WEIGHT_FORMATS(KCAP_LIST_FORMAT)
#undef KCAP_LIST_FORMAT
    return formats;
}

}  // namespace kcap
