// Tests of blue-synth (tools/synth): tiny models of each architecture load with
// modelConfigFromGguf, the parameter formula matches the tensors written and the published sizes
// of the real models, a seed fixes the bytes, the weights have the intended distribution, and the
// vocabularies are well-formed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "compiler/chat_template.h"
#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "compiler/quantize.h"
#include "compiler/tokenizer.h"
#include "tools/synth/synth.h"
#include "vm/llm_abi.h"
#include "vm/quant.h"

namespace blue {
namespace {

// A preset shrunk to test size, keeping its architecture and features.
SynthConfig tiny(const char* preset) {
    SynthConfig c = *synthPreset(preset);
    c.dim = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 128;
    c.n_vocab = 300;
    return c;
}

GgufFile build(const SynthConfig& c, SynthOptions opt = {}) {
    GgufWriter w;
    Status s = synthBuild(c, opt, &w);
    REQUIRE_MESSAGE(s, s.message());
    Result<std::vector<uint8_t>> bytes = w.writeToMemory();
    REQUIRE_MESSAGE(bytes, bytes.message());
    Result<GgufFile> f = ggufParse(std::move(bytes.value()), c.name);
    REQUIRE_MESSAGE(f, f.message());
    return std::move(f.value());
}

std::vector<uint8_t> bytesOf(const SynthConfig& c, SynthOptions opt) {
    GgufWriter w;
    REQUIRE(synthBuild(c, opt, &w));
    return w.writeToMemory().value();
}

std::vector<float> decode(const GgufFile& f, const std::string& name) {
    const GgufTensor* t = f.findTensor(name);
    REQUIRE_MESSAGE(t, name);
    std::span<const uint8_t> data = f.rawTensorData(*t);
    std::vector<float> out(size_t(t->n_elements));
    const uint64_t row_bytes = t->n_bytes / uint64_t(t->rows());
    for (int64_t r = 0; r < t->rows(); ++r) {
        dequantizeRow(t->type, data.data() + uint64_t(r) * row_bytes, out.data() + r * t->ne[0],
                      t->ne[0]);
    }
    return out;
}

}  // namespace

TEST_CASE("synth: parameter counts of the presets") {
    // Published sizes of the real models these presets copy.
    CHECK(synthParamCount(*synthPreset("tinyllama-1.1b")) == 1100048384ull);
    CHECK(synthParamCount(*synthPreset("qwen2-0.5b")) == 494032768ull);
    // PEERS.md: 19.8M, 36.3M and 200.8M; llama2.c's stories15M and stories110M.
    auto millions = [](const char* p) {
        return std::round(synthParamCount(*synthPreset(p)) / 1e5) / 10;
    };
    CHECK(millions("peer-dim256") == 19.8);
    CHECK(millions("peer-moe") == 36.3);
    CHECK(millions("peer-dim1024") == 200.8);
    CHECK(millions("stories15M") == 15.2);
    CHECK(millions("stories110M") == 109.5);
    CHECK(synthPresetNames().size() == 15);
    CHECK_FALSE(synthPreset("llama-70b").has_value());
}

TEST_CASE("synth: a tiny model of each architecture loads") {
    struct Case {
        const char* preset;
        ModelArch arch;
        uint32_t experts;
        bool tied, bias;
    };
    for (Case k : {Case{"stories15M", ModelArch::Llama, 0, true, false},
                   Case{"peer-dim256", ModelArch::Llama, 0, false, false},
                   Case{"qwen2-0.5b", ModelArch::Qwen2, 0, true, true},
                   Case{"mixtral-tiny", ModelArch::Llama, 8, false, false},
                   Case{"qwen2moe-tiny", ModelArch::Qwen2Moe, 16, false, true},
                   Case{"qwen3moe-tiny", ModelArch::Qwen3Moe, 16, false, false},
                   Case{"gemma2-tiny", ModelArch::Gemma2, 0, true, false},
                   Case{"gemma3-tiny", ModelArch::Gemma3, 0, true, false},
                   Case{"phi3-tiny", ModelArch::Phi3, 0, false, false},
                   Case{"mistral-tiny", ModelArch::Llama, 0, false, false}}) {
        for (DType type : {DType::F32, DType::Q8_0, DType::Q4_K}) {
            CAPTURE(k.preset);
            CAPTURE(dtypeName(type));
            SynthConfig c = tiny(k.preset);
            SynthOptions opt;
            opt.type = type;
            GgufFile f = build(c, opt);
            Result<ModelConfig> m = modelConfigFromGguf(f);
            REQUIRE_MESSAGE(m, m.message());
            CHECK(m->arch == k.arch);
            CHECK(m->n_embd == 64);
            CHECK(m->n_layer == 2);
            CHECK(m->n_head == 4);
            CHECK(m->n_head_kv == 2);
            CHECK(m->n_vocab == 300);
            CHECK(m->n_expert == k.experts);
            CHECK((k.experts ? m->n_ff_exp : m->n_ff) == 128);
            if (k.experts) CHECK(m->n_expert_used == c.n_expert_used);
            CHECK(m->n_ff_shexp == c.n_ff_shexp);
            CHECK(m->has_qk_norm == c.qkNorm());
            CHECK(m->tied_output == k.tied);
            CHECK(m->has_qkv_bias == k.bias);
            CHECK(f.getU32("general.file_type").value() == quantizeFileType(type));
            uint64_t elements = 0;
            for (const GgufTensor& t : f.tensors()) elements += uint64_t(t.n_elements);
            CHECK(elements == synthParamCount(c));
        }
    }
}

TEST_CASE("synth: the Qwen MoE presets have Qwen MoE shapes and keys") {
    SynthConfig c2 = *synthPreset("qwen2moe-tiny");
    CHECK(c2.arch == "qwen2moe");
    CHECK(c2.n_expert == 16);
    CHECK(c2.n_expert_used == 4);
    CHECK(c2.n_ff == 256);
    CHECK(c2.n_ff_shexp == 1024);
    CHECK(c2.qkv_bias);
    SynthConfig c3 = *synthPreset("qwen3moe-tiny");
    CHECK(c3.arch == "qwen3moe");
    CHECK(c3.n_expert == 16);
    CHECK(c3.n_expert_used == 4);
    CHECK(c3.n_ff == 128);
    CHECK(c3.n_ff_shexp == 0);
    CHECK(c3.qkNorm());
    for (SynthConfig c : {c2, c3}) {
        CAPTURE(c.name);
        c.n_vocab = 300;
        c.n_layer = 2;
        GgufFile f = build(c);
        Result<ModelConfig> m = modelConfigFromGguf(f);
        REQUIRE_MESSAGE(m, m.message());
        const std::string a = c.arch;
        CHECK(f.getU32(a + ".expert_count").value() == 16);
        CHECK(f.getU32(a + ".expert_used_count").value() == 4);
        CHECK(f.getU32(a + ".expert_feed_forward_length").value() == c.n_ff);
        CHECK(f.has(a + ".expert_shared_feed_forward_length") == (c.n_ff_shexp > 0));
        CHECK(f.getString("tokenizer.ggml.model").value() == "gpt2");
        CHECK(m->n_embd == 256);
        CHECK(m->n_head == 8);
        CHECK(m->n_head_kv == 2);
        CHECK(m->n_ff_exp == c.n_ff);
        CHECK(m->n_ff_shexp == c.n_ff_shexp);
        CHECK(m->expert_weights_norm == (a == "qwen3moe"));
        CHECK(m->has_qkv_bias == (a == "qwen2moe"));
        CHECK(m->has_qk_norm == (a == "qwen3moe"));
        CHECK(m->rope_mode == RopeMode::Neox);
        uint64_t elements = 0;
        for (const GgufTensor& t : f.tensors()) elements += uint64_t(t.n_elements);
        CHECK(elements == synthParamCount(c));
        const GgufTensor* down = f.findTensor("blk.1.ffn_down_shexp.weight");
        CHECK((down != nullptr) == (c.n_ff_shexp > 0));
        if (down) CHECK(down->ne == std::array<int64_t, 4>{1024, 256, 1, 1});
    }
}

TEST_CASE("synth: the seed fixes the bytes, whatever the thread count") {
    SynthConfig c = tiny("mixtral-tiny");
    SynthOptions a, b, other;
    a.seed = b.seed = 42;
    a.threads = 1;
    b.threads = 2;
    other.seed = 43;
    a.type = b.type = other.type = DType::Q4_0;
    std::vector<uint8_t> x = bytesOf(c, a);
    CHECK(x == bytesOf(c, b));
    CHECK(x == bytesOf(c, a));
    std::vector<uint8_t> y = bytesOf(c, other);
    REQUIRE(x.size() == y.size());
    size_t differing = 0;
    for (size_t i = 0; i < x.size(); ++i) differing += x[i] != y[i];
    CHECK(differing > x.size() / 2);
}

TEST_CASE("synth: weights look like N(0, 0.02), norms are 1") {
    SynthConfig c = tiny("qwen2-0.5b");
    c.dim = 256;
    c.n_ff = 512;
    GgufFile f = build(c);
    std::vector<float> w = decode(f, "blk.1.ffn_up.weight");
    double sum = 0, sq = 0, peak = 0;
    for (float v : w) {
        sum += v;
        sq += double(v) * v;
        peak = std::max(peak, double(std::fabs(v)));
    }
    double mean = sum / double(w.size()), sd = std::sqrt(sq / double(w.size()) - mean * mean);
    CHECK(std::fabs(mean) < 2e-4);
    CHECK(std::fabs(sd - 0.02) < 0.0004);
    CHECK(peak < 0.02 * 3.47);
    CHECK(peak > 0.02 * 2.5);
    for (float v : decode(f, "blk.0.attn_norm.weight")) REQUIRE(v == 1.0f);
    for (float v : decode(f, "output_norm.weight")) REQUIRE(v == 1.0f);
    // Tensors are independent streams: the same element of two tensors differs.
    CHECK(decode(f, "blk.0.attn_q.weight")[0] != decode(f, "blk.1.attn_q.weight")[0]);
    std::vector<float> bias = decode(f, "blk.0.attn_q.bias");
    CHECK(std::count(bias.begin(), bias.end(), 0.0f) == 0);
}

TEST_CASE("synth: a quantized model holds the f32 model's weights, in the quantize mix") {
    SynthConfig c = tiny("stories15M");
    c.dim = 256;  // whole K blocks
    c.n_ff = 512;
    SynthOptions q;
    q.type = DType::Q4_K;
    GgufFile ref = build(c), got = build(c, q);
    // Q4_K_M on 2 layers: use_more_bits(i, 2) holds for layer 1 only (7*2/8 = 1).
    CHECK(got.findTensor("blk.0.attn_v.weight")->type == DType::Q4_K);
    CHECK(got.findTensor("blk.1.attn_v.weight")->type == DType::Q6_K);
    CHECK(got.findTensor("blk.1.ffn_down.weight")->type == DType::Q6_K);
    CHECK(got.findTensor("blk.0.ffn_up.weight")->type == DType::Q4_K);
    CHECK(got.findTensor("token_embd.weight")->type == DType::Q6_K);  // tied: it is the output
    CHECK(got.findTensor("blk.0.attn_norm.weight")->type == DType::F32);
    for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"}) {
        std::vector<float> a = decode(ref, name), b = decode(got, name);
        double err = 0, norm = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
            norm += double(a[i]) * a[i];
        }
        CAPTURE(name);
        CHECK(std::sqrt(err / norm) < 0.1);  // Q4_K on Gaussian rows: ~0.08 at most
    }
}

// Mistral v3's control tokens (the mistral-tiny preset): the chat template is inferred as
// mistral-v3; [TOOL_CALLS] is the one control token decoding shows (tool calls are read back
// from it) and the one with bytes in the grammar's token table; [INST] stays hidden.
TEST_CASE("synth: Mistral's control tokens, and the tool-call marker decoding shows") {
    GgufWriter w;
    w.setString("general.architecture", "llama");
    synthAddLlamaVocab(&w, 300, true);
    Result<GgufFile> f = ggufParse(w.writeToMemory().value(), "mistral-vocab");
    REQUIRE(f);
    std::vector<std::string_view> tokens = f->getStringArray("tokenizer.ggml.tokens").value();
    REQUIRE(tokens.size() == 300);
    CHECK(tokens[3] == "[INST]");
    CHECK(tokens[5] == "[TOOL_CALLS]");
    CHECK(tokens[9] == "[/TOOL_RESULTS]");
    CHECK(tokens[10] == "<0x00>");
    Result<ChatTemplate> t = chatTemplateOf(*f);
    REQUIRE(t);
    CHECK(*t == ChatTemplate::MistralV3);
    Result<Tokenizer> tok = Tokenizer::fromGguf(*f);
    REQUIRE_MESSAGE(tok, tok.message());
    const std::vector<int32_t> ids = tok->encode("[INST] hi[/INST][TOOL_CALLS] [", false, true);
    REQUIRE(ids.size() >= 4);
    CHECK(ids[0] == 3);
    CHECK(std::count(ids.begin(), ids.end(), 5) == 1);
    // Decoding leaves out [INST] and [/INST] and shows [TOOL_CALLS]: the text is the rendered
    // one without the hidden tokens' texts (and, as SentencePiece decodes, without the first
    // text token's leading space, which [INST] no longer precedes).
    std::string rendered = tok->decode(ids, true);
    REQUIRE(rendered.find("[INST] ") == 0);
    rendered.erase(0, 7);
    REQUIRE(rendered.find("[/INST]") != std::string::npos);
    rendered.erase(rendered.find("[/INST]"), 7);
    CHECK(tok->decode(ids) == rendered);
    CHECK(rendered.find("[TOOL_CALLS]") != std::string::npos);
    // Without parse_special the marker is text, spelled by ordinary pieces.
    const std::vector<int32_t> plain = tok->encode("[TOOL_CALLS]", false, false);
    CHECK(std::count(plain.begin(), plain.end(), 5) == 0);
    const std::vector<uint32_t> table = tokenBytesTable(*tok, 300);
    CHECK(((table[5] >> 8) & 3u) == BLUE_TB_TEXT);
    CHECK((table[5] & 0xFFu) == 12u);
    const uint32_t at = table[5] >> 10;
    std::string bytes(reinterpret_cast<const char*>(table.data() + 300) + at, 12);
    CHECK(bytes == "[TOOL_CALLS]");
    for (int32_t hidden : {1, 3, 4, 6, 9}) CHECK(((table[size_t(hidden)] >> 8) & 3u) == BLUE_TB_NONE);
    CHECK(((table[2] >> 8) & 3u) == BLUE_TB_END);
}

TEST_CASE("synth: the llama vocabulary") {
    for (uint32_t n : {260u, 1000u, 32000u}) {
        CAPTURE(n);
        GgufWriter w;
        synthAddLlamaVocab(&w, n);
        Result<GgufFile> f = ggufParse(w.writeToMemory().value(), "vocab");
        REQUIRE(f);
        std::vector<std::string_view> tokens = f->getStringArray("tokenizer.ggml.tokens").value();
        std::vector<float> scores = f->getF32Array("tokenizer.ggml.scores").value();
        std::vector<int32_t> types = f->getI32Array("tokenizer.ggml.token_type").value();
        REQUIRE(tokens.size() == n);
        REQUIRE(scores.size() == n);
        REQUIRE(types.size() == n);
        CHECK(tokens[0] == "<unk>");
        CHECK(tokens[1] == "<s>");
        CHECK(tokens[2] == "</s>");
        CHECK(tokens[3] == "<0x00>");
        CHECK(tokens[3 + 0x41] == "<0x41>");
        CHECK(tokens[258] == "<0xFF>");
        CHECK(types[0] == 2);
        CHECK(types[1] == 3);
        CHECK(types[258] == 6);
        CHECK(types[259] == 1);
        CHECK(tokens[259] == "\xE2\x96\x81");
        CHECK(std::set<std::string_view>(tokens.begin(), tokens.end()).size() == n);
        std::set<std::string_view> vocab(tokens.begin() + 259, tokens.end());
        for (size_t i = 260; i < n; ++i) {
            REQUIRE(scores[i] < scores[i - 1]);
            // Reachable by merges: dropping the last character leaves a piece.
            std::string_view t = tokens[i];
            if (t.size() > 1 && t != "\xE2\x96\x81") {
                std::string_view prefix = t.substr(0, t.size() - 1);
                REQUIRE_MESSAGE(vocab.count(prefix), t);
            }
        }
        CHECK(f->getU32("tokenizer.ggml.bos_token_id").value() == 1);
        CHECK(f->getString("tokenizer.ggml.model").value() == "llama");
    }
}

TEST_CASE("synth: the gpt2 vocabulary and its merges") {
    for (uint32_t n : {300u, 151936u}) {
        CAPTURE(n);
        GgufWriter w;
        synthAddGpt2Vocab(&w, n);
        Result<GgufFile> f = ggufParse(w.writeToMemory().value(), "vocab");
        REQUIRE(f);
        std::vector<std::string_view> tokens = f->getStringArray("tokenizer.ggml.tokens").value();
        std::vector<std::string_view> merges = f->getStringArray("tokenizer.ggml.merges").value();
        std::vector<int32_t> types = f->getI32Array("tokenizer.ggml.token_type").value();
        REQUIRE(tokens.size() == n);
        CHECK(tokens[0] == "!");
        CHECK(tokens[188] == "\xC4\x80");  // byte 0 -> U+0100
        CHECK(std::set<std::string_view>(tokens.begin(), tokens.end()).size() == n);
        std::set<std::string_view> seen(tokens.begin(), tokens.begin() + 256);
        for (size_t i = 0; i < merges.size(); ++i) {
            std::string_view m = merges[i];
            size_t space = m.find(' ');
            REQUIRE(space != std::string_view::npos);
            std::string joined = std::string(m.substr(0, space)) + std::string(m.substr(space + 1));
            // Both halves exist before the merge, and the merge makes the next token.
            REQUIRE_MESSAGE(seen.count(m.substr(0, space)), m);
            REQUIRE_MESSAGE(seen.count(m.substr(space + 1)), m);
            REQUIRE(tokens[256 + i] == joined);
            seen.insert(tokens[256 + i]);
        }
        const uint32_t eot = f->getU32("tokenizer.ggml.eos_token_id").value();
        CHECK(tokens[eot] == "<|endoftext|>");
        CHECK(tokens[eot + 2] == "<|im_end|>");
        CHECK(types[eot] == 3);
        CHECK(256 + merges.size() == eot);
        if (n == 151936) {
            CHECK(eot == 151643);  // Qwen2's id
            CHECK(tokens[151646] == "[PAD151646]");
            CHECK(types.back() == 5);
        } else {
            CHECK(eot + 3 == n);
        }
    }
}

TEST_CASE("synth: invalid configs are refused with the field named") {
    auto error = [](SynthConfig c) {
        Status s = synthValidate(c);
        REQUIRE_FALSE(s);
        return s.message();
    };
    SynthConfig c = tiny("stories15M");
    c.n_head = 5;
    CHECK(error(c).find("heads 5") != std::string::npos);
    c = tiny("stories15M");
    c.n_head_kv = 3;
    CHECK(error(c).find("kv-heads 3") != std::string::npos);
    c = tiny("stories15M");
    c.n_vocab = 100;
    CHECK(error(c).find("vocab 100") != std::string::npos);
    c = tiny("stories15M");
    c.n_layer = 0;
    CHECK(error(c).find("layers") != std::string::npos);
    c = tiny("mixtral-tiny");
    c.n_expert_used = 9;
    CHECK(error(c).find("experts-used 9") != std::string::npos);
    c = tiny("qwen2-0.5b");
    c.n_expert = 4;
    c.n_expert_used = 2;
    CHECK(error(c).find("llama") != std::string::npos);
    c = tiny("qwen2moe-tiny");
    c.n_expert = 0;
    CHECK(error(c) == "qwen2moe needs experts (got 0)");
    c = tiny("qwen2moe-tiny");
    c.n_ff_shexp = 0;
    CHECK(error(c).find("shared-ff 0") != std::string::npos);
    c = tiny("qwen2moe-tiny");
    c.qkv_bias = false;
    CHECK(error(c) == "qwen2moe needs Q/K/V biases");
    c = tiny("qwen3moe-tiny");
    c.n_ff_shexp = 64;
    CHECK(error(c).find("shared-ff 64") != std::string::npos);
    GgufWriter w;
    SynthOptions opt;
    opt.type = DType::Q8_K;
    Status s = synthBuild(tiny("stories15M"), opt, &w);
    CHECK_FALSE(s);
    CHECK(s.message().find("Q8_K") != std::string::npos);
}

}  // namespace blue
