// The CUDA backend: executes a Plan on one GPU.
//
// Load time: every weight operand is uploaded once as its raw GGUF blocks; activation buffers
// (max_batch rows), the KV cache (n_ctx rows per layer, f32 or f16: the plan's kv_format),
// each rope stage's cos/sin table and the split-K scratch are allocated; the backend's own
// argmax stage is routed through the capability table like every other stage.
//
// Decode: the first one-token step is captured as a CUDA graph (every layer, the final norm,
// the LM head and the argmax) and replayed for every later token. The graph reads the token
// and its position from device memory and its argmax writes the next token and position
// back, so decode_greedy replays it n times with no host round trip in between; eval copies
// the step in and the logits out around one replay.
// Prefill: chunks of up to max_batch tokens run the same rows with batched kernels.
//
// Which row runs each stage for a call's token count is the plan's (Executor): a launcher runs
// its row's kernels only. EngineOptions::profile runs decode steps without the graph, times every
// stage with CUDA events (each stage waited for, so the times include each launch's latency) and
// prints the totals per kernel and per stage name to stderr when the backend is destroyed;
// prefill chunks are timed the same way into tables of their own.
#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/backend_impl.h"
#include "cuda/cuda_context.h"
#include "dispatch/executor.h"
#include "dispatch/gpu_rows.h"
#include "dispatch/rope_table.h"

namespace kcap {
namespace cuda {

void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess)
        throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")");
}

int shared_optin_bytes(int device) {
    static std::mutex mutex;
    static std::map<int, int> bytes;  // per device, queried once
    std::lock_guard<std::mutex> lock(mutex);
    auto found = bytes.find(device);
    if (found == bytes.end()) {
        int value = 0;
        check(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
              "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
        found = bytes.emplace(device, value).first;
    }
    return found->second;
}

namespace {

// Device allocations owned by one backend, freed together; bytes() is what they asked
// cudaMalloc for (the allocator's rounding not included).
class DeviceArena {
public:
    ~DeviceArena() {
        for (void* p : blocks_) cudaFree(p);
    }
    void* alloc(size_t bytes) {
        void* p = nullptr;
        const size_t asked = bytes ? bytes : 16;
        KCAP_CUDA_CHECK(cudaMalloc(&p, asked));
        blocks_.push_back(p);
        bytes_ += asked;
        return p;
    }
    template <class T>
    T* alloc_n(size_t n) {
        return static_cast<T*>(alloc(n * sizeof(T)));
    }
    size_t bytes() const { return bytes_; }

private:
    std::vector<void*> blocks_;
    size_t bytes_ = 0;
};

// Pinned host memory for the small copies around a decode step.
template <class T>
class PinnedBuffer {
public:
    ~PinnedBuffer() {
        if (data_) cudaFreeHost(data_);
    }
    T* get(size_t n) {
        if (n > size_) {
            if (data_) cudaFreeHost(data_);
            data_ = nullptr;
            KCAP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T)));
            size_ = n;
        }
        return data_;
    }

private:
    T* data_ = nullptr;
    size_t size_ = 0;
};

class CudaBackend final : public Backend_ {
public:
    CudaBackend(const ModelSpec& spec, Plan plan, const EngineOptions& options)
        : plan_(std::move(plan)), executor_(plan_), max_batch_(std::max(1, options.max_batch)), n_vocab_(spec.n_vocab) {
        Context& ctx = ctx_;
        ctx.sm_count = cuda_device_info().sm_count;  // checks the device: sm_80 or newer
        KCAP_CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp props;
        KCAP_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
        ctx.pdl = props.major >= 9;
        profile_ = options.profile;
        cublas_library_ = options.cublas_library;
        if (profile_) use_graph_ = false;
        KCAP_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
        ctx.kv_format = plan_.options.kv_format;
        ctx.n_ctx = plan_.options.n_ctx;

        upload_weights();
        allocate_buffers(spec);
        bind_stages();
        route_decode_choices();
    }

    void attach_trace(std::vector<TraceEntry>* trace) override { executor_.attach_trace(trace); }
    bool trace_routing(bool on) override {
        trace_routing_ = on;
        return true;
    }

    ~CudaBackend() override {
        if (profile_) print_profile();
        for (cudaGraphExec_t exec : graph_exec_)
            if (exec) cudaGraphExecDestroy(exec);
        if (all_logits_) cudaFree(all_logits_);
        if (ctx_.stream) cudaStreamSynchronize(ctx_.stream);
        gemm_.reset();  // before its stream goes
        ctx_.gemm = nullptr;
        if (ctx_.stream) cudaStreamDestroy(ctx_.stream);
    }

    void eval(const int32_t* tokens, int64_t n, int64_t pos0, float* logits, bool all_logits) override {
        for (int64_t start = 0; start < n; start += max_batch_) {
            const int64_t count = std::min<int64_t>(max_batch_, n - start);
            const bool final_chunk = start + count == n;
            const bool need_logits = final_chunk || all_logits;
            float* host_logits = all_logits ? logits + start * n_vocab_ : logits;
            if (count == 1 && !all_logits && use_graph_ && !trace_routing_) {
                decode_step(tokens[start], pos0 + start, need_logits ? host_logits : nullptr);
                continue;
            }
            // A chunk that wants no logits (not the last) skips the LM head: the plan's walk
            // leaves out the stages that run on the last position only.
            set_step(tokens + start, count, pos0 + start);
            float* device_logits = all_logits ? all_logits_buffer(count) : decode_logits_;
            run_stages(count, need_logits, all_logits, device_logits);
            if (profile_ && count > 1) ++profile_prefill_chunks_;
            if (need_logits) {
                const size_t values = size_t(all_logits ? count : 1) * size_t(n_vocab_);
                KCAP_CUDA_CHECK(cudaMemcpyAsync(host_logits, device_logits, values * sizeof(float),
                                                cudaMemcpyDeviceToHost, ctx_.stream));
            }
            KCAP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
        }
    }

    void decode_greedy(int32_t token, int64_t n, int64_t pos0, int32_t* out, int64_t) override {
        decode_on_device(false, token, n, pos0, out);
    }

    bool samples_on_device() const override { return sample_row_ != nullptr; }

    // Every cudaMalloc of this backend: the arena (weights, KV cache, activations, rope tables,
    // attention / q8_1 / mixture-of-experts scratch, decode-step state), the every-position
    // logits of an all_logits call (grown to the largest chunk, kept), the GEMM's scratch and
    // cuBLAS workspace. Not counted, because kcap does not allocate them itself: the CUDA
    // context, the module code loaded on first launch, graph instantiation, cuBLAS's handle.
    int64_t device_bytes() const override {
        const size_t logits = size_t(all_logits_rows_) * size_t(n_vocab_) * sizeof(float);
        return int64_t(arena_.bytes() + logits + gemm_device_bytes(gemm_.get()));
    }

    void decode_sample(int32_t token, int64_t n, int64_t pos0, const SampleSettings& settings, int32_t* out) override {
        if (!sample_row_) return Backend_::decode_sample(token, n, pos0, settings, out);
        KcapSampleSettings wanted{};
        wanted.temperature = settings.temperature;
        wanted.top_p = settings.top_p;
        wanted.min_p = settings.min_p;
        wanted.seed = settings.seed;
        wanted.top_k = settings.top_k;
        // generate calls this once per token with the same settings: copy them only when they change.
        if (!settings_on_device_ || std::memcmp(&wanted, &device_settings_, sizeof(wanted)) != 0) {
            KcapSampleSettings* staged = pinned_settings_.get(1);
            *staged = device_settings_ = wanted;
            KCAP_CUDA_CHECK(cudaMemcpyAsync(ctx_.sample_settings, staged, sizeof(KcapSampleSettings),
                                            cudaMemcpyHostToDevice, ctx_.stream));
            settings_on_device_ = true;
        }
        decode_on_device(true, token, n, pos0, out);
    }

    // n decode steps from `token` at pos0, each choosing the next token on the device (argmax
    // or sampler), fed back by the graph itself; out gets the n choices.
    void decode_on_device(bool sample, int32_t token, int64_t n, int64_t pos0, int32_t* out) {
        if (n <= 0) return;
        set_step(&token, 1, pos0);
        const StepKind kind = sample ? StepKind::Sample : StepKind::Greedy;
        if (use_graph_ && ensure_graph(kind)) {
            for (int64_t i = 0; i < n; ++i) replay(kind);
        } else {
            for (int64_t i = 0; i < n; ++i) run_decode_step(kind);
        }
        int32_t* staged = pinned_tokens_.get(size_t(n));
        KCAP_CUDA_CHECK(cudaMemcpyAsync(staged, ctx_.history, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                        ctx_.stream));
        KCAP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
        std::memcpy(out, staged, size_t(n) * sizeof(int32_t));
    }

private:
    void upload_weights() {
        for (const RoutedStage& routed : plan_.stages)
            for (const TensorRef* operand : routed.stage.operands) {
                if (!operand || device_weights_.count(operand->data)) continue;
                // Padded to 16 bytes (zeroes): the word loads of kernels/dialect.h's
                // kcap_load_u8_u32s_a1 may touch the aligned word after a tensor's last block.
                const size_t padded = (operand->nbytes + 15) / 16 * 16;
                void* device = arena_.alloc(padded);
                KCAP_CUDA_CHECK(cudaMemcpy(device, operand->data, operand->nbytes, cudaMemcpyHostToDevice));
                if (padded > operand->nbytes)
                    KCAP_CUDA_CHECK(cudaMemset(static_cast<uint8_t*>(device) + operand->nbytes, 0, padded - operand->nbytes));
                device_weights_[operand->data] = device;
                weight_bytes_ += operand->nbytes;
            }
    }

    void allocate_buffers(const ModelSpec& spec) {
        Context& ctx = ctx_;
        buffers_.assign(plan_.buffer_widths.size(), nullptr);
        for (size_t b = 0; b < plan_.buffer_widths.size(); ++b) {
            if (Buffer(b) == Buffer::None || Buffer(b) == Buffer::Logits || plan_.buffer_widths[b] == 0) continue;
            buffers_[b] = arena_.alloc_n<float>(size_t(max_batch_) * size_t(plan_.buffer_widths[b]));
        }
        decode_logits_ = arena_.alloc_n<float>(size_t(n_vocab_));
        const size_t kv_bytes = ctx.kv_format == Format::F16 ? 2 : 4;
        ctx.kv.resize(spec.layers.size());
        for (size_t i = 0; i < spec.layers.size(); ++i) {
            const LayerSpec& layer = spec.layers[i];
            if (layer.kv_source_layer >= 0) continue;  // kv_shared: reads layer kv_source_layer's cache
            const KvWidths widths = kv_widths(layer);  // a latent-attention layer: its latent rows only
            ctx.kv[i].k = arena_.alloc(size_t(ctx.n_ctx) * size_t(widths.k) * kv_bytes);
            if (widths.v > 0) ctx.kv[i].v = arena_.alloc(size_t(ctx.n_ctx) * size_t(widths.v) * kv_bytes);
        }
        ctx.step = arena_.alloc_n<int32_t>(2);
        ctx.tokens = arena_.alloc_n<int32_t>(size_t(max_batch_));
        ctx.history = arena_.alloc_n<int32_t>(size_t(ctx.n_ctx) + 1);
        ctx.argmax_result = arena_.alloc_n<int32_t>(1);
        ctx.argmax_partials = int(ceil_div(n_vocab_, cuda_rows::kArgmaxChunk));
        ctx.argmax_partial_value = arena_.alloc_n<float>(size_t(ctx.argmax_partials));
        ctx.argmax_partial_index = arena_.alloc_n<int32_t>(size_t(ctx.argmax_partials));
        ctx.sample_settings = static_cast<KcapSampleSettings*>(arena_.alloc(sizeof(KcapSampleSettings)));
        const size_t candidates = size_t(ceil_div(n_vocab_, KCAP_SAMPLE_CHUNK)) * KCAP_SAMPLE_MAX_TOP_K;
        ctx.sample_partial_value = arena_.alloc_n<float>(candidates);
        ctx.sample_partial_index = arena_.alloc_n<int32_t>(candidates);
    }

    // What each stage reads besides its activation buffers, fixed now so a token never decides.
    void bind_stages() {
        Context& ctx = ctx_;
        stage_data_.resize(plan_.stages.size());
        size_t partial_o = 0, partial_ml = 0;
        std::map<RopeTableKey, const float*> rope_tables;
        for (size_t i = 0; i < plan_.stages.size(); ++i) {
            const Stage& stage = plan_.stages[i].stage;
            StageData& data = stage_data_[i];
            for (size_t j = 0; j < stage.operands.size() && j < std::size(data.operands); ++j)
                if (stage.operands[j]) data.operands[j] = device_weights_.at(stage.operands[j]->data);
            if (stage.op == Op::Rope || stage.op == Op::QkNormRope || stage_owns_rope(stage) ||
                stage.op == Op::AttentionMla) {
                const RopeTableKey key = rope_table_key(stage);
                auto found = rope_tables.find(key);
                if (found == rope_tables.end()) {
                    const std::vector<float> table = rope_cos_sin_table(stage, ctx.n_ctx);
                    float* device = arena_.alloc_n<float>(table.size());
                    KCAP_CUDA_CHECK(cudaMemcpy(device, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
                    found = rope_tables.emplace(key, device).first;
                }
                data.rope_table = found->second;
                // the factors are folded into the table
                data.operands[stage.op == Op::Rope ? 0 : stage.op == Op::AttentionMla ? 3 : 2] = nullptr;
            }
            if (stage.op == Op::AttentionMla) {
                // Splits of about kMlaMinChunk rows at the longest span, at most kMlaGroupsPerSm
                // attend groups (head groups x splits) per multiprocessor; partials for the decode's
                // splits or a prefill chunk's single split of every token.
                const int64_t head_groups = (stage.params.n_head + KCAP_MLA_HEADS_PER_GROUP - 1) / KCAP_MLA_HEADS_PER_GROUP;
                data.attn_splits = decode_key_splits(stage.max_span, cuda_rows::kMlaMinChunk,
                                                     int64_t(cuda_rows::kMlaGroupsPerSm) * ctx.sm_count, head_groups,
                                                     KCAP_MLA_MAX_SPLITS);
                const size_t slots = size_t(stage.params.n_head) * size_t(std::max(data.attn_splits, max_batch_));
                partial_o = std::max(partial_o, slots * size_t(stage.params.kv_lora_rank));
                partial_ml = std::max(partial_ml, slots * 2);
            }
            if (stage.op == Op::Attention) {
                // Enough splits that each takes about kAttnMinChunk keys at the longest span,
                // capped at a few simd groups per multiprocessor (longer spans: longer splits).
                const int n_head_kv = std::max(1, stage.params.n_head_kv);
                const StageParams& sp = stage.params;
                const int64_t simds = int64_t(n_head_kv) *
                                      cuda_rows::attn_decode_head_blocks(sp.n_head, n_head_kv, sp.head_dim, sp.head_dim_v) *
                                      cuda_rows::attn_decode_simds(sp.n_head, n_head_kv, sp.head_dim, sp.head_dim_v);
                data.attn_splits = decode_key_splits(stage.max_span, cuda_rows::kAttnMinChunk,
                                                     int64_t(cuda_rows::kAttnSimdsPerSm) * ctx.sm_count, simds, INT_MAX);
                const size_t slots = size_t(stage.params.n_head) * size_t(data.attn_splits);
                partial_o = std::max(partial_o, slots * size_t(stage.params.head_dim_v));
                partial_ml = std::max(partial_ml, slots * 2);
            }
        }
        // The mixture-of-experts scratch (moe_scratch: max_batch tokens of the widest stage; the
        // grouped experts' tiles of kMmaTokens rows).
        const MoeScratch moe = moe_scratch(plan_, max_batch_, cuda_rows::kMmaTokens);
        // The router's logits: cuda.moe_route_tiled writes partial sums of up to
        // KCAP_MOE_TILE_MAX_SPLITS slices of K.
        if (moe.logits) ctx.moe_logits = arena_.alloc_n<float>(moe.logits * KCAP_MOE_TILE_MAX_SPLITS);
        if (moe.act) {
            ctx.moe_act = arena_.alloc_n<float>(moe.act);
            ctx.moe_up = arena_.alloc_n<float>(moe.up);
            ctx.moe_down = arena_.alloc_n<float>(moe.down);
            ctx.moe_rows = arena_.alloc_n<int>(moe.rows);
            ctx.moe_slot_rows = arena_.alloc_n<int>(moe.slot_rows);
            ctx.moe_tile_expert = arena_.alloc_n<int>(moe.tiles);
            // The grouped q8_1 experts' rounded activations: every value of moe_act's rows (whole
            // runs of 32: the q8_1 rows' FFN widths are multiples of 32).
            bool q8_experts = false, grouped_f_experts = false;
            size_t most_used = 0;  // the most experts a q8_1 experts stage chooses per token
            for (const RoutedStage& routed : plan_.stages)
                for (const Route& route : routed.routes) {
                    if (routed.stage.op != Op::MoeExperts) continue;
                    const bool q8 = route.row->input_encoding == Encoding::Q8_1;
                    q8_experts = q8_experts || q8;
                    grouped_f_experts = grouped_f_experts || (!q8 && route.row->tokens.min >= cuda_rows::kMoeGroupedMinTokens);
                    if (q8) most_used = std::max(most_used, size_t(routed.stage.params.n_expert_used));
                }
            if (q8_experts) {
                ctx.moe_q8_capacity = size_t(cuda_rows::q8_rows_bytes(1, int64_t(moe.act)));
                ctx.moe_q8 = arena_.alloc(ctx.moe_q8_capacity);
                // The slot starts' counts: a call of fewer than kMoeGroupedMinTokens tokens (the
                // row's range), zero until a stage counts.
                ctx.moe_slot_done_capacity = size_t(cuda_rows::kMoeGroupedMinTokens - 1) * most_used;
                ctx.moe_slot_done = arena_.alloc_n<int>(ctx.moe_slot_done_capacity);
                KCAP_CUDA_CHECK(cudaMemset(ctx.moe_slot_done, 0, ctx.moe_slot_done_capacity * sizeof(int)));
            }
            // The grouped bf16 and split-bf16 experts' inputs (x and the activations, in bf16 or
            // split): moe_input_values.
            if (grouped_f_experts) {
                ctx.moe_bf16_capacity = cuda_rows::moe_input_values(moe.down, moe.act);
                ctx.moe_bf16 = arena_.alloc_n<unsigned short>(ctx.moe_bf16_capacity);
            }
        }
        size_t mla_absorbed = 0, mla_latent = 0;
        for (const RoutedStage& routed : plan_.stages) {
            const StageParams& s = routed.stage.params;
            if (routed.stage.op != Op::AttentionMla) continue;
            const size_t slots = size_t(max_batch_) * size_t(s.n_head);
            mla_absorbed = std::max(mla_absorbed, slots * size_t(s.kv_lora_rank + s.rope_dim));
            mla_latent = std::max(mla_latent, slots * size_t(s.kv_lora_rank));
        }
        if (mla_absorbed) {
            ctx.mla_absorbed = arena_.alloc_n<float>(mla_absorbed);
            ctx.mla_latent = arena_.alloc_n<float>(mla_latent);
        }
        ctx.attn_partial_o = arena_.alloc_n<float>(std::max<size_t>(partial_o, 1));
        ctx.attn_partial_ml = arena_.alloc_n<float>(std::max<size_t>(partial_ml, 1));
        // The q8_1 rows' input (one token or a batch): the widest K of any stage routed to one, or
        // output of a stage that writes one for them.
        int64_t q8_k = 0;
        for (const RoutedStage& routed : plan_.stages) {
            for (const Route& route : routed.routes)
                if (route.row->input_encoding == Encoding::Q8_1) q8_k = std::max<int64_t>(q8_k, routed.stage.k);
            if (routed.stage.features & kQ8Output) q8_k = std::max<int64_t>(q8_k, routed.stage.n);
        }
        if (q8_k > 0) {
            ctx.q8_rows_capacity = size_t(cuda_rows::q8_rows_bytes(max_batch_, q8_k));
            ctx.q8_rows = arena_.alloc(ctx.q8_rows_capacity);
        }
        // The bf16 rows' GEMM, where the plan routes a stage to one: scratch for the largest
        // matrix of the layers (bigger than kGemmMaxScratchValues: in chunks of rows) and the
        // widest input. A tail stage (the LM head) reaches the GEMM only for every position's
        // logits: it goes in chunks of the layers' scratch, at least 128 rows each.
        size_t gemm_weights = 0, gemm_input = 0;
        for (const RoutedStage& routed : plan_.stages) {
            const Stage& stage = routed.stage;
            bool bf16 = false;
            for (const Route& route : routed.routes) bf16 = bf16 || route.row->input_encoding == Encoding::BF16;
            if (!bf16) continue;
            const size_t matrices = stage.op == Op::MatMul ? 1
                                    : stage.op == Op::Qkv  ? size_t(qkv_matrices(stage))  // not its biases
                                                           : stage.operands.size();
            for (size_t j = 0; j < matrices; ++j) {
                const size_t values = size_t(stage.operands[j]->n_rows()) * size_t(stage.k);
                gemm_weights = std::max(gemm_weights, stage.last_token_only ? std::min(values, 128 * size_t(stage.k)) : values);
            }
            gemm_input = std::max(gemm_input, size_t(max_batch_) * size_t(stage.k));
        }
        if (gemm_weights > 0) {
            gemm_.reset(gemm_create(ctx.stream, std::min<size_t>(gemm_weights, size_t(cuda_rows::kGemmMaxScratchValues)),
                                    gemm_input, cublas_library_));
            ctx.gemm = gemm_.get();
        }
    }

    // The greedy argmax (and, where a row takes this vocabulary, the sampler) are stages of
    // this backend's decode steps: routed through the table like the plan's stages.
    void route_decode_choices() {
        argmax_row_ = route(logits_stage(argmax_stage_, Op::Argmax, "argmax"), plan_.options, 1);
        sample_row_ = find_route(logits_stage(sample_stage_, Op::Sample, "sample"), plan_.options, 1);
    }

    // A stage of the decode step that reads the last position's logits (k = n = the vocabulary).
    const Stage& logits_stage(Stage& stage, Op op, const char* name) const {
        stage.layer = -1;
        stage.name = name;
        stage.op = op;
        stage.input = Buffer::Logits;
        stage.k = stage.n = n_vocab_;
        stage.last_token_only = true;
        return stage;
    }

    float* buffer(Buffer b) const { return b == Buffer::None ? nullptr : buffers_[size_t(b)]; }

    float* all_logits_buffer(int64_t rows) {
        if (rows > all_logits_rows_) {
            if (all_logits_) KCAP_CUDA_CHECK(cudaFree(all_logits_));
            all_logits_ = nullptr;
            KCAP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&all_logits_), size_t(rows) * size_t(n_vocab_) * 4));
            all_logits_rows_ = rows;
        }
        return all_logits_;
    }

    // Writes the tokens and position of a call into device memory (stream-ordered).
    void set_step(const int32_t* tokens, int64_t n, int64_t pos0) {
        int32_t* staged = pinned_step_.get(size_t(max_batch_) + 2);
        staged[0] = int32_t(pos0);
        staged[1] = 0;
        std::memcpy(staged + 2, tokens, size_t(n) * sizeof(int32_t));
        KCAP_CUDA_CHECK(cudaMemcpyAsync(ctx_.step, staged, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
        KCAP_CUDA_CHECK(
            cudaMemcpyAsync(ctx_.tokens, staged + 2, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
    }

    // Every routed stage for n tokens (the plan's walk, Executor): tail stages (the LM head) run
    // on the last token only unless every position's logits are wanted.
    void run_stages(int64_t n, bool need_logits, bool all_logits, float* logits) {
        executor_.run(
            n, 0, nullptr, need_logits, all_logits, logits, &ctx_, [&](Buffer b) { return buffer(b); },
            [&](size_t i) { return static_cast<const void*>(&stage_data_[i]); },
            [&](const Row& row, const Stage& stage, const KernelCall& call) {
                if (profile_)
                    timed(row.kernel, stage.name, [&] { row.fn(stage, call); }, n > 1);
                else
                    row.fn(stage, call);
                if (trace_routing_ && stage.op == Op::MoeRoute && executor_.trace()) copy_routing(stage, call);
            });
    }

    // TraceOptions::routing: the router's choice, copied out once the stream reaches it.
    void copy_routing(const Stage& stage, const KernelCall& call) {
        const Executor::RoutingRows r = executor_.routing_rows(stage, call);
        std::vector<float>& out = executor_.trace()->back().routing;
        out.resize(size_t(r.rows) * size_t(r.values));
        KCAP_CUDA_CHECK(cudaMemcpyAsync(out.data(), r.first, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                        ctx_.stream));
        KCAP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    }

    // EngineOptions::profile: one stage, waited for, its time added to its kernel's and name's totals.
    template <class Fn>
    void timed(const std::string& kernel, const std::string& name, Fn&& fn, bool prefill = false) {
        if (!profile_start_) {
            KCAP_CUDA_CHECK(cudaEventCreate(&profile_start_));
            KCAP_CUDA_CHECK(cudaEventCreate(&profile_stop_));
        }
        KCAP_CUDA_CHECK(cudaEventRecord(profile_start_, ctx_.stream));
        fn();
        KCAP_CUDA_CHECK(cudaEventRecord(profile_stop_, ctx_.stream));
        KCAP_CUDA_CHECK(cudaEventSynchronize(profile_stop_));
        float ms = 0.0f;
        KCAP_CUDA_CHECK(cudaEventElapsedTime(&ms, profile_start_, profile_stop_));
        auto& k = (prefill ? profile_prefill_kernels_ : profile_kernels_)[kernel];
        k.first += ms, k.second += 1;
        // Stage names without the layer index: "blk.3.attn_q" -> "attn_q".
        std::string key = name;
        const size_t dot = key.rfind('.');
        if (key.rfind("blk.", 0) == 0 && dot != std::string::npos) key = key.substr(dot + 1);
        auto& st = (prefill ? profile_prefill_names_ : profile_names_)[key];
        st.first += ms, st.second += 1;
    }

    void print_profile() const {
        print_profile_tables("decode steps", profile_steps_, profile_kernels_, profile_names_);
        print_profile_tables("prefill chunks", profile_prefill_chunks_, profile_prefill_kernels_, profile_prefill_names_);
    }

    using ProfileTable = std::map<std::string, std::pair<double, int64_t>>;  // ms, launches
    static void print_profile_tables(const char* what, int64_t count, const ProfileTable& kernels,
                                     const ProfileTable& names) {
        if (count == 0) return;
        double total = 0.0;
        for (const auto& kv : kernels) total += kv.second.first;
        const double steps = double(count);
        std::fprintf(stderr, "kcap profile: %lld %s, %.1f us each (stages waited for one by one)\n", (long long)count,
                     what, 1000.0 * total / steps);
        for (const auto* table : {&kernels, &names}) {
            std::vector<std::pair<double, std::string>> sorted;
            for (const auto& kv : *table) sorted.emplace_back(kv.second.first, kv.first);
            std::sort(sorted.rbegin(), sorted.rend());
            for (const auto& e : sorted) {
                const auto& v = table->at(e.second);
                std::fprintf(stderr, "  %-28s %8.1f us/step %5.1f%%  %6.1f us/launch  %lld launches\n", e.second.c_str(),
                             1000.0 * v.first / steps, 100.0 * v.first / (total > 0 ? total : 1.0),
                             1000.0 * v.first / double(v.second), (long long)(v.second / steps));
            }
            std::fprintf(stderr, "  --\n");
        }
    }

    // The decode step's last stage: the greedy argmax, or the sampler (settings in device memory).
    void run_choice(bool sample, bool advance) {
        KernelCall call;
        call.n_tokens = 1;
        call.backend_state = &ctx_;
        call.in = decode_logits_;
        call.out = reinterpret_cast<float*>(ctx_.argmax_result);
        call.inout2 = advance ? reinterpret_cast<float*>(ctx_.history) : nullptr;
        if (sample)
            sample_row_->fn(sample_stage_, call);
        else
            argmax_row_->fn(argmax_stage_, call);
    }

    // A one-token step: every stage, then for greedy / sampled decoding the choice of the next
    // token on the device (fed back through device memory).
    enum class StepKind { Logits = 0, Greedy = 1, Sample = 2 };

    void run_decode_step(StepKind kind) {
        run_stages(1, true, false, decode_logits_);
        if (kind == StepKind::Logits) return;
        const bool sample = kind == StepKind::Sample;
        if (profile_) {
            ++profile_steps_;
            const Row* row = sample ? sample_row_ : argmax_row_;
            timed(row->kernel, sample ? "sample" : "argmax", [&] { run_choice(sample, true); });
        } else {
            run_choice(sample, true);
        }
    }

    // Replays the captured step; what it runs is what the capture's walk recorded.
    void replay(StepKind kind) {
        KCAP_CUDA_CHECK(cudaGraphLaunch(graph_exec_[int(kind)], ctx_.stream));
        if (std::vector<TraceEntry>* trace = executor_.trace())
            trace->insert(trace->end(), graph_trace_[int(kind)].begin(), graph_trace_[int(kind)].end());
    }

    // Captures the one-token step of a kind once, recording the stages it runs. Returns false (and
    // runs steps directly from then on) if this driver cannot capture it; programmatic launch is
    // dropped first if that is why.
    bool ensure_graph(StepKind kind) {
        cudaGraphExec_t& exec = graph_exec_[int(kind)];
        if (exec) return true;
        std::vector<TraceEntry>* outer = executor_.trace();
        for (int attempt = 0; attempt < 2; ++attempt) {
            cudaGraph_t graph = nullptr;
            graph_trace_[int(kind)].clear();
            executor_.attach_trace(&graph_trace_[int(kind)]);
            KCAP_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
            std::string failure;
            try {
                run_decode_step(kind);
            } catch (const std::exception& e) {
                failure = e.what();
            }
            executor_.attach_trace(outer);
            const cudaError_t ended = cudaStreamEndCapture(ctx_.stream, &graph);
            cudaError_t made = cudaErrorUnknown;
            if (failure.empty() && ended == cudaSuccess && graph) made = cudaGraphInstantiate(&exec, graph, 0);
            if (graph) cudaGraphDestroy(graph);
            if (made == cudaSuccess) return true;
            cudaGetLastError();
            exec = nullptr;
            std::fprintf(stderr, "kcap: CUDA graph capture failed (%s%s); %s\n",
                         failure.empty() ? cudaGetErrorString(ended != cudaSuccess ? ended : made) : failure.c_str(),
                         ctx_.pdl ? ", with programmatic launch" : "",
                         ctx_.pdl ? "retrying without programmatic launch" : "decoding without a graph");
            if (!ctx_.pdl) break;
            ctx_.pdl = false;
        }
        use_graph_ = false;
        return false;
    }

    void decode_step(int32_t token, int64_t pos, float* host_logits) {
        set_step(&token, 1, pos);
        if (ensure_graph(StepKind::Logits))
            replay(StepKind::Logits);
        else
            run_decode_step(StepKind::Logits);
        if (host_logits) {
            float* staged = pinned_logits_.get(size_t(n_vocab_));
            KCAP_CUDA_CHECK(
                cudaMemcpyAsync(staged, decode_logits_, size_t(n_vocab_) * sizeof(float), cudaMemcpyDeviceToHost, ctx_.stream));
            KCAP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
            std::memcpy(host_logits, staged, size_t(n_vocab_) * sizeof(float));
        } else {
            KCAP_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
        }
    }

    Plan plan_;
    Executor executor_;
    int max_batch_;
    int64_t n_vocab_;
    Context ctx_;
    // The bf16 rows' GEMM (ctx_.gemm); owned here so a constructor that throws after making it
    // still frees it.
    std::unique_ptr<Gemm, void (*)(Gemm*)> gemm_{nullptr, &gemm_destroy};
    DeviceArena arena_;
    std::unordered_map<const void*, void*> device_weights_;  // host bytes -> device copy
    size_t weight_bytes_ = 0;
    std::vector<float*> buffers_;
    std::vector<StageData> stage_data_;
    float* decode_logits_ = nullptr;
    float* all_logits_ = nullptr;
    int64_t all_logits_rows_ = 0;
    Stage argmax_stage_, sample_stage_;
    const Row* argmax_row_ = nullptr;
    const Row* sample_row_ = nullptr;  // null where no sampling row takes this vocabulary
    std::string cublas_library_;  // EngineOptions::cublas_library
    bool use_graph_ = true;
    bool trace_routing_ = false;  // TraceOptions::routing: one-token calls run outside the graph
    cudaGraphExec_t graph_exec_[3] = {nullptr, nullptr, nullptr};  // by StepKind
    std::vector<TraceEntry> graph_trace_[3];                         // what each captured step runs
    bool profile_ = false;
    cudaEvent_t profile_start_ = nullptr, profile_stop_ = nullptr;
    int64_t profile_steps_ = 0;
    int64_t profile_prefill_chunks_ = 0;
    ProfileTable profile_kernels_, profile_names_, profile_prefill_kernels_, profile_prefill_names_;
    PinnedBuffer<int32_t> pinned_step_, pinned_tokens_;
    PinnedBuffer<float> pinned_logits_;
    PinnedBuffer<KcapSampleSettings> pinned_settings_;
    KcapSampleSettings device_settings_{};  // what ctx_.sample_settings holds, once settings_on_device_
    bool settings_on_device_ = false;
};

}  // namespace
}  // namespace cuda

DeviceInfo cuda_device_info() {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0) {
        cudaGetLastError();
        throw BackendUnavailableError(
            std::string("backend 'cuda': no CUDA device is available on this machine (") +
            (status != cudaSuccess ? std::string(cudaGetErrorString(status)) : std::string("0 devices")) +
            "); use backend='cpu'");
    }
    cudaDeviceProp props;
    KCAP_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    if (props.major < 8)
        throw BackendUnavailableError(std::string("backend 'cuda': ") + props.name + " is sm_" +
                                      std::to_string(props.major * 10 + props.minor) + "; kcap needs sm_80 or newer");
    DeviceInfo info;
    info.name = props.name;
    info.reference = false;
    info.sm_count = props.multiProcessorCount;
    info.shared_optin_bytes = cuda::shared_optin_bytes(0);
    info.sm_version = props.major * 10 + props.minor;
    return info;
}

std::unique_ptr<Backend_> make_cuda_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options) {
    return std::make_unique<cuda::CudaBackend>(spec, std::move(plan), options);
}

}  // namespace kcap
