// The decoder struct of each weight format (kernels/quant.h), by its kcap::Format: how the
// launchers, which the rows name by format, reach the kernel bodies' template arguments.
#pragma once

#include "kcap/formats.h"
#include "kernels/formats_list.h"
#include "kernels/quant.h"

namespace kcap {
namespace cuda {

template <Format FORMAT>
struct DecoderOf;
#define KCAP_DECODER_OF(NAME, DECODER) \
    template <>                        \
    struct DecoderOf<Format::NAME> {   \
        using type = DECODER;          \
    };
KCAP_WEIGHT_FORMATS(KCAP_DECODER_OF)
#undef KCAP_DECODER_OF

template <Format FORMAT>
using Decoder = typename DecoderOf<FORMAT>::type;

}  // namespace cuda
}  // namespace kcap
