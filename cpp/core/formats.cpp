// The format table (GGML id, name, block geometry), lookups by id and by name, row sizes and
// the half-precision conversions. Decoding lives in formats_dequantize.cpp (exact) and
// formats_dot.cpp (fast fused dot); block layouts in formats_blocks.h.
#include "kcap/formats.h"

#include <cctype>
#include <cstring>
#include <limits>

#include "core/formats_blocks.h"
#include "kcap/errors.h"

namespace kcap {
namespace {

// Names of every GGML type id, supported or not, so that a refusal can say what the file
// asked for ("IQ2_XXS") rather than only a number. Empty strings are retired ids.
const char* const kGgmlTypeNames[] = {
    "F32",     "F16",    "Q4_0",    "Q4_1",  "",       "",      "Q5_0",   "Q5_1",  "Q8_0",  "Q8_1",
    "Q2_K",    "Q3_K",   "Q4_K",    "Q5_K",  "Q6_K",   "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL",  "IQ3_S",  "IQ2_S",   "IQ4_XS", "I8",    "I16",   "I32",    "I64",   "F64",   "IQ1_M",
    "BF16",    "",       "",        "",      "TQ1_0",  "TQ2_0", "",       "",      "",      "MXFP4",
    "NVFP4",   "Q1_0",
};
constexpr int kGgmlTypeNameCount = static_cast<int>(sizeof kGgmlTypeNames / sizeof kGgmlTypeNames[0]);

std::string describe_ggml_type(int ggml_type) {
    std::string text = "GGML type " + std::to_string(ggml_type);
    if (ggml_type >= 0 && ggml_type < kGgmlTypeNameCount && kGgmlTypeNames[ggml_type][0] != '\0')
        text += std::string(" (") + kGgmlTypeNames[ggml_type] + ")";
    return text;
}

std::string supported_names() {
    std::string names;
    for (const FormatInfo& info : all_formats()) {
        if (!names.empty()) names += ", ";
        names += info.name;
    }
    return names;
}

// By GGML id: a table built once (the dot kernels look a row's format up on every call).
const FormatInfo* find_format(int ggml_type) {
    struct ById {
        const FormatInfo* info[kGgmlTypeNameCount] = {};
        ById() {
            for (const FormatInfo& format : all_formats()) info[static_cast<int>(format.format)] = &format;
        }
    };
    static const ById by_id;
    return ggml_type >= 0 && ggml_type < kGgmlTypeNameCount ? by_id.info[ggml_type] : nullptr;
}

uint32_t float_bits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

}  // namespace

const std::vector<FormatInfo>& all_formats() {
    static const std::vector<FormatInfo> formats = {
        {Format::F32, "F32", 1, 4},
        {Format::F16, "F16", 1, 2},
        {Format::Q4_0, "Q4_0", 32, 18},
        {Format::Q4_1, "Q4_1", 32, 20},
        {Format::Q5_0, "Q5_0", 32, 22},
        {Format::Q5_1, "Q5_1", 32, 24},
        {Format::Q8_0, "Q8_0", 32, 34},
        {Format::Q2_K, "Q2_K", 256, 84},
        {Format::Q3_K, "Q3_K", 256, 110},
        {Format::Q4_K, "Q4_K", 256, 144},
        {Format::Q5_K, "Q5_K", 256, 176},
        {Format::Q6_K, "Q6_K", 256, 210},
        {Format::BF16, "BF16", 1, 2},
        {Format::MXFP4, "MXFP4", 32, 17},
    };
    return formats;
}

const FormatInfo& format_info(Format format) {
    const FormatInfo* info = find_format(static_cast<int>(format));
    if (info == nullptr)
        throw FormatError(describe_ggml_type(static_cast<int>(format)) +
                          " is not a format kcap decodes; supported: " + supported_names());
    return *info;
}

Format format_from_ggml_type(int ggml_type) {
    const FormatInfo* info = find_format(ggml_type);
    if (info == nullptr)
        throw FormatError(describe_ggml_type(ggml_type) +
                          " is not a format kcap decodes; supported: " + supported_names());
    return info->format;
}

Format format_from_name(const std::string& name) {
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const FormatInfo& info : all_formats())
        if (upper == info.name) return info.format;
    for (int id = 0; id < kGgmlTypeNameCount; ++id)
        if (upper == kGgmlTypeNames[id] && !upper.empty())
            throw FormatError("format '" + name + "' (" + describe_ggml_type(id) +
                              ") is not a format kcap decodes; supported: " + supported_names());
    throw FormatError("unknown format name '" + name + "'; supported: " + supported_names());
}

bool is_supported_ggml_type(int ggml_type) { return find_format(ggml_type) != nullptr; }

const char* format_name(Format format) { return format_info(format).name; }

size_t row_bytes(Format format, int64_t n_elems) {
    const FormatInfo& info = format_info(format);
    if (n_elems < 0)
        throw FormatError(std::string(info.name) + " row of " + std::to_string(n_elems) +
                          " elements: a row length cannot be negative");
    if (n_elems % info.block_elems != 0)
        throw FormatError(std::string(info.name) + " row of " + std::to_string(n_elems) +
                          " elements is not a multiple of the block size " +
                          std::to_string(info.block_elems));
    const int64_t blocks = n_elems / info.block_elems;
    if (blocks > std::numeric_limits<int64_t>::max() / info.block_bytes)
        throw FormatError(std::string(info.name) + " row of " + std::to_string(n_elems) +
                          " elements is too large to address");
    return static_cast<size_t>(blocks * info.block_bytes);
}

float f16_to_f32(uint16_t h) { return blocks::half_to_float(h); }

// Round to nearest, ties to even; overflow goes to infinity, NaN stays NaN (quiet).
uint16_t f32_to_f16(float f) {
    const uint32_t bits = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;

    if (magnitude > 0x7f800000u)  // NaN: keep the top payload bits, force the quiet bit
        return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu));
    if (magnitude >= 0x477ff000u)  // at or above 65520 = max half + half an ulp: rounds to inf
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {  // normal half range (>= 2^-14)
        // Rebias the exponent and drop 13 mantissa bits with round-to-nearest-even; a carry
        // out of the mantissa correctly bumps the exponent.
        const uint32_t rebiased = magnitude - (112u << 23);
        const uint32_t round_bit = 0x1000u;
        const uint32_t lsb = (rebiased >> 13) & 1u;
        return static_cast<uint16_t>(sign | ((rebiased + (round_bit - 1) + lsb) >> 13));
    }
    if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
    // Subnormal half: value / 2^-24 rounded to an integer mantissa, ties to even. Shift the
    // full 24-bit significand so that the result's unit is 2^-24.
    const uint32_t exponent = magnitude >> 23;                 // 102 .. 112
    const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;                    // 14 .. 24
    const uint32_t truncated = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t mantissa = truncated;
    if (remainder > halfway || (remainder == halfway && (truncated & 1u))) ++mantissa;
    return static_cast<uint16_t>(sign | mantissa);  // 0x400 on carry is the smallest normal
}

float bf16_to_f32(uint16_t h) { return blocks::bits_to_float(static_cast<uint32_t>(h) << 16); }

}  // namespace kcap
