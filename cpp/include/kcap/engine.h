// The public C++ API: plan a ModelSpec on a backend and run it token by token.
//
//   auto engine = kcap::Engine(spec, {.backend = "cpu"});
//   engine.eval(tokens, n, logits, /*all_logits=*/false);   // prefill or decode
//
// The KV cache lives in the engine; eval appends at position n_past().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kcap/model_spec.h"

namespace kcap {

struct EngineOptions {
    std::string backend = "cpu";
    std::string kv_type = "f32";   // KV cache element type: f32 or f16
    // Matmul activations: "f32" (exact rows only) or "q8_1" (rows may round them to int8 per
    // 32 values, as llama.cpp does; faster on CUDA, not exact). Stages without such a row keep f32.
    std::string activations = "f32";
    int64_t n_ctx = 0;             // 0: the model's context length
    int n_threads = 0;             // 0: all hardware threads
    int max_batch = 512;           // prefill chunk: tokens per pass through the layers (the most per call)
    std::vector<std::string> excluded_kernels;  // rows the planner may not choose
    // CUDA: time every stage with events (decode steps without the graph) and print the totals
    // per kernel and stage to stderr when the engine is destroyed. Changes no kernel.
    bool profile = false;
    // CPU: after every stage, check what it wrote for NaN and infinity and raise NumericalError
    // naming the first stage that produced one (tests turn it on; off, nothing is checked). The
    // GPU backends refuse it for now.
    bool check_finite = false;
    // CUDA, activations "bf16": the libcublas to load (empty: KCAP_CUBLAS_LIBRARY, else the
    // sonames on the loader's path and the CUDA toolkit's lib64).
    std::string cublas_library;
};

// One route of a stage, as `kcap explain` prints it: the row that runs the stage's calls of
// tokens_min .. tokens_max tokens (tokens_max 0: no upper bound). A stage's routes cover 1 ..
// max_batch exactly once.
struct RouteInfo {
    int layer;
    std::string stage, op, formats, dims, features, kernel, backend;
    int tokens_min = 1;
    int tokens_max = 0;
    // An attention stage: the bytes each token adds to its layer's KV cache (0 elsewhere, and
    // for a layer that reads another layer's cache).
    int64_t kv_bytes_per_token = 0;
};

// One stage that ran in a traced call (Engine::trace): its row and the tokens of its call.
struct TraceEntry {
    int layer;
    std::string stage;
    std::string kernel;
    int n_tokens;
    // A router stage's choice, where the trace asked for it (TraceOptions::routing): n_tokens
    // rows of the chosen experts' ids (as floats), then their weights, n_used each.
    std::vector<float> routing;
};

struct TraceOptions {
    bool keep_cache = false;  // evaluate after what the cache holds (else from an empty cache)
    bool routing = false;     // copy each router stage's choice into its entry
};

// Plans without executing: works for any backend on any machine (the table is data). A GPU
// plan is made for a reference device there (explain_summary names it); an Engine plans for
// its own device.
std::vector<RouteInfo> explain_routes(const ModelSpec& spec, const EngineOptions& options);

// What a plan made by explain_routes assumed: the most tokens per call and the device.
struct PlanSummary {
    int max_batch;
    std::string device;
    int sm_count;
    int shared_optin_bytes;
    int sm_version;  // compute capability, major * 10 + minor
};
PlanSummary explain_summary(const EngineOptions& options);

class Backend_;  // implementation detail of each backend

// Sampling (Engine::decode_sample, sample_token): kcap.sampling's top-k -> top-p -> min-p (at
// temperature 1) -> temperature -> draw, llama.cpp's order, with the draw a hash of (seed, position).
struct SampleSettings {
    float temperature = 1.0f;  // > 0
    int top_k = 40;            // 1 .. kMaxDeviceTopK on the device, 1 .. n_vocab on the host
    float top_p = 1.0f;        // (0, 1]
    float min_p = 0.0f;        // [0, 1)
    uint32_t seed = 0;
};
constexpr int kMaxDeviceTopK = 64;  // KCAP_SAMPLE_MAX_TOP_K of kernels/params.h

// One sampled choice from a row of logits, as the device sampler makes it (kernels/sample.h):
// the top_k largest (ties to the lower id; NaN never chosen), softmax at the temperature,
// top-p, min-p, then a draw whose uniform number is a hash of (seed, position). `position` is
// that of the token whose logits these are.
int32_t sample_token(const float* logits, int64_t n_vocab, const SampleSettings& settings, int64_t position);

class Engine {
public:
    Engine(std::shared_ptr<const ModelSpec> spec, const EngineOptions& options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const std::vector<RouteInfo>& routes() const { return routes_; }

    // Appends n tokens at position n_past() and writes logits: the last position's
    // [n_vocab], or every position's [n, n_vocab] when all_logits. Throws
    // ContextOverflowError past n_ctx and ModelError for a token id outside the vocabulary.
    void eval(const int32_t* tokens, int64_t n, float* logits, bool all_logits);

    // A check that eval calls now and then while it runs (the CPU backend: between stages, at
    // most every 10 ms); to stop it, the check throws, and eval lets the
    // exception through with n_past() unchanged (rows written past n_past are never read).
    // So a long prompt stops within a fraction of a chunk. Empty (the default): never called.
    // Backends whose eval is one device batch (CUDA, Metal) never call it.
    void set_interrupt_check(std::function<void()> check);

    // Greedy decoding: appends `token`, then each greedy choice in turn,
    // n tokens in all; out[i] is the argmax of the logits after the i-th appended token (the
    // last choice, out[n-1], is not yet appended). On CUDA the loop runs on the device: the
    // captured decode graph feeds its own argmax back, with no host round trip per token.
    void decode_greedy(int32_t token, int64_t n, int32_t* out);

    // Sampled decoding: as decode_greedy, each choice drawn by `settings` (top-k, temperature,
    // top-p, min-p; no repetition penalty). On the device where samples_on_device() (CUDA with a
    // sampling row for this vocabulary; top_k at most kMaxDeviceTopK), else on the host from the
    // logits of each step (sample_token): the same rule and the same draws either way.
    bool samples_on_device() const;
    void decode_sample(int32_t token, int64_t n, const SampleSettings& settings, int32_t* out);

    // Evaluates n tokens from an empty cache (or after the cache, options.keep_cache), as eval
    // does (last position's logits into `logits`), and returns every stage that ran: its row and
    // its call's tokens, in order, and with options.routing each router's choice (CPU and CUDA;
    // BackendUnavailableError elsewhere). A routing trace runs a one-token call outside the captured
    // decode graph, through the same rows.
    std::vector<TraceEntry> trace(const int32_t* tokens, int64_t n, float* logits, TraceOptions options = {});

    int64_t n_past() const { return n_past_; }
    int64_t n_ctx() const { return n_ctx_; }
    int64_t n_vocab() const { return spec_->n_vocab; }
    // Bytes of device memory the engine holds (weights, KV cache, scratch; 0 on the CPU).
    int64_t device_bytes() const;
    void reset() { n_past_ = 0; }
    // Keeps the first n positions of the cache (n ≤ n_past) so a shared prefix is reused.
    void truncate(int64_t n);

    // What decode_greedy and decode_sample check before their n steps (callers that allocate
    // for the n results check first).
    void check_decode(const char* what, int32_t token, int64_t n) const;

private:

    std::shared_ptr<const ModelSpec> spec_;
    std::vector<RouteInfo> routes_;
    std::unique_ptr<Backend_> backend_;
    int64_t n_past_ = 0;
    int64_t n_ctx_ = 0;
};

}  // namespace kcap
