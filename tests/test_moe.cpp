// Mixture-of-experts models end to end: synthetic MoE models of each architecture lowered and run
// on the GPU against the reference machine, the expert bytes the GPU reports against the k of E
// experts a token should read, and the grouping of instances' rows by expert.
#include <doctest/doctest.h>

#include <map>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "compiler/upcycle.h"
#include "host/weight_layout.h"
#include "tests/generation_runs.h"
#include "tests/gpu_fixture.h"
#include "tests/moe_models.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "tools/synth/synth.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/llm_request.h"

namespace blue::test {
namespace {

// A preset at dim 64, ff 64, vocab 300, keeping its experts.
SynthConfig small(const char* preset) { return shrunkPreset(preset, 64, 64, 300); }

struct Lowered {
    GgufFile gguf;
    ModelConfig cfg;
    Module module;
};

Lowered lowerFile(const std::string& path, uint32_t max_rows = 64) {
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    LowerOptions opt;
    opt.ctx = 96;
    opt.grammar_words = 0;  // no grammars here: 16 instances fit 1 MiB pages (device profiles)
    opt.max_rows = max_rows;
    opt.chunk = 16;
    opt.model_path = path;
    auto m = lowerModel(g.value(), cfg.value(), opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return {std::move(g.value()), cfg.value(), std::move(m.value())};
}

std::vector<GenerationRequest> requests(uint32_t n, uint32_t max_new) {
    std::vector<GenerationRequest> out;
    for (uint32_t i = 0; i < n; ++i) {
        GenerationRequest r;
        r.tag = 100 + i;
        r.max_new = max_new;
        r.sampling.temperature = 0;
        r.ignore_eog = true;  // every request runs its max_new tokens (random weights may pick EOS)
        r.prompt = {1};
        for (uint32_t t = 0; t < 3 + 5 * i; ++t) r.prompt.push_back(3 + (i * 37 + t * 11) % 290);
        out.push_back(r);
    }
    return out;
}

using TokensByTag = std::map<uint32_t, std::vector<uint32_t>>;

struct GpuRun {
    TokensByTag tokens;
    GpuStats stats;
};

GpuRun runGpu(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs) {
    GpuGenerated g = runOnGpu(m, instances, reqs);
    return {g.out.tokens, g.stats};
}

TokensByTag runRef(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs) {
    return runOnRef(m, instances, reqs).tokens;
}

// Five greedy requests of 6 tokens on 3 instances: the GPU gives the reference machine's tokens.
GpuRun checkGpuMatchesRef(const Module& m) {
    const std::vector<GenerationRequest> reqs = requests(5, 6);
    TokensByTag ref = runRef(m, 3, reqs);
    GpuRun g = runGpu(m, 3, reqs);
    REQUIRE(ref.size() == reqs.size());
    for (const GenerationRequest& r : reqs) {
        CHECK(ref[r.tag].size() == 6);
        CHECK_MESSAGE(g.tokens[r.tag] == ref[r.tag], "request " << r.tag);
    }
    return g;
}

// Bytes of one expert's three matrices in one layer, as the GPU holds them (repacked).
uint64_t expertBytes(const Lowered& l, uint32_t layer) {
    uint64_t total = 0;
    for (const char* name : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
        const GgufTensor* t = l.gguf.findTensor("blk." + std::to_string(layer) + "." + name);
        REQUIRE(t);
        WeightLayout wl;
        REQUIRE(weightLayout(t->type, uint64_t(t->ne[0]), uint64_t(t->ne[1]), &wl));
        total += wl.bytes;
    }
    return total;
}

}  // namespace

TEST_CASE("moe: synthetic MoE models give the reference machine's tokens on the GPU, batched") {
    TempDir dir("blue_moe");
    struct Case {
        const char* preset;
        DType type;
    };
    std::vector<Case> cases = {{"mixtral-tiny", DType::F32}, {"mixtral-tiny", DType::Q4_0}, {"peer-moe", DType::Q8_0}};
    for (const char* extra : {"qwen2moe-tiny", "qwen3moe-tiny"}) {
        if (synthPreset(extra)) cases.push_back({extra, DType::F32});
    }
    for (const Case& c : cases) {
        SynthConfig cfg = small(c.preset);
        SynthOptions so;
        so.type = c.type;
        const std::string path = dir.path + "/" + c.preset + "_" + std::string(dtypeName(c.type)) + ".gguf";
        REQUIRE(synthWrite(cfg, so, path));
        Lowered l = lowerFile(path);
        INFO(std::string(c.preset) << " " << dtypeName(c.type) << ": " << l.cfg.n_expert << " experts, " << l.cfg.n_expert_used
                      << " per token");
        GpuRun g = checkGpuMatchesRef(l.module);
        CHECK(g.stats.round_trips == 0);
        CHECK(g.stats.expert_bytes > 0);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

// IQ4_XS and IQ4_NL through the whole model: 256-wide synthetic models (rows of 256 take IQ4_XS;
// ffn_down's rows of 64 fall back to IQ4_NL) lowered and run on the GPU, dense and with experts
// (the MOEMM kernels), give the reference machine's greedy tokens.
TEST_CASE("moe: dense and MoE models in iq4_xs give the reference machine's tokens on the GPU") {
    TempDir dir("blue_iq4");
    for (const char* preset : {"peer-dim256", "mixtral-tiny"}) {
        SynthConfig cfg = small(preset);
        cfg.dim = 256;
        SynthOptions so;
        so.type = DType::IQ4_XS;
        const std::string path = dir.path + "/" + preset + "_iq4_xs.gguf";
        REQUIRE(synthWrite(cfg, so, path));
        Lowered l = lowerFile(path);
        std::map<DType, int> types;
        for (const GgufTensor& t : l.gguf.tensors()) ++types[t.type];
        CHECK(types[DType::IQ4_XS] > 0);
        CHECK(types[DType::IQ4_NL] > 0);
        INFO(std::string(preset) << ": " << types[DType::IQ4_XS] << " IQ4_XS and "
                                 << types[DType::IQ4_NL] << " IQ4_NL tensors, " << l.cfg.n_expert
                                 << " experts");
        checkGpuMatchesRef(l.module);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

// The low-bit formats through the whole model: a 256-wide dense model in TQ1_0 and in TQ2_0
// (llama.cpp's mix: output Q6_K, token_embd Q4_K, ffn_down's rows of 64 fall back to Q4_0) and
// the MoE model in MXFP4_MOE (experts MXFP4, the other matrices Q8_0) give the reference
// machine's greedy tokens on the GPU.
TEST_CASE("moe: TQ1_0, TQ2_0 and MXFP4 models give the reference machine's tokens on the GPU") {
    TempDir dir("blue_lowbit");
    const std::pair<const char*, DType> cases[] = {
        {"peer-dim256", DType::TQ1_0}, {"peer-dim256", DType::TQ2_0}, {"mixtral-tiny", DType::MXFP4}};
    for (auto [preset, type] : cases) {
        SynthConfig cfg = small(preset);
        cfg.dim = 256;
        SynthOptions so;
        so.type = type;
        const std::string path = dir.path + "/" + preset + "_" + std::string(dtypeName(type)) + ".gguf";
        REQUIRE(synthWrite(cfg, so, path));
        Lowered l = lowerFile(path);
        std::map<DType, int> types;
        for (const GgufTensor& t : l.gguf.tensors()) ++types[t.type];
        INFO(std::string(preset) << " " << dtypeName(type) << ": " << types[type] << " tensors of it, "
                                 << types[DType::Q8_0] << " Q8_0, " << types[DType::Q4_0] << " Q4_0");
        CHECK(types[type] > 0);
        if (type == DType::MXFP4) {
            CHECK(types[DType::MXFP4] == int(3 * cfg.n_layer));  // gate, up, down experts per layer
            CHECK(types[DType::Q8_0] > 0);
        }
        checkGpuMatchesRef(l.module);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

// One instance decoding one row per step: every layer reads exactly its k chosen experts, so the
// expert bytes are rows x layers x k x one expert's bytes, k/E of what a dense pass over every
// expert would read. With 16 instances stepping together the rows that chose the same expert
// share one read of it: fewer bytes than 16 single-row steps.
TEST_CASE("moe: the GPU reads only the chosen experts' weights, once per expert for all instances") {
    TempDir dir("blue_moe");
    SynthConfig cfg = small("mixtral-tiny");
    const std::string path = dir.path + "/moe.gguf";
    SynthOptions so;
    so.type = DType::Q4_0;
    REQUIRE(synthWrite(cfg, so, path));
    Lowered l = lowerFile(path);
    const uint64_t per_expert = expertBytes(l, 0);
    const uint32_t k = l.cfg.n_expert_used, layers = l.cfg.n_layer, E = l.cfg.n_expert;
    REQUIRE(k < E);

    GenerationRequest one;
    one.tag = 1;
    one.max_new = 12;
    one.sampling.temperature = 0;
    one.prompt = {1};
    one.sampling.repeat_penalty = 1.0f;
    GpuRun single = runGpu(l.module, 1, {one});
    // Rows run: the prompt's one token and every generated token (the generation program feeds
    // back the last one too before it sees max_new reached).
    const uint64_t rows = 1 + 12;
    CHECK(single.stats.expert_bytes == rows * layers * k * per_expert);
    MESSAGE("one instance: " << single.stats.expert_bytes / rows << " expert bytes per token, "
                             << layers * E * per_expert << " for every expert (k/E = " << k << "/" << E << ")");

    std::vector<GenerationRequest> many;
    for (uint32_t i = 0; i < 16; ++i) {
        GenerationRequest r = one;
        r.tag = 10 + i;
        r.prompt = {1, 3 + i};
        many.push_back(r);
    }
    GpuRun batched = runGpu(l.module, 16, many);
    const uint64_t batched_rows = 16 * (2 + 12);
    MESSAGE("16 instances: " << batched.stats.expert_bytes / batched_rows << " expert bytes per token");
    CHECK(batched.stats.expert_bytes < batched_rows * layers * k * per_expert / 2);
    CHECK(batched.stats.round_trips == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

// stories260K upcycled into 8 identical experts with a random router, top-2: whatever the router
// picks, the renormalised weights sum to one, so the MoE model computes the dense FFN and must
// give the real model's known greedy text, on the GPU, through routing, grouping and MOEMIX.
TEST_CASE("moe: stories260K upcycled into 8 experts gives the dense model's 256 greedy tokens on the GPU") {
    TempDir dir("blue_moe");
    const std::string path = dir.path + "/stories_moe.gguf";
    UpcycleOptions uo;
    uo.experts = 8;
    uo.experts_used = 2;
    uo.seed = 5;
    auto up = upcycleGguf(sharedDir() + "/models/stories260K/stories260K.gguf", path, uo);
    REQUIRE_MESSAGE(up.isOk(), up.message());
    auto g = ggufOpen(path);
    REQUIRE(g.isOk());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    REQUIRE(cfg.value().n_expert == 8);
    LowerOptions opt;
    opt.ctx = 300;
    opt.grammar_words = 0;  // no grammars here: 16 instances fit 1 MiB pages (device profiles)
    opt.model_path = path;
    auto m = lowerModel(g.value(), cfg.value(), opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    GenerationRequest req;
    req.tag = 3;
    req.max_new = 256;
    req.sampling.temperature = 0;
    req.prompt = {1};
    GpuRun run = runGpu(m.value(), 1, {req});
    CHECK(run.tokens[3] == expectedGreedyIds());
    CHECK(run.stats.expert_bytes > 0);
    CHECK(run.stats.round_trips == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace blue::test
