// See generation_runs.h.
#include "tests/generation_runs.h"

#include <doctest/doctest.h>

#include <bit>

#include "tests/gpu_fixture.h"
#include "vm/abi.h"
#include "vm/weights.h"

namespace blue::test {

Generated generatedByTag(const RunReport& r) {
    Generated out;
    std::map<uint32_t, uint32_t> tag_of;  // instance -> tag of the response it is writing
    for (const OutputRecord& rec : r.output) {
        if (rec.kind == BLUE_OUT_BEGIN) tag_of[rec.inst] = rec.value;
        if (rec.kind == BLUE_OUT_TOKEN) out.tokens[tag_of[rec.inst]].push_back(rec.value);
        if (rec.kind == BLUE_OUT_FLOAT) out.logprobs[tag_of[rec.inst]].push_back(std::bit_cast<float>(rec.value));
        if (rec.kind == BLUE_OUT_UINT) out.cached[tag_of[rec.inst]] = rec.value;
        if (rec.kind == BLUE_OUT_END) out.tokens[rec.value];
    }
    return out;
}

Generated runOnRef(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs) {
    auto w = WeightSource::open(m, "");
    REQUIRE_MESSAGE(w.isOk(), w.message());
    RefMachine machine(m, w.value(), MachineOptions{instances, 1000000});
    for (const GenerationRequest& r : reqs) machine.pushInput(encodeRequest(r));
    machine.closeInput();
    RunReport r = machine.run();
    REQUIRE_MESSAGE(r.status.isOk(), r.status.message());
    return generatedByTag(r);
}

GpuGenerated runOnGpu(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs) {
    auto w = WeightSource::open(m, "");
    REQUIRE_MESSAGE(w.isOk(), w.message());
    GpuOptions opt;
    opt.instances = instances;
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w.value(), opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    for (const GenerationRequest& r : reqs) REQUIRE(machine.value()->pushInput(encodeRequest(r)).isOk());
    machine.value()->closeInput();
    auto r = machine.value()->run();
    REQUIRE_MESSAGE(r.isOk(), r.message());
    CHECK_MESSAGE(r.value().status.isOk(), r.value().status.message());
    CHECK(machine.value()->stats().round_trips == 0);
    return {generatedByTag(r.value()), machine.value()->stats()};
}

}  // namespace blue::test
