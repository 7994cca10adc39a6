// The capability table against its own declarations, for every row of every backend (cpu,
// cuda, metal: their rows are declared in every build), without running a kernel:
//   - each row accepts a stage built from its declaration alone (its op, the first format it
//     allows per operand, the smallest K its legal dims take, the features it requires);
//   - each legal dim the row declares, made just illegal (K short of k_multiple, below k_min or
//     above k_max, a head_dim past max_head_dim or outside head_dims, head_dim_v not a multiple
//     of head_dim_v_multiple, an operand or KV format the row lacks, a feature it lacks, a
//     required feature missing, one byte of threadgroup memory less than it needs), is refused,
//     for that reason;
//   - the routes of each such stage (route_stage, 1 .. max_batch tokens per call) cover every
//     token count exactly once, ascending, each by a row whose token range holds it and that
//     has the highest priority of the rows that fit there; the rows whose range starts where
//     the stage fills the device (the 128-token q8_1 tiles, the experts' slot starts) start at
//     the token count their tokens_min_of computes for it; the experts' slot starts take the
//     one-token decode of gpt-oss-20b's layout and not Qwen3-30B-A3B's.
// The test fails if any row of the table got no stage it accepts (a row no stage here can
// reach is untested).
#include <algorithm>
#include <cstdio>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "dispatch/gpu_rows.h"
#include "dispatch/planner.h"
#include "kcap/errors.h"
#include "test_cuda_common.h"

using namespace kcap_test;

namespace {

// Operands that exist for rejection_reason only (it reads their formats and names).
struct Operands {
    std::deque<TensorRef> refs;
    const TensorRef* add(Format f, const std::string& name) {
        TensorRef ref;
        ref.name = name;
        ref.format = f;
        refs.push_back(ref);
        return &refs.back();
    }
};

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// What K must be a multiple of for the row and these operand formats.
// The step of K (second: of the experts' FFN width, the down matrix's inner dimension) the row
// takes for these operands: its multiple and the block of each operand multiplied along it.
int64_t k_step(const Row& row, const Stage& stage, bool second = false) {
    int64_t m = row.dims.k_multiple;
    if (row.dims.k_multiple_of)
        for (size_t j = 0; j < stage.operands.size(); ++j)
            if (stage.operands[j] && (stage.op == Op::MoeExperts && j == 2) == second)
                m = std::lcm(m, row.dims.k_multiple_of(stage.operands[j]->format));
    return m;
}

// The smallest K the row's legal dims take for these operand formats.
int64_t smallest_k(const Row& row, const Stage& stage) {
    const int64_t m = k_step(row, stage);
    return std::max(m, round_up(row.dims.k_min, m));
}

// The attention head dim of a row's legal stage: the first of its bodies' head dims, else 64
// (a multiple of every k_multiple and head_dim_v_multiple declared, under every max_head_dim).
int legal_head_dim(const Row& row) { return row.dims.head_dims.empty() ? 64 : row.dims.head_dims.front(); }

// A stage the row accepts, built from its declaration alone.
Stage legal_stage(const Row& row, Operands& operands) {
    Stage stage;
    stage.layer = 0;
    stage.name = "table";
    stage.op = row.op;
    // An empty slot takes no operand (the CPU attention's sinks are operand 3, after the slots of
    // a fused rope's operands that it has none of).
    for (size_t i = 0; i < row.operand_formats.size(); ++i)
        stage.operands.push_back(row.operand_formats[i].empty()
                                     ? nullptr
                                     : operands.add(row.operand_formats[i].at(0), "operand" + std::to_string(i)));
    stage.input_encoding = row.input_encoding;
    stage.features = row.requires_all;
    // One of the features the row requires one of: the lowest (a normal rope for the
    // rope-owning attention rows, which any head dim takes).
    if (row.requires_any) stage.features |= row.requires_any & (~row.requires_any + 1);
    if (row.op == Op::Attention) {
        stage.kv_format = row.kv_formats.at(0);
        const int d = legal_head_dim(row);
        stage.params.head_dim = stage.params.head_dim_v = d;
        stage.params.rope_dim = d;
        stage.params.n_head = 4;
        stage.params.n_head_kv = 2;
        stage.k = d;
        stage.n = int64_t(4) * d;
    } else {
        stage.k = smallest_k(row, stage);
        stage.n = 7 * row.dims.n_multiple;
    }
    if (row.op == Op::MoeRoute || row.op == Op::MoeExperts) {  // 8 experts, 2 per token
        stage.params.n_expert = 8;
        stage.params.n_expert_used = 2;
        if (row.op == Op::MoeExperts) stage.k2 = std::lcm(stage.k, k_step(row, stage, true));  // the FFN width
    }
    return stage;
}

// Expects rejection_reason(row, stage) to name `reason` (a fragment of its message).
void expect_refused(const Row& row, const Stage& stage, const std::string& reason, const std::string& what,
                    const DeviceInfo& device = DeviceInfo()) {
    const std::string why = rejection_reason(row, stage, device);
    KCAP_EXPECT(why.find(reason) != std::string::npos, "%s %s: refused for '%s', expected '%s'", row.kernel.c_str(),
                what.c_str(), why.c_str(), reason.c_str());
}

int g_refusals = 0;

// Each legal dim of the row made just illegal, one at a time, from the legal stage.
void check_refusals(const Row& row, const Stage& legal, Operands& operands) {
    const LegalDims& dims = row.dims;
    const auto refused = [&](const Stage& stage, const std::string& reason, const std::string& what,
                             const DeviceInfo& device = DeviceInfo()) {
        expect_refused(row, stage, reason, what, device);
        ++g_refusals;
    };
    // K: half a multiple past a multiple, and for a row whose multiple is above its format's own
    // granule (the tile rows' whole runs of a float format), a K the exact rows take but it not.
    if (dims.k_multiple > 1) {
        Stage s = legal;
        s.k = legal.k + dims.k_multiple / 2;
        if (row.op == Op::Attention)  // K is the head dim
            s.params.head_dim = s.params.head_dim_v = s.params.rope_dim = int(s.k);
        if (!dims.k_max || s.k <= dims.k_max) refused(s, "is not a multiple of " + std::to_string(dims.k_multiple), "K=" + std::to_string(s.k));
        if (!row.operand_formats.empty() && !row.operand_formats[0].empty()) {
            const int64_t granule = exact_k_multiple(row.operand_formats[0][0]);
            if (granule < dims.k_multiple && dims.k_multiple % granule == 0) {
                s.k = legal.k + dims.k_multiple - granule;
                if (!dims.k_max || s.k <= dims.k_max)
                    refused(s, "is not a multiple of " + std::to_string(dims.k_multiple), "K=" + std::to_string(s.k));
            }
        }
    }
    // K of a row whose operands may differ in format (qkv): one operand in the format that needs
    // the largest multiple, at half that multiple.
    if (dims.k_multiple_of && !row.operand_formats.empty()) {
        Format widest = row.operand_formats[0][0];
        for (Format f : row.operand_formats[0])
            if (dims.k_multiple_of(f) > dims.k_multiple_of(widest)) widest = f;
        const int64_t need = dims.k_multiple_of(widest);
        Stage s = legal;
        s.operands[0] = operands.add(widest, "widest");
        s.k = need / 2;
        if (need > legal.k && s.k % legal.k == 0 && s.k >= dims.k_min)
            refused(s, "is not a multiple of " + std::to_string(need), std::string("K=") + std::to_string(s.k) + " with " +
                                                                           format_name(widest));
    }
    if (dims.k_min > 0) {
        Stage s = legal;
        s.k = dims.k_min - 1;
        // The largest multiple below k_min where the multiple allows one (refused for k_min alone).
        const int64_t step = k_step(row, legal);
        if (step > 1) s.k = (dims.k_min - 1) / step * step;
        if (s.k > 0) refused(s, "is below " + std::to_string(dims.k_min), "K=" + std::to_string(s.k));
    }
    if (dims.k_max > 0) {
        Stage s = legal;
        s.k = round_up(dims.k_max + 1, k_step(row, legal));  // a K the row's formats take
        refused(s, "exceeds " + std::to_string(dims.k_max), "K=" + std::to_string(s.k));
    }
    if (dims.n_multiple > 1) {
        Stage s = legal;
        s.n = legal.n + 1;
        refused(s, "N=", "N=" + std::to_string(s.n));
    }
    if (legal.k2 > 0 && k_step(row, legal, true) > 1) {  // the experts' FFN width off the down's multiple
        Stage s = legal;
        s.k2 = legal.k2 + k_step(row, legal, true) / 2;
        refused(s, "is not a multiple of", "K2=" + std::to_string(s.k2));
    }
    if (dims.max_experts > 0) {
        Stage s = legal;
        s.params.n_expert = dims.max_experts + 1;
        refused(s, "experts exceed", std::to_string(s.params.n_expert) + " experts");
    }
    if (dims.max_experts_used > 0) {
        Stage s = legal;
        s.params.n_expert_used = dims.max_experts_used + 1;
        s.params.n_expert = std::max(s.params.n_expert, s.params.n_expert_used);
        refused(s, "experts per token exceed", std::to_string(s.params.n_expert_used) + " used");
    }
    if (row.op == Op::Attention) {
        if (dims.max_head_dim > 0) {  // the next head dim the K alignment takes, past the bound
            Stage s = legal;
            const int d = int(round_up(dims.max_head_dim + 1, dims.k_multiple));
            s.params.head_dim = s.params.head_dim_v = s.params.rope_dim = d;
            s.k = d;
            refused(s, "exceeds " + std::to_string(dims.max_head_dim), "head_dim " + std::to_string(d));
        }
        if (dims.head_dim_v_multiple > 1) {  // a V head dim the K alignment takes, not whole runs
            Stage s = legal;
            s.params.head_dim_v = legal.params.head_dim_v - dims.head_dim_v_multiple / 2;
            refused(s, "head_dim_v", "head_dim_v " + std::to_string(s.params.head_dim_v));
        }
        if (!dims.head_dims.empty()) {
            // Between two head dims of the bodies (a multiple of k_multiple), and one of them with
            // another V head dim.
            Stage s = legal;
            const int d = dims.head_dims.front() + int(std::max<int64_t>(dims.k_multiple, 32));
            s.params.head_dim = s.params.head_dim_v = s.params.rope_dim = d;
            s.k = d;
            refused(s, "is not one of", "head_dim " + std::to_string(d));
            s = legal;
            s.params.head_dim_v = legal.params.head_dim / 2;
            refused(s, "is not one of", "head_dim_v " + std::to_string(s.params.head_dim_v));
        }
        if (!dims.neox_head_dims.empty() && (row.features & kRopeNeox)) {
            // A NeoX rope at a head dim the other checks take but the halves' pairing does not.
            Stage s = legal;
            s.features = (s.features & ~FeatureMask(kRopeNormal)) | kRopeNeox;
            int d = int(dims.k_multiple);
            while (std::find(dims.neox_head_dims.begin(), dims.neox_head_dims.end(), d) != dims.neox_head_dims.end() ||
                   d % dims.head_dim_v_multiple != 0)
                d += int(dims.k_multiple);
            if (dims.head_dims.empty() && (!dims.max_head_dim || d <= dims.max_head_dim)) {
                s.params.head_dim = s.params.head_dim_v = s.params.rope_dim = d;
                s.k = d;
                refused(s, "NeoX", "NeoX head_dim " + std::to_string(d));
            }
        }
        if (row.features & (kRopeNormal | kRopeNeox)) {  // an attention that owns its rope rotates whole heads
            Stage s = legal;
            if (s.features & (kRopeNormal | kRopeNeox)) {
                s.params.rope_dim = legal.params.head_dim / 2;
                refused(s, "rotates whole heads", "rope_dim " + std::to_string(s.params.rope_dim));
            }
        }
        if (dims.max_span > 0) {
            Stage s = legal;
            s.max_span = dims.max_span + 1;
            refused(s, "attention span", "span " + std::to_string(s.max_span));
        }
        // A KV cache type the row does not store.
        for (Format f : {Format::F32, Format::F16, Format::BF16, Format::Q8_0})
            if (std::find(row.kv_formats.begin(), row.kv_formats.end(), f) == row.kv_formats.end()) {
                Stage s = legal;
                s.kv_format = f;
                refused(s, "KV cache type", std::string("KV ") + format_name(f));
                break;
            }
    }
    if (dims.shared_bytes_of) {  // one byte less threadgroup memory than a group of the stage needs
        DeviceInfo small;
        small.name = "a smaller device";
        small.shared_optin_bytes = dims.shared_bytes_of(legal) - 1;
        refused(legal, "bytes of threadgroup memory", "with " + std::to_string(small.shared_optin_bytes) + " bytes", small);
        small.shared_optin_bytes += 1;
        KCAP_EXPECT(rejection_reason(row, legal, small).empty(), "%s refuses a device with the %d bytes it needs",
                    row.kernel.c_str(), small.shared_optin_bytes);
    }
    if (dims.min_sm_version) {  // a device of the compute capability before the one the row needs
        DeviceInfo older;
        older.name = "an older device";
        older.sm_version = dims.min_sm_version - 10;
        refused(legal, "needs sm_" + std::to_string(dims.min_sm_version), "on sm_" + std::to_string(older.sm_version),
                older);
        older.sm_version = dims.min_sm_version;
        KCAP_EXPECT(rejection_reason(row, legal, older).empty(), "%s refuses a device of sm_%d", row.kernel.c_str(),
                    older.sm_version);
    }
    // An operand format the row does not decode (the first format of the table's formats it lacks).
    if (!row.operand_formats.empty()) {
        for (Format f : gpu_weight_formats())
            if (std::find(row.operand_formats[0].begin(), row.operand_formats[0].end(), f) == row.operand_formats[0].end()) {
                Stage s = legal;
                s.operands[0] = operands.add(f, "other");
                refused(s, "row decodes", std::string("operand 0 in ") + format_name(f));
                break;
            }
    }
    // A row that rounds its input (q8_1, bf16) on a plan that keeps f32 activations.
    if (row.input_encoding != Encoding::F32) {
        Stage s = legal;
        s.input_encoding = Encoding::F32;
        refused(s, "activations=f32", "on f32 activations");
    }
    // A feature the row lacks (the first one), and each feature it requires, missing.
    for (int bit = 0; bit < kFeatureCount; ++bit)
        if (!(row.features & (1u << bit))) {
            Stage s = legal;
            s.features |= 1u << bit;
            refused(s, "lacks features: " + feature_names(1u << bit), "with " + feature_names(1u << bit));
            break;
        }
    for (int bit = 0; bit < kFeatureCount; ++bit)
        if (row.requires_all & (1u << bit)) {
            Stage s = legal;
            s.features &= ~(1u << bit);
            refused(s, "takes only stages with: ", "without " + feature_names(1u << bit));
        }
    if (row.requires_any) {
        Stage s = legal;
        s.features &= ~row.requires_any;
        refused(s, "takes only stages with one of: ", "without any of " + feature_names(row.requires_any));
    }
}

// The routes of a stage on the row's backend cover 1 .. max_batch once, ascending, each by a
// row of the backend that fits the stage, takes the route's token counts and has the highest
// priority among the fitting rows there. Returns the rows routed to.
std::vector<const Row*> check_routes(const Row& row, const Stage& stage, int max_batch, const DeviceInfo& device) {
    PlanOptions options;
    options.backend = row.backend;
    options.activations = stage.input_encoding;
    options.max_batch = max_batch;
    options.device = device;
    std::vector<Route> routes;
    try {
        routes = route_stage(stage, options);
    } catch (const RoutingError& e) {
        KCAP_EXPECT(false, "%s: its legal stage has no route for every token count: %s", row.kernel.c_str(), e.what());
        return {};
    }
    std::vector<const Row*> rows;
    int64_t next = 1;
    for (size_t i = 0; i < routes.size(); ++i) {
        const Route& route = routes[i];
        KCAP_EXPECT(route.row && route.tokens.min == next, "%s: route %zu starts at %d, expected %lld",
                    row.kernel.c_str(), i, route.tokens.min, (long long)next);
        if (!route.row) return rows;
        rows.push_back(route.row);
        const bool last = i + 1 == routes.size();
        // Only the last route may be unbounded (its row takes any count past max_batch).
        KCAP_EXPECT(route.tokens.max != 0 ? route.tokens.max >= route.tokens.min && route.tokens.max <= max_batch
                                          : last,
                    "%s: route %zu of %s is %d..%d", row.kernel.c_str(), i, route.row->kernel.c_str(), route.tokens.min,
                    route.tokens.max);
        const TokenRange taken = row_tokens(*route.row, stage, device);
        const bool holds = taken.min <= route.tokens.min &&
                           (taken.max == 0 || (route.tokens.max != 0 && route.tokens.max <= taken.max));
        KCAP_EXPECT(holds, "%s: route %d..%d goes to %s, which takes %d..%d", row.kernel.c_str(), route.tokens.min,
                    route.tokens.max, route.row->kernel.c_str(), taken.min, taken.max);
        KCAP_EXPECT(route.row->backend == row.backend && rejection_reason(*route.row, stage, device).empty(),
                    "%s: route to %s, which does not fit the stage", row.kernel.c_str(), route.row->kernel.c_str());
        // The highest priority of the rows that fit, at both ends of the route.
        for (const int64_t n : {int64_t(route.tokens.min), int64_t(route.tokens.max ? route.tokens.max : max_batch)})
            for (const Row& other : capability_table()) {
                if (other.backend != row.backend || other.op != stage.op || !row_tokens(other, stage, device).contains(n) ||
                    !rejection_reason(other, stage, device).empty())
                    continue;
                KCAP_EXPECT(other.priority <= route.row->priority, "%s: %lld tokens go to %s (priority %d) over %s (%d)",
                            row.kernel.c_str(), (long long)n, route.row->kernel.c_str(), route.row->priority,
                            other.kernel.c_str(), other.priority);
            }
        next = route.tokens.max ? int64_t(route.tokens.max) + 1 : int64_t(max_batch) + 1;
    }
    KCAP_EXPECT(next > max_batch, "%s: the routes end at %lld of %d", row.kernel.c_str(), (long long)next - 1, max_batch);
    return rows;
}

// The ops whose stages run one token per call (the decode step's last node).
bool one_token_op(Op op) { return op == Op::Argmax || op == Op::Sample; }

}  // namespace

// The q8_1 experts' slot starts on the reference device (132 multiprocessors) for the two MoE
// layouts they were measured on: gpt-oss-20b's decode takes them (720 gate/up groups), Qwen3-30B-
// A3B's one-token decode does not (384 groups, under one wave) but its calls of 2-15 tokens do,
// and 16 tokens and more go to the grouped int8 tiles in both.
void check_slot_starts_layouts(int& routes_checked) {
    struct Layout {
        const char* name;
        Format gate_up, down;
        int64_t k, ff;
        int n_expert, n_used;
        const char* one, *two;  // the rows of a call of 1 and of 2 tokens
    };
    const Layout layouts[] = {
        {"gpt-oss-20b", Format::MXFP4, Format::MXFP4, 2880, 2880, 32, 4, "cuda.moe_experts_q8_slot_starts.mxfp4",
         "cuda.moe_experts_q8_slot_starts.mxfp4"},
        {"Qwen3-30B-A3B", Format::Q4_K, Format::Q6_K, 2048, 768, 128, 8, "cuda.moe_experts_q8.q4_k",
         "cuda.moe_experts_q8_slot_starts.q4_k"},
    };
    for (const Layout& l : layouts) {
        Operands operands;
        Stage stage;
        stage.layer = 0;
        stage.name = "experts";
        stage.op = Op::MoeExperts;
        stage.operands = {operands.add(l.gate_up, "ffn_gate_exps"), operands.add(l.gate_up, "ffn_up_exps"),
                          operands.add(l.down, "ffn_down_exps")};
        stage.input_encoding = Encoding::Q8_1;
        stage.features = kSilu | kGated;
        stage.k = stage.n = l.k;
        stage.k2 = l.ff;
        stage.params.n_expert = l.n_expert;
        stage.params.n_expert_used = l.n_used;
        PlanOptions options;
        options.backend = Backend::CUDA;
        options.activations = Encoding::Q8_1;
        options.max_batch = 512;
        for (const int64_t n : {1, 2, 15, 16}) {
            const Row* row = route(stage, options, n);
            const std::string want = n == 1 ? l.one : n < 16 ? l.two : std::string("cuda.moe_experts_q8_mma.") +
                                                                        lowercase(format_name(l.gate_up));
            KCAP_EXPECT(row && row->kernel == want, "%s experts, %lld tokens: %s, expected %s", l.name, (long long)n,
                        row ? row->kernel.c_str() : "-", want.c_str());
            ++routes_checked;
        }
    }
}

int main() {
    const DeviceInfo device;  // the reference device a plan without one is made for
    int per_backend[3] = {0, 0, 0}, accepted[3] = {0, 0, 0};
    std::vector<std::string> unreached;  // rows no route of their own legal stage chose
    std::vector<std::string> without_stage;
    int routes_checked = 0;
    for (const Row& row : capability_table()) {
        const int b = int(row.backend);
        ++per_backend[b];
        Operands operands;
        const Stage stage = legal_stage(row, operands);
        const std::string why = rejection_reason(row, stage, device);
        if (!why.empty()) {
            without_stage.push_back(row.kernel + " (" + why + ")");
            continue;
        }
        ++accepted[b];
        check_refusals(row, stage, operands);
        // Token ranges. A row whose lower bound follows from the stage and the device (the
        // 128-token int8 tiles, the experts' slot starts): the narrowest stage whose range starts
        // within the routes and the row's own range (wider: N, and an experts stage's FFN width).
        Stage routed = stage;
        const int max_batch = one_token_op(row.op) ? 1 : 512;
        if (row.tokens_min_of) {
            const int limit = row.tokens.max ? row.tokens.max : max_batch / 2;
            while (row_tokens(row, routed, device).min > limit) {
                routed.n += 128;
                if (row.op == Op::MoeExperts) routed.k2 += 256;  // whole blocks of every format
            }
            const TokenRange range = row_tokens(row, routed, device);
            KCAP_EXPECT(range.min > row.tokens.min, "%s: starts at %d for N=%lld", row.kernel.c_str(), range.min,
                        (long long)routed.n);
            PlanOptions options;
            options.backend = row.backend;
            options.activations = routed.input_encoding;
            options.max_batch = max_batch;
            options.device = device;
            const Row* below = route(routed, options, range.min - 1);
            const Row* from = route(routed, options, range.min);
            KCAP_EXPECT(from == &row && below != &row, "%s (N=%lld): %d tokens go to %s, %d to %s", row.kernel.c_str(),
                        (long long)routed.n, range.min - 1, below ? below->kernel.c_str() : "-", range.min,
                        from ? from->kernel.c_str() : "-");
            // A smaller device fills its wave with fewer tokens: the range starts no later.
            DeviceInfo small = device;
            small.sm_count = device.sm_count / 2;
            KCAP_EXPECT(row_tokens(row, routed, small).min <= range.min, "%s: a smaller device starts later",
                        row.kernel.c_str());
        }
        std::vector<const Row*> chosen = check_routes(row, routed, max_batch, device);
        if (std::find(chosen.begin(), chosen.end(), &row) == chosen.end()) {
            // A fallback for devices without the threadgroup memory the rows preferred over it
            // opt in to (cuda.attention_mla under cuda.attention_mla_tiled): routed on a device
            // that lets no group opt in to more than its static share; or for devices older than
            // those rows need (cuda.moe_route under cuda.moe_route_cluster): routed on sm_80.
            DeviceInfo smaller = device;
            smaller.shared_optin_bytes = 0;
            chosen = check_routes(row, routed, max_batch, smaller);
            if (std::find(chosen.begin(), chosen.end(), &row) == chosen.end()) {
                DeviceInfo older = device;
                older.sm_version = 80;
                chosen = check_routes(row, routed, max_batch, older);
            }
        }
        ++routes_checked;
        if (std::find(chosen.begin(), chosen.end(), &row) == chosen.end()) unreached.push_back(row.kernel);
    }
    check_slot_starts_layouts(routes_checked);
    for (const std::string& kernel : without_stage) KCAP_EXPECT(false, "no accepted stage built for %s", kernel.c_str());
    // A row that fits its own legal stage but that no token count of it routes to: outranked
    // everywhere it fits (a dead row), named so the table can be fixed.
    for (const std::string& kernel : unreached)
        KCAP_EXPECT(false, "%s: its own legal stage never routes to it (1..512 tokens)", kernel.c_str());
    for (Backend b : {Backend::CPU, Backend::CUDA, Backend::Metal})
        std::printf("%s: %d rows, %d with an accepted stage\n", backend_name(b), per_backend[int(b)], accepted[int(b)]);
    std::printf("%d refusals checked, %d stages routed, %d failures\n", g_refusals, routes_checked, failures());
    return failures() ? 1 : 0;
}
