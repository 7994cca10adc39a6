// The bundle manifest, written and read in one place (kcap/bundle.h, docs/embedding.md).
//
// The spec's fields come from their declared lists (KCAP_MODEL_SCALAR_FIELDS,
// KCAP_LAYER_SCALAR_FIELDS, KCAP_ROPE_YARN_FIELDS and the tensor field lists of
// model_spec.h), so a field added there is written and read without a change here. The reader
// is strict: every field must be present and no unknown one may appear, since a field this
// library does not know could change the math.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/bundle_writer.h"
#include "core/json.h"
#include "kcap/errors.h"

namespace kcap {

namespace {

using json::Value;

// --- writing ------------------------------------------------------------------------------

std::string write_value(int v) { return std::to_string(v); }
std::string write_value(int64_t v) { return std::to_string(v); }
std::string write_value(float v) { return json::number(v); }
std::string write_value(bool v) { return v ? "true" : "false"; }
std::string write_value(const std::string& v) { return json::quote(v); }
std::string write_value(NormKind v) { return json::quote(norm_kind_name(v)); }
std::string write_value(Activation v) { return json::quote(activation_name(v)); }
std::string write_value(RopeStyle v) { return json::quote(rope_style_name(v)); }
std::string write_value(ExpertGating v) { return json::quote(expert_gating_name(v)); }
std::string write_value(ExpertGroupScore v) { return json::quote(expert_group_score_name(v)); }
std::string write_value(const RopeYarn& v) {
    std::string out = "{";
#define KCAP_WRITE_FIELD(TYPE, NAME, DEFAULT) out += (out.size() > 1 ? ", " : "") + json::quote(#NAME) + ": " + write_value(v.NAME);
    KCAP_ROPE_YARN_FIELDS(KCAP_WRITE_FIELD)
#undef KCAP_WRITE_FIELD
    return out + "}";
}

// Members of one object, one per line at `indent`.
class ObjectWriter {
public:
    explicit ObjectWriter(int indent) : pad_(size_t(indent), ' ') {}
    void add(const std::string& key, const std::string& value_json) {
        out_ += (out_.empty() ? "" : ",\n") + pad_ + "  " + json::quote(key) + ": " + value_json;
    }
    std::string str() const { return "{\n" + out_ + "\n" + pad_ + "}"; }

private:
    std::string pad_, out_;
};

std::string write_layer(const LayerSpec& layer, int indent) {
    ObjectWriter w(indent);
#define KCAP_WRITE_FIELD(TYPE, NAME, DEFAULT) w.add(#NAME, write_value(layer.NAME));
    KCAP_LAYER_SCALAR_FIELDS(KCAP_WRITE_FIELD)
#undef KCAP_WRITE_FIELD
#define KCAP_WRITE_TENSOR_FIELD(NAME) w.add(#NAME, write_value(layer.NAME));
    KCAP_LAYER_TENSOR_FIELDS(KCAP_WRITE_TENSOR_FIELD)
#undef KCAP_WRITE_TENSOR_FIELD
    return w.str();
}

// The natural alignment of a format's elements or block words, as the GGUF reader requires.
size_t element_alignment(Format format) {
    const FormatInfo& info = format_info(format);
    return info.block_bytes % 4 == 0 ? 4 : info.block_bytes % 2 == 0 ? 2 : 1;
}

std::string write_tensor(const TensorRef& t, const BundleSource& source) {
    const uint8_t* end = source.file + source.file_size;
    if (t.data < source.file || t.data > end || t.nbytes > size_t(end - t.data))
        throw ModelError("tensor '" + t.name + "' is not a byte range of " + source.gguf_path +
                         "; a bundle can only refer to the GGUF file's own bytes");
    std::string shape = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
    return "{\"name\": " + json::quote(t.name) + ", \"type\": " + json::quote(format_name(t.format)) +
           ", \"shape\": " + shape + "], \"offset\": " + std::to_string(t.data - source.file) +
           ", \"nbytes\": " + std::to_string(t.nbytes) + "}";
}

std::string hex64(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

// --- reading ------------------------------------------------------------------------------

struct Reader {
    std::string file;  // the manifest's path, for errors

    [[noreturn]] void fail(const std::string& where, const std::string& problem) const {
        throw ModelError(file + ": " + where + ": " + problem);
    }

    const Value& member(const Value& object, const std::string& key, const std::string& where) const {
        if (object.kind != Value::Kind::Object) fail(where, "expected an object");
        const Value* v = object.find(key);
        if (!v) fail(where, "missing field '" + key + "'");
        return *v;
    }

    // Every member of `object` must be one of `known`.
    void only(const Value& object, const std::set<std::string>& known, const std::string& where) const {
        for (const auto& [key, value] : object.members)
            if (!known.count(key))
                fail(where, "unknown field '" + key + "' (this kcap reads bundle version " +
                                std::to_string(kBundleVersion) + "; a field it does not know could change the model)");
    }

    int64_t integer(const Value& v, const std::string& where, int64_t lo, int64_t hi) const {
        if (v.kind != Value::Kind::Number) fail(where, "expected an integer");
        errno = 0;
        char* end = nullptr;
        const long long x = std::strtoll(v.text.c_str(), &end, 10);
        if (errno || *end) fail(where, "expected an integer, got " + v.text);
        if (x < lo || x > hi)
            fail(where, v.text + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return x;
    }

    void read(const Value& v, int& out, const std::string& where) const { out = int(integer(v, where, INT_MIN, INT_MAX)); }
    void read(const Value& v, int64_t& out, const std::string& where) const {
        out = integer(v, where, INT64_MIN, INT64_MAX);
    }
    void read(const Value& v, float& out, const std::string& where) const {
        if (v.kind != Value::Kind::Number) fail(where, "expected a number");
        out = std::strtof(v.text.c_str(), nullptr);
        if (!std::isfinite(out)) fail(where, v.text + " is not a finite float");
    }
    void read(const Value& v, bool& out, const std::string& where) const {
        if (v.kind != Value::Kind::Bool) fail(where, "expected true or false");
        out = v.boolean;
    }
    void read(const Value& v, std::string& out, const std::string& where) const {
        if (v.kind != Value::Kind::String) fail(where, "expected a string");
        out = v.text;
    }
    template <class E>
    void read_enum(const Value& v, E& out, const std::string& where, const char* (*name)(E),
                   std::initializer_list<E> values) const {
        std::string text, names;
        read(v, text, where);
        for (E e : values) {
            if (text == name(e)) {
                out = e;
                return;
            }
            names += std::string(names.empty() ? "" : ", ") + name(e);
        }
        fail(where, "'" + text + "' is none of " + names);
    }
#define KCAP_ENUM_VALUES(VALUE, NAME) Enum::VALUE,
#define KCAP_READ_ENUM(TYPE, LIST, NAME_FN)                                             \
    void read(const Value& v, TYPE& out, const std::string& where) const {              \
        using Enum = TYPE;                                                              \
        read_enum<TYPE>(v, out, where, &NAME_FN, {LIST(KCAP_ENUM_VALUES)});             \
    }
    KCAP_READ_ENUM(NormKind, KCAP_NORM_KINDS, norm_kind_name)
    KCAP_READ_ENUM(Activation, KCAP_ACTIVATIONS, activation_name)
    KCAP_READ_ENUM(RopeStyle, KCAP_ROPE_STYLES, rope_style_name)
    KCAP_READ_ENUM(ExpertGating, KCAP_EXPERT_GATINGS, expert_gating_name)
    KCAP_READ_ENUM(ExpertGroupScore, KCAP_EXPERT_GROUP_SCORES, expert_group_score_name)
#undef KCAP_READ_ENUM
#undef KCAP_ENUM_VALUES
    void read(const Value& v, RopeYarn& out, const std::string& where) const {
        std::set<std::string> known;
#define KCAP_READ_FIELD(TYPE, NAME, DEFAULT) \
    read(member(v, #NAME, where), out.NAME, where + "." #NAME); \
    known.insert(#NAME);
        KCAP_ROPE_YARN_FIELDS(KCAP_READ_FIELD)
#undef KCAP_READ_FIELD
        only(v, known, where);
    }

    LayerSpec layer(const Value& v, const std::string& where) const {
        LayerSpec layer;
        std::set<std::string> known;
#define KCAP_READ_FIELD(TYPE, NAME, DEFAULT) \
    read(member(v, #NAME, where), layer.NAME, where + "." #NAME); \
    known.insert(#NAME);
        KCAP_LAYER_SCALAR_FIELDS(KCAP_READ_FIELD)
#undef KCAP_READ_FIELD
#define KCAP_READ_TENSOR_FIELD(NAME) \
    read(member(v, #NAME, where), layer.NAME, where + "." #NAME); \
    known.insert(#NAME);
        KCAP_LAYER_TENSOR_FIELDS(KCAP_READ_TENSOR_FIELD)
#undef KCAP_READ_TENSOR_FIELD
        only(v, known, where);
        return layer;
    }
};

// The GGUF file, mapped read-only for as long as a spec points into it.
struct Mapping {
    const uint8_t* data = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (data) munmap(const_cast<uint8_t*>(data), size);
    }
};

std::shared_ptr<Mapping> map_file(const std::string& path, const std::string& manifest) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw ModelError(manifest + ": its GGUF file " + path + " cannot be opened (" + std::strerror(errno) +
                         "); pass the file's new path if it moved");
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        throw ModelError(manifest + ": its GGUF file " + path + " is not a regular, non-empty file");
    }
    auto mapping = std::make_shared<Mapping>();
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);  // the mapping stays valid without the descriptor
    if (p == MAP_FAILED) throw ModelError(manifest + ": cannot map " + path + " (" + std::strerror(error) + ")");
    mapping->data = static_cast<const uint8_t*>(p);
    mapping->size = size_t(st.st_size);
    return mapping;
}

std::string join_path(const std::string& dir, const std::string& name) {
    if (name.empty() || name[0] == '/') return name;
    return dir.empty() ? name : dir + (dir.back() == '/' ? "" : "/") + name;
}

}  // namespace

uint64_t file_fingerprint(const uint8_t* file, size_t size) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](const uint8_t* p, size_t n) {
        for (size_t i = 0; i < n; ++i) {
            h ^= p[i];
            h *= 0x100000001b3ull;
        }
    };
    const uint64_t size64 = size;
    mix(reinterpret_cast<const uint8_t*>(&size64), sizeof size64);
    const size_t window = size_t(1) << 20;
    mix(file, std::min(size, window));
    if (size > window) mix(file + size - std::min(size - window, window), std::min(size - window, window));
    return h;
}

std::string bundle_manifest(const ModelSpec& spec, const BundleSource& source) {
    ObjectWriter root(0);
    root.add("format", json::quote("kcap-bundle"));
    root.add("version", std::to_string(kBundleVersion));
    root.add("kcap_version", json::quote(source.kcap_version));

    ObjectWriter gguf(2);
    gguf.add("path", json::quote(source.gguf_path));
    gguf.add("size", std::to_string(source.file_size));
    gguf.add("fingerprint", json::quote("fnv1a64:" + hex64(file_fingerprint(source.file, source.file_size))));
    root.add("gguf", gguf.str());

    ObjectWriter tokens(2);
    tokens.add("file", source.has_tokenizer ? json::quote(kBundleTokenizerName) : "null");
    tokens.add("bos_id", source.tokens.bos_id >= 0 ? std::to_string(source.tokens.bos_id) : "null");
    std::string eos = "[";
    for (size_t i = 0; i < source.tokens.eos_ids.size(); ++i)
        eos += (i ? ", " : "") + std::to_string(source.tokens.eos_ids[i]);
    tokens.add("eos_ids", eos + "]");
    tokens.add("add_bos", write_value(source.tokens.add_bos));
    tokens.add("add_eos", write_value(source.tokens.add_eos));
    root.add("tokenizer", tokens.str());
    root.add("chat_template", source.chat_template.empty() ? "null" : json::quote(source.chat_template));

    ObjectWriter model(2);
#define KCAP_WRITE_FIELD(TYPE, NAME, DEFAULT) model.add(#NAME, write_value(spec.NAME));
    KCAP_MODEL_SCALAR_FIELDS(KCAP_WRITE_FIELD)
#undef KCAP_WRITE_FIELD
#define KCAP_WRITE_TENSOR_FIELD(NAME) model.add(#NAME, write_value(spec.NAME));
    KCAP_MODEL_TENSOR_FIELDS(KCAP_WRITE_TENSOR_FIELD)
#undef KCAP_WRITE_TENSOR_FIELD
    std::string layers = "[";
    for (size_t i = 0; i < spec.layers.size(); ++i) layers += (i ? ", " : "") + write_layer(spec.layers[i], 4);
    model.add("layers", layers + "]");
    std::string tensors = "[";
    size_t i = 0;
    for (const auto& [name, ref] : spec.tensors) tensors += (i++ ? ",\n      " : "\n      ") + write_tensor(ref, source);
    model.add("tensors", tensors + "\n    ]");
    root.add("spec", model.str());
    return root.str() + "\n";
}

Bundle load_bundle(const std::string& directory, const std::string& gguf_path) {
    Reader r{join_path(directory, kBundleManifestName)};
    std::ifstream in(r.file, std::ios::binary);
    if (!in) throw ModelError(r.file + ": cannot be read (is " + directory + " a bundle written by `kcap export`?)");
    std::stringstream text;
    text << in.rdbuf();
    const Value root = json::parse(text.str(), r.file);

    std::string format;
    r.read(r.member(root, "format", "manifest"), format, "format");
    if (format != "kcap-bundle") r.fail("format", "expected \"kcap-bundle\", got \"" + format + "\"");
    int version = 0;
    r.read(r.member(root, "version", "manifest"), version, "version");
    if (version != kBundleVersion)
        r.fail("version", "the bundle is version " + std::to_string(version) + "; this kcap reads version " +
                              std::to_string(kBundleVersion) + " (export it again with this kcap)");
    r.only(root, {"format", "version", "kcap_version", "gguf", "tokenizer", "chat_template", "spec"}, "manifest");

    Bundle bundle;
    bundle.directory = directory;
    r.read(r.member(root, "kcap_version", "manifest"), bundle.kcap_version, "kcap_version");

    const Value& gguf = r.member(root, "gguf", "manifest");
    r.only(gguf, {"path", "size", "fingerprint"}, "gguf");
    std::string manifest_path, fingerprint;
    r.read(r.member(gguf, "path", "gguf"), manifest_path, "gguf.path");
    const int64_t size = r.integer(r.member(gguf, "size", "gguf"), "gguf.size", 1, INT64_MAX);
    r.read(r.member(gguf, "fingerprint", "gguf"), fingerprint, "gguf.fingerprint");
    bundle.gguf_path = gguf_path.empty() ? join_path(directory, manifest_path) : gguf_path;
    auto mapping = map_file(bundle.gguf_path, r.file);
    if (int64_t(mapping->size) != size)
        r.fail("gguf", bundle.gguf_path + " holds " + std::to_string(mapping->size) + " bytes; the bundle was made from a file of " +
                           std::to_string(size) + " (export the bundle again from this file)");
    const std::string actual = "fnv1a64:" + hex64(file_fingerprint(mapping->data, mapping->size));
    if (actual != fingerprint)
        r.fail("gguf", bundle.gguf_path + " has fingerprint " + actual + ", not the bundle's " + fingerprint +
                           ": it is not the file the bundle was made from (export the bundle again)");

    const Value& tokens = r.member(root, "tokenizer", "manifest");
    r.only(tokens, {"file", "bos_id", "eos_ids", "add_bos", "add_eos"}, "tokenizer");
    const Value& file = r.member(tokens, "file", "tokenizer");
    if (file.kind != Value::Kind::Null) {
        std::string name;
        r.read(file, name, "tokenizer.file");
        bundle.tokenizer_json = join_path(directory, name);
    }
    const Value& bos = r.member(tokens, "bos_id", "tokenizer");
    if (bos.kind != Value::Kind::Null) bundle.tokens.bos_id = int32_t(r.integer(bos, "tokenizer.bos_id", 0, INT32_MAX));
    const Value& eos = r.member(tokens, "eos_ids", "tokenizer");
    if (eos.kind != Value::Kind::Array) r.fail("tokenizer.eos_ids", "expected an array of token ids");
    for (const Value& id : eos.items) bundle.tokens.eos_ids.push_back(int32_t(r.integer(id, "tokenizer.eos_ids", 0, INT32_MAX)));
    r.read(r.member(tokens, "add_bos", "tokenizer"), bundle.tokens.add_bos, "tokenizer.add_bos");
    r.read(r.member(tokens, "add_eos", "tokenizer"), bundle.tokens.add_eos, "tokenizer.add_eos");
    const Value& chat = r.member(root, "chat_template", "manifest");
    if (chat.kind != Value::Kind::Null) r.read(chat, bundle.chat_template, "chat_template");

    const Value& s = r.member(root, "spec", "manifest");
    auto spec = std::make_shared<ModelSpec>();
    std::set<std::string> known{"layers", "tensors"};
#define KCAP_READ_FIELD(TYPE, NAME, DEFAULT) \
    r.read(r.member(s, #NAME, "spec"), spec->NAME, "spec." #NAME); \
    known.insert(#NAME);
    KCAP_MODEL_SCALAR_FIELDS(KCAP_READ_FIELD)
#undef KCAP_READ_FIELD
#define KCAP_READ_TENSOR_FIELD(NAME) \
    r.read(r.member(s, #NAME, "spec"), spec->NAME, "spec." #NAME); \
    known.insert(#NAME);
    KCAP_MODEL_TENSOR_FIELDS(KCAP_READ_TENSOR_FIELD)
#undef KCAP_READ_TENSOR_FIELD
    r.only(s, known, "spec");

    const Value& layers = r.member(s, "layers", "spec");
    if (layers.kind != Value::Kind::Array) r.fail("spec.layers", "expected an array");
    for (size_t i = 0; i < layers.items.size(); ++i)
        spec->layers.push_back(r.layer(layers.items[i], "spec.layers[" + std::to_string(i) + "]"));

    const Value& tensors = r.member(s, "tensors", "spec");
    if (tensors.kind != Value::Kind::Array) r.fail("spec.tensors", "expected an array");
    for (size_t i = 0; i < tensors.items.size(); ++i) {
        const Value& t = tensors.items[i];
        const std::string where = "spec.tensors[" + std::to_string(i) + "]";
        r.only(t, {"name", "type", "shape", "offset", "nbytes"}, where);
        TensorRef ref;
        r.read(r.member(t, "name", where), ref.name, where + ".name");
        const std::string at = "tensor '" + ref.name + "'";
        std::string type;
        r.read(r.member(t, "type", where), type, where + ".type");
        try {
            ref.format = format_from_name(type);
        } catch (const FormatError& e) {
            r.fail(at, e.what());
        }
        const Value& shape = r.member(t, "shape", where);
        if (shape.kind != Value::Kind::Array || shape.items.empty() || shape.items.size() > 4)
            r.fail(at, "shape must be an array of 1 to 4 dimensions");
        int64_t elements = 1;
        for (const Value& d : shape.items) {
            ref.shape.push_back(r.integer(d, at + " shape", 1, int64_t(1) << 40));
            if (elements > (int64_t(1) << 50) / ref.shape.back()) r.fail(at, "shape holds more than 2^50 elements");
            elements *= ref.shape.back();
        }
        const int64_t offset = r.integer(r.member(t, "offset", where), at + " offset", 0, INT64_MAX);
        const int64_t nbytes = r.integer(r.member(t, "nbytes", where), at + " nbytes", 1, INT64_MAX);
        size_t expected = 0;
        try {
            expected = row_bytes(ref.format, ref.row_length()) * size_t(ref.n_rows());
        } catch (const FormatError& e) {
            r.fail(at, e.what());
        }
        if (size_t(nbytes) != expected)
            r.fail(at, "holds " + std::to_string(nbytes) + " bytes; its shape and type " + type + " need " +
                           std::to_string(expected));
        if (offset > int64_t(mapping->size) || nbytes > int64_t(mapping->size) - offset)
            r.fail(at, "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + nbytes) + ") run past the end of " +
                           bundle.gguf_path + " (" + std::to_string(mapping->size) + " bytes)");
        if (uintptr_t(mapping->data + offset) % element_alignment(ref.format))
            r.fail(at, "starts at byte " + std::to_string(offset) + ", off its elements' alignment of " +
                           std::to_string(element_alignment(ref.format)));
        ref.data = mapping->data + offset;
        ref.nbytes = size_t(nbytes);
        if (spec->tensors.count(ref.name)) r.fail(at, "appears twice");
        spec->tensors[ref.name] = ref;
    }
    spec->keepalive.push_back(mapping);
    bundle.spec = spec;
    return bundle;
}

}  // namespace kcap
