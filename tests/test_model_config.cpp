// Tests of model hyperparameters and the tensor inventory check: the real stories260K model, and
// small synthetic files of every supported architecture built with the writer, each then broken
// in one way to check the message.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

// A tiny model in llama.cpp's naming; fields left at 0 are not written.
struct Spec {
    std::string arch = "llama";
    int64_t n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 48, n_vocab = 40;
    int64_t key_length = 0;  // 0: no attention.key_length key (head_dim = n_embd / n_head)
    int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    bool bias = false, qk_norm = false, tied = false, moe_tensors = false, shexp = false;
    bool post_norms = false;  // gemma*: post_attention_norm, post_ffw_norm
    bool fused = false;       // phi3: attn_qkv and a [n_embd, 2 n_ff] ffn_up, no ffn_gate
    bool ff_key = true;                                   // write feed_forward_length
    std::set<std::string> skip;                           // tensors left out
    std::map<std::string, std::vector<int64_t>> reshape;  // tensors given other dims
    std::map<std::string, DType> retype;                  // tensors given another type
    std::vector<std::string> extra;                       // additional [n_embd] tensors
    std::function<void(GgufWriter&)> keys;                // more keys, or overrides
};

std::string blk(int64_t l, const char* s) {
    return "blk." + std::to_string(l) + "." + s;
}

Status zeros(uint64_t, uint64_t, std::span<uint8_t>) {
    return {};
}

void addTensor(GgufWriter& w, const Spec& s, const std::string& name, std::vector<int64_t> dims) {
    if (s.skip.count(name)) return;
    if (auto it = s.reshape.find(name); it != s.reshape.end()) dims = it->second;
    DType type = DType::F32;
    if (auto it = s.retype.find(name); it != s.retype.end()) type = it->second;
    Status st = w.addTensor(name, type, dims, zeros);
    REQUIRE_MESSAGE(st.isOk(), st.message());
}

void addLayer(GgufWriter& w, const Spec& s, int64_t l) {
    const int64_t e = s.n_embd, d = s.key_length ? s.key_length : e / s.n_head;
    const int64_t q = s.n_head * d, kv = s.n_head_kv * d;
    addTensor(w, s, blk(l, "attn_norm.weight"), {e});
    if (s.fused) {
        addTensor(w, s, blk(l, "attn_qkv.weight"), {e, q + 2 * kv});
    } else {
        addTensor(w, s, blk(l, "attn_q.weight"), {e, q});
        addTensor(w, s, blk(l, "attn_k.weight"), {e, kv});
        addTensor(w, s, blk(l, "attn_v.weight"), {e, kv});
    }
    addTensor(w, s, blk(l, "attn_output.weight"), {q, e});
    if (s.post_norms) addTensor(w, s, blk(l, "post_attention_norm.weight"), {e});
    if (s.bias) {
        addTensor(w, s, blk(l, "attn_q.bias"), {q});
        addTensor(w, s, blk(l, "attn_k.bias"), {kv});
        addTensor(w, s, blk(l, "attn_v.bias"), {kv});
    }
    if (s.qk_norm) {
        addTensor(w, s, blk(l, "attn_q_norm.weight"), {d});
        addTensor(w, s, blk(l, "attn_k_norm.weight"), {d});
    }
    addTensor(w, s, blk(l, "ffn_norm.weight"), {e});
    if (s.post_norms) addTensor(w, s, blk(l, "post_ffw_norm.weight"), {e});
    if (s.fused) {
        addTensor(w, s, blk(l, "ffn_up.weight"), {e, 2 * s.n_ff});
        addTensor(w, s, blk(l, "ffn_down.weight"), {s.n_ff, e});
        return;
    }
    if (!s.moe_tensors) {
        addTensor(w, s, blk(l, "ffn_gate.weight"), {e, s.n_ff});
        addTensor(w, s, blk(l, "ffn_up.weight"), {e, s.n_ff});
        addTensor(w, s, blk(l, "ffn_down.weight"), {s.n_ff, e});
        return;
    }
    const int64_t f = s.n_ff_exp ? s.n_ff_exp : s.n_ff, x = s.n_expert;
    addTensor(w, s, blk(l, "ffn_gate_inp.weight"), {e, x});
    addTensor(w, s, blk(l, "ffn_gate_exps.weight"), {e, f, x});
    addTensor(w, s, blk(l, "ffn_up_exps.weight"), {e, f, x});
    addTensor(w, s, blk(l, "ffn_down_exps.weight"), {f, e, x});
    if (s.shexp) {
        addTensor(w, s, blk(l, "ffn_gate_inp_shexp.weight"), {e});
        addTensor(w, s, blk(l, "ffn_gate_shexp.weight"), {e, s.n_ff_shexp});
        addTensor(w, s, blk(l, "ffn_up_shexp.weight"), {e, s.n_ff_shexp});
        addTensor(w, s, blk(l, "ffn_down_shexp.weight"), {s.n_ff_shexp, e});
    }
}

GgufFile build(const Spec& s) {
    GgufWriter w;
    const std::string a = s.arch;
    w.setString("general.architecture", a);
    w.setU32(a + ".context_length", 256);
    w.setU32(a + ".embedding_length", uint32_t(s.n_embd));
    w.setU32(a + ".block_count", uint32_t(s.n_layer));
    w.setU32(a + ".attention.head_count", uint32_t(s.n_head));
    w.setU32(a + ".attention.head_count_kv", uint32_t(s.n_head_kv));
    w.setF32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
    if (s.ff_key) w.setU32(a + ".feed_forward_length", uint32_t(s.n_ff));
    if (s.key_length) w.setU32(a + ".attention.key_length", uint32_t(s.key_length));
    if (s.n_expert) w.setU32(a + ".expert_count", uint32_t(s.n_expert));
    if (s.n_expert_used) w.setU32(a + ".expert_used_count", uint32_t(s.n_expert_used));
    if (s.n_ff_exp) w.setU32(a + ".expert_feed_forward_length", uint32_t(s.n_ff_exp));
    if (s.n_ff_shexp) w.setU32(a + ".expert_shared_feed_forward_length", uint32_t(s.n_ff_shexp));
    if (s.keys) s.keys(w);
    addTensor(w, s, "token_embd.weight", {s.n_embd, s.n_vocab});
    addTensor(w, s, "output_norm.weight", {s.n_embd});
    if (!s.tied) addTensor(w, s, "output.weight", {s.n_embd, s.n_vocab});
    for (int64_t l = 0; l < s.n_layer; ++l) addLayer(w, s, l);
    for (const std::string& name : s.extra) addTensor(w, s, name, {s.n_embd});
    auto bytes = w.writeToMemory();
    REQUIRE(bytes.isOk());
    Result<GgufFile> f = ggufParse(std::move(bytes).value(), "syn.gguf");
    REQUIRE_MESSAGE(f.isOk(), f.message());
    return std::move(f).value();
}

ModelConfig load(const Spec& s) {
    GgufFile f = build(s);
    Result<ModelConfig> c = modelConfigFromGguf(f);
    REQUIRE_MESSAGE(c.isOk(), c.message());
    return *c;
}

std::string loadError(const Spec& s) {
    GgufFile f = build(s);
    Result<ModelConfig> c = modelConfigFromGguf(f);
    REQUIRE(!c.isOk());
    return c.message();
}

// Small MoE files of each MoE architecture: Mixtral-style llama, qwen2moe, qwen3moe.
Spec mixtralSpec() {
    Spec s;
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.moe_tensors = true;
    return s;
}

Spec qwen2moeSpec() {
    Spec s;
    s.arch = "qwen2moe";
    s.bias = true;
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_exp = 16;
    s.n_ff_shexp = 24;
    s.moe_tensors = s.shexp = true;
    return s;
}

Spec qwen3moeSpec() {
    Spec s;
    s.arch = "qwen3moe";
    s.qk_norm = true;
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_exp = 16;
    s.moe_tensors = true;
    return s;
}

}  // namespace

TEST_CASE("model config: stories260K") {
    Result<GgufFile> f = ggufOpen(test::sharedDir() + "/models/stories260K/stories260K.gguf");
    REQUIRE_MESSAGE(f.isOk(), f.message());
    Result<ModelConfig> r = modelConfigFromGguf(*f);
    REQUIRE_MESSAGE(r.isOk(), r.message());
    const ModelConfig& c = *r;
    CHECK(c.arch == ModelArch::Llama);
    CHECK(c.arch_name == "llama");
    CHECK(c.n_embd == 64);
    CHECK(c.n_ff == 172);
    CHECK(c.n_layer == 5);
    CHECK(c.n_head == 8);
    CHECK(c.n_head_kv == 4);
    CHECK(c.head_dim == 8);
    CHECK(c.head_dim_v == 8);
    CHECK(c.n_rot == 8);
    CHECK(c.n_vocab == 512);
    CHECK(c.n_ctx_train == 2048);  // what the file says (README: trained on 512)
    CHECK(c.rms_norm_eps == doctest::Approx(1e-5));
    CHECK(c.rope_freq_base == 10000.0f);
    CHECK(c.rope_mode == RopeMode::Normal);
    CHECK(c.rope_scaling == RopeScaling::None);
    CHECK_FALSE(c.tied_output);
    CHECK_FALSE(c.has_qkv_bias);
    CHECK_FALSE(c.has_qk_norm);
    CHECK_FALSE(c.has_rope_freqs);
    CHECK_FALSE(c.isMoe());
}

TEST_CASE("model config: describe stories260K and a vocabulary file") {
    Result<GgufFile> f = ggufOpen(test::sharedDir() + "/models/stories260K/stories260K.gguf");
    REQUIRE(f.isOk());
    std::string d = ggufDescribe(*f);
    INFO(d);
    for (const char* part :
         {"GGUF v3, 1185376 bytes", "alignment 32, data section at 0x3760",
          "model: llama, 5 layers, n_embd 64, n_vocab 512", "8 heads, 4 kv heads, head_dim 8",
          "ffn: width 172", "rope normal over 8 dims, base 10000, scaling none",
          "output: output.weight",
          "tokenizer: model \"llama\", 512 tokens, bos 1, eos 2, unk 0, sep none, pad none",
          "metadata (19 keys)", "tensors (48)", "blk.4.ffn_down.weight", "[172, 64]",
          "totals: 48 tensors", "1171200 bytes", "F32: 48"}) {
        CHECK_MESSAGE(d.find(part) != std::string::npos, part);
    }
    Result<GgufFile> v = ggufOpen(test::sharedDir() + "/vocab/ggml-vocab-gpt-2.gguf");
    REQUIRE(v.isOk());
    std::string dv = ggufDescribe(*v);
    CHECK(dv.find("tokenizer: model \"gpt2\", 50257 tokens, pre \"gpt-2\", bos 50256, eos 50256") !=
          std::string::npos);
    CHECK(dv.find("tensors (0)") != std::string::npos);
    CHECK(dv.find("model:") == std::string::npos);
    CHECK(dv.find("not loadable") == std::string::npos);
    // A tokenizer `generate` would refuse is shown with the refusal.
    Spec s;
    s.keys = [](GgufWriter& w) {
        w.setString("tokenizer.ggml.model", "rwkv");
        w.setStringArray("tokenizer.ggml.tokens", std::vector<std::string>(40, "t"));
    };
    std::string ds = ggufDescribe(build(s));
    INFO(ds);
    CHECK(ds.find("tokenizer: model \"rwkv\", 40 tokens\n  not loadable: ") != std::string::npos);
}

TEST_CASE("model config: llama variants") {
    SUBCASE("dense, tied output") {
        Spec s;
        s.tied = true;
        ModelConfig c = load(s);
        CHECK(c.tied_output);
        CHECK(c.n_vocab == 40);
        CHECK(c.head_dim == 8);
        CHECK(c.rms_norm_eps == 1e-6f);
        CHECK_FALSE(c.has_qkv_bias);
    }
    SUBCASE("optional QKV biases in every layer") {
        Spec s;
        s.bias = true;
        CHECK(load(s).has_qkv_bias);
    }
    SUBCASE("a bias in one layer only is refused") {
        Spec s;
        s.bias = true;
        s.skip = {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"};
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.1.attn_q.bias' is not part of the llama forward pass");
    }
    SUBCASE("Mixtral-style MoE") {
        Spec s;
        s.n_expert = 4;
        s.n_expert_used = 2;
        s.moe_tensors = true;
        ModelConfig c = load(s);
        CHECK(c.isMoe());
        CHECK(c.n_expert == 4);
        CHECK(c.n_expert_used == 2);
        CHECK(c.n_ff_exp == 48);  // llama experts have feed_forward_length
        CHECK(c.expert_weights_norm);
    }
    SUBCASE("rope scaling") {
        Spec s;
        s.keys = [](GgufWriter& w) {
            w.setF32("llama.rope.freq_base", 500000.0f);
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
            w.setU32("llama.rope.scaling.original_context_length", 64);
        };
        ModelConfig c = load(s);
        CHECK(c.rope_freq_base == 500000.0f);
        CHECK(c.rope_scaling == RopeScaling::Yarn);
        CHECK(c.rope_scaling_factor == 4.0f);
        CHECK(c.rope_scaling_orig_ctx == 64);
        CHECK(ggufDescribe(build(s)).find("scaling yarn x4 from 64 (beta 32/1, ext 1, magnitude 1.139)") !=
              std::string::npos);

        s.keys = [](GgufWriter& w) { w.setF32("llama.rope.scale_linear", 2.0f); };  // older key
        c = load(s);
        CHECK(c.rope_scaling == RopeScaling::Linear);
        CHECK(c.rope_scaling_factor == 2.0f);
        CHECK(c.rope_scaling_orig_ctx == 256);

        s.keys = [](GgufWriter& w) { w.setString("llama.rope.scaling.type", "longrope"); };
        CHECK(loadError(s).find("rope scaling type 'longrope' is not supported") !=
              std::string::npos);
        s.keys = [](GgufWriter& w) { w.setString("llama.rope.scaling.type", "linear"); };
        CHECK(loadError(s).find("needs a positive rope.scaling.factor") != std::string::npos);
    }
    SUBCASE("Llama 3.1 rope_freqs") {
        Spec s;
        s.extra = {};
        s.keys = nullptr;
        GgufFile plain = build(s);
        CHECK_FALSE(modelConfigFromGguf(plain)->has_rope_freqs);
        s.n_embd = 32;
        s.reshape["rope_freqs.weight"] = {4};  // n_rot / 2
        s.extra = {"rope_freqs.weight"};
        CHECK(load(s).has_rope_freqs);
        s.reshape["rope_freqs.weight"] = {8};
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'rope_freqs.weight' has shape [8], expected [4]");
    }
}

TEST_CASE("model config: qwen architectures") {
    SUBCASE("qwen2: neox rope, required QKV biases") {
        Spec s;
        s.arch = "qwen2";
        s.bias = true;
        s.tied = true;
        ModelConfig c = load(s);
        CHECK(c.arch == ModelArch::Qwen2);
        CHECK(c.rope_mode == RopeMode::Neox);
        CHECK(c.has_qkv_bias);
        CHECK(c.tied_output);
        s.skip = {"blk.1.attn_v.bias"};
        CHECK(loadError(s) == "syn.gguf: qwen2: missing tensor 'blk.1.attn_v.bias'");
    }
    SUBCASE("qwen3: Q/K norm and a head width set by key_length") {
        Spec s;
        s.arch = "qwen3";
        s.qk_norm = true;
        s.key_length = 16;  // not n_embd / n_head = 8
        ModelConfig c = load(s);
        CHECK(c.has_qk_norm);
        CHECK_FALSE(c.has_qkv_bias);
        CHECK(c.head_dim == 16);
        CHECK(c.head_dim_v == 16);
        CHECK(c.n_rot == 16);
        s.reshape["blk.0.attn_k_norm.weight"] = {8};
        CHECK(loadError(s) ==
              "syn.gguf: qwen3: tensor 'blk.0.attn_k_norm.weight' has shape [8], expected [16]");
    }
    SUBCASE("qwen2moe: experts and a shared expert") {
        Spec s;
        s.arch = "qwen2moe";
        s.bias = true;
        s.n_expert = 4;
        s.n_expert_used = 2;
        s.n_ff_exp = 16;
        s.n_ff_shexp = 24;
        s.moe_tensors = s.shexp = true;
        ModelConfig c = load(s);
        CHECK(c.arch == ModelArch::Qwen2Moe);
        CHECK(c.n_ff_exp == 16);
        CHECK(c.n_ff_shexp == 24);
        CHECK_FALSE(c.expert_weights_norm);
        s.skip = {"blk.1.ffn_gate_inp_shexp.weight"};
        CHECK(loadError(s) ==
              "syn.gguf: qwen2moe: missing tensor 'blk.1.ffn_gate_inp_shexp.weight'");
    }
    SUBCASE("qwen3moe: expert width falls back to n_ff / n_expert_used") {
        Spec s;
        s.arch = "qwen3moe";
        s.qk_norm = true;
        s.n_ff = 64;
        s.n_expert = 8;
        s.n_expert_used = 2;
        s.n_ff_exp = 0;
        s.moe_tensors = true;
        s.reshape = {{"blk.0.ffn_gate_exps.weight", {32, 32, 8}},
                     {"blk.0.ffn_up_exps.weight", {32, 32, 8}},
                     {"blk.0.ffn_down_exps.weight", {32, 32, 8}},
                     {"blk.1.ffn_gate_exps.weight", {32, 32, 8}},
                     {"blk.1.ffn_up_exps.weight", {32, 32, 8}},
                     {"blk.1.ffn_down_exps.weight", {32, 32, 8}}};
        ModelConfig c = load(s);
        CHECK(c.n_ff_exp == 32);
        CHECK(c.expert_weights_norm);
        CHECK(c.has_qk_norm);
    }
    SUBCASE("MoE architectures need experts") {
        Spec s;
        s.arch = "qwen3moe";
        s.qk_norm = true;
        CHECK(loadError(s) == "syn.gguf: qwen3moe needs qwen3moe.expert_count > 0");
    }
}

TEST_CASE("model config: errors name the key or tensor") {
    Spec s;
    SUBCASE("wrong shape") {
        s.reshape["blk.0.attn_k.weight"] = {32, 32};
        CHECK(
            loadError(s) ==
            "syn.gguf: llama: tensor 'blk.0.attn_k.weight' has shape [32, 32], expected [32, 16]");
    }
    SUBCASE("missing tensor") {
        s.skip = {"blk.1.ffn_up.weight"};
        CHECK(loadError(s) == "syn.gguf: llama: missing tensor 'blk.1.ffn_up.weight'");
        s.skip = {"token_embd.weight"};
        CHECK(loadError(s) == "syn.gguf: llama: missing tensor 'token_embd.weight'");
    }
    SUBCASE("unsupported type") {
        s.retype["blk.1.attn_q.weight"] = DType::I64;
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.1.attn_q.weight' has type I64, which BlueVM does "
              "not support");
    }
    SUBCASE("types no GPU kernel reads: named at load, not at lowering or on the device") {
        s.retype["blk.1.attn_q.weight"] = DType::Q8_1;
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.1.attn_q.weight' has type Q8_1, which no GPU kernel reads as a "
              "matrix (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
              "IQ4_XS, TQ1_0, TQ2_0, MXFP4 do)");
        s.retype = {{"blk.0.ffn_down.weight", DType::I8}};
        CHECK(loadError(s).find("tensor 'blk.0.ffn_down.weight' has type I8, which no GPU kernel reads") !=
              std::string::npos);
        s.retype = {{"blk.0.attn_norm.weight", DType::F16}};
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.0.attn_norm.weight' has type F16; norm weights, biases and "
              "other vectors must be F32 (as llama.cpp writes them)");
    }
    SUBCASE("rope scaling types") {
        s.keys = [](GgufWriter& w) { w.setString("llama.rope.scaling.type", "longrope"); };
        CHECK(loadError(s) ==
              "syn.gguf: rope scaling type 'longrope' is not supported (BlueVM runs none, linear and yarn; longrope for phi3)");
        // YaRN: llama.cpp's defaults, its keys, and what is refused.
        s.keys = [](GgufWriter& w) {
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
        };
        GgufFile f = build(s);
        Result<ModelConfig> cfg = modelConfigFromGguf(f);
        REQUIRE_MESSAGE(cfg, cfg.message());
        CHECK(cfg.value().yarn_ext_factor == 1.0f);
        CHECK(cfg.value().yarn_attn_factor == 1.0f);
        CHECK(cfg.value().yarn_beta_fast == 32.0f);
        CHECK(cfg.value().yarn_beta_slow == 1.0f);
        CHECK(cfg.value().rope_scaling_orig_ctx == cfg.value().n_ctx_train);
        CHECK(yarnFreqDivisors(cfg.value()).size() == cfg.value().n_rot / 2);
        CHECK(ropeMagnitude(cfg.value(), false) == doctest::Approx(1.0f + 0.1f * std::log(4.0f)));
        CHECK(ropeMagnitude(cfg.value(), true) == 1.0f);
        LowerOptions opt;
        opt.grammar_words = 0;  // the spec has no vocabulary
        Result<Module> m = lowerModel(f, cfg.value(), opt);
        REQUIRE_MESSAGE(m, m.message());
        s.keys = [](GgufWriter& w) {
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
            w.setF32("llama.rope.scaling.yarn_ext_factor", 0.0f);
            w.setF32("llama.rope.scaling.yarn_attn_factor", 0.5f);
            w.setF32("llama.rope.scaling.yarn_beta_fast", 16.0f);
            w.setF32("llama.rope.scaling.yarn_beta_slow", 2.0f);
        };
        ModelConfig c = load(s);
        CHECK(c.yarn_beta_fast == 16.0f);
        CHECK(c.yarn_beta_slow == 2.0f);
        CHECK(ropeMagnitude(c, false) == 0.5f);  // no ramp, no logarithm
        for (float d : yarnFreqDivisors(c)) CHECK(d == doctest::Approx(4.0f));  // all interpolated
        s.keys = [](GgufWriter& w) {
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
            w.setF32("llama.rope.scaling.yarn_ext_factor", 2.0f);
        };
        CHECK(loadError(s) == "syn.gguf: key 'llama.rope.scaling.yarn_ext_factor' is 2; it must be in [0, 1]");
        s.keys = [](GgufWriter& w) {
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
            w.setF32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
        };
        CHECK(loadError(s) ==
              "syn.gguf: key 'llama.rope.scaling.yarn_log_multiplier' (DeepSeek's YaRN magnitude) is not supported");
        s.keys = [](GgufWriter& w) {
            w.setString("llama.rope.scaling.type", "yarn");
            w.setF32("llama.rope.scaling.factor", 4.0f);
            w.setF32("llama.rope.scaling.yarn_beta_fast", -1.0f);
        };
        CHECK(loadError(s) == "syn.gguf: key 'llama.rope.scaling.yarn_beta_fast' is -1; it must be positive");
    }
    SUBCASE("tensor the forward pass would ignore") {
        s.extra = {"blk.0.mystery.weight"};
        CHECK(
            loadError(s) ==
            "syn.gguf: llama: tensor 'blk.0.mystery.weight' is not part of the llama forward pass");
    }
    SUBCASE("unknown architecture") {
        s.arch = "gpt2";
        CHECK(loadError(s) ==
              "syn.gguf: architecture 'gpt2' is not supported (llama, qwen2, qwen3, qwen2moe, "
              "qwen3moe, gemma2, gemma3, phi3)");
    }
    SUBCASE("missing and mistyped keys") {
        s.keys = [](GgufWriter& w) { w.setString("llama.embedding_length", "32"); };
        CHECK(loadError(s) ==
              "syn.gguf: key 'llama.embedding_length': expected an integer, found string");
        s.keys = [](GgufWriter& w) { w.setI32("llama.block_count", -2); };
        CHECK(loadError(s) == "syn.gguf: key 'llama.block_count': value -2 does not fit u32");
        s.ff_key = false;
        s.keys = nullptr;
        CHECK(loadError(s) == "syn.gguf: missing or zero key 'llama.feed_forward_length'");
    }
    SUBCASE("inconsistent heads") {
        s.keys = [](GgufWriter& w) { w.setU32("llama.attention.head_count_kv", 3); };
        CHECK(loadError(s) == "syn.gguf: head_count_kv 3 does not divide head_count 4");
    }
    SUBCASE("vocabulary size disagreements") {
        s.keys = [](GgufWriter& w) {
            std::vector<std::string> tokens(39, "t");
            w.setStringArray("tokenizer.ggml.tokens", tokens);
        };
        CHECK(loadError(s) ==
              "syn.gguf: tokenizer.ggml.tokens has 39 tokens but token_embd.weight has 40 rows");
        s.keys = [](GgufWriter& w) { w.setU32("llama.vocab_size", 41); };
        CHECK(loadError(s) == "syn.gguf: llama.vocab_size is 41 but token_embd.weight has 40 rows");
    }
}

TEST_CASE("model config: describe MoE files with their gating rule") {
    struct Case {
        Spec spec;
        const char* ffn;
        const char* gating;
    };
    for (const Case& k :
         {Case{mixtralSpec(), "ffn: 4 experts, 2 used, expert width 48\n",
               "gating: softmax, top-k, renormalised\n"},
          Case{qwen2moeSpec(), "ffn: 4 experts, 2 used, expert width 16, shared expert width 24\n",
               "gating: softmax, top-k; shared expert gated by sigmoid\n"},
          Case{qwen3moeSpec(), "ffn: 4 experts, 2 used, expert width 16\n",
               "gating: softmax, top-k, renormalised\n"}}) {
        std::string d = ggufDescribe(build(k.spec));
        INFO(d);
        CHECK(d.find(k.ffn) != std::string::npos);
        CHECK(d.find(k.gating) != std::string::npos);
    }
}

TEST_CASE("model config: malformed MoE files name the key or tensor") {
    SUBCASE("expert counts") {
        Spec s = qwen2moeSpec();
        s.n_expert = 0;  // no expert_count key at all
        s.moe_tensors = s.shexp = false;
        CHECK(loadError(s) == "syn.gguf: qwen2moe needs qwen2moe.expert_count > 0");
        s = qwen3moeSpec();
        s.keys = [](GgufWriter& w) { w.setU32("qwen3moe.expert_count", 0); };
        CHECK(loadError(s) == "syn.gguf: qwen3moe needs qwen3moe.expert_count > 0");
        s = mixtralSpec();
        s.keys = [](GgufWriter& w) { w.setU32("llama.expert_used_count", 5); };
        CHECK(loadError(s) ==
              "syn.gguf: key 'llama.expert_used_count' is 5, more than llama.expert_count 4");
        s.keys = [](GgufWriter& w) { w.setU32("llama.expert_used_count", 0); };
        CHECK(loadError(s) == "syn.gguf: key 'llama.expert_used_count' is 0");
        s = qwen3moeSpec();
        s.n_expert_used = 0;  // key absent
        CHECK(loadError(s) == "syn.gguf: missing key 'qwen3moe.expert_used_count'");
    }
    SUBCASE("expert widths") {
        Spec s = qwen2moeSpec();
        s.n_ff_shexp = 0;  // no expert_shared_feed_forward_length: falls back to n_ff
        s.ff_key = false;  // ... which is absent too
        s.shexp = false;
        CHECK(loadError(s) ==
              "syn.gguf: missing or zero key 'qwen2moe.expert_shared_feed_forward_length'");
        s = qwen3moeSpec();
        s.n_ff_exp = 0;  // falls back to feed_forward_length / expert_used_count
        s.ff_key = false;
        CHECK(loadError(s) ==
              "syn.gguf: missing or zero key 'qwen3moe.expert_feed_forward_length'");
    }
    SUBCASE("missing router and expert tensors") {
        Spec s = mixtralSpec();
        s.skip = {"blk.1.ffn_gate_exps.weight"};
        CHECK(loadError(s) == "syn.gguf: llama: missing tensor 'blk.1.ffn_gate_exps.weight'");
        s.skip = {"blk.0.ffn_gate_inp.weight"};
        CHECK(loadError(s) == "syn.gguf: llama: missing tensor 'blk.0.ffn_gate_inp.weight'");
        s = qwen3moeSpec();
        s.skip = {"blk.1.ffn_down_exps.weight"};
        CHECK(loadError(s) == "syn.gguf: qwen3moe: missing tensor 'blk.1.ffn_down_exps.weight'");
        for (const char* name : {"blk.0.ffn_gate_inp_shexp.weight", "blk.1.ffn_up_shexp.weight",
                                 "blk.1.ffn_down_shexp.weight"}) {
            s = qwen2moeSpec();
            s.skip = {name};
            CHECK(loadError(s) == std::string("syn.gguf: qwen2moe: missing tensor '") + name + "'");
        }
    }
    SUBCASE("expert tensors of the wrong shape") {
        Spec s = mixtralSpec();
        s.reshape["blk.1.ffn_up_exps.weight"] = {32, 48, 3};  // E 3, not 4
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.1.ffn_up_exps.weight' has shape "
              "[32, 48, 3], expected [32, 48, 4]");
        s.reshape = {{"blk.0.ffn_gate_inp.weight", {32, 8}}};
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.0.ffn_gate_inp.weight' has shape "
              "[32, 8], expected [32, 4]");
        s = qwen3moeSpec();
        s.reshape["blk.0.ffn_down_exps.weight"] = {24, 32, 4};  // n_ff_exp 24, not 16
        CHECK(loadError(s) ==
              "syn.gguf: qwen3moe: tensor 'blk.0.ffn_down_exps.weight' has shape "
              "[24, 32, 4], expected [16, 32, 4]");
        s.reshape = {{"blk.0.ffn_gate_exps.weight", {32, 16}}};  // 2-D: one expert's worth
        CHECK(loadError(s) ==
              "syn.gguf: qwen3moe: tensor 'blk.0.ffn_gate_exps.weight' has shape "
              "[32, 16], expected [32, 16, 4]");
        s = qwen2moeSpec();
        s.reshape["blk.1.ffn_gate_shexp.weight"] = {32, 16};  // the routed width, not 24
        CHECK(loadError(s) ==
              "syn.gguf: qwen2moe: tensor 'blk.1.ffn_gate_shexp.weight' has shape "
              "[32, 16], expected [32, 24]");
    }
    SUBCASE("dense tensors in an MoE file, MoE tensors in a dense one") {
        Spec s = mixtralSpec();
        s.extra = {"blk.0.ffn_gate.weight"};
        s.reshape["blk.0.ffn_gate.weight"] = {32, 48};
        CHECK(loadError(s) ==
              "syn.gguf: llama: tensor 'blk.0.ffn_gate.weight' is not part of the llama forward "
              "pass");
        s = qwen3moeSpec();
        s.arch = "qwen3";  // the same tensors under the dense architecture
        CHECK(loadError(s) == "syn.gguf: qwen3: missing tensor 'blk.0.ffn_gate.weight'");
    }
}

namespace {

Spec gemmaSpec(const char* arch) {
    Spec s;
    s.arch = arch;
    s.tied = true;
    s.post_norms = true;
    s.qk_norm = std::string(arch) == "gemma3";
    s.n_layer = 6;
    return s;
}

Spec phi3Spec() {
    Spec s;
    s.arch = "phi3";
    s.n_head_kv = 4;
    s.fused = true;
    return s;
}

}  // namespace

TEST_CASE("model config: gemma2, gemma3 and phi3 with llama.cpp's defaults") {
    SUBCASE("gemma2: window 4096, soft caps 50 and 30, even layers slide") {
        ModelConfig c = load(gemmaSpec("gemma2"));
        CHECK(c.arch == ModelArch::Gemma2);
        CHECK((c.gelu_ffn && c.scale_embeddings && c.post_norms && c.tied_output && !c.has_qk_norm));
        CHECK(c.sliding_window == 4096);
        CHECK(c.attn_softcap == 50.0f);
        CHECK(c.final_softcap == 30.0f);
        CHECK(c.isSlidingLayer(0));
        CHECK(!c.isSlidingLayer(1));
        CHECK(c.isSlidingLayer(4));
        CHECK(c.attn_scale == doctest::Approx(1.0 / std::sqrt(8.0)));
        CHECK(c.rope_mode == RopeMode::Neox);
    }
    SUBCASE("gemma3: stated window, 5 of 6 layers slide with base 10000, no soft caps") {
        Spec s = gemmaSpec("gemma3");
        s.keys = [](GgufWriter& w) { w.setU32("gemma3.attention.sliding_window", 512); };
        ModelConfig c = load(s);
        CHECK(c.has_qk_norm);
        CHECK(c.sliding_window == 512);
        for (uint32_t l = 0; l < 5; ++l) CHECK(c.isSlidingLayer(l));
        CHECK(!c.isSlidingLayer(5));
        CHECK(c.rope_freq_base_swa == 10000.0f);
        CHECK(c.attn_softcap == 0.0f);
        CHECK(c.final_softcap == 0.0f);
    }
    SUBCASE("llama takes rope.scaling.attn_factor too, as llama.cpp reads it for every architecture") {
        Spec s;
        CHECK(load(s).rope_attn_factor == 1.0f);
        s.keys = [](GgufWriter& w) { w.setF32("llama.rope.scaling.attn_factor", 1.5f); };
        CHECK(load(s).rope_attn_factor == 1.5f);
    }
    SUBCASE("phi3: fused or separate Q/K/V, fused gate/up, LongRoPE factors") {
        Spec s = phi3Spec();
        s.extra = {};
        s.keys = [](GgufWriter& w) {
            w.setU32("phi3.rope.scaling.original_context_length", 64);
            w.setF32("phi3.rope.scaling.attn_factor", 1.25f);
        };
        ModelConfig c = load(s);
        CHECK((c.fused_qkv && c.fused_up && !c.gelu_ffn && c.sliding_window == 0));
        CHECK(c.rope_scaling_orig_ctx == 64);
        CHECK(c.rope_attn_factor == 1.25f);
        CHECK(!c.has_rope_long);
        s.fused = false;
        s.skip = {};
        // separate Q/K/V still need the fused ffn_up, which this spec only writes when fused
        s.extra = {};
        CHECK(loadError(s) == "syn.gguf: phi3: tensor 'blk.0.ffn_up.weight' has shape [32, 48], expected [32, 96]");
    }
}

TEST_CASE("model config: describe gemma and phi3 files with what they add") {
    Spec g = gemmaSpec("gemma3");
    g.keys = [](GgufWriter& w) { w.setU32("gemma3.attention.sliding_window", 512); };
    std::string text = ggufDescribe(build(g));
    CHECK(text.find("  ffn: width 48, geglu\n") != std::string::npos);
    CHECK(text.find("  sliding window 512 on layers l % 6 < 5 (rope base 10000 there)\n") != std::string::npos);
    CHECK(text.find("  embeddings x sqrt(n_embd) yes, post-sublayer norms yes, attention softcap 0, final softcap 0\n") !=
          std::string::npos);
    Spec p = phi3Spec();
    p.keys = [](GgufWriter& w) { w.setF32("phi3.rope.scaling.attn_factor", 1.25f); };
    text = ggufDescribe(build(p));
    CHECK(text.find("  ffn: width 48, swiglu, gate and up fused in ffn_up\n") != std::string::npos);
    CHECK(text.find("  attention weights: Q, K, V fused in attn_qkv\n") != std::string::npos);
    CHECK(text.find("scaling none, attention factor 1.25\n") != std::string::npos);
}

TEST_CASE("model config: malformed gemma and phi3 files name the key or tensor") {
    SUBCASE("gemma3 without its sliding window") {
        CHECK(loadError(gemmaSpec("gemma3")) == "syn.gguf: missing key 'gemma3.attention.sliding_window'");
    }
    SUBCASE("gemma2 with a zero window or soft cap") {
        Spec s = gemmaSpec("gemma2");
        s.keys = [](GgufWriter& w) { w.setU32("gemma2.attention.sliding_window", 0); };
        CHECK(loadError(s) == "syn.gguf: key 'gemma2.attention.sliding_window' is 0");
        s.keys = [](GgufWriter& w) { w.setF32("gemma2.attn_logit_softcapping", 0.0f); };
        CHECK(loadError(s) == "syn.gguf: key 'gemma2.attn_logit_softcapping' is 0; it must be positive");
        s.keys = [](GgufWriter& w) { w.setF32("gemma2.final_logit_softcapping", -30.0f); };
        CHECK(loadError(s) == "syn.gguf: key 'gemma2.final_logit_softcapping' is -30; it must be positive");
    }
    SUBCASE("gemma without a post-sublayer norm") {
        Spec s = gemmaSpec("gemma2");
        s.skip = {"blk.3.post_ffw_norm.weight"};
        CHECK(loadError(s) == "syn.gguf: gemma2: missing tensor 'blk.3.post_ffw_norm.weight'");
        s = gemmaSpec("gemma3");
        s.keys = [](GgufWriter& w) { w.setU32("gemma3.attention.sliding_window", 512); };
        s.reshape["blk.1.post_attention_norm.weight"] = {16};
        CHECK(loadError(s) == "syn.gguf: gemma3: tensor 'blk.1.post_attention_norm.weight' has shape [16], expected [32]");
    }
    SUBCASE("phi3 fused tensors of the wrong shape") {
        Spec s = phi3Spec();
        s.reshape["blk.1.attn_qkv.weight"] = {32, 64};
        CHECK(loadError(s) == "syn.gguf: phi3: tensor 'blk.1.attn_qkv.weight' has shape [32, 64], expected [32, 96]");
        s = phi3Spec();
        s.reshape["blk.0.ffn_up.weight"] = {32, 48};
        CHECK(loadError(s) == "syn.gguf: phi3: tensor 'blk.0.ffn_up.weight' has shape [32, 48], expected [32, 96]");
    }
    SUBCASE("phi3 LongRoPE factors of the wrong length, attention factor with partial rotation") {
        Spec s = phi3Spec();
        s.extra = {"rope_factors_short.weight"};  // [n_embd], not [n_rot / 2]
        CHECK(loadError(s) == "syn.gguf: phi3: tensor 'rope_factors_short.weight' has shape [32], expected [4]");
        s = phi3Spec();
        s.keys = [](GgufWriter& w) {
            w.setU32("phi3.rope.dimension_count", 4);
            w.setF32("phi3.rope.scaling.attn_factor", 1.19f);
        };
        CHECK(loadError(s) == "syn.gguf: key 'phi3.rope.scaling.attn_factor' with partial rotation "
                              "(rope.dimension_count 4 < head width 8) is not supported");
    }
}

}  // namespace blue
