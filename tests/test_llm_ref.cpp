// The LLM path on the reference machine: stories260K lowered to Blue-IR and run by the CPU
// interpreter reproduces the known greedy output. This pins down the op semantics, the lowering
// and the generation program independently of any GPU kernel.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/llm_request.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

std::vector<uint32_t> expectedGreedyIds() {
    std::ifstream in(sharedDir() + "/models/stories260K/expected_greedy_bos_256.txt");
    std::string line;
    std::getline(in, line);
    std::istringstream ss(line);
    std::vector<uint32_t> ids;
    uint32_t id;
    while (ss >> id) ids.push_back(id);
    return ids;
}

TEST_CASE("stories260K greedy from BOS on the reference machine matches the expected 256 tokens") {
    std::string path = sharedDir() + "/models/stories260K/stories260K.gguf";
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE_MESSAGE(cfg.isOk(), cfg.message());
    LowerOptions opt;
    opt.ctx = 300;
    opt.model_path = path;
    auto m = lowerModel(g.value(), cfg.value(), opt);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    auto w = WeightSource::open(m.value(), "");
    REQUIRE(w.isOk());
    RefMachine machine(m.value(), w.value(), MachineOptions{1, 100000});
    GenerationRequest req;
    req.tag = 7;
    req.max_new = 256;
    req.sampling.temperature = 0;
    req.prompt = {1};
    machine.pushInput(encodeRequest(req));
    machine.closeInput();
    RunReport r = machine.run();
    REQUIRE_MESSAGE(r.status.isOk(), r.status.message());
    std::vector<uint32_t> tokens;
    bool ended = false;
    for (const OutputRecord& rec : r.output) {
        if (rec.kind == BLUE_OUT_TOKEN) tokens.push_back(rec.value);
        if (rec.kind == BLUE_OUT_END) ended = rec.value == 7;
    }
    CHECK(ended);
    std::vector<uint32_t> expected = expectedGreedyIds();
    REQUIRE(expected.size() == 256);
    CHECK(tokens == expected);
}

}  // namespace
}  // namespace blue::test
