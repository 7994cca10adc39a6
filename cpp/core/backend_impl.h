// The interface each backend implements to execute a Plan.
#pragma once

#include <cstdint>

#include "dispatch/planner.h"
#include "kcap/engine.h"

namespace kcap {

class Backend_ {
public:
    virtual ~Backend_() = default;
    // Runs tokens [0, n) at positions pos0.. through the plan; logits as in Engine::eval.
    virtual void eval(const int32_t* tokens, int64_t n, int64_t pos0, float* logits, bool all_logits) = 0;
    // Greedy decoding of n steps from `token` at pos0 (see Engine::decode_greedy). This default evaluates step by step and picks the argmax on
    // the host; the CUDA backend replays its captured decode graph with the argmax on device.
    virtual void decode_greedy(int32_t token, int64_t n, int64_t pos0, int32_t* out, int64_t n_vocab);
    // Sampled decoding with the draw on the device (see Engine::decode_sample); only backends
    // that have it override these.
    virtual bool samples_on_device() const { return false; }
    virtual void decode_sample(int32_t token, int64_t n, int64_t pos0, const SampleSettings& settings, int32_t* out);
    // Records every stage that runs into `trace` until detached (null).
    virtual void attach_trace(std::vector<TraceEntry>* trace) = 0;
    // While on, a traced router stage copies its choice into its entry (TraceEntry::routing).
    // Returns false where the backend cannot (then nothing changes).
    virtual bool trace_routing(bool on) { return !on; }
    // Bytes of device memory this backend holds (weights, KV cache, scratch); 0 on the CPU.
    virtual int64_t device_bytes() const { return 0; }
    // Engine::set_interrupt_check; only a backend whose eval can stop between stages keeps it.
    virtual void set_interrupt_check(std::function<void()>) {}
};

std::unique_ptr<Backend_> make_cpu_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options);
#if defined(KCAP_WITH_CUDA)
// cuda/cuda_backend.cu; throws BackendUnavailableError when the machine has no CUDA device.
std::unique_ptr<Backend_> make_cuda_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options);
// The CUDA device an engine runs on (device 0), for its plan; throws BackendUnavailableError
// when there is none or it is older than sm_80.
DeviceInfo cuda_device_info();
#endif
#if defined(KCAP_WITH_METAL)
// metal/metal_backend.mm; throws BackendUnavailableError when the machine has no
// Metal device or the metallib cannot be loaded.
std::unique_ptr<Backend_> make_metal_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options);
#endif

}  // namespace kcap
