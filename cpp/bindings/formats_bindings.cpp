// kcap._core formats surface: dequantize a raw GGUF tensor, dot one quantized row with a
// vector, and describe the formats. Thin: every check that is about formats (unknown type,
// row not a multiple of the block, byte count) is done here or in the core and raised as
// kcap.FormatError; the loops run with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <string>
#include <vector>

#include "kcap/errors.h"
#include "kcap/formats.h"

namespace py = pybind11;

namespace {

// A GGML type given as its id (int, IntEnum) or its name ("Q4_K", "q4_k").
kcap::Format format_from_arg(const py::handle& ggml_type) {
    if (py::isinstance<py::str>(ggml_type)) return kcap::format_from_name(ggml_type.cast<std::string>());
    if (py::isinstance<py::bool_>(ggml_type) || !py::hasattr(ggml_type, "__index__"))
        throw py::type_error("ggml_type must be a GGML type id (int) or a format name (str), not " +
                             std::string(py::str(py::type::handle_of(ggml_type).attr("__name__"))));
    const py::int_ id = ggml_type.attr("__index__")();
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(id.ptr(), &overflow);
    if (overflow != 0 || value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
        throw kcap::FormatError("GGML type " + std::string(py::str(id)) + " is not a format kcap decodes");
    return kcap::format_from_ggml_type(static_cast<int>(value));
}

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string text = "(";
    for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + (shape.size() == 1 ? ",)" : ")");
}

// The bytes of any C-contiguous array (GGUFReader hands out uint8 for quantized tensors but
// float32/float16 views for float ones), copied only when the array is not contiguous.
py::array contiguous_bytes(const py::array& raw) {
    return py::array::ensure(raw, py::array::c_style);
}

py::array_t<float> dequantize(const py::handle& ggml_type, const py::array& raw_array,
                              const std::vector<int64_t>& shape) {
    const kcap::Format format = format_from_arg(ggml_type);
    const char* name = kcap::format_name(format);
    if (shape.empty())
        throw kcap::FormatError(std::string("dequantize ") + name + ": shape must have at least one dimension");
    int64_t rows = 1;
    for (int64_t dim : shape) {
        if (dim < 0)
            throw kcap::FormatError(std::string("dequantize ") + name + ": negative dimension in shape " +
                                    shape_text(shape));
        rows *= dim;
    }
    const int64_t row_elems = shape.back();
    rows = row_elems == 0 ? 0 : rows / row_elems;
    const size_t bytes_per_row = kcap::row_bytes(format, row_elems);  // throws if not whole blocks
    const size_t expected = bytes_per_row * static_cast<size_t>(rows);

    py::array raw = contiguous_bytes(raw_array);
    const size_t got = static_cast<size_t>(raw.nbytes());
    if (got != expected)
        throw kcap::FormatError(std::string("dequantize ") + name + " tensor of shape " + shape_text(shape) +
                                " needs " + std::to_string(expected) + " bytes, got " + std::to_string(got));

    py::array_t<float> out(shape);
    const auto* src = static_cast<const uint8_t*>(raw.data());
    float* dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        for (int64_t r = 0; r < rows; ++r)
            kcap::dequantize_row(format, src + r * bytes_per_row, dst + r * row_elems, row_elems);
    }
    return out;
}

float dot(const py::handle& ggml_type, const py::array& raw_row,
          const py::array_t<float, py::array::c_style | py::array::forcecast>& x) {
    const kcap::Format format = format_from_arg(ggml_type);
    if (x.ndim() != 1)
        throw kcap::FormatError(std::string("dot ") + kcap::format_name(format) + ": x must be 1-D, got " +
                                std::to_string(x.ndim()) + " dimensions");
    const int64_t n = x.shape(0);
    const size_t expected = kcap::row_bytes(format, n);  // throws if n is not whole blocks
    py::array raw = contiguous_bytes(raw_row);
    const size_t got = static_cast<size_t>(raw.nbytes());
    if (got != expected)
        throw kcap::FormatError(std::string("dot ") + kcap::format_name(format) + " row of " + std::to_string(n) +
                                " elements needs " + std::to_string(expected) + " bytes, got " +
                                std::to_string(got));
    const void* src = raw.data();
    const float* xs = x.data();
    py::gil_scoped_release release;
    return kcap::dot_row(format, src, xs, n);
}

py::dict info_dict(const kcap::FormatInfo& info) {
    py::dict d;
    d["name"] = info.name;
    d["block_elems"] = info.block_elems;
    d["block_bytes"] = info.block_bytes;
    d["ggml_type"] = static_cast<int>(info.format);
    return d;
}

}  // namespace

void init_formats(py::module_& m) {
    m.def("dequantize", &dequantize, py::arg("ggml_type"), py::arg("raw"), py::arg("shape"),
          "Decode a raw GGUF tensor (bytes of any C-contiguous array) of the given numpy-order shape "
          "to float32, bit-exact with gguf.quants.dequantize.");
    m.def("dot", &dot, py::arg("ggml_type"), py::arg("raw_row"), py::arg("x"),
          "dot(dequantize(raw_row), x) accumulated in f32 without materialising the row.");
    m.def(
        "format_info",
        [](const py::handle& ggml_type) { return info_dict(kcap::format_info(format_from_arg(ggml_type))); },
        py::arg("ggml_type"), "name, block_elems, block_bytes and ggml_type of a format.");
    m.def(
        "supported_formats",
        [] {
            std::vector<std::string> names;
            for (const kcap::FormatInfo& info : kcap::all_formats()) names.emplace_back(info.name);
            return names;
        },
        "Names of the formats kcap decodes, in GGML id order.");
}
