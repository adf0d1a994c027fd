// Model hyperparameters from GGUF metadata and the tensor inventory check (see model_config.h).
// Defaults and fallbacks follow llama.cpp's loader so files converted for it load the same here.
#include "compiler/model_config.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <initializer_list>
#include <vector>

namespace blue {

// Assigns the value of a Result to `lhs`, or returns its failed Status.
#define BLUE_ASSIGN(lhs, expr)                 \
    do {                                       \
        auto blue_r_ = (expr);                 \
        if (!blue_r_) return blue_r_.status(); \
        (lhs) = std::move(blue_r_.value());    \
    } while (0)

namespace {

struct ArchTraits {
    ModelArch arch;
    std::string_view name;
    RopeMode rope_mode;
    bool moe;            // every layer is MoE (llama: when expert_count > 0)
    bool qkv_bias;       // required Q/K/V biases (llama: optional, all layers or none)
    bool qk_norm;        // per-head RMSNorm of Q and K
    bool shared_expert;  // qwen2moe's gated shared expert
    bool weights_norm;   // renormalise top-k routing weights
};

constexpr ArchTraits kArchs[] = {
    {ModelArch::Llama, "llama", RopeMode::Normal, false, false, false, false, true},
    {ModelArch::Qwen2, "qwen2", RopeMode::Neox, false, true, false, false, false},
    {ModelArch::Qwen3, "qwen3", RopeMode::Neox, false, false, true, false, false},
    {ModelArch::Qwen2Moe, "qwen2moe", RopeMode::Neox, true, true, false, true, false},
    {ModelArch::Qwen3Moe, "qwen3moe", RopeMode::Neox, true, false, true, false, true},
    {ModelArch::Gemma2, "gemma2", RopeMode::Neox, false, false, false, false, false},
    {ModelArch::Gemma3, "gemma3", RopeMode::Neox, false, false, true, false, false},
    {ModelArch::Phi3, "phi3", RopeMode::Neox, false, false, false, false, false},
};

bool isGemma(ModelArch a) { return a == ModelArch::Gemma2 || a == ModelArch::Gemma3; }

std::string shapeText(const int64_t* ne, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += strFormat(i ? ", %" PRId64 : "%" PRId64, ne[i]);
    return s + "]";
}

// Looks tensors up by name, checks shape and type, and remembers which ones were used.
class TensorChecker {
  public:
    TensorChecker(const GgufFile& file, std::string ctx)
        : file_(file), ctx_(std::move(ctx)), used_(file.tensors().size(), false) {}

    // Checks `name` against `shape` (ne order); returns false when it is optional and absent.
    Result<bool> check(const std::string& name, std::initializer_list<int64_t> shape,
                       bool required = true) {
        const GgufTensor* t = file_.findTensor(name);
        if (!t) {
            if (required) return BLUE_ERROR("%s: missing tensor '%s'", ctx_.c_str(), name.c_str());
            return false;
        }
        used_[t->index] = true;
        bool same = true;
        for (size_t d = 0; d < kGgufMaxDims; ++d) {
            int64_t want = d < shape.size() ? shape.begin()[d] : 1;
            same = same && t->ne[d] == want;
        }
        if (!same) {
            return BLUE_ERROR("%s: tensor '%s' has shape %s, expected %s", ctx_.c_str(),
                              name.c_str(), shapeText(t->ne.data(), t->n_dims).c_str(),
                              shapeText(shape.begin(), shape.size()).c_str());
        }
        if (!t->supported) {
            return BLUE_ERROR("%s: tensor '%s' has type %s, which BlueVM does not support",
                              ctx_.c_str(), name.c_str(), dtypeName(t->type).data());
        }
        if (shape.size() == 1 && t->type != DType::F32) {
            return BLUE_ERROR("%s: tensor '%s' has type %s; norm weights, biases and other vectors must be F32 "
                              "(as llama.cpp writes them)",
                              ctx_.c_str(), name.c_str(), dtypeName(t->type).data());
        }
        const std::vector<DType>& matrix = gpuMatrixTypes();
        if (shape.size() > 1 && std::find(matrix.begin(), matrix.end(), t->type) == matrix.end()) {
            std::string list;
            for (DType m : matrix) list += (list.empty() ? "" : ", ") + std::string(dtypeName(m));
            return BLUE_ERROR("%s: tensor '%s' has type %s, which no GPU kernel reads as a matrix (%s do)",
                              ctx_.c_str(), name.c_str(), dtypeName(t->type).data(), list.c_str());
        }
        return true;
    }

    Status checkAllUsed(std::string_view arch) const {
        for (const GgufTensor& t : file_.tensors()) {
            if (used_[t.index]) continue;
            return BLUE_ERROR("%s: tensor '%s' is not part of the %s forward pass", ctx_.c_str(),
                              ggufPrintable(t.name).c_str(), std::string(arch).c_str());
        }
        return {};
    }

  private:
    const GgufFile& file_;
    std::string ctx_;
    std::vector<bool> used_;
};

std::string blk(uint32_t layer, const char* suffix) {
    return strFormat("blk.%u.%s", layer, suffix);
}

// Reads "{arch}.{suffix}" keys.
class ArchKeys {
  public:
    ArchKeys(const GgufFile& file, std::string_view arch) : file_(file), prefix_(arch) {}
    std::string key(const char* suffix) const { return prefix_ + "." + suffix; }
    Result<uint32_t> positive(const char* suffix) const {
        Result<uint32_t> v = file_.getU32(key(suffix));
        if (v && *v == 0)
            return BLUE_ERROR("%s: key '%s' is 0", file_.name().c_str(), key(suffix).c_str());
        return v;
    }
    Result<uint32_t> u32Or(const char* suffix, uint32_t fallback) const {
        return file_.getU32Or(key(suffix), fallback);
    }
    Result<float> f32Or(const char* suffix, float fallback) const {
        return file_.getF32Or(key(suffix), fallback);
    }
    bool has(const char* suffix) const { return file_.has(key(suffix)); }

  private:
    const GgufFile& file_;
    std::string prefix_;
};

Status readAttention(const GgufFile& file, const ArchKeys& keys, ModelConfig& c) {
    const char* name = file.name().c_str();
    BLUE_ASSIGN(c.n_ctx_train, keys.positive("context_length"));
    BLUE_ASSIGN(c.n_embd, keys.positive("embedding_length"));
    BLUE_ASSIGN(c.n_layer, keys.positive("block_count"));
    BLUE_ASSIGN(c.n_head, keys.positive("attention.head_count"));
    BLUE_ASSIGN(c.n_head_kv, keys.u32Or("attention.head_count_kv", c.n_head));
    if (c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0) {
        return BLUE_ERROR("%s: head_count_kv %u does not divide head_count %u", name, c.n_head_kv,
                          c.n_head);
    }
    if (!keys.has("attention.key_length") && c.n_embd % c.n_head != 0) {
        return BLUE_ERROR("%s: embedding_length %u is not a multiple of head_count %u", name,
                          c.n_embd, c.n_head);
    }
    BLUE_ASSIGN(c.head_dim, keys.u32Or("attention.key_length", c.n_embd / c.n_head));
    BLUE_ASSIGN(c.head_dim_v, keys.u32Or("attention.value_length", c.head_dim));
    BLUE_ASSIGN(c.n_rot, keys.u32Or("rope.dimension_count", c.head_dim));
    if (c.head_dim == 0 || c.head_dim_v == 0) return BLUE_ERROR("%s: head width is 0", name);
    if (c.n_rot == 0 || c.n_rot % 2 != 0 || c.n_rot > c.head_dim) {
        return BLUE_ERROR("%s: rope.dimension_count %u must be even and in [2, head_dim %u]", name,
                          c.n_rot, c.head_dim);
    }
    BLUE_ASSIGN(c.rms_norm_eps, file.getF32(keys.key("attention.layer_norm_rms_epsilon")));
    if (!(c.rms_norm_eps > 0.0f) || !std::isfinite(c.rms_norm_eps)) {
        return BLUE_ERROR("%s: layer_norm_rms_epsilon %g must be positive", name, c.rms_norm_eps);
    }
    return {};
}

Status readPositive(const GgufFile& file, const ArchKeys& keys, const char* suffix, float fallback, float* out) {
    BLUE_ASSIGN(*out, keys.f32Or(suffix, fallback));
    if (!(*out > 0.0f) || !std::isfinite(*out)) {
        return BLUE_ERROR("%s: key '%s' is %g; it must be positive", file.name().c_str(), keys.key(suffix).c_str(), *out);
    }
    return {};
}

// YaRN's keys, with llama.cpp's defaults. DeepSeek's log multiplier (a different magnitude rule)
// is refused rather than ignored.
Status readYarn(const GgufFile& file, const ArchKeys& keys, ModelConfig& c) {
    const char* name = file.name().c_str();
    if (c.rope_scaling_orig_ctx == 0) {
        return BLUE_ERROR("%s: rope scaling 'yarn' needs %s (or %s)", name,
                          keys.key("rope.scaling.original_context_length").c_str(), keys.key("context_length").c_str());
    }
    BLUE_ASSIGN(c.yarn_ext_factor, keys.f32Or("rope.scaling.yarn_ext_factor", 1.0f));
    if (!(c.yarn_ext_factor >= 0.0f && c.yarn_ext_factor <= 1.0f)) {
        return BLUE_ERROR("%s: key '%s' is %g; it must be in [0, 1]", name,
                          keys.key("rope.scaling.yarn_ext_factor").c_str(), c.yarn_ext_factor);
    }
    BLUE_TRY(readPositive(file, keys, "rope.scaling.yarn_attn_factor", 1.0f, &c.yarn_attn_factor));
    BLUE_TRY(readPositive(file, keys, "rope.scaling.yarn_beta_fast", 32.0f, &c.yarn_beta_fast));
    BLUE_TRY(readPositive(file, keys, "rope.scaling.yarn_beta_slow", 1.0f, &c.yarn_beta_slow));
    float log_mul = 0.0f;
    BLUE_ASSIGN(log_mul, keys.f32Or("rope.scaling.yarn_log_multiplier", 0.0f));
    if (log_mul != 0.0f) {
        return BLUE_ERROR("%s: key '%s' (DeepSeek's YaRN magnitude) is not supported", name,
                          keys.key("rope.scaling.yarn_log_multiplier").c_str());
    }
    return {};
}

Status readRope(const GgufFile& file, const ArchKeys& keys, ModelConfig& c) {
    const char* name = file.name().c_str();
    BLUE_ASSIGN(c.rope_freq_base, keys.f32Or("rope.freq_base", 10000.0f));
    if (!(c.rope_freq_base > 0.0f) || !std::isfinite(c.rope_freq_base)) {
        return BLUE_ERROR("%s: rope.freq_base %g must be positive", name, c.rope_freq_base);
    }
    std::string_view type;
    BLUE_ASSIGN(type, file.getStringOr(keys.key("rope.scaling.type"), ""));
    float factor = 0.0f;
    BLUE_ASSIGN(factor, keys.f32Or("rope.scaling.factor", 0.0f));
    if (!keys.has("rope.scaling.factor"))
        BLUE_ASSIGN(factor, keys.f32Or("rope.scale_linear", 0.0f));
    if (type.empty()) type = factor != 0.0f && factor != 1.0f ? "linear" : "none";
    // phi3's LongRoPE: per-pair factors in tensors (rope_factors_long/short), no position scale.
    if (type == "none" || (type == "longrope" && c.arch == ModelArch::Phi3)) {
        c.rope_scaling = RopeScaling::None;
        return {};
    }
    if (type == "linear") {
        c.rope_scaling = RopeScaling::Linear;
    } else if (type == "yarn") {
        c.rope_scaling = RopeScaling::Yarn;
    } else {
        return BLUE_ERROR("%s: rope scaling type '%s' is not supported (BlueVM runs none, linear and yarn; longrope for phi3)", name,
                          ggufPrintable(type).c_str());
    }
    if (!(factor > 0.0f) || !std::isfinite(factor)) {
        return BLUE_ERROR("%s: rope scaling '%s' needs a positive rope.scaling.factor (got %g)",
                          name, std::string(type).c_str(), factor);
    }
    c.rope_scaling_factor = factor;
    BLUE_ASSIGN(c.rope_scaling_orig_ctx,
                keys.u32Or("rope.scaling.original_context_length", c.n_ctx_train));
    if (c.rope_scaling == RopeScaling::Yarn) BLUE_TRY(readYarn(file, keys, c));
    return {};
}

Status readFeedForward(const GgufFile& file, const ArchKeys& keys, const ArchTraits& arch,
                       ModelConfig& c) {
    const char* name = file.name().c_str();
    BLUE_ASSIGN(c.n_ff, keys.u32Or("feed_forward_length", 0));
    BLUE_ASSIGN(c.n_expert, keys.u32Or("expert_count", 0));
    if (arch.arch != ModelArch::Llama && !arch.moe) c.n_expert = 0;
    if (arch.moe && c.n_expert == 0) {
        return BLUE_ERROR("%s: %s needs %s > 0", name, arch.name.data(),
                          keys.key("expert_count").c_str());
    }
    if (c.n_expert == 0) {
        if (c.n_ff == 0)
            return BLUE_ERROR("%s: missing or zero key '%s'", name,
                              keys.key("feed_forward_length").c_str());
        return {};
    }
    BLUE_ASSIGN(c.n_expert_used, keys.positive("expert_used_count"));
    if (c.n_expert_used > c.n_expert) {
        return BLUE_ERROR("%s: key '%s' is %u, more than %s %u", name,
                          keys.key("expert_used_count").c_str(), c.n_expert_used,
                          keys.key("expert_count").c_str(), c.n_expert);
    }
    c.expert_weights_norm = arch.weights_norm;
    uint32_t fallback_exp = arch.arch == ModelArch::Llama ? c.n_ff : c.n_ff / c.n_expert_used;
    BLUE_ASSIGN(c.n_ff_exp, keys.u32Or("expert_feed_forward_length", fallback_exp));
    if (arch.shared_expert) {
        BLUE_ASSIGN(c.n_ff_shexp, keys.u32Or("expert_shared_feed_forward_length", c.n_ff));
        if (c.n_ff_shexp == 0) {
            return BLUE_ERROR("%s: missing or zero key '%s'", name,
                              keys.key("expert_shared_feed_forward_length").c_str());
        }
    }
    if (c.n_ff_exp == 0) {
        return BLUE_ERROR("%s: missing or zero key '%s'", name,
                          keys.key("expert_feed_forward_length").c_str());
    }
    return {};
}

Status checkAttentionTensors(TensorChecker& tc, const ArchTraits& arch, uint32_t l,
                             ModelConfig& c) {
    int64_t e = c.n_embd, q = int64_t(c.n_head) * c.head_dim;
    int64_t k = int64_t(c.n_head_kv) * c.head_dim, v = int64_t(c.n_head_kv) * c.head_dim_v;
    int64_t o = int64_t(c.n_head) * c.head_dim_v;
    BLUE_TRY(tc.check(blk(l, "attn_norm.weight"), {e}).status());
    if (l == 0 && arch.arch == ModelArch::Phi3) {  // phi3: fused Q/K/V in every layer, or in none
        Result<bool> fused = tc.check(blk(l, "attn_qkv.weight"), {e, q + k + v}, false);
        if (!fused) return fused.status();
        c.fused_qkv = *fused;
    }
    if (c.fused_qkv) {
        if (l > 0) BLUE_TRY(tc.check(blk(l, "attn_qkv.weight"), {e, q + k + v}).status());
    } else {
        BLUE_TRY(tc.check(blk(l, "attn_q.weight"), {e, q}).status());
        BLUE_TRY(tc.check(blk(l, "attn_k.weight"), {e, k}).status());
        BLUE_TRY(tc.check(blk(l, "attn_v.weight"), {e, v}).status());
    }
    BLUE_TRY(tc.check(blk(l, "attn_output.weight"), {o, e}).status());
    if (c.post_norms) BLUE_TRY(tc.check(blk(l, "post_attention_norm.weight"), {e}).status());
    if (l == 0 && !c.fused_qkv) {  // layer 0 decides whether optional biases are present in every layer
        Result<bool> has_bias = tc.check(blk(l, "attn_q.bias"), {q}, arch.qkv_bias);
        if (!has_bias) return has_bias.status();
        c.has_qkv_bias = *has_bias;
    }
    if (c.has_qkv_bias) {
        if (l > 0) BLUE_TRY(tc.check(blk(l, "attn_q.bias"), {q}).status());
        BLUE_TRY(tc.check(blk(l, "attn_k.bias"), {k}).status());
        BLUE_TRY(tc.check(blk(l, "attn_v.bias"), {v}).status());
    }
    if (arch.qk_norm) {
        BLUE_TRY(tc.check(blk(l, "attn_q_norm.weight"), {c.head_dim}).status());
        BLUE_TRY(tc.check(blk(l, "attn_k_norm.weight"), {c.head_dim}).status());
    }
    return {};
}

Status checkFeedForwardTensors(TensorChecker& tc, const ArchTraits& arch, uint32_t l,
                               const ModelConfig& c) {
    int64_t e = c.n_embd;
    BLUE_TRY(tc.check(blk(l, "ffn_norm.weight"), {e}).status());
    if (c.post_norms) BLUE_TRY(tc.check(blk(l, "post_ffw_norm.weight"), {e}).status());
    if (c.fused_up) {
        BLUE_TRY(tc.check(blk(l, "ffn_up.weight"), {e, 2 * int64_t(c.n_ff)}).status());
        return tc.check(blk(l, "ffn_down.weight"), {c.n_ff, e}).status();
    }
    if (!c.isMoe()) {
        BLUE_TRY(tc.check(blk(l, "ffn_gate.weight"), {e, c.n_ff}).status());
        BLUE_TRY(tc.check(blk(l, "ffn_up.weight"), {e, c.n_ff}).status());
        return tc.check(blk(l, "ffn_down.weight"), {c.n_ff, e}).status();
    }
    int64_t x = c.n_expert, f = c.n_ff_exp;
    BLUE_TRY(tc.check(blk(l, "ffn_gate_inp.weight"), {e, x}).status());
    BLUE_TRY(tc.check(blk(l, "ffn_gate_exps.weight"), {e, f, x}).status());
    BLUE_TRY(tc.check(blk(l, "ffn_up_exps.weight"), {e, f, x}).status());
    BLUE_TRY(tc.check(blk(l, "ffn_down_exps.weight"), {f, e, x}).status());
    if (arch.shared_expert) {
        int64_t s = c.n_ff_shexp;
        BLUE_TRY(tc.check(blk(l, "ffn_gate_inp_shexp.weight"), {e}).status());
        BLUE_TRY(tc.check(blk(l, "ffn_gate_shexp.weight"), {e, s}).status());
        BLUE_TRY(tc.check(blk(l, "ffn_up_shexp.weight"), {e, s}).status());
        BLUE_TRY(tc.check(blk(l, "ffn_down_shexp.weight"), {s, e}).status());
    }
    return {};
}

Status checkTensors(const GgufFile& file, const ArchTraits& arch, ModelConfig& c) {
    std::string ctx = file.name() + ": " + std::string(arch.name);
    const GgufTensor* embd = file.findTensor("token_embd.weight");
    if (!embd) return BLUE_ERROR("%s: missing tensor 'token_embd.weight'", ctx.c_str());
    if (embd->n_dims != 2 || embd->ne[0] != c.n_embd || embd->ne[1] > int64_t(UINT32_MAX)) {
        return BLUE_ERROR("%s: tensor 'token_embd.weight' has shape %s, expected [%u, n_vocab]",
                          ctx.c_str(), shapeText(embd->ne.data(), embd->n_dims).c_str(), c.n_embd);
    }
    c.n_vocab = uint32_t(embd->ne[1]);
    TensorChecker tc(file, ctx);
    int64_t e = c.n_embd, n_vocab = c.n_vocab;
    BLUE_TRY(tc.check("token_embd.weight", {e, n_vocab}).status());
    BLUE_TRY(tc.check("output_norm.weight", {e}).status());
    Result<bool> has_output = tc.check("output.weight", {e, n_vocab}, false);
    if (!has_output) return has_output.status();
    c.tied_output = !*has_output;
    Result<bool> has_freqs = tc.check("rope_freqs.weight", {c.n_rot / 2}, false);
    if (!has_freqs) return has_freqs.status();
    c.has_rope_freqs = *has_freqs;
    if (arch.arch == ModelArch::Phi3) {
        Result<bool> has_long = tc.check("rope_factors_long.weight", {c.n_rot / 2}, false);
        if (!has_long) return has_long.status();
        Result<bool> has_short = tc.check("rope_factors_short.weight", {c.n_rot / 2}, false);
        if (!has_short) return has_short.status();
        c.has_rope_long = *has_long;
        c.has_rope_short = *has_short;
    }
    for (uint32_t l = 0; l < c.n_layer; ++l) {
        BLUE_TRY(checkAttentionTensors(tc, arch, l, c));
        BLUE_TRY(checkFeedForwardTensors(tc, arch, l, c));
    }
    return tc.checkAllUsed(arch.name);
}

// What gemma2, gemma3 and phi3 add to the llama forward pass, with llama.cpp's defaults: gemma2
// slides on even layers (window 4096 unless stated) and soft-caps attention (50) and output (30)
// logits; gemma3 slides on 5 layers of every 6 (window required) with RoPE base 10000 there;
// both scale embeddings, norm after each sublayer too, use GeGLU and scale queries by
// 1/sqrt(n_embd / n_head) in their 27B sizes (46 and 62 layers), else 1/sqrt(head_dim). phi3
// fuses Q/K/V and gate/up; its sliding window is ignored, as llama.cpp now does. Every
// architecture takes rope.scaling.attn_factor.
Status readArchExtras(const GgufFile& file, const ArchKeys& keys, ModelConfig& c) {
    const char* name = file.name().c_str();
    c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
    if (isGemma(c.arch)) {
        c.gelu_ffn = c.scale_embeddings = c.post_norms = true;
        bool big = c.n_layer == (c.arch == ModelArch::Gemma2 ? 46u : 62u);
        if (big) c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
        if (c.arch == ModelArch::Gemma2) {
            BLUE_ASSIGN(c.sliding_window, keys.u32Or("attention.sliding_window", 4096));
        } else {
            BLUE_ASSIGN(c.sliding_window, file.getU32(keys.key("attention.sliding_window")));
        }
        if (c.sliding_window == 0) {
            return BLUE_ERROR("%s: key '%s' is 0", name, keys.key("attention.sliding_window").c_str());
        }
        c.swa_pattern = c.arch == ModelArch::Gemma2 ? 2 : 6;
    }
    if (c.arch == ModelArch::Gemma2) {
        BLUE_TRY(readPositive(file, keys, "attn_logit_softcapping", 50.0f, &c.attn_softcap));
        BLUE_TRY(readPositive(file, keys, "final_logit_softcapping", 30.0f, &c.final_softcap));
    }
    if (c.arch == ModelArch::Gemma3) {
        c.rope_freq_base_swa = 10000.0f;
        // Newer llama.cpp reads an optional final soft cap for gemma3 too (no Gemma 3 states one).
        if (keys.has("final_logit_softcapping")) {
            BLUE_TRY(readPositive(file, keys, "final_logit_softcapping", 0.0f, &c.final_softcap));
        }
    }
    // llama.cpp reads RoPE's attention factor for every architecture (phi3's converter writes it).
    BLUE_TRY(readPositive(file, keys, "rope.scaling.attn_factor", 1.0f, &c.rope_attn_factor));
    if (ropeMagnitude(c, false) != 1.0f && c.n_rot != c.head_dim) {
        return BLUE_ERROR("%s: %s with partial rotation (rope.dimension_count %u < head width %u) is not supported",
                          name, c.rope_attn_factor != 1.0f ? ("key '" + keys.key("rope.scaling.attn_factor") + "'").c_str()
                                                           : "YaRN's magnitude",
                          c.n_rot, c.head_dim);
    }
    if (c.arch == ModelArch::Phi3) {
        c.fused_up = true;
        if (c.rope_scaling_orig_ctx == 0) {
            BLUE_ASSIGN(c.rope_scaling_orig_ctx, keys.u32Or("rope.scaling.original_context_length", c.n_ctx_train));
        }
    }
    return {};
}

// The vocabulary size the metadata states, where it does, must match token_embd's rows.
Status checkVocab(const GgufFile& file, const ArchKeys& keys, const ModelConfig& c) {
    const char* name = file.name().c_str();
    if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
        if (tokens->isArray() && tokens->count() != c.n_vocab) {
            return BLUE_ERROR("%s: tokenizer.ggml.tokens has %" PRIu64
                              " tokens but token_embd.weight has %u rows",
                              name, tokens->count(), c.n_vocab);
        }
    }
    uint32_t stated = 0;
    BLUE_ASSIGN(stated, keys.u32Or("vocab_size", c.n_vocab));
    if (stated != c.n_vocab) {
        return BLUE_ERROR("%s: %s is %u but token_embd.weight has %u rows", name,
                          keys.key("vocab_size").c_str(), stated, c.n_vocab);
    }
    return {};
}

}  // namespace

std::string_view modelArchName(ModelArch arch) {
    for (const ArchTraits& t : kArchs) {
        if (t.arch == arch) return t.name;
    }
    return "?";
}

const std::vector<DType>& gpuMatrixTypes() {
    static const std::vector<DType> types = {
        DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,   DType::Q5_0,  DType::Q5_1, DType::Q8_0,
        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS,
        DType::TQ1_0, DType::TQ2_0, DType::MXFP4};
    return types;
}

std::vector<float> yarnFreqDivisors(const ModelConfig& c) {
    if (c.rope_scaling != RopeScaling::Yarn) return {};
    // The pair index whose wavelength fits `turns` times into the original context.
    auto pairTurning = [&](float turns) {
        return float(c.n_rot) * std::log(float(c.rope_scaling_orig_ctx) / (turns * 2.0f * float(M_PI))) /
               (2.0f * std::log(c.rope_freq_base));
    };
    float low = std::max(0.0f, std::floor(pairTurning(c.yarn_beta_fast)));
    float high = std::min(float(c.n_rot - 1), std::ceil(pairTurning(c.yarn_beta_slow)));
    std::vector<float> div(c.n_rot / 2);
    for (uint32_t i = 0; i < div.size(); ++i) {
        float y = (float(i) - low) / std::max(0.001f, high - low);
        float r = (1.0f - std::clamp(y, 0.0f, 1.0f)) * c.yarn_ext_factor;
        div[i] = 1.0f / ((1.0f - r) / c.rope_scaling_factor + r);
    }
    return div;
}

float ropeMagnitude(const ModelConfig& c, bool own_base_layer) {
    float m = c.rope_attn_factor;
    if (c.rope_scaling == RopeScaling::Yarn) {
        m *= c.yarn_attn_factor;
        if (c.yarn_ext_factor != 0.0f && !own_base_layer) m *= 1.0f + 0.1f * std::log(c.rope_scaling_factor);
    }
    return m;
}

std::string_view ropeScalingName(RopeScaling s) {
    switch (s) {
        case RopeScaling::None:
            return "none";
        case RopeScaling::Linear:
            return "linear";
        case RopeScaling::Yarn:
            return "yarn";
    }
    return "?";
}

Result<ModelConfig> modelConfigFromGguf(const GgufFile& file) {
    std::string_view arch_name;
    BLUE_ASSIGN(arch_name, file.getString("general.architecture"));
    const ArchTraits* arch = nullptr;
    for (const ArchTraits& t : kArchs) {
        if (t.name == arch_name) arch = &t;
    }
    if (!arch) {
        return BLUE_ERROR(
            "%s: architecture '%s' is not supported (llama, qwen2, qwen3, qwen2moe, "
            "qwen3moe, gemma2, gemma3, phi3)",
            file.name().c_str(), ggufPrintable(arch_name).c_str());
    }
    ModelConfig c;
    c.arch = arch->arch;
    c.arch_name = std::string(arch_name);
    c.rope_mode = arch->rope_mode;
    c.has_qk_norm = arch->qk_norm;
    ArchKeys keys(file, arch_name);
    BLUE_TRY(readAttention(file, keys, c));
    BLUE_TRY(readRope(file, keys, c));
    BLUE_TRY(readFeedForward(file, keys, *arch, c));
    BLUE_TRY(readArchExtras(file, keys, c));
    BLUE_TRY(checkTensors(file, *arch, c));
    BLUE_TRY(checkVocab(file, keys, c));
    return c;
}

#undef BLUE_ASSIGN

}  // namespace blue
