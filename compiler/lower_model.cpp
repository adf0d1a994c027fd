// The model compiler (see lower_model.h): tensors and the forward block; the generation program
// is in lower_generate.cpp, the state both share in lower_model_internal.h.
#include "compiler/lower_model.h"

#include <bit>
#include <cstring>
#include <cmath>
#include <map>

#include "compiler/asm.h"
#include "compiler/code_builder.h"
#include "compiler/lower_model_internal.h"
#include "compiler/tokenizer.h"
#include "vm/abi.h"
#include "vm/llm_abi.h"
#include "vm/verify.h"

namespace blue {

using namespace lower_model;

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
// (gemma) its post-FFN norm. The up projection goes into hb first and the gate's matmul gates it
// there (MATMULGLU): the activation in the same dispatch, no SWIGLU pass over hb.
void Lowering::feedForward(CodeBuilder& cb, uint32_t l, const std::map<std::string, uint32_t>& a) {
    const uint32_t eps = floatBits(cfg.rms_norm_eps), f = cfg.n_ff;
    const uint32_t hb = a.at("hb"), xb = a.at("xb"), xb2 = a.at("xb2"), x = a.at("x");
    uint32_t gate_w = cfg.fused_up ? layerWeightRows(l, "ffn_up.weight", 0, f) : layerWeight(l, "ffn_gate.weight");
    uint32_t up_w = cfg.fused_up ? layerWeightRows(l, "ffn_up.weight", f, f) : layerWeight(l, "ffn_up.weight");
    cb.tensor(Op::MATMUL, {hb, up_w, xb});
    cb.tensor(Op::MATMULGLU, {hb, gate_w, xb, cfg.gelu_ffn ? BLUE_GLU_GELU : BLUE_GLU_SILU});
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
        shared = activation("shexp_out", BLUE_TC_ROWS, DType::F32, {dim});
        shared_gate = activation("shexp_gate", BLUE_TC_ROWS, DType::F32, {1});
        cb.tensor(Op::MATMUL, {hs, layerWeight(l, "ffn_up_shexp.weight"), xb});
        cb.tensor(Op::MATMULGLU, {hs, layerWeight(l, "ffn_gate_shexp.weight"), xb, BLUE_GLU_SILU});
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
    // Q and K in one dispatch (ROPEQK rotates both in place).
    cb.tensor(Op::ROPEQK, {q, k, freqs, BLUE_FA_POS, cfg.head_dim, cfg.n_rot, mode, floatBits(base), floatBits(scale)});
    // RoPE's attention factor scales the rotated Q and K, so their products by its square.
    const float magnitude = ropeMagnitude(cfg, own_base);
    float qscale = (cfg.attn_scale > 0 ? cfg.attn_scale : 1.0f / std::sqrt(float(cfg.head_dim))) * magnitude * magnitude;
    if (kv_page) {
        pagedCaches(cb, l, ctx, a, floatBits(qscale), sliding ? cfg.sliding_window : 0u, floatBits(cfg.attn_softcap));
        return;
    }
    std::string ln = std::to_string(l);
    uint32_t kc = activation("kcache." + ln, BLUE_TC_INSTANCE, kv_type, {kv_dim, ctx});
    uint32_t vc = activation("vcache." + ln, BLUE_TC_INSTANCE, kv_type, {kv_dim, ctx});
    cb.tensor(Op::KVSTORE, {k, kc, v, vc, BLUE_FA_POS});
    if (sliding || cfg.attn_softcap > 0) {
        cb.tensor(Op::ATTNX, {a.at("att"), kc, vc, q, cfg.n_head, cfg.n_head_kv, BLUE_FA_POS, floatBits(qscale),
                              sliding ? cfg.sliding_window : 0u, floatBits(cfg.attn_softcap)});
    } else {
        cb.tensor(Op::ATTN, {a.at("att"), kc, vc, q, cfg.n_head, cfg.n_head_kv, BLUE_FA_POS, floatBits(qscale)});
    }
}

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
        std::string_view p = tok.piece(int32_t(t));  // empty for hidden control tokens
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

// verifyModule's limit on a computed tensor's storage (vm/verify.cpp).
constexpr uint64_t kMaxPoolBytes = uint64_t(1) << 32;

Result<KvPaging> kvPaging(const LowerOptions& opt, uint32_t ctx, uint64_t row_bytes) {
    if (opt.kv_page == 0) return KvPaging{};
    const uint32_t ps = opt.kv_page;
    if (ps < BLUE_KVP_MIN_PAGE || ps > BLUE_KVP_MAX_PAGE || (ps & (ps - 1)) != 0) {
        return BLUE_ERROR("kv page %u: positions per page must be a power of two from %u to %u (8, 16 or 32)", ps,
                          BLUE_KVP_MIN_PAGE, BLUE_KVP_MAX_PAGE);
    }
    const uint64_t pool = opt.kv_pool ? opt.kv_pool : uint64_t(std::max(opt.kv_pool_contexts, 1u)) * ctx;
    const uint64_t pages = (pool + ps - 1) / ps, need = (uint64_t(ctx) + ps - 1) / ps;
    if (pages < need) {
        return BLUE_ERROR("kv pool of %llu positions (%llu pages of %u) is smaller than one request of the full "
                          "context: %u positions need %llu pages (%llu positions)",
                          (unsigned long long)pool, (unsigned long long)pages, ps, ctx, (unsigned long long)need,
                          (unsigned long long)(need * ps));
    }
    if (pages * ps * row_bytes > kMaxPoolBytes) {
        return BLUE_ERROR("kv pool of %llu positions needs %.1f GiB per layer for K and as much for V; a tensor holds "
                          "at most 4 GiB (%llu positions)",
                          (unsigned long long)pool, double(pages * ps * row_bytes) / (1u << 30),
                          (unsigned long long)(kMaxPoolBytes / row_bytes / ps * ps));
    }
    const uint64_t heap = BLUE_KVP_BASE(uint64_t(opt.in_slots)) + BLUE_KVP_HEAP_WORDS(pages, uint64_t(ps));
    if (heap > BLUE_MAX_HEAP_WORDS) {
        return BLUE_ERROR("kv pool of %llu pages: its page state needs %llu heap words, more than %u",
                          (unsigned long long)pages, (unsigned long long)heap, BLUE_MAX_HEAP_WORDS);
    }
    return KvPaging{ps, uint32_t(pages)};
}

Result<Module> lowerModel(const GgufFile& gguf, const ModelConfig& cfg, const LowerOptions& opt) {
    if (Status s = checkLowerable(cfg); !s) return Status::error(gguf.name() + ": " + s.message());
    uint32_t ctx = opt.ctx ? opt.ctx : std::min<uint32_t>(cfg.n_ctx_train ? cfg.n_ctx_train : 2048, 2048);
    uint32_t max_rows = opt.max_rows ? opt.max_rows : 512;
    uint32_t chunk = std::min(opt.chunk ? opt.chunk : 128, max_rows);
    if (ctx < 2) return Status::error("context length must be at least 2");
    if (max_rows > BLUE_MAX_ROWS) return BLUE_ERROR("max rows %u is above %u", max_rows, BLUE_MAX_ROWS);
    if (opt.sessions > kMaxSessions) return BLUE_ERROR("%u session slots: at most %u", opt.sessions, kMaxSessions);
    Result<KvPaging> paging =
        kvPaging(opt, ctx, dtypeRowBytes(opt.kv_type, uint64_t(cfg.n_head_kv) * cfg.head_dim).value_or(0));
    if (!paging) return paging.status();

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
    if (paging.value().page) {  // the page table and the page state (lower_kv_pages.cpp)
        lw.kv_page = paging.value().page;
        lw.kv_pages = paging.value().pages;
        lw.kv_heap = BLUE_KVP_BASE(opt.in_slots);
        m.layout.regs = kPagedRegs;
        m.layout.local_words += (ctx + lw.kv_page - 1) / lw.kv_page;
        m.layout.heap_words += uint32_t(BLUE_KVP_HEAP_WORDS(lw.kv_pages, lw.kv_page));  // kvPaging bounds it
        m.layout.heap_static = m.layout.heap_words;
    }
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
    if (lw.kv_page) {
        m.meta.push_back({kMetaKvPage, std::to_string(lw.kv_page)});
        m.meta.push_back({kMetaKvPages, std::to_string(lw.kv_pages)});
    }
    Status s = verifyModule(m);
    if (!s) return s.prefix("lowered module fails verification (compiler bug)");
    return m;
}

}  // namespace blue
