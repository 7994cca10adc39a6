// Parameter structs shared by host launchers and kernel bodies (plain scalars only, so the
// same bytes mean the same thing to a CUDA launch, a Metal setBytes and the host tests).
//
// Activation buffers are packed per stage: token m's row of a stage's input starts at
// m * (input width of that stage), as on the CPU backend.
#pragma once

// y[m, n] = W[n, :] . x[m, :] (+ bias[n]); W rows of raw GGUF blocks.
struct KcapMatmulParams {
    int k;               // inner dimension (a multiple of the format's block; of 4 for float formats)
    int n;               // output rows
    int m;               // tokens
    unsigned row_bytes;  // bytes of one weight row
    int has_bias;
};

// RMS or Layer norm of `groups` groups of `width` per token, times weight (+ bias).
struct KcapNormParams {
    int width;
    int rows;  // tokens * groups
    float eps;
    int layer_norm;
    int has_weight;
    int has_bias;
};

// Fused residual add and norm (add_norm), one group per token row of `width`:
//   r = residual + scale * (has_post ? post_norm(branch) : branch);  residual = r;  normed = norm(r)
// Both norms are of one kind (RMS or Layer); each has an optional weight and bias.
struct KcapAddNormParams {
    int width;
    float eps;
    float scale;
    int layer_norm;
    int has_post;
    int has_post_weight;
    int has_post_bias;
    int has_weight;
    int has_bias;
};

// Rotary embedding of Q and K in place; cos/sin come from a table [n_ctx][rope_dim / 2][2]
// made on the host in double precision (the CPU reference's angles, bit for bit).
struct KcapRopeParams {
    int n_tokens;
    int n_head;
    int n_head_kv;
    int head_dim;
    int rope_dim;
    int neox;
};

// Causal (optionally windowed) softmax attention over the KV cache.
// q: [tokens][n_head][head_dim]; new k/v: [tokens][n_head_kv][head_dim(_v)]; out: [tokens][n_head][head_dim_v];
// cache rows: [n_ctx][k_width] and [n_ctx][v_width], f32 or f16.
struct KcapAttentionParams {
    int n_tokens;
    int n_head;
    int n_head_kv;
    int head_dim;
    int head_dim_v;
    int k_width;
    int v_width;
    int window;      // 0: global; else a query at p sees keys p - window < k <= p
    float scale;     // multiplies q . k
    float softcap;   // softcap * tanh(score / softcap) when > 0
    int kv_f16;      // cache element type: 0 f32, 1 f16
    int n_splits;    // decode: key-range splits (grid y)
    int min_chunk;   // decode: fewest keys one split takes (a multiple of 32)
    int append;      // 1: store the new K/V in the cache; 0: a shared-KV layer (kv_shared) reads
                     // the cache another layer filled in this pass and stores nothing
    // Decode of a stage that owns the rope (planner: rope + attention fused): the decode rotates
    // the query heads and the new K itself (rope_dim == head_dim), after an RMS norm of each head
    // with the q_norm / k_norm weights when qk_norm is set. 0: Q and K arrive rotated.
    int rope;         // 0 none, 1 normal (adjacent pairs), 2 NeoX (halves)
    int qk_norm;      // 1: RMS-norm each head of Q and the new K first (eps below)
    float qk_norm_eps;
    int head_blocks;  // decode: groups per KV head, each taking a share of its query heads
                      // (kcap_decode_heads; grid x = n_head_kv * head_blocks); 0 or 1: one
};

// Elementwise stages over n_tokens * n values.
struct KcapElementwiseParams {
    int count;       // values
    int activation;  // kcap::Activation as int (SiLU 0, GeluTanh 1, GeluErf 2, ReLU 3, SwigluOai 4)
    int gated;       // activation: out = act(in) * in2 when set
    float cap;       // softcap
    float scale;     // add: out = in + scale * in2 (residual scale); scale: out = in * scale
};

// Embedding rows of the raw table, times scale, plus the learned position embedding of each
// token's position (positions: [n_ctx][width], f32 or f16) where the model has one.
struct KcapEmbedParams {
    int n_tokens;
    int width;
    unsigned row_bytes;
    float scale;
    int positions;  // 0: none, 1: f32 rows, 2: f16 rows
};

// Per-layer embeddings (PLE): for token m with scaled embedding e and L layers of `per` values,
//   ple = (rms_norm_per_layer(norm_w, (proj . e) * proj_scale) + table[id] * token_scale) * combine_scale
// (the projection is a matmul body; the combine reads its output in place).
struct KcapPleParams {
    int n_tokens;
    int width;             // n_layer * per
    int per;               // values per layer
    unsigned table_row_bytes;
    float eps;
    float proj_scale;
    float token_scale;
    float combine_scale;
};

// Per-layer gate: out[m][i] = act(gate[m][i]) * ple[m * stride + offset + i], i < per.
struct KcapPleGateParams {
    int n_tokens;
    int per;
    int stride;      // row width of the per-layer buffer
    int offset;      // this layer's slice: layer * per
    int activation;  // as KcapElementwiseParams
};

// Greedy argmax over one row of logits, in two passes (partials, then one group).
struct KcapArgmaxParams {
    int count;       // logits
    int chunk;       // logits per group in the first pass
    int n_partials;  // groups of the first pass
    int advance;     // second pass: feed the winner back as the next token (decode graph)
};

// Top-k sampling of one row of logits, in two passes (each group's top k, then one group
// merges them and draws). The settings that may change per call live in device memory
// (KcapSampleSettings), so one captured decode graph serves any of them.
struct KcapSampleParams {
    int count;       // logits
    int n_partials;  // groups of the first pass (each KCAP_SAMPLE_CHUNK logits)
    int advance;     // feed the drawn token back as the next token (decode graph)
};
struct KcapSampleSettings {
    float temperature;  // > 0
    float top_p;        // (0, 1]; 1 keeps every candidate
    float min_p;        // [0, 1); 0 keeps every candidate
    unsigned seed;      // with the position, the draw's counter-based random number
    int top_k;          // 1 .. KCAP_SAMPLE_MAX_TOP_K
    int pad[3];
};
#define KCAP_SAMPLE_THREADS 256
#define KCAP_SAMPLE_PER_THREAD 16  // candidates each thread holds in a pass
#define KCAP_SAMPLE_CHUNK (KCAP_SAMPLE_THREADS * KCAP_SAMPLE_PER_THREAD)  // logits per first-pass group
#define KCAP_SAMPLE_MAX_TOP_K 64
// The second pass holds every group's k candidates at once (KCAP_SAMPLE_CHUNK of them), so a
// vocabulary of at most KCAP_SAMPLE_CHUNK / KCAP_SAMPLE_MAX_TOP_K * KCAP_SAMPLE_CHUNK logits.
#define KCAP_SAMPLE_MAX_PARTIALS (KCAP_SAMPLE_CHUNK / KCAP_SAMPLE_MAX_TOP_K)

// Upper bounds that size per-thread arrays and shared memory; rows declare them as legal dims.
#define KCAP_ATTN_MAX_HEAD_DIM 256
#define KCAP_ATTN_MAX_SIMDS 8

#define KCAP_MOE_MAX_EXPERTS 512  // the router's logits staged in threadgroup memory (DeepSeek V3: 256)
#define KCAP_MOE_MAX_USED 32
#define KCAP_MOE_MAX_GROUPS 32  // group-limited routing: one group per lane of the route's simd group
// Multi-head latent attention (kernels/attention_mla.h): threads of every launch, the widest
// latent (its weighted sum held in registers, 32 values per lane) and cache row.
#define KCAP_MLA_THREADS 256
#define KCAP_MLA_MAX_LORA 512
#define KCAP_MLA_MAX_WIDTH 640  // DeepSeek: 512 + 64
#define KCAP_MLA_ROPE_PER_LANE 4  // the rope key's values per lane of a cache row (rope <= 128)
#define KCAP_MLA_MAX_SIMDS (KCAP_MLA_THREADS / 32)
// Query heads one attend group scores against each cache row it loads, and the fewest cache rows
// per key split of the decode (cuda/rows.h: measured with kMlaGroupsPerSm).
#ifndef KCAP_MLA_HEADS_PER_GROUP
#define KCAP_MLA_HEADS_PER_GROUP 2
#endif
#ifndef KCAP_MLA_MIN_CHUNK
#define KCAP_MLA_MIN_CHUNK 16
#endif
#define KCAP_MLA_MAX_SPLITS 1024    // most key splits of a decode (the combine's weights)
#define KCAP_MLA_COMBINE_COLS 64    // latent values per combine group (its threads: 4 phases each)
// The rows of kcap_mla_rows' W . x (x of k values, k a multiple of 32) one simd group takes at a
// time: 32 / (k / 32) where k / 32 is a power of two up to 32 (lanes in aligned segments, one
// row each), else 1; and per group of KCAP_MLA_THREADS threads.
#define KCAP_MLA_ROWS_PER_SIMD(k) \
    (((k) / 32 <= 32 && (((k) / 32) & ((k) / 32 - 1)) == 0) ? 32 / ((k) / 32) : 1)
#define KCAP_MLA_ROWS_PER_GROUP(k) (KCAP_MLA_MAX_SIMDS * KCAP_MLA_ROWS_PER_SIMD(k))
#define KCAP_MLA_RUN_STRIDE 33  // floats per staged run of x: lanes of different runs hit different banks
// kcap_mla_attend's threadgroup memory: the group's queries, each simd group's weighted latent,
// its max and sum.
#define KCAP_MLA_ATTEND_SHARED_FLOATS \
    (KCAP_MLA_HEADS_PER_GROUP * KCAP_MLA_MAX_WIDTH + KCAP_MLA_MAX_SIMDS * (KCAP_MLA_MAX_LORA + 2))
// kcap_mla_combine's: the splits' weights and one float per thread.
#define KCAP_MLA_COMBINE_SHARED_FLOATS (KCAP_MLA_MAX_SPLITS + KCAP_MLA_THREADS)
// kcap_mla_absorb's and kcap_mla_v_up's: x in runs of KCAP_MLA_RUN_STRIDE.
#define KCAP_MLA_ROWS_SHARED_FLOATS (KCAP_MLA_MAX_WIDTH / 32 * KCAP_MLA_RUN_STRIDE)
// A prefill chunk's forms (kernels/attention_mla.h, *_tokens and kcap_mla_attend_tiled): the
// tokens one absorb or V-up group takes (each decoded weight run used for all of them); the
// tiled attend's query rows and keys per step (its thread roles assume both are 32 and
// KCAP_MLA_THREADS is 256), its threadgroup row stride (floats; 16-byte aligned, and 4 past a
// multiple of 32 at DeepSeek's 576 so the simd groups' float4 reads of 8 rows hit 32 banks) and
// its threadgroup memory: the queries, the staged cache rows, the depth quarters' partial scores
// and the softmax weights.
#define KCAP_MLA_TOKENS 16
#define KCAP_MLA_TOKENS_SHARED_FLOATS(k) (KCAP_MLA_TOKENS * ((k) / 32) * KCAP_MLA_RUN_STRIDE)
#define KCAP_MLA_TILE_ROWS 32
#define KCAP_MLA_TILE_KEYS 32
#define KCAP_MLA_TILE_STRIDE(width) (((width) + 3) / 4 * 4 + 4)
#define KCAP_MLA_TILE_SHARED_FLOATS(width)                                     \
    ((KCAP_MLA_TILE_ROWS + KCAP_MLA_TILE_KEYS) * KCAP_MLA_TILE_STRIDE(width) + \
     4 * KCAP_MLA_TILE_ROWS * KCAP_MLA_TILE_KEYS + KCAP_MLA_TILE_KEYS * KCAP_MLA_TILE_ROWS)
// The router's logits (kernels/moe.h): tokens per group, experts per simd group, runs of x
// staged at a time, and the staged floats (runs padded to 36 floats: KCAP_MATVEC_RUN_STRIDE;
// 8 tokens of 28 runs fit Metal's 32 KB of threadgroup memory). One expert per simd group spreads
// a decode's router rows over twice the groups (CUDA: cuda_rows::kMoeLogitThreads).
#define KCAP_MOE_LOGIT_TOKENS 8
#define KCAP_MOE_LOGIT_EXPERTS 1
#define KCAP_MOE_LOGIT_CHUNK_RUNS 28
#define KCAP_MOE_LOGIT_SHARED_FLOATS (KCAP_MOE_LOGIT_TOKENS * KCAP_MOE_LOGIT_CHUNK_RUNS * 36)
// The router's logits of many tokens as a tiled matmul (kcap_moe_logits_tiled): a group takes a
// tile of KCAP_MOE_TILE tokens x KCAP_MOE_TILE experts over one slice of K with
// KCAP_MOE_TILE_THREADS threads, each 2 tokens x 4 experts; the slice's x and weights staged
// KCAP_MOE_TILE_STAGE_RUNS 32-value runs at a time, rows padded by one float. The slices'
// partial sums (at most KCAP_MOE_TILE_MAX_SPLITS, each of KCAP_MOE_TILE_SPLIT_RUNS runs or more)
// are added in slice order by kcap_moe_route.
#define KCAP_MOE_TILE 32
#define KCAP_MOE_TILE_THREADS 128
#define KCAP_MOE_TILE_STAGE_RUNS 4
#define KCAP_MOE_TILE_STRIDE (32 * KCAP_MOE_TILE_STAGE_RUNS + 1)
#define KCAP_MOE_TILE_SHARED_FLOATS (2 * KCAP_MOE_TILE * KCAP_MOE_TILE_STRIDE)
#define KCAP_MOE_TILE_SPLIT_RUNS 8
#define KCAP_MOE_TILE_MAX_SPLITS 16

// Mixture of experts (kernels/moe.h). Routing rows: per token, n_used expert ids (as floats)
// then their weights. The experts' stacked matrices: gate and up [n_expert][ff][k], down
// [n_expert][n][ff], each expert's rows contiguous.
struct KcapMoeParams {
    int n_tokens;
    int k;                     // the FFN input width (n_embd)
    int ff;                    // each expert's FFN width
    int n;                     // the output width (n_embd)
    int n_expert;
    int n_used;
    int renormalize;           // the chosen weights divided by their sum
    float scale;               // times this
    unsigned router_row_bytes;
    float logit_scale;         // the router's logits times this before the softmax
    int expert_scaled;         // each chosen weight times its expert's entry of the scale vector
    int gate_up_merged;        // gate and up in one tensor: expert e's ff gate rows, then its ff up rows
    float swiglu_alpha;        // the clamped SwiGLU's (activation swiglu_oai)
    float swiglu_limit;
    int sigmoid;               // each expert's sigmoid of its logit instead of a softmax over all
    int n_groups;              // group-limited routing when > 1: experts in n_groups equal groups,
    int n_groups_used;         // only the n_groups_used best groups' experts chosen,
    int group_top2;            // a group scored by its two largest choice scores (else its largest)
    int logit_splits;          // kcap_moe_route: 0, the logits as given; more, partial sums of the
                               // logits over that many slices of K ([split][token][expert]), summed
                               // in slice order, plus the router's bias, times logit_scale
};

// Multi-head latent attention (kernels/attention_mla.h): per token a cache row of width = lora
// + rope values (the normed latent, the rotated rope key); query heads of nope + rope values;
// W_k_b rows (kb_row_bytes each): head h's lora rows of nope values, or (combined) W_kv_b's
// rows h * (nope + dv) + i of lora values; W_v_b rows: head h's dv rows of lora values, or the
// next dv rows of W_kv_b.
struct KcapMlaParams {
    int n_tokens;
    int n_head;
    int lora;
    int rope;
    int nope;
    int dv;
    int width;
    float scale;  // multiplies the scores
    float eps;    // the latent's RMS norm
    int kv_f16;
    int combined;
    unsigned kb_row_bytes;
    unsigned vb_row_bytes;
};
