// Python surface of bundles (kcap/bundle.h): `kcap export` writes the manifest through
// bundle_manifest, and the tests read a bundle back as a C++ host does (load_bundle).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/bundle_writer.h"
#include "kcap/bundle.h"
#include "kcap/kcap.h"
#include "kcap/errors.h"

namespace py = pybind11;
using namespace kcap;

void init_bundle(py::module_& m) {
    m.attr("__version__") = kcap::version();
    m.attr("BUNDLE_VERSION") = kBundleVersion;
    m.attr("BUNDLE_MANIFEST") = kBundleManifestName;
    m.attr("BUNDLE_TOKENIZER") = kBundleTokenizerName;
    m.def(
        "bundle_manifest",
        [](const ModelSpec& spec, py::array file, const std::string& gguf_path, int32_t bos_id,
           std::vector<int32_t> eos_ids, bool add_bos, bool add_eos, const std::string& chat_template,
           bool has_tokenizer, const std::string& kcap_version) {
            BundleSource source;
            source.gguf_path = gguf_path;
            source.file = static_cast<const uint8_t*>(file.data());
            source.file_size = size_t(file.nbytes());
            source.tokens.bos_id = bos_id;
            source.tokens.eos_ids = std::move(eos_ids);
            source.tokens.add_bos = add_bos;
            source.tokens.add_eos = add_eos;
            source.chat_template = chat_template;
            source.has_tokenizer = has_tokenizer;
            source.kcap_version = kcap_version;
            return bundle_manifest(spec, source);
        },
        py::arg("spec"), py::arg("file"), py::arg("gguf_path"), py::arg("bos_id"), py::arg("eos_ids"),
        py::arg("add_bos"), py::arg("add_eos"), py::arg("chat_template"), py::arg("has_tokenizer"),
        py::arg("kcap_version"),
        "The text of a bundle's manifest for spec, whose tensors are byte ranges of `file` (the whole GGUF "
        "file's bytes); bos_id -1 for none, chat_template '' for none.");
    m.def(
        "load_bundle",
        [](const std::string& directory, const std::string& gguf_path) {
            const Bundle b = load_bundle(directory, gguf_path);
            py::dict d;
            d["directory"] = b.directory;
            d["gguf_path"] = b.gguf_path;
            d["bos_id"] = b.tokens.bos_id >= 0 ? py::object(py::int_(b.tokens.bos_id)) : py::object(py::none());
            d["eos_ids"] = b.tokens.eos_ids;
            d["add_bos"] = b.tokens.add_bos;
            d["add_eos"] = b.tokens.add_eos;
            d["chat_template"] = b.chat_template;
            d["tokenizer_json"] = b.tokenizer_json;
            d["kcap_version"] = b.kcap_version;
            // A copy of the spec that Python can hand to Engine (its mapping travels in keepalive).
            return py::make_tuple(std::make_shared<ModelSpec>(*b.spec), d);
        },
        py::arg("directory"), py::arg("gguf_path") = "",
        "Reads a bundle as a C++ host does (kcap::load_bundle): returns (ModelSpec, manifest fields).");
}
