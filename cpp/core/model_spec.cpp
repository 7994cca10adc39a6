// ModelSpec helpers: tensor lookup with errors that name what is missing.
#include "kcap/model_spec.h"

#include "kcap/errors.h"

namespace kcap {

const uint8_t* TensorRef::row(int64_t index) const {
    return data + static_cast<size_t>(index) * row_bytes(format, row_length());
}

#define KCAP_ENUM_NAME_CASE(VALUE, NAME) \
    case Enum::VALUE: return NAME;

#define KCAP_ENUM_NAME_FUNCTION(FUNCTION, TYPE, LIST) \
    const char* FUNCTION(TYPE value) {                \
        using Enum = TYPE;                            \
        switch (value) { LIST(KCAP_ENUM_NAME_CASE) }  \
        return "?";                                   \
    }

KCAP_ENUM_NAME_FUNCTION(norm_kind_name, NormKind, KCAP_NORM_KINDS)
KCAP_ENUM_NAME_FUNCTION(activation_name, Activation, KCAP_ACTIVATIONS)
KCAP_ENUM_NAME_FUNCTION(rope_style_name, RopeStyle, KCAP_ROPE_STYLES)
KCAP_ENUM_NAME_FUNCTION(expert_gating_name, ExpertGating, KCAP_EXPERT_GATINGS)
KCAP_ENUM_NAME_FUNCTION(expert_group_score_name, ExpertGroupScore, KCAP_EXPERT_GROUP_SCORES)

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
