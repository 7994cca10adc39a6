// The Metal backend: executes a Plan on the system's Metal device (Objective-C++, ARC).
// Structure follows cuda/cuda_backend.cu: same Plan, same Stage/KernelCall, same rows.
//
// Load time: the metallib (kcap.metallib next to the _core module, or $KCAP_METALLIB) is
// loaded; a compute pipeline is made for every entry point of every routed row (the cache is
// keyed by row, the names come from the row's declaration in metal/rows.cpp) and checked
// against the row's geometry; the weights become MTLBuffers without copying where the pages
// allow (newBufferWithBytesNoCopy on the page-rounded range of the memory-mapped file, which
// Python keeps mapped for the model's lifetime) and are copied otherwise; activations, the KV
// cache (the plan's kv_format, f32 or f16), rope tables and split-K scratch are allocated.
//
// Execution: a decode step (all layers, final norm, LM head and, for decode_greedy, the argmax
// that feeds the next token back) is encoded into one command buffer and waited for once; a
// prefill chunk of up to max_batch tokens is one command buffer of the batched kernels.
//
// Nothing here has run: no Apple GPU exists where it was written (see docs/metal.md).
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <tuple>

#include "core/backend_impl.h"
#include "dispatch/executor.h"
#include "dispatch/gpu_rows.h"
#include "dispatch/rope_table.h"
#include "metal/metal_context.h"

namespace kcap {
namespace metal {

std::pair<id<MTLBuffer>, size_t> Context::resolve(const void* p) const {
    const auto* address = static_cast<const uint8_t*>(p);
    auto it = std::upper_bound(allocations.begin(), allocations.end(), address,
                               [](const uint8_t* a, const Allocation& b) { return a < b.base; });
    if (it != allocations.begin()) {
        --it;
        if (address < it->base + it->length) return {it->buffer, it->buffer_offset + size_t(address - it->base)};
    }
    throw Error("metal: a kernel argument is not in any buffer of this backend");
}

id<MTLComputePipelineState> Context::pipeline(const Row& row, int entry) const {
    auto it = pipelines.find({&row, entry});
    if (it == pipelines.end()) throw Error("metal: no pipeline for " + row.kernel + " entry " + std::to_string(entry));
    return it->second;
}

void bind(const Context& ctx, int index, const void* p) {
    if (!p) {
        [ctx.encoder setBuffer:ctx.dummy offset:0 atIndex:NSUInteger(index)];
        return;
    }
    const auto [buffer, offset] = ctx.resolve(p);
    [ctx.encoder setBuffer:buffer offset:offset atIndex:NSUInteger(index)];
}

void dispatch(const Context& ctx, const Row& row, int entry, MTLSize groups, int threads) {
    [ctx.encoder setComputePipelineState:ctx.pipeline(row, entry)];
    [ctx.encoder dispatchThreadgroups:groups threadsPerThreadgroup:MTLSizeMake(NSUInteger(threads), 1, 1)];
}

namespace {

std::string metallib_path() {
    if (const char* env = std::getenv("KCAP_METALLIB"); env && *env) return env;
    // Installed next to this library's module (kcap/_core*.so): find our own file.
    Dl_info info;
    if (dladdr(reinterpret_cast<const void*>(&metallib_path), &info) && info.dli_fname) {
        std::string self = info.dli_fname;
        const size_t slash = self.rfind('/');
        return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/kcap.metallib";
    }
    return "kcap.metallib";
}

class MetalBackend final : public Backend_ {
public:
    MetalBackend(const ModelSpec& spec, Plan plan, const EngineOptions& options)
        : plan_(std::move(plan)), executor_(plan_), max_batch_(std::max(1, options.max_batch)), n_vocab_(spec.n_vocab) {
        @autoreleasepool {
            ctx_.device = MTLCreateSystemDefaultDevice();
            if (!ctx_.device)
                throw BackendUnavailableError("backend 'metal': no Metal device is available on this machine; use backend='cpu'");
            const std::string path = metallib_path();
            NSError* error = nil;
            ctx_.library = [ctx_.device newLibraryWithURL:[NSURL fileURLWithPath:@(path.c_str())] error:&error];
            if (!ctx_.library)
                throw BackendUnavailableError("backend 'metal': cannot load the kernels from " + path + " (" +
                                              std::string(error ? error.localizedDescription.UTF8String : "unknown") + ")");
            ctx_.queue = [ctx_.device newCommandQueue];
            ctx_.kv_format = plan_.options.kv_format;
            ctx_.n_ctx = plan_.options.n_ctx;
            ctx_.dummy = [ctx_.device newBufferWithLength:16 options:MTLResourceStorageModeShared];
            route_argmax();
            build_pipelines();
            wrap_weights();
            allocate_buffers(spec);
            bind_stages();
        }
    }

    void eval(const int32_t* tokens, int64_t n, int64_t pos0, float* logits, bool all_logits) override {
        for (int64_t start = 0; start < n; start += max_batch_) {
            const int64_t count = std::min<int64_t>(max_batch_, n - start);
            const bool need_logits = start + count == n || all_logits;
            set_step(tokens + start, count, pos0 + start);
            float* device_logits = all_logits ? all_logits_buffer(count) : decode_logits_;
            @autoreleasepool {
                begin();
                run_stages(count, need_logits, all_logits, device_logits);
                end_and_wait();
            }
            if (need_logits) {
                const size_t values = size_t(all_logits ? count : 1) * size_t(n_vocab_);
                std::memcpy(all_logits ? logits + start * n_vocab_ : logits, device_logits, values * sizeof(float));
            }
        }
    }

    // One command buffer per token, waited for once; the argmax feeds the next token and
    // position back into the step buffer, so the host writes nothing between tokens.
    void decode_greedy(int32_t token, int64_t n, int64_t pos0, int32_t* out, int64_t) override {
        if (n <= 0) return;
        set_step(&token, 1, pos0);
        for (int64_t i = 0; i < n; ++i) {
            @autoreleasepool {
                begin();
                run_stages(1, true, false, decode_logits_);
                run_argmax(true);
                end_and_wait();
            }
        }
        std::memcpy(out, ctx_.history, size_t(n) * sizeof(int32_t));
    }

    void attach_trace(std::vector<TraceEntry>* trace) override { executor_.attach_trace(trace); }

private:
    // The backend's own argmax stage, routed through the table like any other (as on CUDA).
    void route_argmax() {
        argmax_stage_.layer = -1;
        argmax_stage_.name = "argmax";
        argmax_stage_.op = Op::Argmax;
        argmax_stage_.input = Buffer::Logits;
        argmax_stage_.k = argmax_stage_.n = n_vocab_;
        argmax_stage_.last_token_only = true;
        argmax_row_ = route(argmax_stage_, plan_.options, 1);
    }

    // Every entry of every routed row, compiled now; a row whose declared threadgroup (threads
    // or threadgroup memory) does not fit the pipeline or the device, or a device whose simd
    // width is not the dialect's, is refused here.
    void build_pipelines() {
        std::vector<const Row*> rows = {argmax_row_};
        for (const RoutedStage& routed : plan_.stages)
            for (const Route& route : routed.routes) rows.push_back(route.row);
        for (const Row* row : rows) {
            const auto& entries = metal_rows::entry_points(row->kernel);
            if (entries.empty()) throw Error("metal: row " + row->kernel + " declares no entry points");
            for (size_t e = 0; e < entries.size(); ++e) {
                if (ctx_.pipelines.count({row, int(e)})) continue;
                id<MTLFunction> function = [ctx_.library newFunctionWithName:@(entries[e].c_str())];
                if (!function) throw Error("metal: " + entries[e] + " (row " + row->kernel + ") is not in the metallib");
                NSError* error = nil;
                id<MTLComputePipelineState> pipeline = [ctx_.device newComputePipelineStateWithFunction:function error:&error];
                if (!pipeline)
                    throw Error("metal: cannot build " + entries[e] + ": " +
                                std::string(error ? error.localizedDescription.UTF8String : "unknown"));
                if (pipeline.threadExecutionWidth != NSUInteger(metal_rows::kSimdWidth))
                    throw BackendUnavailableError("backend 'metal': simd width " + std::to_string(pipeline.threadExecutionWidth) +
                                                  ", the kernels assume " + std::to_string(metal_rows::kSimdWidth));
                if (pipeline.maxTotalThreadsPerThreadgroup < NSUInteger(row->geometry.threads_per_group))
                    throw BackendUnavailableError("backend 'metal': " + entries[e] + " allows " +
                                                  std::to_string(pipeline.maxTotalThreadsPerThreadgroup) +
                                                  " threads per group; row " + row->kernel + " needs " +
                                                  std::to_string(row->geometry.threads_per_group));
                if (NSUInteger(row->geometry.shared_bytes) > ctx_.device.maxThreadgroupMemoryLength)
                    throw BackendUnavailableError("backend 'metal': row " + row->kernel + " needs " +
                                                  std::to_string(row->geometry.shared_bytes) +
                                                  " bytes of threadgroup memory; the device gives " +
                                                  std::to_string(ctx_.device.maxThreadgroupMemoryLength));
                ctx_.pipelines[{row, int(e)}] = pipeline;
            }
        }
    }

    void add_allocation(const uint8_t* base, size_t length, id<MTLBuffer> buffer, size_t offset) {
        Allocation a;
        a.base = base, a.length = length, a.buffer = buffer, a.buffer_offset = offset;
        ctx_.allocations.insert(std::upper_bound(ctx_.allocations.begin(), ctx_.allocations.end(), a,
                                                 [](const Allocation& x, const Allocation& y) { return x.base < y.base; }),
                                a);
    }

    // Shared-storage buffer registered under its own contents pointer.
    template <class T>
    T* alloc_n(size_t n) {
        const size_t bytes = std::max<size_t>(n * sizeof(T), 16);
        id<MTLBuffer> buffer = [ctx_.device newBufferWithLength:bytes options:MTLResourceStorageModeShared];
        if (!buffer) throw Error("metal: cannot allocate " + std::to_string(bytes) + " bytes");
        add_allocation(static_cast<const uint8_t*>(buffer.contents), bytes, buffer, 0);
        return static_cast<T*>(buffer.contents);
    }

    // Weights: operand ranges merged where their pages touch (tensors are contiguous in the
    // mapped file), each merged range wrapped without a copy, or copied if Metal refuses it.
    void wrap_weights() {
        const size_t page = size_t(getpagesize());
        std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
        for (const RoutedStage& routed : plan_.stages)
            for (const TensorRef* operand : routed.stage.operands)
                if (operand && operand->nbytes) ranges.emplace_back(operand->data, operand->data + operand->nbytes);
        std::sort(ranges.begin(), ranges.end());
        auto page_down = [&](const uint8_t* p) { return reinterpret_cast<const uint8_t*>(uintptr_t(p) / page * page); };
        auto page_up = [&](const uint8_t* p) { return page_down(p + page - 1); };
        std::vector<std::pair<const uint8_t*, const uint8_t*>> merged;
        for (const auto& r : ranges) {
            if (!merged.empty() && page_down(r.first) <= page_up(merged.back().second))
                merged.back().second = std::max(merged.back().second, r.second);
            else
                merged.push_back(r);
        }
        for (const auto& [begin, end] : merged) {
            const uint8_t* base = page_down(begin);
            const size_t length = size_t(page_up(end) - base);
            id<MTLBuffer> buffer = nil;
            if (length <= ctx_.device.maxBufferLength)
                buffer = [ctx_.device newBufferWithBytesNoCopy:const_cast<uint8_t*>(base)
                                                        length:length
                                                       options:MTLResourceStorageModeShared
                                                   deallocator:nil];
            if (buffer) {
                add_allocation(begin, size_t(end - begin), buffer, size_t(begin - base));
                wrapped_bytes_ += size_t(end - begin);
            } else {
                buffer = [ctx_.device newBufferWithBytes:begin length:size_t(end - begin) options:MTLResourceStorageModeShared];
                if (!buffer) throw Error("metal: cannot allocate the weights");
                add_allocation(begin, size_t(end - begin), buffer, 0);
                copied_bytes_ += size_t(end - begin);
            }
        }
    }

    void allocate_buffers(const ModelSpec& spec) {
        buffers_.assign(plan_.buffer_widths.size(), nullptr);
        for (size_t b = 0; b < plan_.buffer_widths.size(); ++b) {
            if (Buffer(b) == Buffer::None || Buffer(b) == Buffer::Logits || plan_.buffer_widths[b] == 0) continue;
            buffers_[b] = alloc_n<float>(size_t(max_batch_) * size_t(plan_.buffer_widths[b]));
        }
        decode_logits_ = alloc_n<float>(size_t(n_vocab_));
        const size_t kv_bytes = ctx_.kv_format == Format::F16 ? 2 : 4;  // a plan parameter
        ctx_.kv.resize(spec.layers.size());
        for (size_t i = 0; i < spec.layers.size(); ++i) {
            const LayerSpec& layer = spec.layers[i];
            if (layer.kv_source_layer >= 0) continue;  // kv_shared: reads layer kv_source_layer's cache
            const KvWidths widths = kv_widths(layer);  // a latent-attention layer: its latent rows only
            const size_t k = std::max<size_t>(16, size_t(ctx_.n_ctx) * size_t(widths.k) * kv_bytes);
            const size_t v = std::max<size_t>(16, size_t(ctx_.n_ctx) * size_t(widths.v) * kv_bytes);
            ctx_.kv[i].k = [ctx_.device newBufferWithLength:k options:MTLResourceStorageModePrivate];
            ctx_.kv[i].v = [ctx_.device newBufferWithLength:v options:MTLResourceStorageModePrivate];
            if (!ctx_.kv[i].k || !ctx_.kv[i].v) throw Error("metal: cannot allocate the KV cache");
        }
        ctx_.step = alloc_n<int32_t>(2);
        ctx_.tokens = alloc_n<int32_t>(size_t(max_batch_));
        ctx_.history = alloc_n<int32_t>(size_t(ctx_.n_ctx) + 1);
        ctx_.argmax_result = alloc_n<int32_t>(1);
        ctx_.argmax_partials = int(ceil_div(n_vocab_, metal_rows::kArgmaxChunk));
        ctx_.argmax_partial_value = alloc_n<float>(size_t(ctx_.argmax_partials));
        ctx_.argmax_partial_index = alloc_n<int32_t>(size_t(ctx_.argmax_partials));
    }

    // What each stage reads besides its activation buffers, fixed now so a token never decides.
    void bind_stages() {
        stage_data_.resize(plan_.stages.size());
        size_t partial_o = 0, partial_ml = 0;
        std::map<RopeTableKey, const float*> rope_tables;
        for (size_t i = 0; i < plan_.stages.size(); ++i) {
            const Stage& stage = plan_.stages[i].stage;
            StageData& data = stage_data_[i];
            for (size_t j = 0; j < stage.operands.size() && j < std::size(data.operands); ++j)
                if (stage.operands[j]) data.operands[j] = stage.operands[j]->data;
            if (stage.op == Op::Rope || stage.op == Op::AttentionMla) {
                const RopeTableKey key = rope_table_key(stage);
                auto found = rope_tables.find(key);
                if (found == rope_tables.end()) {
                    const std::vector<float> table = rope_cos_sin_table(stage, ctx_.n_ctx);
                    float* copy = alloc_n<float>(table.size());
                    std::memcpy(copy, table.data(), table.size() * sizeof(float));
                    found = rope_tables.emplace(key, copy).first;
                }
                data.rope_table = found->second;
                data.operands[stage.op == Op::Rope ? 0 : 3] = nullptr;  // the factors are folded into the table
            }
            if (stage.op == Op::AttentionMla) {
                // Splits of about kMlaMinChunk rows at the longest span, at most kMlaGroupsPerCore
                // attend groups (head groups x splits) per kGpuCores core, as cuda_backend.cu;
                // partials for the decode's splits or a prefill chunk's single split of every token.
                const int64_t head_groups = (stage.params.n_head + KCAP_MLA_HEADS_PER_GROUP - 1) / KCAP_MLA_HEADS_PER_GROUP;
                data.attn_splits = decode_key_splits(stage.max_span, metal_rows::kMlaMinChunk,
                                                     int64_t(metal_rows::kMlaGroupsPerCore) * metal_rows::kGpuCores,
                                                     head_groups, KCAP_MLA_MAX_SPLITS);
                const size_t slots = size_t(stage.params.n_head) * size_t(std::max(data.attn_splits, max_batch_));
                partial_o = std::max(partial_o, slots * size_t(stage.params.kv_lora_rank));
                partial_ml = std::max(partial_ml, slots * 2);
            }
            if (stage.op == Op::Attention) {
                // Enough splits that each takes about kAttnMinChunk keys at the longest span,
                // capped at a few threadgroups per core (kGpuCores stands in for the count
                // Metal does not report; longer spans: longer splits), as cuda_backend.cu.
                data.attn_splits = decode_key_splits(stage.max_span, metal_rows::kAttnMinChunk,
                                                     int64_t(metal_rows::kAttnSplitsPerCore) * metal_rows::kGpuCores,
                                                     std::max(1, stage.params.n_head_kv), INT_MAX);
                const size_t slots = size_t(stage.params.n_head) * size_t(data.attn_splits);
                partial_o = std::max(partial_o, slots * size_t(stage.params.head_dim_v));
                partial_ml = std::max(partial_ml, slots * 2);
            }
        }
        ctx_.attn_partial_o = alloc_n<float>(std::max<size_t>(partial_o, 1));
        ctx_.attn_partial_ml = alloc_n<float>(std::max<size_t>(partial_ml, 1));
        // The mixture-of-experts scratch (moe_scratch: max_batch tokens of the widest stage; no
        // grouped tiles on Metal).
        const MoeScratch moe = moe_scratch(plan_, max_batch_, 0);
        if (moe.logits) ctx_.moe_logits = alloc_n<float>(moe.logits);
        if (moe.act) {
            ctx_.moe_act = alloc_n<float>(moe.act);
            ctx_.moe_down = alloc_n<float>(moe.down);
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
            ctx_.mla_absorbed = alloc_n<float>(mla_absorbed);
            ctx_.mla_latent = alloc_n<float>(mla_latent);
        }
    }

    float* buffer(Buffer b) const { return b == Buffer::None ? nullptr : buffers_[size_t(b)]; }

    float* all_logits_buffer(int64_t rows) {
        if (rows > all_logits_rows_) {
            all_logits_ = alloc_n<float>(size_t(rows) * size_t(n_vocab_));  // the old one stays registered (rare)
            all_logits_rows_ = rows;
        }
        return all_logits_;
    }

    // No command buffer is in flight between calls (each is waited for), so the host writes
    // the step state directly into shared memory.
    void set_step(const int32_t* tokens, int64_t n, int64_t pos0) {
        ctx_.step[0] = int32_t(pos0);
        ctx_.step[1] = 0;
        std::memcpy(ctx_.tokens, tokens, size_t(n) * sizeof(int32_t));
    }

    void begin() {
        ctx_.command_buffer = [ctx_.queue commandBuffer];
        ctx_.encoder = [ctx_.command_buffer computeCommandEncoder];  // serial: each dispatch sees the last
    }

    void end_and_wait() {
        [ctx_.encoder endEncoding];
        [ctx_.command_buffer commit];
        [ctx_.command_buffer waitUntilCompleted];
        const bool failed = ctx_.command_buffer.status == MTLCommandBufferStatusError;
        NSError* error = ctx_.command_buffer.error;
        ctx_.encoder = nil;
        ctx_.command_buffer = nil;
        if (failed) throw Error("metal: command buffer failed: " + std::string(error ? error.localizedDescription.UTF8String : "?"));
    }

    // Every routed stage for n tokens: the plan's walk (Executor), as cuda_backend.cu runs it.
    void run_stages(int64_t n, bool need_logits, bool all_logits, float* logits) {
        executor_.run(
            n, 0, nullptr, need_logits, all_logits, logits, &ctx_, [&](Buffer b) { return buffer(b); },
            [&](size_t i) { return static_cast<const void*>(&stage_data_[i]); },
            [](const Row& row, const Stage& stage, const KernelCall& call) { row.fn(stage, call); });
    }

    void run_argmax(bool advance) {
        StageData data;
        KernelCall call;
        call.row = argmax_row_;
        call.n_tokens = 1;
        call.backend_state = &ctx_;
        call.stage_state = &data;
        call.in = decode_logits_;
        call.out = reinterpret_cast<float*>(ctx_.argmax_result);
        call.inout2 = advance ? reinterpret_cast<float*>(ctx_.history) : nullptr;
        argmax_row_->fn(argmax_stage_, call);
    }

    Plan plan_;
    Executor executor_;
    int max_batch_;
    int64_t n_vocab_;
    Context ctx_;
    std::vector<float*> buffers_;
    std::vector<StageData> stage_data_;
    float* decode_logits_ = nullptr;
    float* all_logits_ = nullptr;
    int64_t all_logits_rows_ = 0;
    size_t wrapped_bytes_ = 0, copied_bytes_ = 0;
    Stage argmax_stage_;
    const Row* argmax_row_ = nullptr;
};

}  // namespace
}  // namespace metal

std::unique_ptr<Backend_> make_metal_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options) {
    return std::make_unique<metal::MetalBackend>(spec, std::move(plan), options);
}

bool metal_device_available() {
    @autoreleasepool {
        return MTLCreateSystemDefaultDevice() != nil;
    }
}

}  // namespace kcap
