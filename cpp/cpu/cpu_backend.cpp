// CPU backend: executes a Plan with f32 activation buffers, a thread pool and a KV cache.
// Long prompts run in chunks of max_batch tokens; the LM head runs on the last position
// only unless every position's logits are asked for.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/backend_impl.h"
#include "cpu/cpu_state.h"
#include "dispatch/executor.h"
#include "kcap/errors.h"

namespace kcap {

namespace {

class CpuBackend : public Backend_ {
public:
    CpuBackend(const ModelSpec& spec, Plan plan, const EngineOptions& options)
        : plan_(std::move(plan)),
          executor_(plan_),
          state_(options.n_threads > 0 ? options.n_threads : int(std::max(1u, std::thread::hardware_concurrency()))),
          max_batch_(std::max(1, options.max_batch)),
          n_vocab_(spec.n_vocab),
          check_finite_(options.check_finite) {
        state_.kv.resize(spec.layers.size());
        for (size_t i = 0; i < spec.layers.size(); ++i) {
            KvLayer& kv = state_.kv[i];
            kv.format = plan_.options.kv_format;
            const KvWidths widths = kv_widths(spec.layers[i]);
            kv.k_width = widths.k;
            kv.v_width = widths.v;
        }
        buffers_.resize(plan_.buffer_widths.size());
    }

    void attach_trace(std::vector<TraceEntry>* trace) override { executor_.attach_trace(trace); }
    void set_interrupt_check(std::function<void()> check) override { interrupt_check_ = std::move(check); }
    bool trace_routing(bool on) override {
        trace_routing_ = on;
        return true;
    }

    void eval(const int32_t* tokens, int64_t n, int64_t pos0, float* logits, bool all_logits) override {
        for (int64_t start = 0; start < n; start += max_batch_) {
            const int64_t count = std::min<int64_t>(max_batch_, n - start);
            const bool final_chunk = start + count == n;
            float* chunk_logits = all_logits ? logits + start * n_vocab_ : logits;
            run_chunk(tokens + start, count, pos0 + start, final_chunk || all_logits, all_logits, chunk_logits);
        }
    }

private:
    float* buffer(Buffer b, int64_t rows) {
        if (b == Buffer::None) return nullptr;
        auto& storage = buffers_[size_t(b)];
        const size_t needed = size_t(rows * plan_.buffer_widths[size_t(b)]);
        if (storage.size() < needed) storage.resize(needed);
        return storage.data();
    }

    void run_chunk(const int32_t* tokens, int64_t n, int64_t pos0, bool need_logits, bool all_logits,
                   float* logits) {
        executor_.run(
            n, pos0, tokens, need_logits, all_logits, logits, &state_, [&](Buffer b) { return buffer(b, n); },
            [](size_t) { return nullptr; }, [&](const Row& row, const Stage& stage, const KernelCall& call) {
                row.fn(stage, call);
                if (check_finite_) check_output_finite(stage, call, pos0);
                poll_interrupt();
                if (trace_routing_ && stage.op == Op::MoeRoute && executor_.trace()) {
                    const Executor::RoutingRows r = executor_.routing_rows(stage, call);
                    executor_.trace()->back().routing.assign(r.first, r.first + r.rows * r.values);
                }
            });
    }

    // Engine::set_interrupt_check: called between stages (the thread pool is idle then), at most
    // every 10 ms, so that a check which takes a lock (Python's signal check takes the GIL) costs
    // nothing measurable; what it throws ends the eval.
    void poll_interrupt() {
        if (!interrupt_check_) return;
        const auto now = std::chrono::steady_clock::now();
        if (now < next_interrupt_check_) return;
        next_interrupt_check_ = now + std::chrono::milliseconds(10);
        interrupt_check_();
    }

    // EngineOptions::check_finite: the rows this call wrote (the stage's output buffer, or Q
    // for a rope that rotates in place) hold no NaN or infinity.
    void check_output_finite(const Stage& stage, const KernelCall& call, int64_t pos0) const {
        const bool in_place = stage.op == Op::Rope || stage.op == Op::QkNormRope;
        const Buffer b = in_place ? stage.input : stage.output;
        if (b == Buffer::None || !call.out) return;
        const int64_t width = b == Buffer::Logits ? n_vocab_ : plan_.buffer_widths[size_t(b)];
        const int64_t count = int64_t(call.n_tokens) * width;
        for (int64_t i = 0; i < count; ++i) {
            if (!std::isfinite(call.out[i]))
                throw NumericalError("stage '" + stage.name + "'" +
                                     (stage.layer >= 0 ? " of layer " + std::to_string(stage.layer) : std::string()) +
                                     " (" + call.row->kernel + ") wrote " + std::to_string(call.out[i]) + " at token " +
                                     std::to_string(pos0 + call.row_offset + i / width) + ", value " +
                                     std::to_string(i % width));
        }
    }

    Plan plan_;
    Executor executor_;
    CpuState state_;
    int max_batch_;
    int64_t n_vocab_;
    bool check_finite_;
    bool trace_routing_ = false;
    std::function<void()> interrupt_check_;
    std::chrono::steady_clock::time_point next_interrupt_check_{};
    std::vector<std::vector<float>> buffers_;
};

}  // namespace

std::unique_ptr<Backend_> make_cpu_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options) {
    return std::make_unique<CpuBackend>(spec, std::move(plan), options);
}

}  // namespace kcap
