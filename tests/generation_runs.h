// Generation requests run to the end on the reference machine and on the GPU (one GpuMachine of
// a lowered model, not an Engine), and their output records read back per request tag: what the
// model tests (test_moe, test_archs) compare.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "host/machine.h"
#include "vm/interp.h"
#include "vm/llm_request.h"
#include "vm/module.h"

namespace blue::test {

// Per request tag: its tokens, and the log-probability records it wrote (requests with logprobs).
// A request that ended without a token still has an (empty) entry.
struct Generated {
    std::map<uint32_t, std::vector<uint32_t>> tokens;
    std::map<uint32_t, std::vector<float>> logprobs;
    std::map<uint32_t, uint32_t> cached;  // prompt tokens whose KV rows were reused (prefix reuse)
};

Generated generatedByTag(const RunReport& r);

// The requests run to the end on `instances` instances of the reference machine.
Generated runOnRef(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs);

// The same on the GPU (checks that the run ends cleanly with no round trip), with its counters.
struct GpuGenerated {
    Generated out;
    GpuStats stats;
};
GpuGenerated runOnGpu(const Module& m, uint32_t instances, const std::vector<GenerationRequest>& reqs);

}  // namespace blue::test
