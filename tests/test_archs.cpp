// gemma2, gemma3, phi3 and qwen2 with YaRN end to end: blue-synth's tiny presets lowered to
// Blue-IR, the forward block checked for the ops each architecture needs (GeGLU, soft caps,
// sliding windows, fused matrices read as row views, LongRoPE factors, YaRN's divisors), and greedy generation on the GPU against the
// reference machine, with prompts longer than the sliding window.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "tests/generation_runs.h"
#include "tests/gpu_fixture.h"
#include "tests/naive_forward.h"
#include "tests/temp_dir.h"
#include "tools/synth/synth.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/llm_request.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

constexpr uint32_t kCtx = 96;

struct Model {
    GgufFile gguf;
    ModelConfig cfg;
};

Model open(const std::string& path) {
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    return {std::move(g.value()), cfg.value()};
}

Module lower(const Model& model, const ModelConfig& cfg, const std::string& path,
             DType kv_type = DType::F16) {
    LowerOptions opt;
    opt.kv_type = kv_type;
    opt.ctx = kCtx;
    opt.grammar_words = 0;  // no grammars here: 16 instances fit 1 MiB pages (device profiles)
    opt.max_rows = 64;
    opt.chunk = 16;
    opt.model_path = path;
    auto m = lowerModel(model.gguf, cfg, opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return std::move(m.value());
}

// Four greedy requests with prompts of 4 to 19 tokens (past gemma's window of 8), 6 tokens each.
std::vector<GenerationRequest> requests() {
    std::vector<GenerationRequest> out;
    for (uint32_t i = 0; i < 4; ++i) {
        GenerationRequest r;
        r.tag = 100 + i;
        r.max_new = 6;
        r.sampling.temperature = 0;
        r.logprobs = true;
        r.prompt = {1};
        for (uint32_t t = 0; t < 3 + 5 * i; ++t) r.prompt.push_back(3 + (i * 37 + t * 11) % 500);
        out.push_back(r);
    }
    return out;
}

// The largest difference between two runs' log-probabilities (infinite when the shapes differ).
double maxLogprobDiff(const Generated& a, const Generated& b) {
    double worst = 0;
    for (const auto& [tag, lp] : a.logprobs) {
        auto it = b.logprobs.find(tag);
        if (it == b.logprobs.end() || it->second.size() != lp.size()) return INFINITY;
        for (size_t i = 0; i < lp.size(); ++i)
            worst = std::max(worst, std::fabs(double(lp[i]) - it->second[i]));
    }
    return worst;
}

// Three instances; the log-probabilities are what the soft caps and RoPE factors move even where
// the greedy tokens stay.
Generated runRef(const Module& m, const std::vector<GenerationRequest>& reqs = requests()) {
    return runOnRef(m, 3, reqs);
}

Generated runGpu(const Module& m) {
    return runOnGpu(m, 3, requests()).out;
}

// The GPU gives the reference machine's 6 tokens for every request, and their log-probabilities
// within 1e-3 (float kernels against double sums); returns the reference run.
Generated checkGpuMatchesRef(const Module& m) {
    Generated ref = runRef(m);
    Generated g = runGpu(m);
    REQUIRE(ref.tokens.size() == 4);
    for (const auto& [tag, tokens] : ref.tokens) {
        CHECK(tokens.size() == 6);
        CHECK(ref.logprobs[tag].size() == 6);
        CHECK_MESSAGE(g.tokens[tag] == tokens, "request " << tag);
    }
    CHECK(maxLogprobDiff(ref, g) < 1e-3);
    return ref;
}

std::vector<TensorInstr> forwardOps(const Module& m) {
    std::vector<TensorInstr> instrs;
    REQUIRE(decodeBlock(m, m.blocks[0], &instrs).isOk());
    return instrs;
}

size_t countOp(const std::vector<TensorInstr>& ops, Op op) {
    return size_t(
        std::count_if(ops.begin(), ops.end(), [op](const TensorInstr& t) { return t.op == op; }));
}

std::string writePreset(const TempDir& dir, const char* preset, DType type = DType::F32) {
    std::optional<SynthConfig> c = synthPreset(preset);
    REQUIRE_MESSAGE(c.has_value(), preset);
    SynthOptions so;
    so.type = type;
    const std::string path = dir.path + "/" + preset + "_" + std::string(dtypeName(type)) + ".gguf";
    REQUIRE(synthWrite(*c, so, path));
    return path;
}

}  // namespace

TEST_CASE("archs: gemma2-tiny on the GPU gives the reference tokens; its window changes them") {
    TempDir dir("blue_archs");
    const std::string path = writePreset(dir, "gemma2-tiny");
    Model model = open(path);
    CHECK(model.cfg.head_dim == 48);  // Q is 192 wide, the residual 256, as in Gemma 2 2B
    Module m = lower(model, model.cfg, path);
    std::vector<TensorInstr> ops = forwardOps(m);
    // GeGLU in the gate projection's matmul (MATMULGLU, gelu): no GEGLU pass.
    CHECK(countOp(ops, Op::MATMULGLU) == 4);
    for (const TensorInstr& t : ops) {
        if (t.op == Op::MATMULGLU) CHECK(t.args[3] == BLUE_GLU_GELU);
    }
    CHECK(countOp(ops, Op::GEGLU) == 0);
    CHECK(countOp(ops, Op::SWIGLU) == 0);
    CHECK(countOp(ops, Op::SOFTCAP) == 1);
    CHECK(countOp(ops, Op::ATTN) == 0);
    std::vector<uint32_t> windows;
    for (const TensorInstr& t : ops) {
        if (t.op != Op::ATTNX) continue;
        windows.push_back(t.args[8]);
        CHECK(std::bit_cast<float>(t.args[9]) == 50.0f);
    }
    CHECK(windows == std::vector<uint32_t>{8, 0, 8, 0});
    CHECK(countOp(ops, Op::RMSNORM) == 4 * 4 + 1);  // pre and post norms of both sublayers, output
    Generated ref = checkGpuMatchesRef(m);
    // The window and the final soft cap matter for these prompts: without either the reference
    // machine's log-probabilities move.
    ModelConfig full = model.cfg;
    full.sliding_window = 0;
    CHECK(maxLogprobDiff(runRef(lower(model, full, path)), ref) > 1e-3);
    ModelConfig uncapped = model.cfg;
    uncapped.final_softcap = 0;
    CHECK(maxLogprobDiff(runRef(lower(model, uncapped, path)), ref) > 1e-3);
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("archs: gemma3-tiny on the GPU gives the reference tokens") {
    TempDir dir("blue_archs");
    const std::string path = writePreset(dir, "gemma3-tiny");
    Model model = open(path);
    Module m = lower(model, model.cfg, path);
    std::vector<TensorInstr> ops = forwardOps(m);
    CHECK(countOp(ops, Op::MATMULGLU) == 6);
    CHECK(countOp(ops, Op::GEGLU) == 0);
    CHECK(countOp(ops, Op::SOFTCAP) == 0);
    CHECK(countOp(ops, Op::ATTNX) == 5);  // layers 0..4 slide, with no soft cap
    CHECK(countOp(ops, Op::ATTN) == 1);
    std::vector<float> bases;
    for (const TensorInstr& t : ops) {
        if (t.op == Op::ATTNX) CHECK((t.args[8] == 8 && t.args[9] == 0));
        if (t.op == Op::ROPEQK && bases.size() < 6) bases.push_back(std::bit_cast<float>(t.args[7]));
    }
    REQUIRE(bases.size() == 6);  // Q and K of 6 layers: 10000 on the local layers, 1e6 on layer 5
    for (size_t i = 0; i < 5; ++i) CHECK(bases[i] == 10000.0f);
    CHECK(bases[5] == 1e6f);
    checkGpuMatchesRef(m);
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE(
    "archs: phi3-tiny, short and long LongRoPE factors, F32 and Q8_0, on the GPU gives the "
    "reference tokens") {
    TempDir dir("blue_archs");
    for (DType type : {DType::F32, DType::Q8_0}) {
        const std::string path = writePreset(dir, "phi3-tiny", type);
        Model model = open(path);
        INFO(dtypeName(type));
        REQUIRE(model.cfg.fused_qkv);
        Module m = lower(model, model.cfg, path);
        std::vector<TensorInstr> ops = forwardOps(m);
        // Q/K/V and gate/up are row views of the fused matrices: 5 matmuls per layer read them.
        size_t views = 0;
        for (const TensorDecl& t : m.tensors) views += t.name.find(".weight[") != std::string::npos;
        CHECK(countOp(ops, Op::MATMULGLU) == 3);  // SwiGLU in the gate rows' matmul
        CHECK(countOp(ops, Op::SWIGLU) == 0);
        CHECK(countOp(ops, Op::ATTN) == 3);
        const TensorInstr* rope = nullptr;
        for (const TensorInstr& t : ops) {
            if (t.op == Op::ROPEQK && !rope) rope = &t;
        }
        REQUIRE(rope);
        CHECK(m.tensors[rope->args[2]].name == "rope_factors_short.weight");  // ctx 96 <= 4096
        Generated short_tokens = checkGpuMatchesRef(m);
        if (type != DType::F32) continue;
        CHECK(views == 15);
        // A context past the original one takes the long factors (the file says 4096; pretend 64).
        ModelConfig longer = model.cfg;
        longer.rope_scaling_orig_ctx = 64;
        Module ml = lower(model, longer, path);
        std::vector<TensorInstr> lops = forwardOps(ml);
        for (const TensorInstr& t : lops) {
            if (t.op == Op::ROPEQK) CHECK(ml.tensors[t.args[2]].name == "rope_factors_long.weight");
        }
        CHECK(maxLogprobDiff(checkGpuMatchesRef(ml), short_tokens) > 1e-3);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE(
    "archs: qwen2 with YaRN (factor 4 from 512): per-pair divisors and magnitude from the "
    "metadata, the GPU gives the reference tokens, and YaRN changes them") {
    TempDir dir("blue_archs");
    const std::string path = writePreset(dir, "qwen2-yarn-tiny");
    Model model = open(path);
    REQUIRE(model.cfg.rope_scaling == RopeScaling::Yarn);
    CHECK(model.cfg.rope_scaling_factor == 4.0f);
    CHECK(model.cfg.rope_scaling_orig_ctx == 512);
    Module m = lower(model, model.cfg, path);
    std::vector<TensorInstr> ops = forwardOps(m);
    CHECK(countOp(ops, Op::ROPEQK) == 3);  // Q and K of each layer in one dispatch
    CHECK(countOp(ops, Op::ROPE) == 0);
    uint32_t table = ~0u;
    for (const TensorInstr& t : ops) {
        if (t.op != Op::ROPEQK) continue;
        CHECK(m.tensors[t.args[2]].name == "rope_yarn_divisors");
        CHECK(std::bit_cast<float>(t.args[8]) == 1.0f);  // no position scale: the divisors carry it
        table = t.args[2];
    }
    // Head width 64, base 10000, 512 original positions: pair i turns 512 / (2 pi 10000^(2i/64))
    // times, 32 times at i = 3.25 and once at i = 15.3, so pairs 0..3 keep their frequency
    // (divisor 1), pairs 16..31 are interpolated (divisor 4) and the ramp rises between.
    REQUIRE(table != ~0u);
    std::vector<float> div(32);
    REQUIRE(m.tensors[table].bytes == 32 * 4);
    std::memcpy(div.data(), m.data.data() + m.tensors[table].offset, 32 * 4);
    for (uint32_t i = 0; i <= 3; ++i) CHECK(div[i] == doctest::Approx(1.0f));
    for (uint32_t i = 16; i < 32; ++i) CHECK(div[i] == doctest::Approx(4.0f));
    for (uint32_t i = 4; i < 16; ++i) {
        CHECK(div[i] > div[i - 1]);
        CHECK(div[i] < 4.0f);
    }
    // cos and sin grow by 1 + 0.1 ln 4, so the query scale by its square.
    const float mag = 1.0f + 0.1f * std::log(4.0f);
    for (const TensorInstr& t : ops) {
        if (t.op == Op::ATTN) CHECK(std::bit_cast<float>(t.args[7]) == doctest::Approx(mag * mag / 8.0f));
    }
    Generated yarn = checkGpuMatchesRef(m);
    ModelConfig plain = model.cfg;
    plain.rope_scaling = RopeScaling::None;
    CHECK(maxLogprobDiff(runRef(lower(model, plain, path)), yarn) > 1e-3);
    CHECK_NO_VALIDATION_ERRORS();
}

// The lowered program against tests/naive_forward.cpp, a plain forward pass written from
// llama.cpp's graphs: for the longest request (19 prompt tokens, past gemma's window), the
// reference machine's greedy tokens are the naive pass's argmax at each step, with the same
// log-probability.
TEST_CASE(
    "archs: the lowered gemma2, gemma3, phi3 and qwen2-with-YaRN programs agree with a plain C++ "
    "forward pass") {
    TempDir dir("blue_archs");
    for (const char* preset : {"gemma2-tiny", "gemma3-tiny", "phi3-tiny", "qwen2-yarn-tiny"}) {
        INFO(std::string(preset));
        const std::string path = writePreset(dir, preset);
        Model model = open(path);
        const GenerationRequest req = requests().back();
        Generated ref = runRef(lower(model, model.cfg, path, DType::F32), {req});
        const std::vector<uint32_t>& got = ref.tokens[req.tag];
        REQUIRE(got.size() == 6);
        std::vector<uint32_t> seq = req.prompt;
        seq.insert(seq.end(), got.begin(), got.end() - 1);
        std::vector<std::vector<double>> lp = naiveLogProbs(model.gguf, model.cfg, kCtx, seq);
        for (size_t j = 0; j < got.size(); ++j) {
            const std::vector<double>& row = lp[req.prompt.size() - 1 + j];
            CHECK(size_t(std::max_element(row.begin(), row.end()) - row.begin()) == got[j]);
            CHECK(std::fabs(row[got[j]] - ref.logprobs[req.tag][j]) < 1e-4);
        }
    }
}

}  // namespace blue::test
