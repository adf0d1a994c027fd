// The LLM path on the reference machine: stories260K lowered to Blue-IR and run by the CPU
// interpreter reproduces the known greedy output. This pins down the op semantics, the lowering
// and the generation program independently of any GPU kernel.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "tests/gpu_fixture.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/llm_request.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

struct Stories {
    GgufFile gguf;
    Module module;
};

Stories loweredStories(uint32_t ctx) {
    std::string path = sharedDir() + "/models/stories260K/stories260K.gguf";
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    LowerOptions opt;
    opt.ctx = ctx;
    opt.model_path = path;
    // No grammar memory: no request here has a grammar, and the GPU-assisted validation pass
    // (tools/test.sh) runs these tests 4x slower with it (its 16 MiB input ring, 62 s vs 245 s).
    opt.grammar_words = 0;
    auto m = lowerModel(g.value(), cfg.value(), opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return Stories{std::move(g.value()), std::move(m.value())};
}

std::vector<uint32_t> tokensOf(const RunReport& r, uint32_t tag) {
    std::vector<uint32_t> tokens;
    bool ended = false;
    for (const OutputRecord& rec : r.output) {
        if (rec.kind == BLUE_OUT_TOKEN) tokens.push_back(rec.value);
        if (rec.kind == BLUE_OUT_END) ended = rec.value == tag;
    }
    CHECK(ended);
    return tokens;
}

TEST_CASE("stories260K greedy from BOS on the reference machine matches the expected 256 tokens") {
    Stories s = loweredStories(300);
    Module& m = s.module;
    auto w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    RefMachine machine(m, w.value(), MachineOptions{1, 100000});
    GenerationRequest req;
    req.tag = 7;
    req.max_new = 256;
    req.sampling.temperature = 0;
    req.prompt = {1};
    machine.pushInput(encodeRequest(req));
    machine.closeInput();
    RunReport r = machine.run();
    REQUIRE_MESSAGE(r.status.isOk(), r.status.message());
    std::vector<uint32_t> tokens = tokensOf(r, 7);
    std::vector<uint32_t> expected = expectedGreedyIds();
    REQUIRE(expected.size() == 256);
    CHECK(tokens == expected);
}

// Greedy from BOS on the GPU with `opt`: the tokens and the machine's counters.
struct GreedyRun {
    GpuStats stats;
    std::vector<uint32_t> tokens;
};
GreedyRun greedyFromBos(const GpuOptions& opt, uint32_t max_new) {
    Stories s = loweredStories(300);
    auto w = WeightSource::open(s.module, "");
    REQUIRE(w.isOk());
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, s.module, w.value(), opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    GenerationRequest req;
    req.tag = 3;
    req.max_new = max_new;
    req.sampling.temperature = 0;
    req.prompt = {1};
    REQUIRE(machine.value()->pushInput(encodeRequest(req)).isOk());
    machine.value()->closeInput();
    auto r = machine.value()->run();
    REQUIRE_MESSAGE(r.isOk(), r.message());
    CHECK_MESSAGE(r.value().status.isOk(), r.value().status.message());
    return {machine.value()->stats(), tokensOf(r.value(), 3)};
}

TEST_CASE("stories260K greedy from BOS on the GPU matches the expected 256 tokens") {
    GpuOptions opt;
    opt.chain_cycles = 64;
    opt.max_submit_ms = 0;  // fixed 64-cycle chains: the submit count below is about chains
    GreedyRun run = greedyFromBos(opt, 256);
    CHECK(run.tokens == expectedGreedyIds());
    const GpuStats& st = run.stats;
    MESSAGE("stories260K 256 tokens: " << st.json());
    CHECK(st.submits <= 8);
    CHECK(st.round_trips == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("watchdog bound: chains shrink to one cycle per submission, tokens unchanged") {
    GpuOptions opt;
    opt.chain_cycles = 64;
    opt.max_submit_ms = 0.01;  // shorter than any cycle on any device
    GreedyRun run = greedyFromBos(opt, 256);
    CHECK(run.tokens == expectedGreedyIds());
    const GpuStats& st = run.stats;
    MESSAGE("max_submit_ms 0.01: " << st.json());
    CHECK(st.chain_cycles_min == 1);
    CHECK(st.chain_cycles_now == 1);
    CHECK(st.chain_rerecords > 0);
    CHECK(st.submits_timed == st.submits);
    // The first two chains (4 cycles each) are in flight before the first is timed; after
    // them, one cycle per submission.
    CHECK(st.submits >= 2 + (258 - 8));
    CHECK(st.round_trips == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test
