// ModelSpec helpers: tensor lookup with errors that name what is missing.
#include "kcap/model_spec.h"

#include "kcap/errors.h"

namespace kcap {

const uint8_t* TensorRef::row(int64_t index) const {
    return data + static_cast<size_t>(index) * row_bytes(format, row_length());
}

const char* norm_kind_name(NormKind kind) { return kind == NormKind::RMS ? "rms" : "layer"; }

const char* activation_name(Activation activation) {
    switch (activation) {
        case Activation::SiLU: return "silu";
        case Activation::GeluTanh: return "gelu_tanh";
        case Activation::GeluErf: return "gelu_erf";
        case Activation::ReLU: return "relu";
    }
    return "?";
}

const char* rope_style_name(RopeStyle style) {
    switch (style) {
        case RopeStyle::None: return "none";
        case RopeStyle::Normal: return "normal";
        case RopeStyle::NeoX: return "neox";
    }
    return "?";
}

const TensorRef& ModelSpec::tensor(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw ModelError("missing tensor '" + name + "' in the model file");
    return it->second;
}

const TensorRef* ModelSpec::optional_tensor(const std::string& name) const {
    if (name.empty()) return nullptr;
    return &tensor(name);  // a named tensor must exist; "" is the only way to be absent
}

}  // namespace kcap
