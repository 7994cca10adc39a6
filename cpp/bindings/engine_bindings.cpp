// Python surface of the model description, the capability table, planning and the engine.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dispatch/capability.h"
#include "dispatch/planner.h"
#include "dispatch/rope_table.h"
#include "kcap/engine.h"
#include "kcap/errors.h"
#include "metal/rows.h"

namespace py = pybind11;
using namespace kcap;

namespace {

// Thrown by StopCheck's engine check when a signal handler raised (Ctrl-C: KeyboardInterrupt);
// the Python exception stays set on this thread until eval has unwound and takes the GIL back.
struct PendingPythonError {};
// Thrown by StopCheck's engine check when the eval's cancel event is set.
struct Cancelled {};

// While an eval runs, the engine checks between stages (Engine::set_interrupt_check, at most
// every 10 ms) for what should stop it: on the main thread (the only one Python runs signal
// handlers on) a signal, so Ctrl-C during a long prompt lands within a stage or two; on any
// thread the eval's cancel event (an object with is_set(), a threading.Event: a server's client
// that went away). Either leaves the cache at n_past. Without a cancel event, other threads get
// no check: they could not see a signal, and taking the GIL from them would contend with the
// main one.
class StopCheck {
public:
    StopCheck(Engine& engine, const py::object& cancel) : engine_(engine) {
        const py::object threading = py::module_::import("threading");
        const bool main_thread = threading.attr("current_thread")().is(threading.attr("main_thread")());
        if (!main_thread && cancel.is_none()) return;
        py::object is_set = cancel.is_none() ? py::object() : py::getattr(cancel, "is_set");
        engine_.set_interrupt_check([main_thread, is_set]() {
            py::gil_scoped_acquire gil;
            if (main_thread && PyErr_CheckSignals() != 0) throw PendingPythonError{};
            if (is_set && is_set().cast<bool>()) throw Cancelled{};
        });
        installed_ = true;
    }
    ~StopCheck() {
        if (installed_) engine_.set_interrupt_check({});
    }
    StopCheck(const StopCheck&) = delete;
    StopCheck& operator=(const StopCheck&) = delete;

private:
    Engine& engine_;
    bool installed_ = false;
};

// Token ids from Python, checked, never coerced: an integer array (a float or bool array is
// refused, not truncated), every id within the vocabulary (an int64 id of 2^32 + 2 is refused,
// not wrapped to 2), and the context room for them, before anything is sized by their count.
std::vector<int32_t> checked_token_ids(const Engine& engine, const py::array& tokens, bool from_empty = false) {
    const char kind = tokens.dtype().kind();
    if (kind != 'i' && kind != 'u')
        throw ModelError(std::string("token ids must be integers, got an array of dtype ") +
                         std::string(py::str(tokens.dtype())));
    const auto wide = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(tokens);
    if (!wide) throw ModelError("token ids must be an integer array");
    const int64_t n = int64_t(wide.size());
    if (n <= 0) throw ModelError("eval needs at least one token");
    const int64_t cached = from_empty ? 0 : engine.n_past();
    if (cached + n > engine.n_ctx())
        throw ContextOverflowError("context overflow: " + std::to_string(cached) + " cached + " +
                                   std::to_string(n) + " new tokens exceed the context length " +
                                   std::to_string(engine.n_ctx()));
    std::vector<int32_t> ids(static_cast<size_t>(n));
    const int64_t* data = wide.data();
    for (int64_t i = 0; i < n; ++i) {
        if (data[i] < 0 || data[i] >= engine.n_vocab())
            throw ModelError("token id " + std::to_string(data[i]) + " (at " + std::to_string(i) +
                             ") is outside the vocabulary [0, " + std::to_string(engine.n_vocab()) + ")");
        ids[size_t(i)] = int32_t(data[i]);
    }
    return ids;
}

py::dict route_to_dict(const RouteInfo& r) {
    py::dict d;
    d["layer"] = r.layer;
    d["stage"] = r.stage;
    d["op"] = r.op;
    d["formats"] = r.formats;
    d["dims"] = r.dims;
    d["features"] = r.features;
    d["kernel"] = r.kernel;
    d["backend"] = r.backend;
    d["tokens_min"] = r.tokens_min;
    d["tokens_max"] = r.tokens_max ? py::object(py::int_(r.tokens_max)) : py::object(py::none());
    d["kv_bytes_per_token"] = r.kv_bytes_per_token;
    return d;
}

py::list routes_to_list(const std::vector<RouteInfo>& routes) {
    py::list out;
    for (const auto& r : routes) out.append(route_to_dict(r));
    return out;
}

EngineOptions make_options(const std::string& backend, const std::string& kv_type, int64_t n_ctx, int n_threads,
                           int max_batch, const std::vector<std::string>& excluded,
                           const std::string& activations, bool profile = false,
                           const std::string& cublas_library = "") {
    EngineOptions options;
    options.profile = profile;
    options.cublas_library = cublas_library;
    options.backend = backend;
    options.kv_type = kv_type;
    options.activations = activations;
    options.n_ctx = n_ctx;
    options.n_threads = n_threads;
    options.max_batch = max_batch;
    options.excluded_kernels = excluded;
    return options;
}

// Registers a weight tensor whose bytes stay owned by the Python buffer (a memory map).
void add_tensor(ModelSpec& spec, const std::string& name, int ggml_type, const std::vector<int64_t>& shape,
                py::array data) {
    if (!(data.flags() & py::array::c_style)) throw ModelError("tensor '" + name + "' data is not contiguous");
    TensorRef ref;
    ref.name = name;
    ref.format = format_from_ggml_type(ggml_type);
    ref.shape = shape;
    ref.data = static_cast<const uint8_t*>(data.data());
    ref.nbytes = size_t(data.nbytes());
    if (shape.empty()) throw ModelError("tensor '" + name + "' has no shape");
    size_t expected = row_bytes(ref.format, ref.row_length()) * size_t(ref.n_rows());
    if (expected != ref.nbytes)
        throw ModelError("tensor '" + name + "' holds " + std::to_string(ref.nbytes) + " bytes, its shape and type " +
                         format_name(ref.format) + " need " + std::to_string(expected));
    // Keep the buffer alive as long as any copy of the spec; release it under the GIL.
    auto* owner = new py::object(data);
    spec.keepalive.emplace_back(owner, [](void* p) {
        py::gil_scoped_acquire gil;
        delete static_cast<py::object*>(p);
    });
    spec.tensors[name] = ref;
}

// A view of rows [offset, offset + count) of a registered 2-D tensor, or of elements
// [offset, offset + count) of a 1-D float tensor: how a fused QKV weight or bias is split
// into the Q, K and V operands the planner routes separately.
void add_tensor_view(ModelSpec& spec, const std::string& name, const std::string& base_name, int64_t offset,
                     int64_t count) {
    const TensorRef& base = spec.tensor(base_name);
    TensorRef view = base;
    view.name = name;
    if (base.shape.size() == 1) {
        const FormatInfo& info = format_info(base.format);
        if (info.block_elems != 1) throw ModelError("1-D view of block-quantized tensor '" + base_name + "'");
        if (offset < 0 || count <= 0 || offset + count > base.row_length())
            throw ModelError("view of elements [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                             ") is outside tensor '" + base_name + "'");
        view.shape = {count};
        view.data = base.data + size_t(offset) * size_t(info.block_bytes);
        view.nbytes = size_t(count) * size_t(info.block_bytes);
    } else {
        if (base.shape.size() != 2 || offset < 0 || count <= 0 || offset + count > base.n_rows())
            throw ModelError("view of rows [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                             ") is outside tensor '" + base_name + "'");
        const size_t stride = row_bytes(base.format, base.row_length());
        view.shape = {base.row_length(), count};
        view.data = base.data + size_t(offset) * stride;
        view.nbytes = size_t(count) * stride;
    }
    spec.tensors[name] = view;
}

}  // namespace

void init_engine(py::module_& m) {
    // Each enum's Python values come from its list in model_spec.h (a value named None is None_).
#define KCAP_BIND_ENUM_VALUE(VALUE, NAME) e.value(std::string(#VALUE) == "None" ? "None_" : #VALUE, Enum::VALUE);
#define KCAP_BIND_ENUM(TYPE, LIST)        \
    {                                     \
        using Enum = TYPE;                \
        py::enum_<TYPE> e(m, #TYPE);      \
        LIST(KCAP_BIND_ENUM_VALUE)        \
    }
    KCAP_BIND_ENUM(NormKind, KCAP_NORM_KINDS)
    KCAP_BIND_ENUM(Activation, KCAP_ACTIVATIONS)
    KCAP_BIND_ENUM(RopeStyle, KCAP_ROPE_STYLES)
    KCAP_BIND_ENUM(ExpertGating, KCAP_EXPERT_GATINGS)
    KCAP_BIND_ENUM(ExpertGroupScore, KCAP_EXPERT_GROUP_SCORES)
#undef KCAP_BIND_ENUM
#undef KCAP_BIND_ENUM_VALUE
    py::class_<RopeYarn> yarn(m, "RopeYarn", "YaRN rope scaling of a layer (none unless factor > 0).");
    yarn.def(py::init<>());
#define KCAP_BIND_FIELD(TYPE, NAME, DEFAULT) yarn.def_readwrite(#NAME, &RopeYarn::NAME);
    KCAP_ROPE_YARN_FIELDS(KCAP_BIND_FIELD)
#undef KCAP_BIND_FIELD
    py::class_<LayerSpec> layer(m, "LayerSpec", "One decoder block: head geometry, tensor names and features.");
#define KCAP_BIND_LAYER_TENSOR(NAME) layer.def_readwrite(#NAME, &LayerSpec::NAME);
    KCAP_LAYER_TENSOR_FIELDS(KCAP_BIND_LAYER_TENSOR)
#undef KCAP_BIND_LAYER_TENSOR
    py::list layer_fields, model_fields;
#define KCAP_LIST_TENSOR_FIELD(NAME) layer_fields.append(#NAME);
    KCAP_LAYER_TENSOR_FIELDS(KCAP_LIST_TENSOR_FIELD)
#undef KCAP_LIST_TENSOR_FIELD
#define KCAP_LIST_TENSOR_FIELD(NAME) model_fields.append(#NAME);
    KCAP_MODEL_TENSOR_FIELDS(KCAP_LIST_TENSOR_FIELD)
#undef KCAP_LIST_TENSOR_FIELD
    py::list layer_scalars, model_scalars;
#define KCAP_LIST_FIELD(TYPE, NAME, DEFAULT) layer_scalars.append(#NAME);
    KCAP_LAYER_SCALAR_FIELDS(KCAP_LIST_FIELD)
#undef KCAP_LIST_FIELD
#define KCAP_LIST_FIELD(TYPE, NAME, DEFAULT) model_scalars.append(#NAME);
    KCAP_MODEL_SCALAR_FIELDS(KCAP_LIST_FIELD)
#undef KCAP_LIST_FIELD
    m.attr("LAYER_SCALAR_FIELDS") = py::tuple(layer_scalars);
    m.attr("MODEL_SCALAR_FIELDS") = py::tuple(model_scalars);
    m.attr("LAYER_TENSOR_FIELDS") = py::tuple(layer_fields);
    m.attr("MODEL_TENSOR_FIELDS") = py::tuple(model_fields);
    layer.def(py::init<>());
#define KCAP_BIND_FIELD(TYPE, NAME, DEFAULT) layer.def_readwrite(#NAME, &LayerSpec::NAME);
    KCAP_LAYER_SCALAR_FIELDS(KCAP_BIND_FIELD)
#undef KCAP_BIND_FIELD

    py::class_<ModelSpec, std::shared_ptr<ModelSpec>> model(m, "ModelSpec", "Pure-data model description.",
                                                            py::dynamic_attr());
#define KCAP_BIND_MODEL_TENSOR(NAME) model.def_readwrite(#NAME, &ModelSpec::NAME);
    KCAP_MODEL_TENSOR_FIELDS(KCAP_BIND_MODEL_TENSOR)
#undef KCAP_BIND_MODEL_TENSOR
#define KCAP_BIND_FIELD(TYPE, NAME, DEFAULT) model.def_readwrite(#NAME, &ModelSpec::NAME);
    KCAP_MODEL_SCALAR_FIELDS(KCAP_BIND_FIELD)
#undef KCAP_BIND_FIELD
    model.def(py::init<>())
        .def_readwrite("layers", &ModelSpec::layers)
        .def("add_tensor", &add_tensor, py::arg("name"), py::arg("ggml_type"), py::arg("shape"), py::arg("data"),
             "Registers a weight tensor (GGUF order shape, raw bytes kept alive, never copied).")
        .def("add_tensor_view", &add_tensor_view, py::arg("name"), py::arg("base"), py::arg("offset"),
             py::arg("count"), "Registers rows (2-D) or elements (1-D) of a registered tensor under a new name.")
        .def("has_tensor", [](const ModelSpec& s, const std::string& name) { return s.tensors.count(name) > 0; });

    m.def(
        "explain_routes",
        [](const ModelSpec& spec, const std::string& backend, const std::string& kv_type, int64_t n_ctx,
           const std::vector<std::string>& excluded, const std::string& activations, int max_batch) {
            return routes_to_list(
                explain_routes(spec, make_options(backend, kv_type, n_ctx, 0, max_batch, excluded, activations)));
        },
        py::arg("spec"), py::arg("backend") = "cpu", py::arg("kv_type") = "f32", py::arg("n_ctx") = 0,
        py::arg("excluded_kernels") = std::vector<std::string>{}, py::arg("activations") = "f32",
        py::arg("max_batch") = 512,
        "Plans the model on a backend without running it; returns one dict per route of each stage "
        "(tokens_min .. tokens_max tokens per call, tokens_max None for no bound).");
    m.def(
        "rope_table",
        [](int rope_dim, float rope_base, float freq_scale, const RopeYarn& yarn, int64_t n_ctx) {
            Stage stage;
            stage.op = Op::Rope;
            stage.params.rope_dim = rope_dim;
            stage.params.rope_base = rope_base;
            stage.params.rope_freq_scale = freq_scale;
            stage.params.rope_yarn = yarn;
            return rope_cos_sin_table(stage, n_ctx);
        },
        py::arg("rope_dim"), py::arg("rope_base"), py::arg("freq_scale") = 1.0f, py::arg("yarn") = RopeYarn(),
        py::arg("n_ctx") = 1,
        "The (cos, sin) pairs every backend rotates by, [n_ctx][rope_dim / 2][2] flattened "
        "(dispatch/rope_table.h), without frequency factors.");
    m.def(
        "explain_summary",
        [](const std::string& backend, int max_batch) {
            const PlanSummary s = explain_summary(make_options(backend, "f32", 0, 0, max_batch, {}, "f32"));
            py::dict d;
            d["max_batch"] = s.max_batch;
            d["device"] = s.device;
            d["sm_count"] = s.sm_count;
            d["shared_optin_bytes"] = s.shared_optin_bytes;
            d["sm_version"] = s.sm_version;
            return d;
        },
        py::arg("backend") = "cpu", py::arg("max_batch") = 512,
        "What explain_routes assumes: the most tokens per call and the device a GPU plan is made for.");

    m.def(
        "capability_rows",
        [] {
            py::list out;
            for (const Row& row : capability_table()) {
                py::dict d;
                d["kernel"] = row.kernel;
                d["op"] = op_name(row.op);
                d["backend"] = backend_name(row.backend);
                py::list operands;
                for (const auto& formats : row.operand_formats) {
                    py::list names;
                    for (Format f : formats) names.append(format_name(f));
                    operands.append(names);
                }
                d["operand_formats"] = operands;
                py::list kv;
                for (Format f : row.kv_formats) kv.append(format_name(f));
                d["kv_formats"] = kv;
                d["input_encoding"] = encoding_name(row.input_encoding);
                d["features"] = feature_names(row.features);
                d["k_multiple"] = row.dims.k_multiple;
                d["k_multiple_of_operand_formats"] = row.dims.k_multiple_of != nullptr;
                d["k_min"] = row.dims.k_min;
                d["k_max"] = row.dims.k_max;
                d["n_multiple"] = row.dims.n_multiple;
                d["max_head_dim"] = row.dims.max_head_dim;
                d["head_dims"] = row.dims.head_dims;
                d["max_span"] = row.dims.max_span;
                d["priority"] = row.priority;
                d["tokens_min"] = row.tokens.min;
                d["tokens_max"] = row.tokens.max ? py::object(py::int_(row.tokens.max)) : py::object(py::none());
                d["tokens_min_by_stage"] = row.tokens_min_of != nullptr;
                d["requires_any"] = feature_names(row.requires_any);
                d["requires_all"] = feature_names(row.requires_all);
                d["launches"] = row.launches;
                d["compiled"] = row.fn != nullptr;
                out.append(d);
            }
            return out;
        },
        "Every row of the capability table.");

    // Each Metal row's entry points, as declared with the row in metal/rows.cpp; tests check
    // every name against the kernels in metal/*.metal.
    m.def(
        "metal_entry_points",
        [] {
            py::dict out;
            for (const auto& [kernel, entries] : metal_rows::all_entry_points()) out[py::str(kernel)] = entries;
            return out;
        },
        "Metal row kernel name -> its entry point names, in the order its launcher uses them.");
    m.attr("MAX_DEVICE_TOP_K") = kMaxDeviceTopK;
    // The option values the engine takes, from their one list each (the CLI offers these).
    py::list kv_types, activations;
    for (Format f : kv_formats()) kv_types.append(kv_type_name(f));
    for (Encoding e : encodings()) activations.append(encoding_name(e));
    m.attr("KV_TYPES") = kv_types;
    m.attr("ACTIVATIONS") = activations;
    m.def("metal_device_available", &metal_device_available,
          "True where the Metal backend is built in and a Metal device exists (then the default backend).");

    py::class_<Engine>(m, "Engine", "A planned model with its KV cache on one backend.")
        .def(py::init([](const ModelSpec& spec, const std::string& backend, const std::string& kv_type, int64_t n_ctx,
                         int n_threads, int max_batch, const std::vector<std::string>& excluded,
                         const std::string& activations, bool profile, const std::string& cublas_library,
                         bool check_finite) {
                 EngineOptions options = make_options(backend, kv_type, n_ctx, n_threads, max_batch, excluded,
                                                      activations, profile, cublas_library);
                 options.check_finite = check_finite;
                 // The engine keeps its own copy of the spec (tensor refs and their owners).
                 return std::make_unique<Engine>(std::make_shared<const ModelSpec>(spec), options);
             }),
             py::arg("spec"), py::arg("backend") = "cpu", py::arg("kv_type") = "f32", py::arg("n_ctx") = 0,
             py::arg("n_threads") = 0, py::arg("max_batch") = 512,
             py::arg("excluded_kernels") = std::vector<std::string>{}, py::arg("activations") = "f32",
             py::arg("profile") = false, py::arg("cublas_library") = "", py::arg("check_finite") = false)
        .def(
            "eval",
            [](Engine& engine, py::array tokens, bool all_logits, const py::object& cancel) -> py::object {
                const std::vector<int32_t> checked = checked_token_ids(engine, tokens);
                const int64_t n = int64_t(checked.size());
                py::array_t<float> logits =
                    all_logits ? py::array_t<float>({n, engine.n_vocab()}) : py::array_t<float>(engine.n_vocab());
                const int32_t* ids = checked.data();
                float* out = logits.mutable_data();
                const StopCheck stop(engine, cancel);
                try {
                    py::gil_scoped_release release;
                    engine.eval(ids, n, out, all_logits);
                } catch (const PendingPythonError&) {
                    throw py::error_already_set();  // the KeyboardInterrupt the check left set
                } catch (const Cancelled&) {
                    return py::none();
                }
                return logits;
            },
            py::arg("tokens"), py::arg("all_logits") = false, py::arg("cancel") = py::none(),
            "Appends tokens at n_past and returns the last position's logits [vocab] (or [n, vocab]); None, with "
            "n_past unchanged, when cancel (an object with is_set(), such as a threading.Event) is set while it "
            "runs (checked between stages on the CPU).")
        .def(
            "decode_greedy",
            [](Engine& engine, int32_t token, int64_t n) {
                engine.check_decode("decode_greedy", token, n);  // before n results are allocated
                py::array_t<int32_t> out(n);
                int32_t* ids = out.mutable_data();
                {
                    py::gil_scoped_release release;
                    engine.decode_greedy(token, n, ids);
                }
                return out;
            },
            py::arg("token"), py::arg("n"),
            "Appends token and greedily decodes: returns the n argmax choices (the last not yet appended). "
            "On cuda the whole loop runs on the device.")
        .def(
            "decode_sample",
            [](Engine& engine, int32_t token, int64_t n, float temperature, int top_k, float top_p, float min_p,
               uint32_t seed) {
                engine.check_decode("decode_sample", token, n);  // before n results are allocated
                py::array_t<int32_t> out(n);
                int32_t* ids = out.mutable_data();
                SampleSettings settings;
                settings.temperature = temperature;
                settings.top_k = top_k;
                settings.top_p = top_p;
                settings.min_p = min_p;
                settings.seed = seed;
                {
                    py::gil_scoped_release release;
                    engine.decode_sample(token, n, settings, ids);
                }
                return out;
            },
            py::arg("token"), py::arg("n"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p") = 1.0f,
            py::arg("min_p") = 0.0f, py::arg("seed") = 0u,
            "As decode_greedy, each choice drawn on the device (top-k <= 64, temperature, top-p, min-p; "
            "the draw a hash of seed and position). Only where samples_on_device.")
        .def_property_readonly("samples_on_device", &Engine::samples_on_device)
        .def("reset", &Engine::reset, "Empties the KV cache.")
        .def("truncate", &Engine::truncate, py::arg("n"), "Keeps the first n cached positions.")
        .def_property_readonly("n_past", &Engine::n_past)
        .def_property_readonly("n_ctx", &Engine::n_ctx)
        .def_property_readonly("n_vocab", &Engine::n_vocab)
        .def_property_readonly("device_bytes", &Engine::device_bytes,
                               "Bytes of device memory the engine holds (weights, KV cache, scratch; 0 on the CPU).")
        .def("routes", [](const Engine& engine) { return routes_to_list(engine.routes()); })
        .def(
            "trace",
            [](Engine& engine, py::array tokens, bool keep_cache, bool routing) {
                const std::vector<int32_t> checked = checked_token_ids(engine, tokens, /*from_empty=*/!keep_cache);
                const int64_t n = int64_t(checked.size());
                py::array_t<float> logits(engine.n_vocab());
                const int32_t* ids = checked.data();
                float* out = logits.mutable_data();
                std::vector<TraceEntry> ran;
                {
                    py::gil_scoped_release release;
                    TraceOptions options;
                    options.keep_cache = keep_cache;
                    options.routing = routing;
                    ran = engine.trace(ids, n, out, options);
                }
                py::list entries;
                for (const TraceEntry& e : ran) {
                    py::dict d;
                    d["layer"] = e.layer;
                    d["stage"] = e.stage;
                    d["kernel"] = e.kernel;
                    d["n_tokens"] = e.n_tokens;
                    if (!e.routing.empty()) {
                        // n_tokens rows of n_used ids (stored as floats), then n_used weights
                        const py::ssize_t used = py::ssize_t(e.routing.size()) / (2 * e.n_tokens);
                        py::array_t<int32_t> experts({py::ssize_t(e.n_tokens), used});
                        py::array_t<float> weights({py::ssize_t(e.n_tokens), used});
                        for (py::ssize_t t = 0; t < e.n_tokens; ++t)
                            for (py::ssize_t k = 0; k < used; ++k) {
                                experts.mutable_at(t, k) = int32_t(e.routing[size_t(t * 2 * used + k)]);
                                weights.mutable_at(t, k) = e.routing[size_t(t * 2 * used + used + k)];
                            }
                        d["experts"] = experts;
                        d["weights"] = weights;
                    }
                    entries.append(d);
                }
                return py::make_tuple(entries, logits);
            },
            py::arg("tokens"), py::arg("keep_cache") = false, py::arg("routing") = false,
            "Evaluates tokens as eval does, from an empty cache unless keep_cache, and returns (what ran: one dict "
            "per stage call with layer, stage, kernel, n_tokens, and with routing each router's choice as "
            "experts and weights arrays of n_tokens x n_used (cpu and cuda); the last position's logits).");
}
