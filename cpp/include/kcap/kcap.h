// kcap's C++ API for embedding hosts (docs/embedding.md): every public header.
//
//   #include <kcap/kcap.h>
//   kcap::Bundle bundle = kcap::load_bundle("model.bundle");   // written by `kcap export`
//   kcap::EngineOptions options;                               // backend, n_ctx, kv_type, activations ...
//   kcap::Engine engine(bundle.spec, options);
//   std::vector<float> logits(engine.n_vocab());
//   engine.eval(ids.data(), ids.size(), logits.data(), false);
#pragma once

#include "kcap/bundle.h"
#include "kcap/engine.h"
#include "kcap/errors.h"
#include "kcap/formats.h"
#include "kcap/model_spec.h"

namespace kcap {

// The version of the library, e.g. "0.1.0" (the Python package's kcap.__version__).
const char* version();

}  // namespace kcap
