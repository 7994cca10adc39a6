// A bundle: what `kcap export MODEL -o DIR` writes so that a C++ host runs MODEL without Python.
//
//   DIR/kcap-bundle.json  the manifest (docs/embedding.md): format "kcap-bundle" and its version;
//                         the GGUF file (path, size and a fingerprint of its bytes); the ModelSpec
//                         the architecture module built, every field, and each tensor as a byte
//                         range of the GGUF file; the token ids a host needs (BOS, end of
//                         generation) and the chat template
//   DIR/tokenizer.json    the tokenizer, in the format of Hugging Face's tokenizers library
//                         (absent when the GGUF has no vocabulary)
//
// The weights are never copied: load_bundle memory-maps the GGUF file and the spec's tensors
// point into the mapping, as Python's loader does.
//
//   kcap::Bundle bundle = kcap::load_bundle("model.bundle");
//   kcap::EngineOptions options;            // backend "cpu", "cuda" or "metal"; n_ctx; kv_type; activations
//   kcap::Engine engine(bundle.spec, options);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kcap/model_spec.h"

namespace kcap {

// The manifest version this library writes and reads.
constexpr int kBundleVersion = 1;

// What a host needs to turn text into ids and back around the engine.
struct BundleTokens {
    int32_t bos_id = -1;           // -1: the vocabulary has no BOS token
    std::vector<int32_t> eos_ids;  // tokens that end a generation (EOS, end of turn), ascending
    bool add_bos = false;          // prepend bos_id to an encoded prompt (tokenizer.json does so too)
    bool add_eos = false;          // append the EOS token to an encoded prompt (likewise)
};

struct Bundle {
    std::string directory;
    std::string gguf_path;                  // the file the spec's tensors are mapped from
    std::shared_ptr<const ModelSpec> spec;  // holds the mapping alive
    BundleTokens tokens;
    std::string chat_template;   // the GGUF's Jinja chat template; "" where it has none
    std::string tokenizer_json;  // path of DIR/tokenizer.json; "" where the GGUF has no vocabulary
    std::string kcap_version;    // the kcap that wrote the bundle
};

// Reads DIR/kcap-bundle.json and maps its GGUF file. gguf_path, when not empty, replaces the
// manifest's (a file moved since the export); a relative path in the manifest is relative to
// DIR. Throws ModelError naming the file and the field when the manifest is malformed, of
// another version, or names a field this library does not know; when the GGUF file is
// missing, of another size or fingerprint; or when a tensor's byte range does not fit it.
Bundle load_bundle(const std::string& directory, const std::string& gguf_path = "");

}  // namespace kcap
