// C++ host test: builds a small ModelSpec in memory (F32 and Q8_0 weights), plans it,
// checks routing errors, and runs the engine: prefill logits equal token-by-token logits,
// the context limit holds, and the C++ API works without Python.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kcap/engine.h"
#include "kcap/errors.h"

using namespace kcap;

static int passed = 0, failed = 0;
#define CHECK(cond, what)                                        \
    do {                                                         \
        if (cond) {                                              \
            ++passed;                                            \
        } else {                                                 \
            ++failed;                                            \
            std::printf("FAIL %s:%d %s\n", __FILE__, __LINE__, what); \
        }                                                        \
    } while (0)

struct Storage {
    std::vector<std::vector<uint8_t>> blobs;
};

static void add_f32(ModelSpec& spec, Storage& store, const std::string& name, std::vector<int64_t> shape,
                    std::mt19937& rng, float mean, float stddev) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<uint8_t> bytes(size_t(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
        float v = dist(rng);
        std::memcpy(bytes.data() + i * 4, &v, 4);
    }
    store.blobs.push_back(std::move(bytes));
    TensorRef t;
    t.name = name;
    t.format = Format::F32;
    t.shape = shape;
    t.data = store.blobs.back().data();
    t.nbytes = store.blobs.back().size();
    spec.tensors[name] = t;
}

static std::shared_ptr<ModelSpec> tiny_spec(Storage& store) {
    store.blobs.reserve(64);
    auto spec = std::make_shared<ModelSpec>();
    std::mt19937 rng(7);
    const int64_t d = 32, ff = 48, vocab = 50;
    spec->architecture = "test";
    spec->n_embd = d;
    spec->n_vocab = vocab;
    spec->context_length = 16;
    spec->norm_eps = 1e-5f;
    spec->token_embd = "tok";
    spec->output_norm = "out_norm";
    spec->output = "tok";
    add_f32(*spec, store, "tok", {d, vocab}, rng, 0.0f, 0.5f);
    add_f32(*spec, store, "out_norm", {d}, rng, 1.0f, 0.1f);
    for (int il = 0; il < 2; ++il) {
        LayerSpec layer;
        layer.n_head = 4;
        layer.n_head_kv = 2;
        layer.head_dim = layer.head_dim_v = 8;
        std::string p = "l" + std::to_string(il) + ".";
        layer.attn_norm = p + "an";
        layer.wq = p + "q";
        layer.wk = p + "k";
        layer.wv = p + "v";
        layer.wo = p + "o";
        layer.ffn_norm = p + "fn";
        layer.ffn_gate = p + "g";
        layer.ffn_up = p + "u";
        layer.ffn_down = p + "d";
        layer.rope_style = RopeStyle::NeoX;
        layer.rope_dim = 8;
        layer.sliding_window = il == 0 ? 3 : 0;
        add_f32(*spec, store, layer.attn_norm, {d}, rng, 1.0f, 0.1f);
        add_f32(*spec, store, layer.ffn_norm, {d}, rng, 1.0f, 0.1f);
        add_f32(*spec, store, layer.wq, {d, 32}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.wk, {d, 16}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.wv, {d, 16}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.wo, {32, d}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.ffn_gate, {d, ff}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.ffn_up, {d, ff}, rng, 0.0f, 0.2f);
        add_f32(*spec, store, layer.ffn_down, {ff, d}, rng, 0.0f, 0.2f);
        spec->layers.push_back(layer);
    }
    return spec;
}

int main() {
    Storage store;
    auto spec = tiny_spec(store);

    // Routing: every stage gets a CPU row; excluding the only attention row is refused.
    auto routes = explain_routes(*spec, EngineOptions{});
    CHECK(!routes.empty(), "routes planned");
    bool all_cpu = true;
    for (const auto& r : routes) all_cpu = all_cpu && r.backend == "cpu" && !r.kernel.empty();
    CHECK(all_cpu, "every stage routed to a cpu row");
    EngineOptions no_attention;
    no_attention.excluded_kernels = {"cpu.attention"};
    try {
        explain_routes(*spec, no_attention);
        CHECK(false, "excluding cpu.attention must fail");
    } catch (const RoutingError& e) {
        std::string msg = e.what();
        CHECK(msg.find("layer 0 stage 'attention'") != std::string::npos, "names layer and stage");
        CHECK(msg.find("sliding_window") != std::string::npos, "names the required feature");
        CHECK(msg.find("excluded by the caller") != std::string::npos, "names each rejection");
    }
    try {
        EngineOptions cuda;
        cuda.backend = "vulkan";
        explain_routes(*spec, cuda);
        CHECK(false, "unknown backend must fail");
    } catch (const BackendUnavailableError&) {
        CHECK(true, "unknown backend refused");
    }

    // Execution: prefill of 6 tokens equals 6 single-token steps.
    EngineOptions options;
    options.n_threads = 2;
    Engine prefill_engine(spec, options);
    Engine step_engine(spec, options);
    const std::vector<int32_t> tokens = {3, 14, 15, 9, 26, 5};
    const int64_t vocab = spec->n_vocab;
    std::vector<float> all(tokens.size() * vocab, std::nanf(""));
    prefill_engine.eval(tokens.data(), int64_t(tokens.size()), all.data(), true);
    double max_diff = 0.0;
    bool finite = true;
    for (size_t t = 0; t < tokens.size(); ++t) {
        std::vector<float> one(vocab, std::nanf(""));
        step_engine.eval(&tokens[t], 1, one.data(), false);
        for (int64_t i = 0; i < vocab; ++i) {
            finite = finite && std::isfinite(one[i]) && std::isfinite(all[t * vocab + i]);
            max_diff = std::max(max_diff, double(std::fabs(one[i] - all[t * vocab + i])));
        }
    }
    CHECK(finite, "every logit written (outputs were NaN-poisoned)");
    CHECK(max_diff < 1e-4, "prefill equals token-by-token decode");
    CHECK(step_engine.n_past() == int64_t(tokens.size()), "n_past advances");

    // Context: 16 positions; 6 used, 11 more must be refused.
    std::vector<int32_t> many(11, 1);
    std::vector<float> out(vocab);
    try {
        step_engine.eval(many.data(), int64_t(many.size()), out.data(), false);
        CHECK(false, "context overflow must fail");
    } catch (const ContextOverflowError& e) {
        CHECK(std::string(e.what()).find("context length 16") != std::string::npos, "overflow names the limit");
    }
    try {
        int32_t bad = 50;
        step_engine.eval(&bad, 1, out.data(), false);
        CHECK(false, "token outside vocabulary must fail");
    } catch (const ModelError&) {
        CHECK(true, "token outside vocabulary refused");
    }

    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
