// Engine: plans a ModelSpec once at construction, then executes it on the chosen backend.
#include "kcap/engine.h"

#include <cmath>
#include <thread>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/backend_impl.h"
#include "dispatch/planner.h"
#include "kcap/errors.h"

namespace kcap {

namespace {

// `device`: plan for the engine's own device (queried) rather than the reference device.
PlanOptions plan_options(const EngineOptions& options, bool device) {
    PlanOptions plan;
    plan.backend = backend_from_name(options.backend);
    plan.kv_format = kv_format_from_name(options.kv_type);
    plan.activations = encoding_from_name(options.activations);
    plan.n_ctx = options.n_ctx;
    if (options.max_batch < 1) throw ModelError("max_batch must be at least 1, got " + std::to_string(options.max_batch));
    plan.max_batch = options.max_batch;
    plan.excluded_kernels = options.excluded_kernels;
#if defined(KCAP_WITH_CUDA)
    if (device && plan.backend == Backend::CUDA) plan.device = cuda_device_info();
#else
    (void)device;
#endif
    return plan;
}

std::vector<RouteInfo> describe(const Plan& plan) {
    std::vector<RouteInfo> routes;
    for (const RoutedStage& routed : plan.stages) {
        const Stage& s = routed.stage;
        for (const Route& route : routed.routes)
            routes.push_back({s.layer, s.name, op_name(s.op), describe_formats(s), describe_dims(s),
                              feature_names(s.features), route.row->kernel, backend_name(route.row->backend),
                              route.tokens.min, route.tokens.max, kv_bytes_per_token(s)});
    }
    return routes;
}

}  // namespace

std::vector<RouteInfo> explain_routes(const ModelSpec& spec, const EngineOptions& options) {
    return describe(make_plan(spec, plan_options(options, false)));
}

PlanSummary explain_summary(const EngineOptions& options) {
    const PlanOptions plan = plan_options(options, false);
    return {plan.max_batch, plan.device.name, plan.device.sm_count, plan.device.shared_optin_bytes,
            plan.device.sm_version};
}

Engine::Engine(std::shared_ptr<const ModelSpec> spec, const EngineOptions& options) : spec_(std::move(spec)) {
    Plan plan = make_plan(*spec_, plan_options(options, true));
    if (options.check_finite && plan.options.backend != Backend::CPU)
        throw BackendUnavailableError("check_finite is implemented on the cpu backend only, not on '" +
                                      options.backend + "'");
    routes_ = describe(plan);
    n_ctx_ = plan.options.n_ctx;
    for (const RoutedStage& routed : plan.stages)
        for (const Route& route : routed.routes)
            if (!route.row->fn)
                throw BackendUnavailableError("backend '" + options.backend + "' is not compiled into this build (row " +
                                              route.row->kernel + " has no kernel)");
    switch (plan.options.backend) {
        case Backend::CPU: backend_ = make_cpu_backend(*spec_, std::move(plan), options); break;
#if defined(KCAP_WITH_CUDA)
        case Backend::CUDA: backend_ = make_cuda_backend(*spec_, std::move(plan), options); break;
#endif
#if defined(KCAP_WITH_METAL)
        case Backend::Metal: backend_ = make_metal_backend(*spec_, std::move(plan), options); break;
#endif
        default:
            throw BackendUnavailableError("backend '" + options.backend + "' is not available in this build");
    }
}

Engine::~Engine() {
    backend_.reset();
#ifdef __GLIBC__
    // Hand the freed buffers (KV cache, scratch, packed weights) back to the system: glibc keeps
    // freed heap in its arenas, so without this a process that loads and frees models kept a
    // model's worth of RSS (Gemma 3 270M: 226 MB against 63 MB with the trim, measured over 12
    // load/free cycles).
    malloc_trim(0);
#endif
}

void Engine::eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
    if (n <= 0) throw ModelError("eval needs at least one token");
    if (n_past_ + n > n_ctx_)
        throw ContextOverflowError("context overflow: " + std::to_string(n_past_) + " cached + " + std::to_string(n) +
                                   " new tokens exceed the context length " + std::to_string(n_ctx_));
    for (int64_t i = 0; i < n; ++i)
        if (tokens[i] < 0 || tokens[i] >= spec_->n_vocab)
            throw ModelError("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                             std::to_string(spec_->n_vocab) + ")");
    backend_->eval(tokens, n, n_past_, logits, all_logits);
    n_past_ += n;
}

void Engine::set_interrupt_check(std::function<void()> check) { backend_->set_interrupt_check(std::move(check)); }

// Greedy decoding on the host from eval's logits, for backends without a device argmax.
void Backend_::decode_greedy(int32_t token, int64_t n, int64_t pos0, int32_t* out, int64_t n_vocab) {
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n; ++i) {
        eval(&token, 1, pos0 + i, logits.data(), false);
        int64_t best = 0;  // first maximum, like numpy's argmax
        for (int64_t v = 1; v < n_vocab; ++v)
            if (logits[size_t(v)] > logits[size_t(best)]) best = v;
        out[i] = token = int32_t(best);
    }
}

// What decode_greedy and decode_sample check before their n steps from `token`.
void Engine::check_decode(const char* what, int32_t token, int64_t n) const {
    if (n <= 0) throw ModelError(std::string(what) + " needs at least one step");
    if (n_past_ + n > n_ctx_)
        throw ContextOverflowError("context overflow: " + std::to_string(n_past_) + " cached + " + std::to_string(n) +
                                   " new tokens exceed the context length " + std::to_string(n_ctx_));
    if (token < 0 || token >= spec_->n_vocab)
        throw ModelError("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                         std::to_string(spec_->n_vocab) + ")");
}

void Engine::decode_greedy(int32_t token, int64_t n, int32_t* out) {
    check_decode("decode_greedy", token, n);
    backend_->decode_greedy(token, n, n_past_, out, spec_->n_vocab);
    n_past_ += n;
}

void Backend_::decode_sample(int32_t, int64_t, int64_t, const SampleSettings&, int32_t*) {
    throw BackendUnavailableError("this backend has no device sampling; sample from eval's logits (kcap.sampling)");
}

int64_t Engine::device_bytes() const { return backend_->device_bytes(); }

bool Engine::samples_on_device() const { return backend_->samples_on_device(); }

void Engine::decode_sample(int32_t token, int64_t n, const SampleSettings& settings, int32_t* out) {
    check_decode("decode_sample", token, n);
    const bool device = backend_->samples_on_device();
    const int64_t max_k = device ? kMaxDeviceTopK : spec_->n_vocab;
    if (!(settings.temperature > 0.0f && std::isfinite(1.0f / settings.temperature)))
        throw ModelError("decode_sample: temperature must be > 0 with a finite inverse (0 is decode_greedy)");
    if (settings.top_k < 1 || settings.top_k > max_k)
        throw ModelError("decode_sample: top_k must be in 1.." + std::to_string(max_k) +
                         (device ? " on the device" : "") + ", got " + std::to_string(settings.top_k));
    if (!(settings.top_p > 0.0f && settings.top_p <= 1.0f)) throw ModelError("decode_sample: top_p must be in (0, 1]");
    if (!(settings.min_p >= 0.0f && settings.min_p < 1.0f)) throw ModelError("decode_sample: min_p must be in [0, 1)");
    if (device) {
        backend_->decode_sample(token, n, n_past_, settings, out);
        n_past_ += n;
        return;
    }
    // On the host from eval's logits, with the device's choice rule and draws (the draw after
    // the token at position p uses p).
    std::vector<float> logits(static_cast<size_t>(spec_->n_vocab));
    for (int64_t i = 0; i < n; ++i) {
        backend_->eval(&token, 1, n_past_, logits.data(), false);
        out[i] = token = sample_token(logits.data(), spec_->n_vocab, settings, n_past_);
        ++n_past_;
    }
}

std::vector<TraceEntry> Engine::trace(const int32_t* tokens, int64_t n, float* logits, TraceOptions options) {
    std::vector<TraceEntry> ran;
    if (options.routing && !backend_->trace_routing(true))
        throw BackendUnavailableError("a trace of the routers' choices is implemented on the cpu and cuda "
                                      "backends only");
    if (!options.keep_cache) reset();
    backend_->attach_trace(&ran);
    try {
        eval(tokens, n, logits, false);
    } catch (...) {
        backend_->attach_trace(nullptr);
        if (options.routing) backend_->trace_routing(false);
        throw;
    }
    backend_->attach_trace(nullptr);
    if (options.routing) backend_->trace_routing(false);
    return ran;
}

void Engine::truncate(int64_t n) {
    if (n < 0 || n > n_past_)
        throw ModelError("cannot truncate the cache to " + std::to_string(n) + " positions; it holds " +
                         std::to_string(n_past_));
    n_past_ = n;
}

}  // namespace kcap
