// Synthetic models: presets, validation, the tensor inventory and the streamed random weights
// (see synth.h). The vocabularies are in synth_vocab.cpp.
#include "tools/synth/synth.h"

#include <cmath>
#include <memory>
#include <thread>

#include "compiler/quantize.h"
#include "vm/quant.h"

namespace blue {

namespace {

constexpr float kWeightStd = 0.02f;
constexpr uint32_t kMaxDim = 1u << 24;
constexpr uint32_t kMinVocab = 260;
constexpr uint64_t kMinElemsPerThread = 16384;

SynthConfig llama(std::string name, uint32_t dim, uint32_t layers, uint32_t heads, uint32_t kv,
                  uint32_t ff, uint32_t ctx, bool tied) {
    SynthConfig c;
    c.name = std::move(name);
    c.dim = dim;
    c.n_layer = layers;
    c.n_head = heads;
    c.n_head_kv = kv;
    c.n_ff = ff;
    c.n_vocab = 32000;
    c.n_ctx = ctx;
    c.tied_output = tied;
    return c;
}

std::vector<SynthConfig> presets() {
    std::vector<SynthConfig> p;
    // llama2.c's TinyStories checkpoints share the classifier with the embeddings.
    p.push_back(llama("stories15M", 288, 6, 6, 6, 768, 256, true));
    p.push_back(llama("stories110M", 768, 12, 12, 12, 2048, 1024, true));
    p.push_back(llama("tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048, false));
    SynthConfig qwen = llama("qwen2-0.5b", 896, 24, 14, 2, 4864, 32768, true);
    qwen.arch = "qwen2";
    qwen.n_vocab = 151936;
    qwen.qkv_bias = true;
    qwen.rope_base = 1000000.0f;
    qwen.norm_eps = 1e-6f;
    p.push_back(qwen);
    // The shapes of PEERS.md (head width 64).
    p.push_back(llama("peer-dim256", 256, 4, 4, 4, 768, 2048, false));
    SynthConfig moe = llama("peer-moe", 256, 4, 4, 4, 768, 2048, false);
    moe.n_expert = 8;
    moe.n_expert_used = 2;
    p.push_back(moe);
    p.push_back(llama("peer-dim1024", 1024, 12, 16, 16, 2304, 2048, false));
    SynthConfig mixtral = llama("mixtral-tiny", 512, 8, 8, 2, 1024, 4096, false);
    mixtral.n_expert = 8;
    mixtral.n_expert_used = 2;
    mixtral.rope_base = 1000000.0f;
    p.push_back(mixtral);
    // Qwen1.5-MoE-A2.7B scaled down: 60 experts top-4 -> 16 top-4, a shared expert 4x an expert's
    // width, Q/K/V biases.
    SynthConfig qwen2moe = llama("qwen2moe-tiny", 256, 4, 8, 2, 256, 8192, false);
    qwen2moe.arch = "qwen2moe";
    qwen2moe.n_expert = 16;
    qwen2moe.n_expert_used = 4;
    qwen2moe.n_ff_shexp = 1024;
    qwen2moe.qkv_bias = true;
    qwen2moe.rope_base = 1000000.0f;
    qwen2moe.norm_eps = 1e-6f;
    p.push_back(qwen2moe);
    // Qwen3-30B-A3B scaled down: 128 experts top-8 -> 16 top-4, Q/K norm, no shared expert, no
    // biases (its head width 128 != dim / heads is not reproduced: blue-synth has no key_length).
    SynthConfig qwen3moe = llama("qwen3moe-tiny", 256, 4, 8, 2, 128, 40960, false);
    qwen3moe.arch = "qwen3moe";
    qwen3moe.n_expert = 16;
    qwen3moe.n_expert_used = 4;
    qwen3moe.rope_base = 1000000.0f;
    qwen3moe.norm_eps = 1e-6f;
    p.push_back(qwen3moe);
    // Gemma 2 2B scaled down (256000 tokens, window 4096 -> 512 and 8; soft caps 50 and 30);
    // the window is small enough that test prompts slide past it. Like the 2B, its heads are not
    // dim / heads wide (key_length 48: Q is 192 wide, the residual 256).
    SynthConfig gemma2 = llama("gemma2-tiny", 256, 4, 4, 2, 512, 8192, true);
    gemma2.arch = "gemma2";
    gemma2.n_vocab = 512;
    gemma2.norm_eps = 1e-6f;
    gemma2.sliding_window = 8;
    gemma2.head_dim = 48;
    p.push_back(gemma2);
    // Gemma 3 1B scaled down: 6 layers, so one global layer after five sliding ones.
    SynthConfig gemma3 = llama("gemma3-tiny", 256, 6, 4, 1, 512, 32768, true);
    gemma3.arch = "gemma3";
    gemma3.n_vocab = 512;
    gemma3.norm_eps = 1e-6f;
    gemma3.rope_base = 1000000.0f;
    gemma3.sliding_window = 8;
    p.push_back(gemma3);
    // Phi-3-mini-128k scaled down: fused Q/K/V and gate/up, LongRoPE factors for contexts past
    // 4096 and the attention factor its converter computes (sqrt(1 + ln 32 / ln 4096)).
    SynthConfig phi3 = llama("phi3-tiny", 192, 3, 6, 6, 512, 131072, false);
    phi3.arch = "phi3";
    phi3.n_vocab = 512;
    phi3.orig_ctx = 4096;
    phi3.attn_factor = 1.1902380714f;
    p.push_back(phi3);
    // Qwen2.5 with YaRN as its model card asks (factor 4 from 32768) scaled down: factor 4 from
    // 512, so that a test's positions and the ramp between extrapolated and interpolated pairs
    // both matter (head width 64, base 10000: pairs 0..3 keep their frequency, 16..31 are
    // interpolated, the ramp rises between).
    SynthConfig qwen_yarn = llama("qwen2-yarn-tiny", 256, 3, 4, 2, 512, 2048, true);
    qwen_yarn.arch = "qwen2";
    qwen_yarn.n_vocab = 512;
    qwen_yarn.qkv_bias = true;
    qwen_yarn.norm_eps = 1e-6f;
    qwen_yarn.orig_ctx = 512;
    qwen_yarn.yarn_factor = 4.0f;
    p.push_back(qwen_yarn);
    // Mistral 7B v0.3's vocabulary layout scaled down: its control tokens after </s> ([INST],
    // [/INST], [TOOL_CALLS], [AVAILABLE_TOOLS], ...), so the chat template is inferred as
    // mistral-v3 and tool calls take Mistral's format.
    SynthConfig mistral = llama("mistral-tiny", 256, 2, 4, 2, 512, 4096, false);
    mistral.n_vocab = 512;
    mistral.rope_base = 1000000.0f;
    mistral.mistral_tokens = true;
    p.push_back(mistral);
    return p;
}

// Ones: norm weights. FactorsShort / FactorsLong: LongRoPE frequency divisors 1, 1.25, 1.5,
// 1.75 / 1, 1.5, 2, 2.5 (repeating).
enum class Init { Random, Ones, FactorsShort, FactorsLong };

bool isQwenMoe(const SynthConfig& c) {
    return c.arch == "qwen2moe" || c.arch == "qwen3moe";
}

struct TensorSpec {
    std::string name;
    std::vector<int64_t> dims;  // ne order: row length first
    Init init;
};

std::string blk(uint32_t layer, const char* suffix) {
    return strFormat("blk.%u.%s", layer, suffix);
}

void addLayer(const SynthConfig& c, uint32_t l, std::vector<TensorSpec>& out) {
    const int64_t e = c.dim, q = int64_t(c.n_head) * c.headDim();
    const int64_t kv = int64_t(c.n_head_kv) * c.headDim(), f = c.n_ff, x = c.n_expert;
    const bool phi3 = c.arch == "phi3";
    out.push_back({blk(l, "attn_norm.weight"), {e}, Init::Ones});
    if (phi3) {
        out.push_back({blk(l, "attn_qkv.weight"), {e, q + 2 * kv}, Init::Random});
    } else {
        out.push_back({blk(l, "attn_q.weight"), {e, q}, Init::Random});
        out.push_back({blk(l, "attn_k.weight"), {e, kv}, Init::Random});
        out.push_back({blk(l, "attn_v.weight"), {e, kv}, Init::Random});
    }
    if (c.qkv_bias) {
        out.push_back({blk(l, "attn_q.bias"), {q}, Init::Random});
        out.push_back({blk(l, "attn_k.bias"), {kv}, Init::Random});
        out.push_back({blk(l, "attn_v.bias"), {kv}, Init::Random});
    }
    if (c.qkNorm()) {
        out.push_back({blk(l, "attn_q_norm.weight"), {c.headDim()}, Init::Ones});
        out.push_back({blk(l, "attn_k_norm.weight"), {c.headDim()}, Init::Ones});
    }
    out.push_back({blk(l, "attn_output.weight"), {q, e}, Init::Random});
    if (c.isGemma()) out.push_back({blk(l, "post_attention_norm.weight"), {e}, Init::Ones});
    out.push_back({blk(l, "ffn_norm.weight"), {e}, Init::Ones});
    if (c.isGemma()) out.push_back({blk(l, "post_ffw_norm.weight"), {e}, Init::Ones});
    if (phi3) {  // gate rows, then up rows
        out.push_back({blk(l, "ffn_down.weight"), {f, e}, Init::Random});
        out.push_back({blk(l, "ffn_up.weight"), {e, 2 * f}, Init::Random});
        return;
    }
    if (c.n_expert == 0) {
        out.push_back({blk(l, "ffn_gate.weight"), {e, f}, Init::Random});
        out.push_back({blk(l, "ffn_down.weight"), {f, e}, Init::Random});
        out.push_back({blk(l, "ffn_up.weight"), {e, f}, Init::Random});
        return;
    }
    out.push_back({blk(l, "ffn_gate_inp.weight"), {e, x}, Init::Random});
    out.push_back({blk(l, "ffn_gate_exps.weight"), {e, f, x}, Init::Random});
    out.push_back({blk(l, "ffn_down_exps.weight"), {f, e, x}, Init::Random});
    out.push_back({blk(l, "ffn_up_exps.weight"), {e, f, x}, Init::Random});
    if (c.n_ff_shexp == 0) return;
    const int64_t s = c.n_ff_shexp;
    out.push_back({blk(l, "ffn_gate_inp_shexp.weight"), {e}, Init::Random});
    out.push_back({blk(l, "ffn_gate_shexp.weight"), {e, s}, Init::Random});
    out.push_back({blk(l, "ffn_down_shexp.weight"), {s, e}, Init::Random});
    out.push_back({blk(l, "ffn_up_shexp.weight"), {e, s}, Init::Random});
}

// In the order llama.cpp's converters write them: embeddings, output, then the layers.
std::vector<TensorSpec> tensorSpecs(const SynthConfig& c) {
    std::vector<TensorSpec> specs;
    specs.push_back({"token_embd.weight", {c.dim, c.n_vocab}, Init::Random});
    specs.push_back({"output_norm.weight", {c.dim}, Init::Ones});
    if (!c.tied_output) specs.push_back({"output.weight", {c.dim, c.n_vocab}, Init::Random});
    if (c.arch == "phi3" && c.orig_ctx) {
        specs.push_back({"rope_factors_long.weight", {c.headDim() / 2}, Init::FactorsLong});
        specs.push_back({"rope_factors_short.weight", {c.headDim() / 2}, Init::FactorsShort});
    }
    for (uint32_t l = 0; l < c.n_layer; ++l) addLayer(c, l, specs);
    return specs;
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t tensorKey(uint64_t seed, std::string_view name) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (char ch : name) h = (h ^ uint8_t(ch)) * 0x100000001b3ull;
    return splitmix64(seed ^ splitmix64(h));
}

// Element i of a tensor: the sum of four 16-bit uniforms from one hash, centred and scaled to
// unit variance (a bell curve on [-3.46, 3.46]), times kWeightStd.
void generate(uint64_t key, Init init, uint64_t first_elem, float* out, int64_t n) {
    if (init == Init::Ones) {
        for (int64_t i = 0; i < n; ++i) out[i] = 1.0f;
        return;
    }
    if (init != Init::Random) {
        float step = init == Init::FactorsShort ? 0.25f : 0.5f;
        for (int64_t i = 0; i < n; ++i) out[i] = 1.0f + step * float((first_elem + uint64_t(i)) % 4);
        return;
    }
    constexpr float kScale = 1.7320508f / 65536.0f * kWeightStd;
    for (int64_t i = 0; i < n; ++i) {
        uint64_t h = splitmix64(key + (first_elem + uint64_t(i)) * 0x9E3779B97F4A7C15ull);
        uint32_t s = uint32_t(h & 0xffff) + uint32_t((h >> 16) & 0xffff) +
                     uint32_t((h >> 32) & 0xffff) + uint32_t(h >> 48);
        out[i] = (float(s) - 131070.0f) * kScale;
    }
}

struct Progress {
    uint64_t done = 0, total = 0;
    std::function<void(uint64_t, uint64_t)> fn;
};

GgufTensorFill makeFill(const TensorSpec& spec, DType type, uint64_t key, uint32_t threads,
                        std::shared_ptr<Progress> progress) {
    const int64_t row_len = spec.dims[0];
    const uint64_t row_bytes = *dtypeRowBytes(type, uint64_t(row_len));
    const Init init = spec.init;
    return [=](uint64_t first, uint64_t n, std::span<uint8_t> out) -> Status {
        auto work = [&](uint64_t r0, uint64_t count) {
            std::vector<float> row(static_cast<size_t>(row_len));
            for (uint64_t r = r0; r < r0 + count; ++r) {
                generate(key, init, (first + r) * uint64_t(row_len), row.data(), row_len);
                quantizeRow(type, row.data(), out.data() + r * row_bytes, row_len);
            }
        };
        uint64_t min_rows = std::max<uint64_t>(1, kMinElemsPerThread / uint64_t(row_len));
        quantizeParallelRows(n, threads, work, min_rows);
        progress->done += out.size();
        if (progress->fn) progress->fn(progress->done, progress->total);
        return {};
    };
}

void setMetadata(const SynthConfig& c, const SynthOptions& o, GgufWriter* w) {
    const std::string a = c.arch;
    w->setString("general.architecture", a);
    w->setString("general.name", c.name);
    w->setString("general.description",
                 strFormat("synthetic model, random weights (blue-synth, seed %llu)",
                           (unsigned long long)o.seed));
    w->setU32("general.file_type", quantizeFileType(o.type));
    w->setU32("general.quantization_version", 2);
    w->setU32(a + ".vocab_size", c.n_vocab);
    w->setU32(a + ".context_length", c.n_ctx);
    w->setU32(a + ".embedding_length", c.dim);
    w->setU32(a + ".block_count", c.n_layer);
    // Qwen MoE files state the dense width their config names (the shared expert's in qwen2moe)
    // and the expert widths in keys of their own; llama experts take feed_forward_length.
    uint32_t ff = c.n_ff;
    if (c.arch == "qwen2moe") ff = c.n_ff_shexp;
    if (c.arch == "qwen3moe") ff = c.n_ff * c.n_expert_used;
    w->setU32(a + ".feed_forward_length", ff);
    w->setU32(a + ".attention.head_count", c.n_head);
    w->setU32(a + ".attention.head_count_kv", c.n_head_kv);
    w->setF32(a + ".attention.layer_norm_rms_epsilon", c.norm_eps);
    w->setF32(a + ".rope.freq_base", c.rope_base);
    w->setU32(a + ".rope.dimension_count", c.headDim());
    if (c.head_dim) {
        w->setU32(a + ".attention.key_length", c.head_dim);
        w->setU32(a + ".attention.value_length", c.head_dim);
    }
    if (c.n_expert > 0) {
        w->setU32(a + ".expert_count", c.n_expert);
        w->setU32(a + ".expert_used_count", c.n_expert_used);
    }
    if (isQwenMoe(c)) w->setU32(a + ".expert_feed_forward_length", c.n_ff);
    if (c.n_ff_shexp) w->setU32(a + ".expert_shared_feed_forward_length", c.n_ff_shexp);
    if (c.isGemma()) {
        w->setU32(a + ".attention.sliding_window", c.sliding_window);
        if (c.arch == "gemma2") {
            w->setF32(a + ".attn_logit_softcapping", 50.0f);
            w->setF32(a + ".final_logit_softcapping", 30.0f);
        }
    }
    if (c.arch == "phi3" && c.orig_ctx) {
        w->setU32(a + ".rope.scaling.original_context_length", c.orig_ctx);
        w->setF32(a + ".rope.scaling.attn_factor", c.attn_factor);
    }
    if (c.yarn_factor > 0) {
        w->setString(a + ".rope.scaling.type", "yarn");
        w->setF32(a + ".rope.scaling.factor", c.yarn_factor);
        w->setU32(a + ".rope.scaling.original_context_length", c.orig_ctx);
    }
    if (c.arch == "qwen2" || isQwenMoe(c)) {
        synthAddGpt2Vocab(w, c.n_vocab);
    } else {
        synthAddLlamaVocab(w, c.n_vocab, c.mistral_tokens);
    }
}

}  // namespace

std::optional<SynthConfig> synthPreset(std::string_view name) {
    for (SynthConfig& c : presets()) {
        if (c.name == name) return c;
    }
    return std::nullopt;
}

std::vector<std::string_view> synthPresetNames() {
    static const std::vector<SynthConfig> kAll = presets();
    std::vector<std::string_view> names;
    for (const SynthConfig& c : kAll) names.push_back(c.name);
    return names;
}

Status synthValidate(const SynthConfig& c) {
    if (c.arch != "llama" && c.arch != "qwen2" && !isQwenMoe(c) && !c.isGemma() && c.arch != "phi3") {
        return BLUE_ERROR(
            "architecture '%s' is not one blue-synth makes (llama, qwen2, qwen2moe, qwen3moe, gemma2, "
            "gemma3, phi3)",
            c.arch.c_str());
    }
    if (c.isGemma() && c.sliding_window == 0) return BLUE_ERROR("%s needs a sliding window > 0", c.arch.c_str());
    const std::pair<const char*, uint32_t> sizes[] = {
        {"dim", c.dim}, {"layers", c.n_layer}, {"heads", c.n_head}, {"kv-heads", c.n_head_kv},
        {"ff", c.n_ff}, {"vocab", c.n_vocab},  {"ctx", c.n_ctx}};
    for (const auto& [field, value] : sizes) {
        if (value == 0 || value >= kMaxDim)
            return BLUE_ERROR("%s must be in 1..%u (got %u)", field, kMaxDim - 1, value);
    }
    if (c.head_dim % 2 != 0) return BLUE_ERROR("head width %u must be even", c.head_dim);
    if (!c.head_dim && (c.dim % c.n_head != 0 || c.headDim() % 2 != 0)) {
        return BLUE_ERROR("dim %u must be a multiple of heads %u with an even quotient", c.dim,
                          c.n_head);
    }
    if (c.n_head % c.n_head_kv != 0)
        return BLUE_ERROR("kv-heads %u must divide heads %u", c.n_head_kv, c.n_head);
    const uint32_t min_vocab = kMinVocab + (c.mistral_tokens ? 7 : 0);
    if (c.n_vocab < min_vocab)
        return BLUE_ERROR("vocab %u is too small for the tokenizer (>= %u)", c.n_vocab, min_vocab);
    if (c.n_expert > 0 && c.arch != "llama" && !isQwenMoe(c)) {
        return BLUE_ERROR(
            "experts need the llama (Mixtral-style), qwen2moe or qwen3moe "
            "architecture; got %s",
            c.arch.c_str());
    }
    if (c.n_expert == 0 && isQwenMoe(c))
        return BLUE_ERROR("%s needs experts (got 0)", c.arch.c_str());
    if ((c.n_ff_shexp > 0) != (c.arch == "qwen2moe")) {
        return BLUE_ERROR(
            "shared-ff %u: qwen2moe needs a shared expert, other architectures have "
            "none (%s)",
            c.n_ff_shexp, c.arch.c_str());
    }
    if (c.n_ff_shexp >= kMaxDim)
        return BLUE_ERROR("shared-ff must be below %u (got %u)", kMaxDim, c.n_ff_shexp);
    if (c.n_expert > 0 && (c.n_expert_used == 0 || c.n_expert_used > c.n_expert)) {
        return BLUE_ERROR("experts-used %u must be in 1..experts %u", c.n_expert_used, c.n_expert);
    }
    if ((c.arch == "qwen2" || c.arch == "qwen2moe") && !c.qkv_bias)
        return BLUE_ERROR("%s needs Q/K/V biases", c.arch.c_str());
    return {};
}

uint64_t synthParamCount(const SynthConfig& c) {
    const uint64_t e = c.dim, q = uint64_t(c.n_head) * c.headDim();
    const uint64_t kv = uint64_t(c.n_head_kv) * c.headDim(), f = c.n_ff;
    uint64_t attn = e * q + 2 * e * kv + q * e + (c.qkv_bias ? q + 2 * kv : 0);
    attn += c.qkNorm() ? 2 * uint64_t(c.headDim()) : 0;
    uint64_t ffn = c.n_expert ? c.n_expert * 3 * e * f + e * c.n_expert : 3 * e * f;
    ffn += c.n_ff_shexp ? 3 * e * c.n_ff_shexp + e : 0;
    uint64_t layer = attn + ffn + (c.isGemma() ? 4 : 2) * e;
    uint64_t factors = c.arch == "phi3" && c.orig_ctx ? c.headDim() : 0;
    return uint64_t(c.n_vocab) * e * (c.tied_output ? 1 : 2) + e + c.n_layer * layer + factors;
}

Status synthBuild(const SynthConfig& config, const SynthOptions& options, GgufWriter* writer) {
    BLUE_TRY(synthValidate(config));
    if (!quantizeIsTarget(options.type)) {
        return BLUE_ERROR("type %s is not one blue-synth writes (choose one of: %s)",
                          dtypeName(options.type).data(), quantizeTypeNames().c_str());
    }
    setMetadata(config, options, writer);
    QuantizeModelInfo model;
    model.n_layer = config.n_layer;
    model.n_gqa = config.n_head / config.n_head_kv;
    model.n_expert = config.n_expert;
    model.has_output = !config.tied_output;
    const uint32_t threads =
        options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
    auto progress = std::make_shared<Progress>();
    progress->fn = options.progress;
    for (const TensorSpec& spec : tensorSpecs(config)) {
        const int64_t row_len = spec.dims[0];
        DType type = quantizeIsWeightMatrix(spec.name, uint32_t(spec.dims.size()))
                         ? quantizeTensorType(spec.name, row_len, options.type, model, options.pure)
                         : DType::F32;
        uint64_t rows = 1;
        for (size_t d = 1; d < spec.dims.size(); ++d) rows *= uint64_t(spec.dims[d]);
        progress->total += *dtypeRowBytes(type, uint64_t(row_len)) * rows;
        GgufTensorFill fill =
            makeFill(spec, type, tensorKey(options.seed, spec.name), threads, progress);
        BLUE_TRY(writer->addTensor(spec.name, type, spec.dims, std::move(fill)));
    }
    return {};
}

Status synthWrite(const SynthConfig& config, const SynthOptions& options, const std::string& path) {
    GgufWriter writer;
    BLUE_TRY(synthBuild(config, options, &writer));
    return writer.write(path);
}

}  // namespace blue
