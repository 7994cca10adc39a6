// Writing a bundle's manifest (kcap/bundle.h): `kcap export` calls this through the Python
// module, so that the one file that reads the manifest also writes it (cpp/core/bundle.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "kcap/bundle.h"

namespace kcap {

constexpr const char* kBundleManifestName = "kcap-bundle.json";
constexpr const char* kBundleTokenizerName = "tokenizer.json";

// The GGUF file the spec's tensors point into (its whole mapping), and what the manifest says
// besides the spec.
struct BundleSource {
    std::string gguf_path;
    const uint8_t* file = nullptr;
    size_t file_size = 0;
    BundleTokens tokens;
    std::string chat_template;  // "" writes null
    bool has_tokenizer = false;  // DIR/tokenizer.json is written beside the manifest
    std::string kcap_version;
};

// The manifest's text. Throws ModelError when a tensor of the spec is not a byte range of the
// file (then no host could map it).
std::string bundle_manifest(const ModelSpec& spec, const BundleSource& source);

// The fingerprint the manifest records: FNV-1a (64 bits) over the file's size and its first
// and last MiB, which hold the header and the metadata and the last tensors' bytes.
uint64_t file_fingerprint(const uint8_t* file, size_t size);

}  // namespace kcap
