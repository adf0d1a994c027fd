// Tests of `bluevm quantize` (compiler/quantize.h): the llama.cpp-style type mix on hand-derived
// cases, quantizing the real stories260K model to q8_0, q4_0 and q4_k (tensor types, decode
// error against the f32 original, metadata, thread-count independence), requantization, progress
// reports, F16/BF16 in and out, synthetic MoE models (3-D expert tensors: Mixtral-style, qwen2moe
// with a shared expert, qwen3moe) and the error cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "compiler/quantize.h"
#include "tests/test_paths.h"
#include "tools/synth/synth.h"
#include "vm/quant.h"

namespace blue {
namespace {

std::string storiesPath() {
    return test::sharedDir() + "/models/stories260K/stories260K.gguf";
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        path = std::filesystem::temp_directory_path() /
               ("blue_quantize_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
    static int& counter() {
        static int n = 0;
        return n;
    }
};

std::vector<uint8_t> readAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> decodeTensor(const GgufFile& f, const GgufTensor& t) {
    std::span<const uint8_t> data = f.rawTensorData(t);
    std::vector<float> out(size_t(t.n_elements));
    const uint64_t row_bytes = t.n_bytes / uint64_t(t.rows());
    for (int64_t r = 0; r < t.rows(); ++r) {
        dequantizeRow(t.type, data.data() + uint64_t(r) * row_bytes, out.data() + r * t.ne[0],
                      t.ne[0]);
    }
    return out;
}

double relRmse(const std::vector<float>& ref, const std::vector<float>& got) {
    REQUIRE(ref.size() == got.size());
    double err = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        norm += double(ref[i]) * ref[i];
    }
    return std::sqrt(err / norm);
}

// Relative RMSE each stored type may show against the f32 original. Worst tensor measured on
// stories260K (trained weights, heavier-tailed than Gaussian): F16 2.0e-4 (rounding bounds it by
// 2^-11), Q8_0 0.0062, Q5_0 0.050, IQ4_NL 0.081, Q4_0 0.096; the bounds leave ~1.4x room and stay
// below the next coarser format's typical error. Types that stories260K does not produce fail the
// check.
double errorBound(DType t) {
    switch (t) {
        case DType::F16:
            return 4.9e-4;
        case DType::Q8_0:
            return 0.009;
        case DType::Q5_0:
            return 0.07;
        case DType::Q4_0:
            return 0.13;
        case DType::IQ4_NL:
            return 0.11;
        default:
            return 0.0;
    }
}

// The expected output type of every stories260K tensor, derived by hand from llama.cpp's rules:
// rows of 64 (token_embd, attention, ffn_gate/up, output), rows of 172 (ffn_down), 5 layers.
DType expectedStoriesType(std::string_view name, DType target) {
    if (name.find("norm") != std::string_view::npos) return DType::F32;
    if (name.find("ffn_down") != std::string_view::npos) return DType::F16;  // 172 % 32 != 0
    if (name == "output.weight") return DType::Q8_0;  // Q6_K (or Q8_0): 64 % 256 != 0 -> Q8_0
    if (target == DType::Q4_K) {
        // Q4_K_M gives attn_v Q6_K where use_more_bits(layer, 5) holds: layers 2 and 4; rows of 64
        // then fall back: Q6_K -> Q8_0, Q4_K -> Q5_0.
        if (name == "blk.2.attn_v.weight" || name == "blk.4.attn_v.weight") return DType::Q8_0;
        return DType::Q5_0;
    }
    if (target == DType::IQ4_XS) return DType::IQ4_NL;  // rows of 64: the 32-element fallback
    return target;
}

}  // namespace

TEST_CASE("quantize: type names and llama.cpp file types") {
    CHECK(quantizeTargetFromName("q4_k") == QuantizeTarget(DType::Q4_K, 15));
    CHECK(quantizeTargetFromName("Q4_K_M") == QuantizeTarget(DType::Q4_K, 15));
    CHECK(quantizeTargetFromName("q4_k_s") == QuantizeTarget(DType::Q4_K, 14));
    CHECK(quantizeTargetFromName("q3_k_s") == QuantizeTarget(DType::Q3_K, 11));
    CHECK(quantizeTargetFromName("q3_k") == QuantizeTarget(DType::Q3_K, 12));
    CHECK(quantizeTargetFromName("q3_k_l") == QuantizeTarget(DType::Q3_K, 13));
    CHECK(quantizeTargetFromName("q5_k_s") == QuantizeTarget(DType::Q5_K, 16));
    CHECK(quantizeTargetFromName("q5_k_m") == QuantizeTarget(DType::Q5_K, 17));
    CHECK(quantizeTargetFromName("q2_k_s") == QuantizeTarget(DType::Q2_K, 21));
    CHECK(quantizeTargetFromName("Q8_0") == QuantizeTarget(DType::Q8_0));
    CHECK(quantizeTargetFromName("bf16") == QuantizeTarget(DType::BF16));
    CHECK_FALSE(quantizeTargetFromName("q8_k").has_value());
    CHECK_FALSE(quantizeTargetFromName("q4").has_value());
    CHECK_FALSE(quantizeTargetFromName("q6_k_m").has_value());
    CHECK_FALSE(quantizeTargetFromName("").has_value());
    CHECK(quantizeTypeNames().find("q4_k_s, q4_k_m (q4_k), q5_k_s") != std::string::npos);
    CHECK(quantizeFileType(DType::F32) == 0);
    CHECK(quantizeFileType(DType::F16) == 1);
    CHECK(quantizeFileType(DType::Q4_0) == 2);
    CHECK(quantizeFileType(DType::Q8_0) == 7);
    CHECK(quantizeFileType(DType::Q2_K) == 10);
    CHECK(quantizeFileType(DType::Q3_K) == 12);  // Q3_K_M
    CHECK(quantizeFileType(DType::Q4_K) == 15);  // Q4_K_M
    CHECK(quantizeFileType(DType::Q5_K) == 17);  // Q5_K_M
    CHECK(quantizeFileType(DType::Q6_K) == 18);
    CHECK(quantizeFileType(DType::BF16) == 32);
    CHECK(quantizeTargetFromName("iq4_nl") == QuantizeTarget(DType::IQ4_NL));
    CHECK(quantizeTargetFromName("IQ4_XS") == QuantizeTarget(DType::IQ4_XS));
    CHECK(quantizeFileType(DType::IQ4_NL) == 25);
    CHECK(quantizeFileType(DType::IQ4_XS) == 30);
}

TEST_CASE("quantize: which tensors are weight matrices") {
    CHECK(quantizeIsWeightMatrix("blk.0.attn_q.weight", 2));
    CHECK(quantizeIsWeightMatrix("blk.0.ffn_up_exps.weight", 3));
    CHECK(quantizeIsWeightMatrix("token_embd.weight", 2));
    CHECK_FALSE(quantizeIsWeightMatrix("blk.0.attn_norm.weight", 1));
    CHECK_FALSE(quantizeIsWeightMatrix("blk.0.attn_q_norm.weight", 2));
    CHECK_FALSE(quantizeIsWeightMatrix("blk.0.attn_q.bias", 2));
    CHECK_FALSE(quantizeIsWeightMatrix("blk.0.ffn_gate_inp.weight", 2));  // the MoE router
}

TEST_CASE("quantize: the mix follows llama.cpp's Q4_K_M, Q3_K_M, Q2_K, the S/L sizes and IQ4 rules") {
    // A 32-layer model with 4096-wide rows (whole K blocks), like Llama-2-7B.
    QuantizeModelInfo m{32, 1, 0, true};
    auto type = [&](const char* name, DType target) {
        return quantizeTensorType(name, 4096, target, m);
    };
    // use_more_bits(i, 32): i < 4, i >= 28, or (i - 4) % 3 == 2.
    CHECK(type("blk.0.attn_v.weight", DType::Q4_K) == DType::Q6_K);
    CHECK(type("blk.3.attn_v.weight", DType::Q4_K) == DType::Q6_K);
    CHECK(type("blk.4.attn_v.weight", DType::Q4_K) == DType::Q4_K);
    CHECK(type("blk.5.attn_v.weight", DType::Q4_K) == DType::Q4_K);
    CHECK(type("blk.6.attn_v.weight", DType::Q4_K) == DType::Q6_K);
    CHECK(type("blk.28.ffn_down.weight", DType::Q4_K) == DType::Q6_K);
    CHECK(type("blk.26.ffn_down.weight", DType::Q4_K) == DType::Q4_K);
    CHECK(type("blk.9.ffn_down.weight", DType::Q5_K) == DType::Q6_K);
    CHECK(type("blk.9.attn_q.weight", DType::Q4_K) == DType::Q4_K);
    CHECK(type("blk.9.ffn_up.weight", DType::Q4_K) == DType::Q4_K);
    CHECK(type("output.weight", DType::Q4_K) == DType::Q6_K);
    CHECK(type("output.weight", DType::Q4_0) == DType::Q6_K);
    CHECK(type("output.weight", DType::Q8_0) == DType::Q8_0);
    CHECK(type("token_embd.weight", DType::Q4_K) == DType::Q4_K);
    // Q3_K_M: attn_v Q5_K in layers 0-1, else Q4_K; ffn_down Q5_K below n/16 = 2; attn_output Q4_K.
    CHECK(type("blk.1.attn_v.weight", DType::Q3_K) == DType::Q5_K);
    CHECK(type("blk.2.attn_v.weight", DType::Q3_K) == DType::Q4_K);
    CHECK(type("blk.1.ffn_down.weight", DType::Q3_K) == DType::Q5_K);
    CHECK(type("blk.2.ffn_down.weight", DType::Q3_K) == DType::Q4_K);
    CHECK(type("blk.2.attn_output.weight", DType::Q3_K) == DType::Q4_K);
    CHECK(type("blk.2.attn_q.weight", DType::Q3_K) == DType::Q3_K);
    // Q2_K: attn_v Q3_K (no GQA), ffn_down and attn_output Q3_K.
    CHECK(type("blk.7.attn_v.weight", DType::Q2_K) == DType::Q3_K);
    CHECK(type("blk.7.ffn_down.weight", DType::Q2_K) == DType::Q3_K);
    CHECK(type("blk.7.attn_output.weight", DType::Q2_K) == DType::Q3_K);
    CHECK(type("blk.7.ffn_gate.weight", DType::Q2_K) == DType::Q2_K);
    // Plain targets keep every matrix in their type (apart from the output).
    CHECK(type("blk.0.attn_v.weight", DType::Q4_0) == DType::Q4_0);
    CHECK(type("blk.0.ffn_down.weight", DType::Q5_1) == DType::Q5_1);
    CHECK(type("output.weight", DType::F16) == DType::F16);
    // --pure: no mix.
    CHECK(quantizeTensorType("output.weight", 4096, DType::Q4_K, m, true) == DType::Q4_K);
    CHECK(quantizeTensorType("blk.0.attn_v.weight", 4096, DType::Q4_K, m, true) == DType::Q4_K);

    SUBCASE("GQA, tied output and 8-expert models") {
        QuantizeModelInfo gqa{22, 8, 0, false};
        CHECK(quantizeTensorType("blk.5.attn_v.weight", 2048, DType::Q2_K, gqa) == DType::Q4_K);
        CHECK(quantizeTensorType("token_embd.weight", 2048, DType::Q4_K, gqa) == DType::Q6_K);
        QuantizeModelInfo moe{32, 4, 8, true};
        CHECK(quantizeTensorType("blk.5.attn_v.weight", 4096, DType::Q4_0, moe) == DType::Q8_0);
        CHECK(quantizeTensorType("blk.5.attn_k.weight", 4096, DType::Q4_K, moe) == DType::Q8_0);
        CHECK(quantizeTensorType("blk.5.attn_output.weight", 4096, DType::Q4_K, moe) ==
              DType::Q5_K);
        CHECK(quantizeTensorType("blk.5.attn_output.weight", 4096, DType::Q5_K, moe) ==
              DType::Q5_K);
        CHECK(quantizeTensorType("blk.5.ffn_down_exps.weight", 4096, DType::Q4_K, moe) ==
              DType::Q4_K);  // (5 - 4) % 3 == 1: no extra bits
        CHECK(quantizeTensorType("blk.6.ffn_down_exps.weight", 4096, DType::Q4_K, moe) ==
              DType::Q6_K);
    }
    SUBCASE("the S and L sizes of the K-quants (llama.cpp's Q2_K_S, Q3_K_S, Q3_K_L, Q4_K_S, Q5_K_S)") {
        auto sized = [&](const char* name, const char* target, const QuantizeModelInfo& info) {
            std::optional<QuantizeTarget> t = quantizeTargetFromName(target);
            REQUIRE(t);
            return quantizeTensorType(name, 4096, *t, info);
        };
        QuantizeModelInfo gqa{32, 4, 0, true}, moe{32, 4, 8, true};
        // Q2_K_S: attn_v Q4_K only with GQA >= 4; ffn_down Q4_K in the first 32/8 = 4 layers.
        CHECK(sized("blk.7.attn_v.weight", "q2_k_s", m) == DType::Q2_K);
        CHECK(sized("blk.7.attn_v.weight", "q2_k_s", gqa) == DType::Q4_K);
        CHECK(sized("blk.3.ffn_down.weight", "q2_k_s", m) == DType::Q4_K);
        CHECK(sized("blk.4.ffn_down.weight", "q2_k_s", m) == DType::Q2_K);
        CHECK(sized("blk.7.attn_output.weight", "q2_k_s", m) == DType::Q2_K);
        CHECK(sized("blk.7.attn_output.weight", "q2_k_s", moe) == DType::Q2_K);  // not in the 8-expert list
        // Q3_K_S: Q3_K everywhere but the output; 8 experts: attn_output Q5_K.
        for (const char* n : {"blk.0.attn_v.weight", "blk.0.ffn_down.weight", "blk.0.attn_output.weight",
                              "blk.0.attn_qkv.weight"}) {
            CHECK(sized(n, "q3_k_s", m) == DType::Q3_K);
        }
        CHECK(sized("output.weight", "q3_k_s", m) == DType::Q6_K);
        CHECK(sized("blk.5.attn_output.weight", "q3_k_s", moe) == DType::Q5_K);
        // Q3_K_L: attn_v, ffn_down, attn_output Q5_K; fused QKV Q4_K; 8 experts keep attn_output.
        CHECK(sized("blk.20.attn_v.weight", "q3_k_l", m) == DType::Q5_K);
        CHECK(sized("blk.20.ffn_down.weight", "q3_k_l", m) == DType::Q5_K);
        CHECK(sized("blk.20.attn_output.weight", "q3_k_l", m) == DType::Q5_K);
        CHECK(sized("blk.20.attn_qkv.weight", "q3_k_l", m) == DType::Q4_K);
        CHECK(sized("blk.20.attn_q.weight", "q3_k_l", m) == DType::Q3_K);
        CHECK(sized("blk.5.attn_output.weight", "q3_k_l", moe) == DType::Q3_K);
        // Q4_K_S: attn_v Q5_K in layers 0-3, ffn_down Q5_K in the first 4; no use_more_bits.
        CHECK(sized("blk.3.attn_v.weight", "q4_k_s", m) == DType::Q5_K);
        CHECK(sized("blk.4.attn_v.weight", "q4_k_s", m) == DType::Q4_K);
        CHECK(sized("blk.28.attn_v.weight", "q4_k_s", m) == DType::Q4_K);  // Q4_K_M: Q6_K
        CHECK(sized("blk.3.ffn_down.weight", "q4_k_s", m) == DType::Q5_K);
        CHECK(sized("blk.28.ffn_down.weight", "q4_k_s", m) == DType::Q4_K);
        CHECK(sized("blk.0.attn_qkv.weight", "q4_k_s", m) == DType::Q4_K);  // Q4_K_M: Q5_K
        CHECK(sized("blk.5.attn_output.weight", "q4_k_s", moe) == DType::Q5_K);
        // Q5_K_S: Q5_K everywhere but the output; 8 experts: attn_v/attn_k Q8_0 as for every type.
        for (const char* n : {"blk.0.attn_v.weight", "blk.28.ffn_down.weight", "blk.0.attn_qkv.weight"}) {
            CHECK(sized(n, "q5_k_s", m) == DType::Q5_K);
        }
        CHECK(sized("blk.5.attn_v.weight", "q5_k_s", moe) == DType::Q8_0);
        CHECK(sized("blk.5.attn_output.weight", "q5_k_s", moe) == DType::Q5_K);
    }
    SUBCASE("IQ4_NL and IQ4_XS") {
        // ffn_down Q5_K in the first n_layer/8 = 4 layers (no importance matrix), attn_v Q5_K
        // when n_gqa >= 4; the output Q6_K; 8 experts: attn_output Q5_K, attn_v/attn_k Q8_0.
        for (DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
            CAPTURE(dtypeName(t));
            CHECK(type("blk.3.ffn_down.weight", t) == DType::Q5_K);
            CHECK(type("blk.4.ffn_down.weight", t) == t);
            CHECK(type("blk.0.attn_v.weight", t) == t);
            CHECK(type("blk.0.attn_q.weight", t) == t);
            CHECK(type("blk.0.attn_output.weight", t) == t);
            CHECK(type("token_embd.weight", t) == t);
            CHECK(type("output.weight", t) == DType::Q6_K);
            QuantizeModelInfo gqa{32, 4, 0, true}, moe{32, 4, 8, true};
            CHECK(quantizeTensorType("blk.9.attn_v.weight", 4096, t, gqa) == DType::Q5_K);
            CHECK(quantizeTensorType("blk.9.attn_v.weight", 4096, t, moe) == DType::Q8_0);
            CHECK(quantizeTensorType("blk.9.attn_k.weight", 4096, t, moe) == DType::Q8_0);
            CHECK(quantizeTensorType("blk.9.attn_output.weight", 4096, t, moe) == DType::Q5_K);
        }
        // Rows that are whole 32-blocks but not 256-blocks: IQ4_XS and Q2_K/Q3_K take IQ4_NL,
        // as llama.cpp does; the output (64 % 256 != 0) Q8_0.
        CHECK(quantizeTensorType("blk.9.attn_q.weight", 896, DType::IQ4_XS, m) == DType::IQ4_NL);
        CHECK(quantizeTensorType("blk.9.attn_q.weight", 896, DType::Q2_K, m) == DType::IQ4_NL);
        CHECK(quantizeTensorType("blk.9.attn_q.weight", 896, DType::Q3_K, m) == DType::IQ4_NL);
        CHECK(quantizeTensorType("output.weight", 896, DType::IQ4_XS, m) == DType::Q8_0);
        CHECK(quantizeTensorType("output.weight", 896, DType::IQ4_NL, m) == DType::Q8_0);
    }
    SUBCASE("row lengths that are not whole blocks fall back") {
        CHECK(quantizeTensorType("blk.9.attn_q.weight", 896, DType::Q4_K, m) == DType::Q5_0);
        CHECK(quantizeTensorType("blk.0.attn_v.weight", 896, DType::Q4_K, m) == DType::Q8_0);
        CHECK(quantizeTensorType("output.weight", 896, DType::Q4_K, m) == DType::Q8_0);
        CHECK(quantizeTensorType("blk.9.ffn_down.weight", 172, DType::Q8_0, m) == DType::F16);
        CHECK(quantizeTensorType("blk.9.ffn_down.weight", 172, DType::F16, m) == DType::F16);
    }
}

TEST_CASE("quantize: stories260K to q8_0, q4_0, q4_k, iq4_nl and iq4_xs") {
    Result<GgufFile> src = ggufOpen(storiesPath());
    REQUIRE_MESSAGE(src, src.message());
    TempDir dir;
    for (DType target : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::IQ4_NL, DType::IQ4_XS}) {
        CAPTURE(dtypeName(target));
        std::string out = dir.file(std::string(dtypeName(target)) + ".gguf");
        std::vector<std::string> notes;
        QuantizeOptions opt;
        opt.threads = 2;
        opt.on_note = [&](const std::string& n) { notes.push_back(n); };
        Result<QuantizeReport> report = quantizeGguf(storiesPath(), out, target, opt);
        REQUIRE_MESSAGE(report, report.message());
        CHECK(report->notes == notes);
        CHECK(report->file_type == quantizeFileType(target));
        CHECK(report->file_bytes_out == std::filesystem::file_size(out));
        CHECK(report->file_bytes_out < report->file_bytes_in / 2);

        Result<GgufFile> q = ggufOpen(out);
        REQUIRE_MESSAGE(q, q.message());
        Result<ModelConfig> config = modelConfigFromGguf(*q);
        REQUIRE_MESSAGE(config, config.message());
        CHECK(config->n_ff == 172);

        // Every input key is there with the same value; file_type and quantization_version set.
        for (const GgufKv& kv : src->kvs()) {
            const GgufValue* v = q->find(kv.key);
            REQUIRE_MESSAGE(v, kv.key);
            CHECK(v->type() == kv.value.type());
            auto a = v->encodedPayload(), b = kv.value.encodedPayload();
            CHECK_MESSAGE(std::equal(a.begin(), a.end(), b.begin(), b.end()), kv.key);
        }
        CHECK(q->getU32("general.file_type").value() == quantizeFileType(target));
        CHECK(q->getU32("general.quantization_version").value() == 2);
        CHECK(q->kvs().size() == src->kvs().size() + 2);

        REQUIRE(q->tensors().size() == src->tensors().size());
        for (const GgufTensor& t : src->tensors()) {
            CAPTURE(t.name);
            const GgufTensor* qt = q->findTensor(t.name);
            REQUIRE(qt);
            CHECK(qt->ne == t.ne);
            CHECK(dtypeName(qt->type) == dtypeName(expectedStoriesType(t.name, target)));
            std::vector<float> ref = decodeTensor(*src, t), got = decodeTensor(*q, *qt);
            if (qt->type == DType::F32) {
                CHECK(ref == got);
            } else {
                double err = relRmse(ref, got);
                CAPTURE(err);
                CHECK(err < errorBound(qt->type));
                CHECK(err > 0.0);
            }
        }
        // The ffn_down fallback is reported in a note that names the tensors.
        bool fallback_note = false;
        for (const std::string& n : notes) {
            fallback_note = fallback_note || (n.find("rows of 172") != std::string::npos &&
                                              n.find("F16") != std::string::npos &&
                                              n.find("blk.0.ffn_down.weight") != std::string::npos);
        }
        CHECK_MESSAGE(fallback_note, "notes: " << notes.size());
    }
}

TEST_CASE("quantize: the output does not depend on the thread count") {
    TempDir dir;
    for (DType target : {DType::Q4_K, DType::Q4_0}) {
        QuantizeOptions one, two;
        one.threads = 1;
        two.threads = 2;
        std::string a = dir.file("a.gguf"), b = dir.file("b.gguf");
        REQUIRE(quantizeGguf(storiesPath(), a, target, one));
        REQUIRE(quantizeGguf(storiesPath(), b, target, two));
        CHECK(readAll(a) == readAll(b));
    }
}

TEST_CASE("quantize: progress reports reach the total") {
    TempDir dir;
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    QuantizeOptions opt;
    opt.progress = [&](uint64_t done, uint64_t total) { calls.push_back({done, total}); };
    REQUIRE(quantizeGguf(storiesPath(), dir.file("p.gguf"), DType::Q8_0, opt));
    REQUIRE(calls.size() >= 48);  // at least one per tensor
    for (size_t i = 1; i < calls.size(); ++i) CHECK(calls[i].first > calls[i - 1].first);
    CHECK(calls.back().first == calls.back().second);
    CHECK(calls.back().second == 1171200);  // the tensor bytes of stories260K
}

TEST_CASE("quantize: requantizing quantized input") {
    TempDir dir;
    std::string q8 = dir.file("q8.gguf"), q4 = dir.file("q4.gguf"), again = dir.file("q8b.gguf");
    REQUIRE(quantizeGguf(storiesPath(), q8, DType::Q8_0));
    Result<QuantizeReport> report = quantizeGguf(q8, q4, DType::Q4_0);
    REQUIRE_MESSAGE(report, report.message());
    bool warned = false;
    for (const std::string& n : report->notes) {
        warned = warned || (n.find("already Q8_0") != std::string::npos &&
                            n.find("Q4_0") != std::string::npos);
    }
    CHECK(warned);
    Result<GgufFile> f = ggufOpen(q4);
    REQUIRE(f);
    CHECK(f->findTensor("blk.0.attn_q.weight")->type == DType::Q4_0);
    CHECK(f->findTensor("blk.0.ffn_down.weight")->type == DType::F16);

    // The same type again: tensors are copied unchanged, so the file is identical.
    Result<QuantizeReport> same = quantizeGguf(q8, again, DType::Q8_0);
    REQUIRE(same);
    CHECK(same->notes.size() == 1);  // only the ffn_down fallback
    CHECK(readAll(q8) == readAll(again));
}

TEST_CASE("quantize: f16 and bf16 targets, and f16 input") {
    Result<GgufFile> src = ggufOpen(storiesPath());
    REQUIRE(src);
    TempDir dir;
    std::string f16 = dir.file("f16.gguf"), bf16 = dir.file("bf16.gguf"), q8 = dir.file("q8.gguf");
    REQUIRE(quantizeGguf(storiesPath(), f16, DType::F16));
    REQUIRE(quantizeGguf(storiesPath(), bf16, DType::BF16));
    Result<QuantizeReport> from_f16 = quantizeGguf(f16, q8, DType::Q8_0);
    REQUIRE_MESSAGE(from_f16, from_f16.message());
    CHECK(from_f16->notes.size() == 1);  // the ffn_down fallback; F16 input is no requantization
    Result<GgufFile> h = ggufOpen(f16), b = ggufOpen(bf16), q = ggufOpen(q8);
    REQUIRE(h);
    REQUIRE(b);
    REQUIRE(q);
    CHECK(h->getU32("general.file_type").value() == 1);
    CHECK(b->getU32("general.file_type").value() == 32);
    for (const GgufTensor& t : src->tensors()) {
        CAPTURE(t.name);
        bool norm = t.n_dims == 1;
        CHECK(h->findTensor(t.name)->type == (norm ? DType::F32 : DType::F16));
        CHECK(b->findTensor(t.name)->type == (norm ? DType::F32 : DType::BF16));
        if (norm) continue;
        std::vector<float> ref = decodeTensor(*src, t);
        CHECK(relRmse(ref, decodeTensor(*b, *b->findTensor(t.name))) < 4e-3);  // 2^-8
        const GgufTensor* qt = q->findTensor(t.name);
        CHECK(relRmse(ref, decodeTensor(*q, *qt)) < errorBound(qt->type) + 4.9e-4);
    }
}

TEST_CASE("quantize: a synthetic Mixtral-style model with 3-D expert tensors") {
    SynthConfig c = *synthPreset("mixtral-tiny");
    c.dim = 256;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_head_kv = 1;
    c.n_ff = 128;
    c.n_vocab = 300;
    TempDir dir;
    std::string f32 = dir.file("moe.gguf"), q = dir.file("moe-q4_k.gguf");
    REQUIRE(synthWrite(c, SynthOptions{}, f32));
    Result<QuantizeReport> report = quantizeGguf(f32, q, DType::Q4_K);
    REQUIRE_MESSAGE(report, report.message());
    Result<GgufFile> a = ggufOpen(f32), b = ggufOpen(q);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(modelConfigFromGguf(*b));
    // Expected from llama.cpp's Q4_K_M rules for 8 experts, then the row-length fallbacks.
    const std::map<std::string, DType> expected = {
        {"token_embd.weight", DType::Q4_K},
        {"output.weight", DType::Q6_K},
        {"blk.0.attn_q.weight", DType::Q4_K},
        {"blk.0.attn_k.weight", DType::Q8_0},         // 8 experts
        {"blk.0.attn_v.weight", DType::Q8_0},         // 8 experts
        {"blk.0.attn_output.weight", DType::Q5_K},    // 8 experts
        {"blk.0.ffn_gate_inp.weight", DType::F32},    // the router is never quantized
        {"blk.0.ffn_gate_exps.weight", DType::Q4_K},  // [256, 128, 8]
        {"blk.0.ffn_up_exps.weight", DType::Q4_K},
        {"blk.0.ffn_down_exps.weight", DType::Q5_0},  // rows of 128: Q4_K -> Q5_0
        {"blk.1.ffn_down_exps.weight", DType::Q8_0},  // use_more_bits: Q6_K -> Q8_0
        {"blk.1.attn_norm.weight", DType::F32},
    };
    for (const auto& [name, type] : expected) {
        CAPTURE(name);
        const GgufTensor* t = b->findTensor(name);
        REQUIRE(t);
        CHECK(dtypeName(t->type) == dtypeName(type));
        CHECK(t->ne == a->findTensor(name)->ne);
        // Gaussian weights: Q4_K ~0.08, Q5_0 ~0.04, Q5_K ~0.04, Q6_K ~0.02, Q8_0 ~0.005.
        double err = relRmse(decodeTensor(*a, *a->findTensor(name)), decodeTensor(*b, *t));
        CHECK(err < (t->type == DType::F32 ? 1e-30 : 0.1));
    }
}

namespace {

// The type llama.cpp's mixes give the tensors of the 2-layer Qwen MoE models below (4 experts:
// no 8-expert rule), derived by hand; rows of 128 (qwen3moe's ffn_down_exps) are not whole Q4_K
// blocks and fall back (Q4_K -> Q5_0, Q6_K -> Q8_0). use_more_bits(l, 2) holds for layer 1.
DType expectedQwenMoeType(const std::string& name, int64_t row_len, DType target) {
    if (name.find("_norm") != std::string::npos || name.find("ffn_gate_inp") != std::string::npos ||
        name.find(".bias") != std::string::npos) {
        return DType::F32;  // norms, the router, the shared expert's gate vector, biases
    }
    if (name == "output.weight") return target == DType::Q8_0 ? DType::Q8_0 : DType::Q6_K;
    if (target != DType::Q4_K) return target;
    bool layer1 = name.rfind("blk.1.", 0) == 0;
    bool more_bits = layer1 && (name.find("ffn_down") != std::string::npos ||
                                name.find("attn_v.weight") != std::string::npos);
    if (row_len % 256 != 0) return more_bits ? DType::Q8_0 : DType::Q5_0;
    return more_bits ? DType::Q6_K : DType::Q4_K;
}

}  // namespace

TEST_CASE("quantize: Qwen MoE models, expert by expert, in q4_0, q8_0 and q4_k") {
    TempDir dir;
    for (const char* preset : {"qwen2moe-tiny", "qwen3moe-tiny"}) {
        SynthConfig c = *synthPreset(preset);
        c.n_layer = 2;
        c.n_vocab = 300;
        c.n_expert = 4;
        c.n_expert_used = 2;
        const std::string f32 = dir.file(std::string(preset) + ".gguf");
        REQUIRE(synthWrite(c, SynthOptions{}, f32));
        Result<GgufFile> a = ggufOpen(f32);
        REQUIRE(a);
        const ModelConfig ca = modelConfigFromGguf(*a).value();
        for (DType target : {DType::Q4_0, DType::Q8_0, DType::Q4_K}) {
            CAPTURE(preset);
            CAPTURE(dtypeName(target));
            const std::string q =
                dir.file(std::string(preset) + "-" + std::string(dtypeName(target)) + ".gguf");
            Result<QuantizeReport> report = quantizeGguf(f32, q, target);
            REQUIRE_MESSAGE(report, report.message());
            Result<GgufFile> b = ggufOpen(q);
            REQUIRE(b);
            Result<ModelConfig> cb = modelConfigFromGguf(*b);
            REQUIRE_MESSAGE(cb, cb.message());
            CHECK(cb->n_expert == ca.n_expert);
            CHECK(cb->n_expert_used == ca.n_expert_used);
            CHECK(cb->n_ff_exp == ca.n_ff_exp);
            CHECK(cb->n_ff_shexp == ca.n_ff_shexp);
            CHECK(b->getU32("general.file_type").value() == quantizeFileType(target));
            for (const GgufTensor& ta : a->tensors()) {
                const std::string name(ta.name);
                CAPTURE(name);
                const GgufTensor* tb = b->findTensor(name);
                REQUIRE(tb);
                CHECK(tb->n_dims == ta.n_dims);
                CHECK(tb->ne == ta.ne);
                CHECK(dtypeName(tb->type) ==
                      dtypeName(expectedQwenMoeType(name, ta.ne[0], target)));
                std::span<const uint8_t> qa = a->rawTensorData(ta), qb = b->rawTensorData(*tb);
                if (tb->type == DType::F32) {
                    CHECK(std::equal(qa.begin(), qa.end(), qb.begin(), qb.end()));
                    continue;
                }
                // Each row of every expert is quantized on its own, as in a 2-D tensor.
                const uint64_t row_bytes = *dtypeRowBytes(tb->type, uint64_t(ta.ne[0]));
                std::vector<uint8_t> block(row_bytes);
                bool same = true;
                for (int64_t r = 0; r < ta.rows(); ++r) {
                    const float* row = reinterpret_cast<const float*>(qa.data()) + r * ta.ne[0];
                    quantizeRow(tb->type, row, block.data(), ta.ne[0]);
                    same = same &&
                           std::memcmp(block.data(), qb.data() + r * row_bytes, row_bytes) == 0;
                }
                CHECK(same);
                // Decoded expert by expert, each expert's matrix stays close to the original.
                std::vector<float> ra = decodeTensor(*a, ta), rb = decodeTensor(*b, *tb);
                const size_t per = size_t(ta.ne[0] * ta.ne[1]);
                for (int64_t e = 0; e < ta.ne[2]; ++e) {
                    CAPTURE(e);
                    std::vector<float> xa(ra.begin() + e * per, ra.begin() + (e + 1) * per);
                    std::vector<float> xb(rb.begin() + e * per, rb.begin() + (e + 1) * per);
                    // Gaussian rows: Q4_0 ~0.1, Q4_K ~0.08, Q5_0 ~0.04, Q6_K ~0.02, Q8_0 ~0.005.
                    CHECK(relRmse(xa, xb) < (tb->type == DType::Q8_0 ? 0.01 : 0.13));
                }
            }
        }
    }
}

TEST_CASE("quantize: errors are one clear line") {
    TempDir dir;
    auto message = [&](const std::string& in, const std::string& out, DType type) {
        Result<QuantizeReport> r = quantizeGguf(in, out, type);
        REQUIRE_FALSE(r);
        CHECK(r.message().find('\n') == std::string::npos);
        return r.message();
    };
    std::string out = dir.file("out.gguf");
    std::string missing = message(dir.file("nope.gguf"), out, DType::Q8_0);
    CHECK(missing.find("nope.gguf") != std::string::npos);

    std::string junk = dir.file("junk.gguf");
    std::ofstream(junk) << "not a gguf file at all";
    CHECK(message(junk, out, DType::Q8_0).find("junk.gguf") != std::string::npos);

    std::string vocab = test::sharedDir() + "/vocab/ggml-vocab-llama-spm.gguf";
    std::string not_model = message(vocab, out, DType::Q8_0);
    CHECK(not_model.find("not a model") != std::string::npos);
    CHECK(not_model.find("token_embd.weight") != std::string::npos);

    CHECK(message(storiesPath(), out, DType::Q8_K).find("not a quantization type") !=
          std::string::npos);
    CHECK(message(storiesPath(), out, DType::I8).find("q8_0, q4_0") != std::string::npos);

    std::string unwritable = message(storiesPath(), dir.file("no/such/dir/out.gguf"), DType::Q8_0);
    CHECK(unwritable.find("no/such/dir/out.gguf") != std::string::npos);
    CHECK(unwritable.find("cannot create") != std::string::npos);

    std::string copy = dir.file("copy.gguf");
    std::filesystem::copy_file(storiesPath(), copy);
    CHECK(message(copy, copy, DType::Q8_0).find("must not be the input") != std::string::npos);
    CHECK(std::filesystem::file_size(copy) == std::filesystem::file_size(storiesPath()));
    CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("quantize: a non-finite weight is refused and no file is left") {
    // stories260K with one NaN in blk.1.attn_q.weight, row 3.
    Result<GgufFile> src = ggufOpen(storiesPath());
    REQUIRE(src);
    std::vector<uint8_t> bytes(src->bytes().begin(), src->bytes().end());
    const GgufTensor* t = src->findTensor("blk.1.attn_q.weight");
    REQUIRE(t);
    const float nan = std::nanf("");
    std::memcpy(bytes.data() + t->offset + (3 * 64 + 5) * 4, &nan, 4);
    TempDir dir;
    std::string in = dir.file("nan.gguf"), out = dir.file("out.gguf");
    std::ofstream(in, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    Result<QuantizeReport> r = quantizeGguf(in, out, DType::Q4_0);
    REQUIRE_FALSE(r);
    CHECK(r.message() == in + ": tensor 'blk.1.attn_q.weight': row 3 holds a non-finite value "
                              "(NaN or infinity)");
    CHECK_FALSE(std::filesystem::exists(out));
}

}  // namespace blue
