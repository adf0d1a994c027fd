// ggufDescribe: the text `bluevm info` prints for a GGUF file (see model_config.h).
#include <cinttypes>
#include <map>

#include "compiler/model_config.h"
#include "compiler/tokenizer.h"

namespace blue {

namespace {

std::string bytesText(uint64_t n) {
    if (n < 1024) return strFormat("%" PRIu64 " B", n);
    if (n < (uint64_t(1) << 20)) return strFormat("%.2f KiB", double(n) / 1024.0);
    if (n < (uint64_t(1) << 30)) return strFormat("%.2f MiB", double(n) / double(1 << 20));
    return strFormat("%.2f GiB", double(n) / double(1 << 30));
}

std::string shapeText(const GgufTensor& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) s += strFormat(d ? ", %" PRId64 : "%" PRId64, t.ne[d]);
    return s + "]";
}

void describeModel(const GgufFile& file, std::string& out) {
    Result<ModelConfig> r = modelConfigFromGguf(file);
    if (!r) {
        out += "model: not loadable: " + r.message() + "\n";
        return;
    }
    const ModelConfig& c = *r;
    out += strFormat("model: %s, %u layers, n_embd %u, n_vocab %u, n_ctx_train %u\n",
                     c.arch_name.c_str(), c.n_layer, c.n_embd, c.n_vocab, c.n_ctx_train);
    out += strFormat(
        "  attention: %u heads, %u kv heads, head_dim %u (v %u), qkv bias %s, qk norm %s\n",
        c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.has_qkv_bias ? "yes" : "no",
        c.has_qk_norm ? "yes" : "no");
    if (c.isMoe()) {
        out += strFormat("  ffn: %u experts, %u used, expert width %u", c.n_expert, c.n_expert_used,
                         c.n_ff_exp);
        if (c.n_ff_shexp) out += strFormat(", shared expert width %u", c.n_ff_shexp);
        // Mixtral and qwen3moe renormalise the top-k softmax weights; qwen2moe does not, and adds
        // its shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).
        out += "\n  gating: softmax, top-k";
        if (c.expert_weights_norm) out += ", renormalised";
        out += c.n_ff_shexp ? "; shared expert gated by sigmoid\n" : "\n";
    } else {
        out += strFormat("  ffn: width %u, %s%s\n", c.n_ff, c.gelu_ffn ? "geglu" : "swiglu",
                         c.fused_up ? ", gate and up fused in ffn_up" : "");
    }
    if (c.fused_qkv) out += "  attention weights: Q, K, V fused in attn_qkv\n";
    if (c.sliding_window) {
        out += strFormat("  sliding window %u on layers l %% %u < %u", c.sliding_window, c.swa_pattern,
                         c.swa_pattern - 1);
        if (c.rope_freq_base_swa > 0) out += strFormat(" (rope base %g there)", double(c.rope_freq_base_swa));
        out += "\n";
    }
    if (c.scale_embeddings || c.post_norms || c.attn_softcap > 0 || c.final_softcap > 0) {
        out += strFormat("  embeddings x sqrt(n_embd) %s, post-sublayer norms %s, attention softcap %g, final softcap %g\n",
                         c.scale_embeddings ? "yes" : "no", c.post_norms ? "yes" : "no", double(c.attn_softcap),
                         double(c.final_softcap));
    }
    out += strFormat("  query scale %g\n", double(c.attn_scale));
    out += strFormat("  rms_norm_eps %g, rope %s over %u dims, base %g, scaling %s",
                     double(c.rms_norm_eps), c.rope_mode == RopeMode::Neox ? "neox" : "normal",
                     c.n_rot, double(c.rope_freq_base), ropeScalingName(c.rope_scaling).data());
    if (c.rope_scaling != RopeScaling::None) {
        out += strFormat(" x%g from %u", double(c.rope_scaling_factor), c.rope_scaling_orig_ctx);
    }
    if (c.rope_scaling == RopeScaling::Yarn) {
        out += strFormat(" (beta %g/%g, ext %g, magnitude %.4g)", double(c.yarn_beta_fast), double(c.yarn_beta_slow),
                         double(c.yarn_ext_factor), double(ropeMagnitude(c, false)));
    }
    if (c.has_rope_long || c.has_rope_short) {
        out += strFormat(", LongRoPE factors%s%s (original context %u)", c.has_rope_short ? " short" : "",
                         c.has_rope_long ? " long" : "", c.rope_scaling_orig_ctx);
    }
    if (c.rope_attn_factor != 1.0f) out += strFormat(", attention factor %g", double(c.rope_attn_factor));
    out += c.has_rope_freqs ? ", rope_freqs.weight\n" : "\n";
    out += c.tied_output ? "  output: tied to token_embd.weight\n" : "  output: output.weight\n";
}

void describeTokenizer(const GgufFile& file, std::string& out) {
    const GgufValue* model = file.find("tokenizer.ggml.model");
    const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
    if (!model && !tokens) return;
    out += "tokenizer: model " + (model ? model->toDisplay() : std::string("(none)"));
    if (tokens) out += strFormat(", %" PRIu64 " tokens", tokens->count());
    if (const GgufValue* pre = file.find("tokenizer.ggml.pre")) out += ", pre " + pre->toDisplay();
    static constexpr const char* kSpecials[][2] = {
        {"bos", "tokenizer.ggml.bos_token_id"},       {"eos", "tokenizer.ggml.eos_token_id"},
        {"eot", "tokenizer.ggml.eot_token_id"},       {"unk", "tokenizer.ggml.unknown_token_id"},
        {"sep", "tokenizer.ggml.seperator_token_id"}, {"pad", "tokenizer.ggml.padding_token_id"},
    };
    for (const auto& [label, key] : kSpecials) {
        const GgufValue* v = file.find(key);
        if (!v) continue;
        Result<int64_t> id = v->toI64();
        bool none = id && (*id < 0 || *id == int64_t(UINT32_MAX));
        out += strFormat(", %s %s", label, none ? "none" : v->toDisplay().c_str());
    }
    out += "\n";
    // What `generate` would say about it: a tokenizer model or pre-tokenizer BlueVM does not run.
    Result<Tokenizer> t = Tokenizer::fromGguf(file);
    if (!t) out += "  not loadable: " + t.message() + "\n";
}

void describeTensors(const GgufFile& file, std::string& out) {
    out += strFormat("tensors (%zu):\n", file.tensors().size());
    size_t name_width = 4;
    for (const GgufTensor& t : file.tensors()) name_width = std::max(name_width, t.name.size());
    name_width = std::min<size_t>(name_width, 48);
    struct Total {
        uint64_t count = 0, bytes = 0;
    };
    std::map<std::string_view, Total> by_type;
    uint64_t bytes = 0, elements = 0;
    for (const GgufTensor& t : file.tensors()) {
        std::string_view type = dtypeName(t.type);
        out += strFormat("  %4u  %-*s  %-7s%s %-22s %12" PRIu64 "\n", t.index, int(name_width),
                         ggufPrintable(t.name, 48).c_str(), type.data(), t.supported ? " " : "!",
                         shapeText(t).c_str(), t.n_bytes);
        by_type[type].count++;
        by_type[type].bytes += t.n_bytes;
        bytes += t.n_bytes;
        elements += uint64_t(t.n_elements);
    }
    out += strFormat("totals: %zu tensors, %" PRIu64 " elements, %" PRIu64 " bytes (%s)",
                     file.tensors().size(), elements, bytes, bytesText(bytes).c_str());
    for (const auto& [type, total] : by_type) {
        out += strFormat("; %s: %" PRIu64 " (%s)", type.data(), total.count,
                         bytesText(total.bytes).c_str());
    }
    out += "\n";
    for (const GgufTensor& t : file.tensors()) {
        if (t.supported) continue;
        out += "(!: type not supported by BlueVM; such tensors cannot be loaded)\n";
        break;
    }
}

}  // namespace

std::string ggufDescribe(const GgufFile& file) {
    std::string out;
    out += strFormat("file: %s\n", file.name().c_str());
    out += strFormat("format: GGUF v%u, %zu bytes (%s), alignment %u", file.version(),
                     file.bytes().size(), bytesText(file.bytes().size()).c_str(), file.alignment());
    if (!file.tensors().empty())
        out += strFormat(", data section at 0x%" PRIx64, file.dataOffset());
    out += "\n";
    if (const GgufValue* arch = file.find("general.architecture")) {
        out += "architecture: " + arch->toDisplay() + "\n";
    }
    if (!file.tensors().empty()) describeModel(file, out);
    describeTokenizer(file, out);
    out += strFormat("metadata (%zu keys):\n", file.kvs().size());
    for (const GgufKv& kv : file.kvs()) {
        out += strFormat("  %-44s %-14s %s\n", ggufPrintable(kv.key, 60).c_str(),
                         kv.value.typeDisplay().c_str(), kv.value.toDisplay().c_str());
    }
    describeTensors(file, out);
    return out;
}

}  // namespace blue
