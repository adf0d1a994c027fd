// The model compiler (see lower_model.h): tensors, the forward block, the generation program.
#include "compiler/lower_model.h"

#include <bit>
#include <cstring>
#include <cmath>
#include <map>

#include "compiler/asm.h"
#include "compiler/code_builder.h"
#include "compiler/tokenizer.h"
#include "vm/abi.h"
#include "vm/llm_abi.h"
#include "vm/verify.h"

namespace blue {

namespace {

constexpr uint32_t kNone = 0xFFFFFFFFu;
// Heap words of claimRequest: per input slot, the tag + 1 of the message first seen there, and the
// cycle it was first seen in (in_slots words after).
constexpr uint32_t kSeenTagHeap = 0;
// A grammar automaton of more words than this is copied into the instance in a cycle of its own.
constexpr uint32_t kGrammarCopyAlone = 4096;

uint32_t floatBits(float f) { return std::bit_cast<uint32_t>(f); }

struct Lowering {
    const GgufFile& gguf;
    const ModelConfig& cfg;
    DType kv_type;
    Module& m;
    std::string prefix;         // before every tensor and block name (several models in one module)
    uint32_t extern_index = 0;  // the model's file among the module's externs
    std::map<std::string, uint32_t> ids;
    uint32_t grammar = kNone, token_bytes = kNone;  // SAMPLEG's operands (structured output)
    Pooling pooling = Pooling::None;                  // embeddings: the embed block pools so
    uint32_t embed_block = kNone, pooled = kNone;     // ... and writes `pooled`
    uint32_t sessions = 0;                            // session slots (LowerOptions::sessions)
    uint32_t session_tokens = kNone, session_load = kNone, session_save = kNone;

    // A WEIGHT tensor read from the GGUF file, by its GGUF name.
    uint32_t weight(const std::string& name) {
        if (auto it = ids.find(prefix + name); it != ids.end()) return it->second;
        const GgufTensor* g = gguf.findTensor(name);
        assert(g && "modelConfigFromGguf checked the tensor exists");
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = g->type;
        t.cls = BLUE_TC_WEIGHT;
        t.ndim = g->n_dims;
        for (uint32_t d = 0; d < 4; ++d) t.ne[d] = uint64_t(g->ne[d]);
        t.source = DataSource::EXTERN;
        t.extern_index = extern_index;
        t.offset = g->offset;
        t.bytes = g->n_bytes;
        return add(t);
    }
    uint32_t layerWeight(uint32_t layer, const char* name) {
        return weight("blk." + std::to_string(layer) + "." + name);
    }
    // Rows [row0, row0 + rows) of a fused matrix as a WEIGHT of its own (the rows are contiguous
    // in every type, so this is a narrower view of the same file bytes).
    uint32_t layerWeightRows(uint32_t layer, const char* name, uint64_t row0, uint64_t rows) {
        std::string gname = "blk." + std::to_string(layer) + "." + name;
        std::string view = gname + strFormat("[%llu:%llu]", (unsigned long long)row0, (unsigned long long)(row0 + rows));
        if (auto it = ids.find(prefix + view); it != ids.end()) return it->second;
        const GgufTensor* g = gguf.findTensor(gname);
        assert(g && "modelConfigFromGguf checked the tensor exists");
        uint64_t row_bytes = *dtypeRowBytes(g->type, uint64_t(g->ne[0]));
        TensorDecl t;
        t.name = prefix + view;
        t.dtype = g->type;
        t.cls = BLUE_TC_WEIGHT;
        t.ndim = 2;
        t.ne[0] = uint64_t(g->ne[0]);
        t.ne[1] = rows;
        t.source = DataSource::EXTERN;
        t.extern_index = extern_index;
        t.offset = g->offset + row0 * row_bytes;
        t.bytes = rows * row_bytes;
        return add(t);
    }
    bool hasTensor(const std::string& name) const { return gguf.findTensor(name) != nullptr; }
    // A constant WEIGHT vector the compiler computes, stored in the module's DATA section.
    template <typename T>
    uint32_t constant(const std::string& name, DType type, const std::vector<T>& values) {
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = type;
        t.cls = BLUE_TC_WEIGHT;
        t.ne[0] = values.size();
        appendTensorData(&m, &t, values.data(), values.size() * sizeof(T));
        return add(t);
    }
    // YaRN's per-pair frequency divisors, computed here from the config: one DATA tensor every
    // layer's ROPE shares.
    uint32_t yarnDivisors() {
        if (auto it = ids.find(prefix + "rope_yarn_divisors"); it != ids.end()) return it->second;
        return constant("rope_yarn_divisors", DType::F32, yarnFreqDivisors(cfg));
    }

    uint32_t activation(const std::string& name, uint32_t cls, DType type,
                        std::initializer_list<uint64_t> dims) {
        if (auto it = ids.find(prefix + name); it != ids.end()) return it->second;  // another block's
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = type;
        t.cls = cls;
        t.ndim = uint32_t(dims.size());
        uint32_t d = 0;
        for (uint64_t n : dims) t.ne[d++] = n;
        return add(t);
    }
    uint32_t add(const TensorDecl& t) {
        m.tensors.push_back(t);
        return ids[t.name] = uint32_t(m.tensors.size() - 1);
    }

    uint32_t forwardBlock(CodeBuilder& cb, uint32_t ctx, ForwardHead head = ForwardHead::Sample, uint32_t table = kNone);
    void attention(CodeBuilder& cb, uint32_t layer, uint32_t ctx, const std::map<std::string, uint32_t>& a);
    void experts(CodeBuilder& cb, uint32_t layer, const std::map<std::string, uint32_t>& a);
    void feedForward(CodeBuilder& cb, uint32_t layer, const std::map<std::string, uint32_t>& a);
    void sessionBlocks(CodeBuilder& cb, uint32_t ctx);
    void generationProgram(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk);
    void claimRequest(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label halt);
    void loadSession(CodeBuilder& cb, uint32_t ctx);
    void saveSession(CodeBuilder& cb, uint32_t ctx);
    void unlessStored(CodeBuilder& cb, CodeBuilder::Label skip);
};

// The session store (LowerOptions::sessions): per layer a GLOBAL K and V store of `sessions`
// slots shaped like the caches, a GLOBAL token table ((ctx + 1) words a slot: the count, then the
// tokens), and two blocks that copy KV rows between an instance's caches and a slot, taking the
// block arguments (rows = 1, slot, first row, end row).
void Lowering::sessionBlocks(CodeBuilder& cb, uint32_t ctx) {
    const uint32_t kv_dim = cfg.n_head_kv * cfg.head_dim;
    session_tokens = activation("session_tokens", BLUE_TC_GLOBAL, DType::I32, {uint64_t(ctx + 1) * sessions});
    for (uint32_t dir : {0u, 1u}) {
        uint32_t b = cb.beginBlock(prefix + (dir ? "session_save" : "session_load"), 4);
        for (uint32_t l = 0; l < cfg.n_layer; ++l) {
            for (const char* kv : {"k", "v"}) {
                const std::string ln = std::to_string(l);
                const uint32_t cache = ids.at(prefix + kv + "cache." + ln);
                const uint32_t store = activation(std::string(kv) + "session." + ln, BLUE_TC_GLOBAL, kv_type,
                                                  {kv_dim, ctx, sessions});
                cb.tensor(Op::KVCOPY, {cache, store, dir, 1, 2, 3});
            }
        }
        cb.endBlock();
        (dir ? session_save : session_load) = b;
    }
}

uint32_t Lowering::forwardBlock(CodeBuilder& cb, uint32_t ctx, ForwardHead head, uint32_t table) {
    const uint32_t dim = cfg.n_embd, q_dim = cfg.n_head * cfg.head_dim;
    const uint32_t kv_dim = cfg.n_head_kv * cfg.head_dim;
    std::map<std::string, uint32_t> a;
    a["x"] = activation("x", BLUE_TC_ROWS, DType::F32, {dim});
    a["xb"] = activation("xb", BLUE_TC_ROWS, DType::F32, {dim});
    a["xb2"] = activation("xb2", BLUE_TC_ROWS, DType::F32, {dim});
    a["q"] = activation("q", BLUE_TC_ROWS, DType::F32, {q_dim});
    a["k"] = activation("k", BLUE_TC_ROWS, DType::F32, {kv_dim});
    a["v"] = activation("v", BLUE_TC_ROWS, DType::F32, {kv_dim});
    a["att"] = activation("att", BLUE_TC_ROWS, DType::F32, {q_dim});
    if (!cfg.isMoe()) {
        a["hb"] = activation("hb", BLUE_TC_ROWS, DType::F32, {cfg.n_ff});
        a["hb2"] = activation("hb2", BLUE_TC_ROWS, DType::F32, {cfg.n_ff});
    }
    uint32_t eps = floatBits(cfg.rms_norm_eps);

    static const char* kNames[] = {"forward", "draft", "verify", "score", "embed"};
    uint32_t block = cb.beginBlock(prefix + kNames[int(head)], head == ForwardHead::Verify ? BLUE_FA_COUNT + 1 : BLUE_FA_COUNT);
    cb.tensor(Op::EMBED, {a["x"], weight("token_embd.weight"), BLUE_FA_TOKENS});
    if (cfg.scale_embeddings) cb.tensor(Op::TSCALE, {a["x"], a["x"], floatBits(std::sqrt(float(dim)))});
    for (uint32_t l = 0; l < cfg.n_layer; ++l) {
        cb.tensor(Op::RMSNORM, {a["xb"], a["x"], layerWeight(l, "attn_norm.weight"), eps, 0});
        attention(cb, l, ctx, a);
        if (cfg.post_norms) {
            cb.tensor(Op::MATMUL, {a["xb2"], layerWeight(l, "attn_output.weight"), a["att"]});
            cb.tensor(Op::RMSNORM, {a["xb2"], a["xb2"], layerWeight(l, "post_attention_norm.weight"), eps, 0});
            cb.tensor(Op::TADD, {a["x"], a["x"], a["xb2"]});
        } else {  // the residual added by the matmul itself: one dispatch fewer
            cb.tensor(Op::MATMULADD, {a["x"], layerWeight(l, "attn_output.weight"), a["att"]});
        }
        cb.tensor(Op::RMSNORM, {a["xb"], a["x"], layerWeight(l, "ffn_norm.weight"), eps, 0});
        if (cfg.isMoe()) {
            experts(cb, l, a);
        } else {
            feedForward(cb, l, a);
        }
    }
    if (head == ForwardHead::Embed) {  // `table` is the Pooling
        const uint32_t out_norm = weight("output_norm.weight");
        pooled = activation("pooled", BLUE_TC_INSTANCE, DType::F32, {dim});
        if (Pooling(table) == Pooling::Last) {  // an INSTANCE destination reads the last row
            cb.tensor(Op::RMSNORM, {pooled, a["x"], out_norm, eps, 0});
        } else {
            cb.tensor(Op::RMSNORM, {a["xb"], a["x"], out_norm, eps, 0});
            cb.tensor(Op::POOL, {pooled, a["xb"], Pooling(table) == Pooling::Mean ? BLUE_POOL_MEAN : BLUE_POOL_FIRST,
                                 BLUE_FA_POS});
        }
        cb.endBlock();
        return block;
    }
    const uint32_t cap = cfg.final_softcap > 0 ? floatBits(cfg.final_softcap) : 0;
    uint32_t lm_head = weight(cfg.tied_output ? "token_embd.weight" : "output.weight");
    if (head == ForwardHead::Score) {
        uint32_t row_logits = activation("row_logits", BLUE_TC_ROWS, DType::F32, {cfg.n_vocab});
        cb.tensor(Op::RMSNORM, {a["xb"], a["x"], weight("output_norm.weight"), eps, 0});
        cb.tensor(Op::MATMUL, {row_logits, lm_head, a["xb"]});
        if (cap) cb.tensor(Op::SOFTCAP, {row_logits, row_logits, cap});
        cb.tensor(Op::SCORE, {table, row_logits});
        cb.endBlock();
        return block;
    }
    if (head == ForwardHead::Verify) {
        // Every row's logits: the target scores all K+1 positions of a speculation at once.
        uint32_t row_logits = activation("row_logits", BLUE_TC_ROWS, DType::F32, {cfg.n_vocab});
        cb.tensor(Op::RMSNORM, {a["xb"], a["x"], weight("output_norm.weight"), eps, 0});
        cb.tensor(Op::MATMUL, {row_logits, lm_head, a["xb"]});
        if (cap) cb.tensor(Op::SOFTCAP, {row_logits, row_logits, cap});
        cb.tensor(Op::SPEC, {table, row_logits, BLUE_FA_SAMPLING, BLUE_FA_SPEC});
        cb.endBlock();
        return block;
    }
    uint32_t xlast = activation("x_last", BLUE_TC_INSTANCE, DType::F32, {dim});
    uint32_t logits = activation("logits", BLUE_TC_INSTANCE, DType::F32, {cfg.n_vocab});
    cb.tensor(Op::RMSNORM, {xlast, a["x"], weight("output_norm.weight"), eps, 0});
    cb.tensor(Op::MATMUL, {logits, lm_head, xlast});
    if (cap) cb.tensor(Op::SOFTCAP, {logits, logits, cap});
    if (head == ForwardHead::SampleQ) {
        cb.tensor(Op::SAMPLEQ, {logits, BLUE_FA_SAMPLING, table});
    } else if (grammar != kNone) {
        cb.tensor(Op::SAMPLEG, {logits, BLUE_FA_SAMPLING, grammar, token_bytes});
    } else {
        cb.tensor(Op::SAMPLE, {logits, BLUE_FA_SAMPLING});
    }
    cb.endBlock();
    return block;
}

// A dense FFN on the normed rows xb, added into x: SwiGLU or (gemma) GeGLU of the gate and up
// projections (phi3's ffn_up holds the gate's rows, then the up rows), the down projection, and
// (gemma) its post-FFN norm.
void Lowering::feedForward(CodeBuilder& cb, uint32_t l, const std::map<std::string, uint32_t>& a) {
    const uint32_t eps = floatBits(cfg.rms_norm_eps), f = cfg.n_ff;
    const uint32_t hb = a.at("hb"), hb2 = a.at("hb2"), xb = a.at("xb"), xb2 = a.at("xb2"), x = a.at("x");
    uint32_t gate_w = cfg.fused_up ? layerWeightRows(l, "ffn_up.weight", 0, f) : layerWeight(l, "ffn_gate.weight");
    uint32_t up_w = cfg.fused_up ? layerWeightRows(l, "ffn_up.weight", f, f) : layerWeight(l, "ffn_up.weight");
    cb.tensor(Op::MATMUL, {hb, gate_w, xb});
    cb.tensor(Op::MATMUL, {hb2, up_w, xb});
    cb.tensor(cfg.gelu_ffn ? Op::GEGLU : Op::SWIGLU, {hb, hb, hb2});
    if (cfg.post_norms) {
        cb.tensor(Op::MATMUL, {xb2, layerWeight(l, "ffn_down.weight"), hb});
        cb.tensor(Op::RMSNORM, {xb2, xb2, layerWeight(l, "post_ffw_norm.weight"), eps, 0});
        cb.tensor(Op::TADD, {x, x, xb2});
    } else {
        cb.tensor(Op::MATMULADD, {x, layerWeight(l, "ffn_down.weight"), hb});
    }
}

// A mixture-of-experts FFN on the normed rows xb, added into x. The router's logits pick each
// row's k experts on the GPU (MOEROUTE, gated as the architecture does in llama.cpp: Mixtral and
// qwen3moe renormalise the top-k softmax weights, qwen2moe keeps softmax-over-all weights); the
// expert matmuls (MOEMM) read only the chosen experts' matrices, each expert once for all the
// rows of all instances that chose it; MOEMIX adds the weighted slots (and qwen2moe's shared
// expert, scaled by sigmoid of its own gate) to the residual.
void Lowering::experts(CodeBuilder& cb, uint32_t l, const std::map<std::string, uint32_t>& a) {
    const uint32_t E = cfg.n_expert, k = cfg.n_expert_used, f = cfg.n_ff_exp, dim = cfg.n_embd;
    const uint32_t logits = activation("moe_logits", BLUE_TC_ROWS, DType::F32, {E});
    const uint32_t sel = activation("moe_sel", BLUE_TC_ROWS, DType::F32, {2 * k});
    const uint32_t map = activation("moe_map", BLUE_TC_GLOBAL, DType::I32,
                                    {BLUE_MOE_MAP_WORDS(uint64_t(E), uint64_t(m.layout.max_rows) * k)});
    const uint32_t gate = activation("moe_gate", BLUE_TC_ROWS, DType::F32, {k * f});
    const uint32_t up = activation("moe_up", BLUE_TC_ROWS, DType::F32, {k * f});
    const uint32_t down = activation("moe_down", BLUE_TC_ROWS, DType::F32, {k * dim});
    const uint32_t xb = a.at("xb"), x = a.at("x");
    cb.tensor(Op::MATMUL, {logits, layerWeight(l, "ffn_gate_inp.weight"), xb});
    cb.tensor(Op::MOEROUTE, {sel, logits, map, k, cfg.expert_weights_norm ? 0u : 1u});
    cb.tensor(Op::MOEMM, {gate, layerWeight(l, "ffn_gate_exps.weight"), xb, map});
    cb.tensor(Op::MOEMM, {up, layerWeight(l, "ffn_up_exps.weight"), xb, map});
    cb.tensor(Op::SWIGLU, {gate, gate, up});
    cb.tensor(Op::MOEMM, {down, layerWeight(l, "ffn_down_exps.weight"), gate, map});
    uint32_t shared = kNone, shared_gate = kNone;
    if (cfg.n_ff_shexp > 0) {
        const uint32_t s = cfg.n_ff_shexp;
        const uint32_t hs = activation("shexp_h", BLUE_TC_ROWS, DType::F32, {s});
        const uint32_t hs2 = activation("shexp_h2", BLUE_TC_ROWS, DType::F32, {s});
        shared = activation("shexp_out", BLUE_TC_ROWS, DType::F32, {dim});
        shared_gate = activation("shexp_gate", BLUE_TC_ROWS, DType::F32, {1});
        cb.tensor(Op::MATMUL, {hs, layerWeight(l, "ffn_gate_shexp.weight"), xb});
        cb.tensor(Op::MATMUL, {hs2, layerWeight(l, "ffn_up_shexp.weight"), xb});
        cb.tensor(Op::SWIGLU, {hs, hs, hs2});
        cb.tensor(Op::MATMUL, {shared, layerWeight(l, "ffn_down_shexp.weight"), hs});
        // The gate's weight is a vector [dim] in the file: a one-row matrix to MATMUL.
        const uint32_t gw = layerWeight(l, "ffn_gate_inp_shexp.weight");
        m.tensors[gw].ndim = 2;
        m.tensors[gw].ne[1] = 1;
        cb.tensor(Op::MATMUL, {shared_gate, gw, xb});
    }
    cb.tensor(Op::MOEMIX, {x, x, down, sel, shared, shared_gate});
}

void Lowering::attention(CodeBuilder& cb, uint32_t l, uint32_t ctx,
                         const std::map<std::string, uint32_t>& a) {
    const uint32_t kv_dim = cfg.n_head_kv * cfg.head_dim;
    const uint32_t q_dim = cfg.n_head * cfg.head_dim;
    const uint32_t q = a.at("q"), k = a.at("k"), v = a.at("v"), xb = a.at("xb");
    if (cfg.fused_qkv) {  // phi3: Q, K and V rows of one matrix
        cb.tensor(Op::MATMUL, {q, layerWeightRows(l, "attn_qkv.weight", 0, q_dim), xb});
        cb.tensor(Op::MATMUL, {k, layerWeightRows(l, "attn_qkv.weight", q_dim, kv_dim), xb});
        cb.tensor(Op::MATMUL, {v, layerWeightRows(l, "attn_qkv.weight", q_dim + kv_dim, kv_dim), xb});
    } else {
        cb.tensor(Op::MATMUL, {q, layerWeight(l, "attn_q.weight"), xb});
        cb.tensor(Op::MATMUL, {k, layerWeight(l, "attn_k.weight"), xb});
        cb.tensor(Op::MATMUL, {v, layerWeight(l, "attn_v.weight"), xb});
    }
    if (cfg.has_qkv_bias) {
        cb.tensor(Op::TADD, {q, q, layerWeight(l, "attn_q.bias")});
        cb.tensor(Op::TADD, {k, k, layerWeight(l, "attn_k.bias")});
        cb.tensor(Op::TADD, {v, v, layerWeight(l, "attn_v.bias")});
    }
    uint32_t eps = floatBits(cfg.rms_norm_eps);
    if (cfg.has_qk_norm) {
        cb.tensor(Op::RMSNORM, {q, q, layerWeight(l, "attn_q_norm.weight"), eps, cfg.head_dim});
        cb.tensor(Op::RMSNORM, {k, k, layerWeight(l, "attn_k_norm.weight"), eps, cfg.head_dim});
    }
    // Frequency factors: rope_freqs, else (phi3 LongRoPE, as llama.cpp picks them) the long ones
    // when the context passes the original one, else the short ones.
    uint32_t freqs = kNone;
    bool long_ctx = ctx > cfg.rope_scaling_orig_ctx;
    if (cfg.has_rope_freqs) {
        freqs = weight("rope_freqs.weight");
    } else if (long_ctx ? cfg.has_rope_long : cfg.has_rope_short) {
        freqs = weight(long_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight");
    }
    uint32_t mode = cfg.rope_mode == RopeMode::Neox ? 2 : 0;
    float scale = cfg.rope_scaling == RopeScaling::Linear ? 1.0f / cfg.rope_scaling_factor : 1.0f;
    float base = cfg.rope_freq_base;
    const bool sliding = cfg.isSlidingLayer(l);
    const bool own_base = sliding && cfg.rope_freq_base_swa > 0;
    if (own_base) {  // gemma3's local layers: their own base, unscaled
        base = cfg.rope_freq_base_swa;
        scale = 1.0f;
    } else if (cfg.rope_scaling == RopeScaling::Yarn) {  // YaRN: a divisor per pair (checkLowerable)
        freqs = yarnDivisors();
    }
    for (uint32_t t : {q, k}) {
        cb.tensor(Op::ROPE, {t, t, freqs, BLUE_FA_POS, cfg.head_dim, cfg.n_rot, mode,
                             floatBits(base), floatBits(scale)});
    }
    std::string ln = std::to_string(l);
    uint32_t kc = activation("kcache." + ln, BLUE_TC_INSTANCE, kv_type, {kv_dim, ctx});
    uint32_t vc = activation("vcache." + ln, BLUE_TC_INSTANCE, kv_type, {kv_dim, ctx});
    cb.tensor(Op::KVSTORE, {k, kc, v, vc, BLUE_FA_POS});
    // RoPE's attention factor scales the rotated Q and K, so their products by its square.
    const float magnitude = ropeMagnitude(cfg, own_base);
    float qscale = (cfg.attn_scale > 0 ? cfg.attn_scale : 1.0f / std::sqrt(float(cfg.head_dim))) * magnitude * magnitude;
    if (sliding || cfg.attn_softcap > 0) {
        cb.tensor(Op::ATTNX, {a.at("att"), kc, vc, q, cfg.n_head, cfg.n_head_kv, BLUE_FA_POS, floatBits(qscale),
                              sliding ? cfg.sliding_window : 0u, floatBits(cfg.attn_softcap)});
    } else {
        cb.tensor(Op::ATTN, {a.at("att"), kc, vc, q, cfg.n_head, cfg.n_head_kv, BLUE_FA_POS, floatBits(qscale)});
    }
}

// Registers of the generation program.
enum Reg : uint8_t {
    kSlot = 1, kTmp, kTmp2, kPrompt, kMaxNew, kTag, kPos, kGenerated, kCtx, kChunk, kMinus1,
    kTok, kI, kN, kWord, kHist, kNStop, kFlags, kArgRows = 20, kArgPos, kArgTokens, kArgSampling, kIid, kCancelMark, kFlagWord,
    kStart, kLp, kReuse, kEmbed, kSess,
};

// Where SAMPLE writes the top log-probabilities: after the history.
uint32_t topLogprobsAddr(uint32_t ctx) { return BLUE_LM_HISTORY + ctx; }
// The word after them: positions whose KV rows match the history (vm/llm_abi.h).
uint32_t kvValidAddr(uint32_t ctx) { return topLogprobsAddr(ctx) + 2 * BLUE_MAX_TOP_LOGPROBS; }
// The word after it: the first position whose KV row and token a session save writes (those
// before it came from the slot unchanged).
uint32_t sessionFromAddr(uint32_t ctx) { return kvValidAddr(ctx) + 1; }

// Jumps to `skip` unless the request continues a conversation its slot holds: no session, or a
// new one (BLUE_REQ_FLAG_SESSION_NEW: the slot holds another's or nothing).
void Lowering::unlessStored(CodeBuilder& cb, CodeBuilder::Label skip) {
    cb.jump(Op::BEQZ, {kSess}, skip);
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_SESSION_NEW);
    cb.jump(Op::BNEZ, {kWord}, skip);
}

// A session request before prefix reuse: the slot's tokens become the history and its count the
// positions whose KV rows are valid, so INCMP finds what the prompt shares with the conversation.
// Not for a new session (nothing stored) or a request without one.
void Lowering::loadSession(CodeBuilder& cb, uint32_t ctx) {
    auto done = cb.newLabel("session_loaded"), copy = cb.newLabel("session_copy");
    unlessStored(cb, done);
    cb.op(Op::ADDI, {kN, kSess}, uint32_t(-1));
    cb.op(Op::MULI, {kN, kN}, ctx + 1);  // the slot's count word
    cb.op(Op::TLD, {kWord, kN}, session_tokens);
    cb.op(Op::MINU, {kWord, kWord, kCtx});
    cb.op(Op::ST, {kWord, 0}, kvValidAddr(ctx));
    cb.li(kI, 0);
    cb.bind(copy);
    cb.jump(Op::BGEU, {kI, kWord}, done);
    cb.op(Op::ADD, {kTok, kN, kI});
    cb.op(Op::ADDI, {kTok, kTok}, 1);
    cb.op(Op::TLD, {kTok, kTok}, session_tokens);
    cb.op(Op::ST, {kTok, kI}, BLUE_LM_HISTORY);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, copy);
    cb.bind(done);
}

// At a request's end: its tokens and KV rows from sessionFrom to kPos go into its slot, and the
// slot's count becomes kPos. Nothing without a session.
void Lowering::saveSession(CodeBuilder& cb, uint32_t ctx) {
    auto done = cb.newLabel("session_saved"), copy = cb.newLabel("session_save_tokens");
    auto copied = cb.newLabel("session_tokens_saved");
    cb.jump(Op::BEQZ, {kSess}, done);
    cb.op(Op::ADDI, {kArgPos, kSess}, uint32_t(-1));  // block argument 1: the slot
    cb.op(Op::MULI, {kN, kArgPos}, ctx + 1);
    cb.op(Op::TST, {kPos, kN}, session_tokens);
    cb.op(Op::LD, {kI, 0}, sessionFromAddr(ctx));
    cb.op(Op::MOV, {kArgTokens, kI});  // block argument 2: the first row
    cb.bind(copy);
    cb.jump(Op::BGEU, {kI, kPos}, copied);
    cb.op(Op::LD, {kTok, kI}, BLUE_LM_HISTORY);
    cb.op(Op::ADD, {kWord, kN, kI});
    cb.op(Op::ADDI, {kWord, kWord}, 1);
    cb.op(Op::TST, {kTok, kWord}, session_tokens);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, copy);
    cb.bind(copied);
    cb.li(kArgRows, 1);
    cb.op(Op::MOV, {kArgSampling, kPos});  // block argument 3: the end row
    cb.op(Op::RUN, {kArgRows}, session_save);
    cb.bind(done);
}

// Which idle instance takes the next request is decided here, on the GPU, by what the instances
// hold (INPEEK looks at the next message without taking it; INCMP compares its prompt with the
// instance's history, as prefix reuse does):
//   - an instance whose KV rows hold more than the prompt's first token takes it at once;
//   - an instance that holds nothing takes it one cycle after the message was first seen;
//   - an instance that holds another conversation, two cycles after.
// So a conversation's next turn goes to the instance that holds it, and a new one to an empty
// instance before it displaces anyone's rows. The first instance to see a message marks it (heap
// words: per input slot, the message's tag + 1 at kSeenTagHeap and the cycle in_slots words after).
// Several holders race; whichever claims first takes it. INRECV takes the next message, which may
// be another than the one looked at: the instance runs whatever it claims, so this choice moves
// work and never changes results. kSlot is the claimed slot after it.
void Lowering::claimRequest(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label halt) {
    auto peek = cb.newLabel("peek_request"), waiting = cb.newLabel("request_waiting");
    auto seen = cb.newLabel("request_seen"), wait = cb.newLabel("request_wait");
    auto claim = cb.newLabel("claim_request");
    cb.bind(peek);
    cb.op(Op::INPEEK, {kSlot});
    cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
    cb.li(kWord, 0xFFFFFFFEu);
    cb.jump(Op::BNE, {kSlot, kWord}, waiting);
    cb.bind(wait);
    cb.op(Op::YIELD, {});
    cb.jump(Op::JMP, {}, peek);
    cb.bind(waiting);
    // The prompt starts after the header and the grammar section (its length word, then that
    // many words).
    cb.li(kTmp2, BLUE_REQ_HEADER);
    cb.op(Op::INLEN, {kTmp, kSlot});
    cb.jump(Op::BGEU, {kTmp2, kTmp}, claim);  // no grammar word: malformed, let the request reject it
    cb.op(Op::INLD, {kWord, kSlot, kTmp2});
    cb.op(Op::ADD, {kTmp2, kTmp2, kWord});
    cb.op(Op::ADDI, {kTmp2, kTmp2}, 1);
    cb.jump(Op::BLTU, {kTmp, kTmp2}, claim);
    cb.li(kReuse, BLUE_LM_HISTORY);
    cb.op(Op::INCMP, {kReuse, kSlot, kTmp2});
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.li(kWord, 2);
    cb.jump(Op::BGEU, {kReuse, kWord}, claim);  // holds more of it than the first token
    cb.li(kTmp, BLUE_REQ_TAG);
    cb.op(Op::INLD, {kTag, kSlot, kTmp});
    cb.op(Op::ADDI, {kTag, kTag}, 1);
    cb.op(Op::LDG, {kWord, kSlot}, kSeenTagHeap);
    cb.jump(Op::BEQ, {kWord, kTag}, seen);
    cb.op(Op::STG, {kTag, kSlot}, kSeenTagHeap);  // the first to see it
    cb.op(Op::CYCLE, {kWord});
    cb.op(Op::STG, {kWord, kSlot}, kSeenTagHeap + m.layout.in_slots);
    cb.jump(Op::JMP, {}, wait);
    cb.bind(seen);
    cb.op(Op::CYCLE, {kTmp});
    cb.op(Op::LDG, {kWord, kSlot}, kSeenTagHeap + m.layout.in_slots);
    cb.op(Op::SUB, {kTmp, kTmp, kWord});  // cycles since it was first seen
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::SEQI, {kN, kWord}, 0);  // 1: this instance holds nothing
    cb.li(kWord, 2);
    cb.op(Op::SUB, {kN, kWord, kN});  // cycles to wait: 1 when empty, else 2
    cb.jump(Op::BLTU, {kTmp, kN}, wait);
    cb.bind(claim);
    cb.op(Op::INRECV, {kSlot});
    cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
}

void Lowering::generationProgram(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk) {
    auto next = cb.newLabel("next_request"), halt = cb.newLabel("halt");
    auto copy_params = cb.newLabel("copy_params"), copy_stop = cb.newLabel("copy_stop");
    auto prefill = cb.newLabel("prefill"), gen = cb.newLabel("generate");
    auto finish = cb.newLabel("finish"), chunk_ok = cb.newLabel("chunk_ok");
    auto eog_loop = cb.newLabel("eog_loop"), stop_loop = cb.newLabel("stop_loop");
    auto emit = cb.newLabel("emit"), reject = cb.newLabel("reject");

    // End-of-generation tokens of the model, in the constant pool: {count, ids...}.
    std::vector<uint32_t> eog = endOfGenerationTokens(gguf, cfg);
    uint32_t eog_at = uint32_t(m.consts.size());
    m.consts.push_back(uint32_t(eog.size()));
    m.consts.insert(m.consts.end(), eog.begin(), eog.end());
    // The loop's LDK names eog_at + 1 even when the count is 0 (a file without end tokens): the
    // verifier checks that offset against the pool, so it must exist (never read then).
    if (eog.empty()) m.consts.push_back(0);
    m.syms.push_back({SymKind::CONST, eog_at, "eog_tokens"});

    cb.li(kMinus1, 0xFFFFFFFFu);
    cb.li(kCtx, ctx);
    cb.op(Op::IID, {kIid});
    cb.bind(next);
    claimRequest(cb, ctx, halt);
    cb.li(kTmp, BLUE_REQ_TAG);
    cb.op(Op::INLD, {kTag, kSlot, kTmp});
    cb.op(Op::OUTBEGIN, {kTag});
    cb.op(Op::ADDI, {kCancelMark, kTag}, 1);  // the host sets this instance's flag to tag + 1 to cancel
    cb.li(kTmp, BLUE_REQ_MAX_NEW);
    cb.op(Op::INLD, {kMaxNew, kSlot, kTmp});
    cb.li(kTmp, BLUE_REQ_FLAGS);
    cb.op(Op::INLD, {kFlags, kSlot, kTmp});  // all flags until prefix reuse read its own
    // An embedding request runs the embed block and emits the pooled vector; a program lowered
    // without one rejects it.
    cb.op(Op::ANDI, {kEmbed, kFlags}, BLUE_REQ_FLAG_EMBED);
    if (embed_block == kNone) cb.jump(Op::BNEZ, {kEmbed}, reject);
    // A session (1 + its slot): none beyond the program's slots.
    cb.li(kTmp, BLUE_REQ_SESSION);
    cb.op(Op::INLD, {kSess, kSlot, kTmp});
    cb.li(kWord, sessions + 1);
    cb.jump(Op::BGEU, {kSess, kWord}, reject);
    if (sessions) {  // a save writes from here on; loading a stored conversation moves it
        cb.li(kWord, 0);
        cb.op(Op::ST, {kWord, 0}, sessionFromAddr(ctx));
    }
    // Log-probabilities: kLp = 0 (none) or 1 + N alternatives, which SAMPLE writes when N > 0.
    cb.li(kTmp, BLUE_REQ_LOGPROBS);
    cb.op(Op::INLD, {kLp, kSlot, kTmp});
    cb.li(kTmp, BLUE_MAX_TOP_LOGPROBS + 1);
    cb.op(Op::MINU, {kLp, kLp, kTmp});
    cb.op(Op::ADDI, {kWord, kLp}, uint32_t(-1));
    cb.op(Op::MINU, {kWord, kWord, kLp});  // kLp - 1, or 0 when kLp is 0
    cb.op(Op::ST, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_TOP_N);
    cb.li(kWord, topLogprobsAddr(ctx));
    cb.op(Op::ST, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_TOP_ADDR);
    // Sampling parameters: request words TEMP..SEED map in order onto SP_TEMP..SP_SEED.
    cb.li(kI, 0);
    cb.li(kN, BLUE_SP_SEED + 1);
    cb.bind(copy_params);
    cb.op(Op::ADDI, {kTmp, kI}, BLUE_REQ_TEMP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.op(Op::ST, {kWord, kI}, BLUE_LM_SAMPLING + BLUE_SP_TEMP);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::BLTU, {kI, kN}, copy_params);
    // Stop tokens of the request: the count (clamped) and all slots.
    cb.li(kTmp, BLUE_REQ_N_STOP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.li(kTmp, BLUE_REQ_MAX_STOP);
    cb.op(Op::MINU, {kNStop, kWord, kTmp});
    cb.li(kI, 0);
    cb.bind(copy_stop);
    cb.op(Op::ADDI, {kTmp, kI}, BLUE_REQ_STOP);
    cb.op(Op::INLD, {kWord, kSlot, kTmp});
    cb.op(Op::ST, {kWord, kI}, BLUE_LM_STOP);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.li(kN, BLUE_REQ_MAX_STOP);
    cb.jump(Op::BLTU, {kI, kN}, copy_stop);
    // The prompt goes into the history at its start position (the positions before it are a
    // restored conversation: history and KV rows the host wrote); one that does not fit is
    // rejected.
    cb.li(kTmp, BLUE_REQ_START);
    cb.op(Op::INLD, {kStart, kSlot, kTmp});
    cb.jump(Op::BGEU, {kStart, kCtx}, reject);
    // The grammar section (its length, then the automaton) goes into the instance's grammar
    // tensor, which starts empty (no grammar); kTmp2 = where the prompt starts. A program
    // lowered without grammars skips the (empty) section.
    cb.li(kTmp2, BLUE_REQ_HEADER);
    if (grammar != kNone) {
        // A large automaton is copied in a cycle of its own, at its start: lavapipe ends every
        // loop of a sequencer invocation after 65,535 iterations in all (one 8-lane group), and
        // INTCPY takes one word an iteration. Instances that resume at the copy all run it in the
        // same round of slow instructions, so their copies overlap instead of adding up, and the
        // prompt's comparisons wait for the next cycle. The host keeps an automaton under the
        // limit on such devices (maxGrammarWords).
        auto copy_grammar = cb.newLabel("copy_grammar");
        cb.op(Op::INLD, {kWord, kSlot, kTmp2});
        cb.li(kTmp, kGrammarCopyAlone);
        cb.op(Op::SLTU, {kN, kTmp, kWord});  // 1: copied in a cycle of its own
        cb.jump(Op::BEQZ, {kN}, copy_grammar);
        cb.op(Op::YIELD, {});
        cb.bind(copy_grammar);
        cb.li(kWord, 0);
        cb.li(kTmp, BLUE_GR_STATES);
        cb.op(Op::TST, {kWord, kTmp}, grammar);
        cb.op(Op::INTCPY, {kTmp2, kSlot}, grammar);
        auto copied = cb.newLabel("grammar_copied");
        cb.jump(Op::BEQZ, {kN}, copied);
        cb.op(Op::YIELD, {});
        cb.bind(copied);
    } else {
        cb.op(Op::INLD, {kWord, kSlot, kTmp2});
        cb.jump(Op::BNEZ, {kWord}, reject);
        cb.op(Op::ADDI, {kTmp2, kTmp2}, 1);
    }
    cb.op(Op::INLEN, {kTmp, kSlot});
    cb.op(Op::SUB, {kTmp, kTmp, kTmp2});
    cb.jump(Op::BGEU, {kTmp, kCtx}, reject);
    cb.op(Op::ADD, {kTmp, kTmp, kStart});
    cb.jump(Op::BGEU, {kTmp, kCtx}, reject);
    cb.li(kHist, BLUE_LM_HISTORY);
    // Prefix reuse: the KV rows of the positions the instance processed last stay valid for the
    // leading prompt tokens that equal its history there, so prefill starts after them (at most
    // at the last prompt token, whose logits give the first sample). Not for a restored
    // conversation (the host wrote what precedes the start) or when the request opts out.
    auto no_reuse = cb.newLabel("no_reuse");
    cb.li(kReuse, 0);
    cb.jump(Op::BNEZ, {kStart}, no_reuse);
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_NO_PREFIX);
    cb.jump(Op::BNEZ, {kWord}, no_reuse);
    // Mean and first-token pooling need every prompt row computed in this request.
    if (pooling == Pooling::Mean || pooling == Pooling::Cls) cb.jump(Op::BNEZ, {kEmbed}, no_reuse);
    if (sessions) loadSession(cb, ctx);
    cb.li(kReuse, BLUE_LM_HISTORY);
    cb.op(Op::INCMP, {kReuse, kSlot, kTmp2});
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.op(Op::ADDI, {kWord, kTmp}, uint32_t(-1));  // kTmp: prompt length (start is 0)
    cb.op(Op::MINU, {kReuse, kReuse, kWord});       // no prompt: -1, and kReuse is 0 already
    cb.jump(Op::BEQZ, {kReuse}, no_reuse);
    cb.op(Op::OUTU, {kReuse});
    if (sessions) {  // the shared rows of a stored conversation come from its slot
        auto own = cb.newLabel("own_rows");
        unlessStored(cb, own);
        cb.li(kArgRows, 1);
        cb.op(Op::ADDI, {kArgPos, kSess}, uint32_t(-1));
        cb.li(kArgTokens, 0);
        cb.op(Op::MOV, {kArgSampling, kReuse});
        cb.op(Op::RUN, {kArgRows}, session_load);
        cb.op(Op::ST, {kReuse, 0}, sessionFromAddr(ctx));
        cb.bind(own);
    }
    cb.bind(no_reuse);
    cb.op(Op::ANDI, {kFlags, kFlags}, BLUE_REQ_FLAG_IGNORE_EOG);
    cb.op(Op::ADD, {kPos, kStart, kReuse});  // one of them is 0
    cb.op(Op::ADD, {kPrompt, kHist, kStart});
    cb.op(Op::INCPY, {kPrompt, kSlot, kTmp2});  // kPrompt = prompt length
    cb.op(Op::INFREE, {kSlot});
    cb.jump(Op::BEQZ, {kPrompt}, finish);
    cb.op(Op::ADD, {kPrompt, kPrompt, kStart});  // kPrompt = the position after the prompt
    cb.op(Op::ST, {kHist, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_ADDR);
    cb.li(kChunk, chunk);
    cb.li(kArgSampling, BLUE_LM_SAMPLING);
    // Prefill in chunks; every chunk samples, the last chunk's sample is the first token.
    cb.bind(prefill);
    cb.op(Op::SUB, {kArgRows, kPrompt, kPos});
    cb.jump(Op::BLTU, {kArgRows, kChunk}, chunk_ok);
    cb.op(Op::MOV, {kArgRows, kChunk});
    cb.bind(chunk_ok);
    cb.op(Op::MOV, {kArgPos, kPos});
    cb.op(Op::ADD, {kArgTokens, kHist, kPos});
    cb.op(Op::ADD, {kPos, kPos, kArgRows});
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
    // The RNG counter is the position of the token being sampled, so a seed draws the same
    // numbers however the sequence was split into chunks, requests or restored snapshots.
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    if (embed_block != kNone) {
        auto run_embed = cb.newLabel("run_embed"), ran = cb.newLabel("ran");
        cb.jump(Op::BNEZ, {kEmbed}, run_embed);
        cb.op(Op::RUN, {kArgRows}, block);
        cb.jump(Op::JMP, {}, ran);
        cb.bind(run_embed);
        cb.op(Op::RUN, {kArgRows}, embed_block);
        cb.bind(ran);
    } else {
        cb.op(Op::RUN, {kArgRows}, block);
    }
    cb.jump(Op::BLTU, {kPos, kPrompt}, prefill);
    if (embed_block != kNone) {  // the pooled vector, one OUTF per element, ends the request
        auto embedded = cb.newLabel("generate_or_embed"), emit_pooled = cb.newLabel("emit_pooled");
        cb.jump(Op::BEQZ, {kEmbed}, embedded);
        cb.li(kI, 0);
        cb.li(kN, cfg.n_embd);
        cb.bind(emit_pooled);
        cb.op(Op::TLD, {kWord, kI}, pooled);
        cb.op(Op::OUTF, {kWord});
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::BLTU, {kI, kN}, emit_pooled);
        cb.jump(Op::JMP, {}, finish);
        cb.bind(embedded);
    }
    cb.li(kGenerated, 0);
    // Decode: check the sampled token, emit it, feed it back.
    cb.bind(gen);
    cb.jump(Op::BGEU, {kGenerated, kMaxNew}, finish);
    cb.op(Op::LD, {kTok, 0}, BLUE_LM_SAMPLING + BLUE_SP_OUT_TOKEN);
    cb.jump(Op::BNEZ, {kFlags}, stop_loop);
    cb.li(kI, 0);
    cb.li(kTmp2, 0);
    cb.op(Op::LDK, {kN, kTmp2}, eog_at);
    cb.bind(eog_loop);
    cb.jump(Op::BGEU, {kI, kN}, stop_loop);
    cb.op(Op::LDK, {kWord, kI}, eog_at + 1);
    cb.jump(Op::BEQ, {kTok, kWord}, finish);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, eog_loop);
    cb.bind(stop_loop);
    cb.li(kI, 0);
    auto stop_next = cb.newLabel("stop_next");
    cb.bind(stop_next);
    cb.jump(Op::BGEU, {kI, kNStop}, emit);
    cb.op(Op::LD, {kWord, kI}, BLUE_LM_STOP);
    cb.jump(Op::BEQ, {kTok, kWord}, finish);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, stop_next);
    // Asked for: the token's log-probability and its alternatives' go out ahead of it.
    auto emit_token = cb.newLabel("emit_token"), emit_top = cb.newLabel("emit_top");
    cb.bind(emit);
    cb.jump(Op::BEQZ, {kLp}, emit_token);
    cb.op(Op::LD, {kWord, 0}, BLUE_LM_SAMPLING + BLUE_SP_OUT_LOGPROB);
    cb.op(Op::OUTF, {kWord});
    cb.li(kI, 0);
    cb.op(Op::ADDI, {kN, kLp}, uint32_t(-1));
    cb.bind(emit_top);
    cb.jump(Op::BGEU, {kI, kN}, emit_token);
    cb.op(Op::ADD, {kTmp, kI, kI});
    cb.op(Op::LD, {kWord, kTmp}, topLogprobsAddr(ctx));
    cb.op(Op::OUT, {kWord});
    cb.op(Op::LD, {kWord, kTmp}, topLogprobsAddr(ctx) + 1);
    cb.op(Op::OUTF, {kWord});
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, emit_top);
    cb.bind(emit_token);
    cb.op(Op::OUTT, {kTok});
    if (grammar != kNone) {  // the automaton takes the emitted token at the next sample
        cb.op(Op::ADDI, {kWord, kTok}, 1);
        cb.li(kTmp, BLUE_GR_PENDING);
        cb.op(Op::TST, {kWord, kTmp}, grammar);
    }
    cb.op(Op::ADDI, {kGenerated, kGenerated}, 1);
    cb.op(Op::INFLAG, {kFlagWord, kIid});
    cb.jump(Op::BEQ, {kFlagWord, kCancelMark}, finish);
    cb.jump(Op::BGEU, {kPos, kCtx}, finish);
    cb.op(Op::ST, {kTok, kPos}, BLUE_LM_HISTORY);
    cb.li(kArgRows, 1);
    cb.op(Op::MOV, {kArgPos, kPos});
    cb.op(Op::ADD, {kArgTokens, kHist, kPos});
    cb.op(Op::ADDI, {kPos, kPos}, 1);
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN);
    cb.op(Op::ST, {kPos, 0}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    cb.op(Op::RUN, {kArgRows}, block);
    cb.jump(Op::JMP, {}, gen);
    cb.bind(reject);
    cb.op(Op::INFREE, {kSlot});
    cb.li(kSess, 0);  // a rejected request saves nothing into a session
    cb.bind(finish);
    // The positions before kPos hold KV rows of the history's tokens: what the next request may
    // reuse. (A rejected request leaves kPos as the last request ended it.)
    cb.op(Op::ST, {kPos, 0}, kvValidAddr(ctx));
    if (sessions) saveSession(cb, ctx);
    cb.op(Op::OUTEND, {kTag});
    cb.jump(Op::JMP, {}, next);
    cb.bind(halt);
    cb.op(Op::HALT);
}

}  // namespace

Result<uint32_t> checkGenerationModule(const Module& m, const std::string& path) {
    const std::string* kind = m.metaValue(kMetaKind);
    if (!kind || *kind != "llm-generate" || m.externs.empty()) {
        return BLUE_ERROR("%s: not a generation program (lower a model with `bluec lower`)", path.c_str());
    }
    const std::string* layout = m.metaValue(kMetaRequest);
    if (!layout || *layout != std::to_string(BLUE_REQ_LAYOUT)) {
        return BLUE_ERROR("%s: lowered by an older bluec (request layout %s; this build's is %u): lower the model again",
                          path.c_str(), layout ? layout->c_str() : "1", BLUE_REQ_LAYOUT);
    }
    const std::string* ctx = m.metaValue(kMetaCtx);
    uint64_t n = 0;
    bool digits = ctx && !ctx->empty() && ctx->size() <= 10;
    for (size_t i = 0; digits && i < ctx->size(); ++i) {
        digits = (*ctx)[i] >= '0' && (*ctx)[i] <= '9';
        n = n * 10 + uint64_t((*ctx)[i] - '0');
    }
    if (!digits || n < 2 || n > UINT32_MAX) {
        return BLUE_ERROR("%s: %s '%s' is not a context length", path.c_str(), kMetaCtx,
                          ctx ? ctx->c_str() : "(missing)");
    }
    return uint32_t(n);
}

const char* poolingName(Pooling p) {
    switch (p) {
        case Pooling::Mean: return "mean";
        case Pooling::Cls: return "cls";
        case Pooling::Last: return "last";
        default: return "none";
    }
}

std::optional<Pooling> parsePooling(std::string_view name) {
    for (Pooling p : {Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last}) {
        if (name == poolingName(p)) return p;
    }
    return std::nullopt;
}

Result<Pooling> poolingOf(const GgufFile& gguf, const ModelConfig& cfg) {
    const std::string key = cfg.arch_name + ".pooling_type";
    if (!gguf.has(key)) return Pooling::None;
    Result<uint32_t> v = gguf.getU32(key);
    if (!v) return v.status();
    if (v.value() == 4) return Pooling::None;  // rank: a reranker's head, which is not lowered
    if (v.value() > uint32_t(Pooling::Last)) {
        return BLUE_ERROR("%s: key '%s': pooling type %u is not supported (0 none, 1 mean, 2 cls, 3 last; "
                          "4, a reranker's, gives none)", gguf.name().c_str(), key.c_str(), v.value());
    }
    return Pooling(v.value());
}

Status checkLowerable(const ModelConfig& cfg) {
    if (cfg.isMoe() && (cfg.n_expert > BLUE_MOE_MAX_EXPERTS || cfg.n_expert_used > BLUE_MOE_MAX_SLOTS)) {
        return BLUE_ERROR("%u experts with %u per token: at most %u experts and %u per token are supported",
                          cfg.n_expert, cfg.n_expert_used, BLUE_MOE_MAX_EXPERTS, BLUE_MOE_MAX_SLOTS);
    }
    if (cfg.rope_scaling == RopeScaling::Yarn && (cfg.has_rope_freqs || cfg.has_rope_long || cfg.has_rope_short)) {
        return Status::error("rope scaling 'yarn' together with frequency-factor tensors (rope_freqs/rope_factors_*) is not supported");
    }
    if (cfg.head_dim_v != cfg.head_dim) return Status::error("K and V head sizes differ; not supported");
    return Status::ok();
}

uint32_t addForwardBlock(Module& m, CodeBuilder& cb, const GgufFile& gguf, const ModelConfig& cfg,
                         DType kv_type, uint32_t ctx, uint32_t extern_index, const std::string& prefix,
                         ForwardHead head, uint32_t table) {
    Lowering lw{gguf, cfg, kv_type, m, prefix, extern_index, {}};
    // Blocks of the same model share its tensors (weights, activations, KV caches).
    for (uint32_t i = 0; i < m.tensors.size(); ++i) {
        if (!prefix.empty() && m.tensors[i].name.compare(0, prefix.size(), prefix) == 0) lw.ids[m.tensors[i].name] = i;
    }
    return lw.forwardBlock(cb, ctx, head, table);
}

std::vector<uint32_t> tokenBytesTable(const Tokenizer& tok, uint32_t vocab) {
    std::vector<uint32_t> info(vocab, BLUE_TB_NONE << 8);
    std::string bytes;
    for (uint32_t t = 0; t < vocab && int32_t(t) < tok.vocabSize(); ++t) {
        if (tok.isEog(int32_t(t))) {
            info[t] = BLUE_TB_END << 8;
            continue;
        }
        if (tok.isControl(int32_t(t))) continue;
        std::string_view p = tok.piece(int32_t(t));
        if (p.empty() || p.size() > 255 || bytes.size() + p.size() >= (1u << 22)) continue;
        info[t] = uint32_t(bytes.size()) << 10 | BLUE_TB_TEXT << 8 | uint32_t(p.size());
        bytes += p;
    }
    std::vector<uint32_t> out(info);
    out.resize(vocab + (bytes.size() + 3) / 4, 0);
    std::memcpy(out.data() + vocab, bytes.data(), bytes.size());
    return out;
}

std::vector<uint32_t> endOfGenerationTokens(const GgufFile& gguf, const ModelConfig& cfg) {
    std::vector<uint32_t> eog;
    for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                            "tokenizer.ggml.eom_token_id"}) {
        auto id = gguf.getU32(key);
        if (id.isOk() && id.value() < cfg.n_vocab) eog.push_back(id.value());
    }
    return eog;
}

Result<Module> lowerModel(const GgufFile& gguf, const ModelConfig& cfg, const LowerOptions& opt) {
    if (Status s = checkLowerable(cfg); !s) return Status::error(gguf.name() + ": " + s.message());
    uint32_t ctx = opt.ctx ? opt.ctx : std::min<uint32_t>(cfg.n_ctx_train ? cfg.n_ctx_train : 2048, 2048);
    uint32_t max_rows = opt.max_rows ? opt.max_rows : 512;
    uint32_t chunk = std::min(opt.chunk ? opt.chunk : 128, max_rows);
    if (ctx < 2) return Status::error("context length must be at least 2");
    if (max_rows > BLUE_MAX_ROWS) return BLUE_ERROR("max rows %u is above %u", max_rows, BLUE_MAX_ROWS);
    if (opt.sessions > kMaxSessions) return BLUE_ERROR("%u session slots: at most %u", opt.sessions, kMaxSessions);

    Module m;
    Lowering lw{gguf, cfg, opt.kv_type, m, "", 0, {}};
    m.externs.push_back(opt.model_path);
    m.layout.regs = 32;
    m.layout.local_words = sessionFromAddr(ctx) + 1;
    m.layout.in_slots = opt.in_slots;
    m.layout.in_slot_words = BLUE_REQ_HEADER + 1 + opt.grammar_words + ctx + 1;
    m.layout.max_rows = max_rows;
    m.layout.max_steps = 4096;
    m.layout.heap_words = 2 * opt.in_slots;  // claimRequest's marks: a tag and a cycle per input slot
    m.layout.heap_static = m.layout.heap_words;
    if (opt.grammar_words) {
        if (opt.grammar_words < BLUE_GR_HEADER_WORDS + 2) {
            return BLUE_ERROR("grammar words %u: at least %u, or 0 for none", opt.grammar_words, BLUE_GR_HEADER_WORDS + 2);
        }
        Result<Tokenizer> tok = Tokenizer::fromGguf(gguf);
        if (!tok) return tok.status();  // names the file
        lw.token_bytes = lw.constant("token_bytes", DType::I32, tokenBytesTable(tok.value(), cfg.n_vocab));
        lw.grammar = lw.activation("grammar", BLUE_TC_INSTANCE, DType::I32, {opt.grammar_words});
    }
    if (opt.pooling) {
        lw.pooling = *opt.pooling;
    } else {
        Result<Pooling> file_pooling = poolingOf(gguf, cfg);
        if (!file_pooling) return file_pooling.status();
        lw.pooling = file_pooling.value();
    }
    CodeBuilder cb(&m);
    uint32_t block = lw.forwardBlock(cb, ctx);
    if (lw.pooling != Pooling::None) lw.embed_block = lw.forwardBlock(cb, ctx, ForwardHead::Embed, uint32_t(lw.pooling));
    lw.sessions = opt.sessions;
    if (lw.sessions) lw.sessionBlocks(cb, ctx);
    lw.generationProgram(cb, block, ctx, chunk);
    BLUE_TRY(cb.finish());
    m.meta = {{kMetaKind, "llm-generate"},
              {kMetaArch, std::string(modelArchName(cfg.arch))},
              {kMetaCtx, std::to_string(ctx)},
              {kMetaRequest, std::to_string(BLUE_REQ_LAYOUT)},
              {kMetaGrammarWords, std::to_string(opt.grammar_words)},
              {kMetaPooling, poolingName(lw.pooling)},
              {kMetaSessions, std::to_string(opt.sessions)}};
    Status s = verifyModule(m);
    if (!s) return s.prefix("lowered module fails verification (compiler bug)");
    return m;
}

}  // namespace blue
