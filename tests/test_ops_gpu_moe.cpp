// The mixture-of-experts ops in the generic per-op test (test_ops_gpu.cpp runs these cases):
// MOEROUTE (routing and the expert map), MOEMM (the grouped expert matmul, every weight type, its
// single-pair and tiled variants, x shared by the slots and one part per slot) and MOEMIX.
#include <doctest/doctest.h>

#include "host/machine_plan.h"
#include "host/pipelines.h"
#include "host/weight_layout.h"
#include "tests/gpu_fixture.h"
#include "tests/test_ops_gpu.h"
#include "vm/abi.h"
#include "vm/tensor_ops.h"

namespace blue::test {

namespace {

constexpr uint32_t kVocab = 64;
constexpr uint32_t kMaxRows = 24;

uint32_t mapTensor(OpModule& om, uint32_t experts, uint32_t slots, const std::string& name = "map") {
    return om.tensor(name, BLUE_TC_GLOBAL, DType::I32, {BLUE_MOE_MAP_WORDS(experts, kMaxRows * slots)});
}

// 11 rows in 5 instances (tiles of BLUE_MOE_TILE_ROWS pairs) and one row alone (tiles of one).
const std::vector<std::pair<std::vector<uint32_t>, std::vector<uint32_t>>> kRuns = {
    {{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}}, {{1}, {3}}};

}  // namespace

// MOEROUTE over 11 experts, 3 per row, with both gating rules. The chosen ids are exact small
// floats and must be equal; the weights use exp (3 + 2|x| ULP in Vulkan, |x| <= 6 here) and one
// division: ~4e-6 relative at worst; 1e-5.
void moerouteCase() {
    constexpr uint32_t kExperts = 11, kSlots = 3;
    for (const auto& [rows, starts] : kRuns) {
        OpModule om(kVocab, kMaxRows, kTokens + 8, 0x40E1);
        uint32_t logits = om.rowsInput("logits", kExperts, -3, 3);
        uint32_t sel0 = om.tensor("sel_renorm", BLUE_TC_ROWS, DType::F32, {2 * kSlots});
        uint32_t sel1 = om.tensor("sel_softmax_all", BLUE_TC_ROWS, DType::F32, {2 * kSlots});
        uint32_t map0 = mapTensor(om, kExperts, kSlots);
        uint32_t map1 = mapTensor(om, kExperts, kSlots, "map1");
        om.step(Op::MOEROUTE, {sel0, logits, map0, kSlots, 0});
        om.step(Op::MOEROUTE, {sel1, logits, map1, kSlots, 1});
        std::vector<InstancePlan> plans = raggedPlans(om, rows, starts);
        Module m = om.build(plans);
        auto both = runOnBoth(m, uint32_t(plans.size()));
        if (!both) return;
        const uint32_t items = totalRows(plans);
        const std::string run = items == 1 ? " one row" : " ragged rows";
        expectClose(*both, sel0, items, 1e-5, "MOEROUTE top-k renormalised" + run);
        expectClose(*both, sel1, items, 1e-5, "MOEROUTE softmax over all" + run);
        // The map's header and offsets do not depend on the order rows landed in.
        std::vector<uint8_t> g = both->gpuBytes(map0);
        const std::vector<uint8_t>& r = both->refBytes(map0);
        REQUIRE(g.size() >= (BLUE_MOE_H_WORDS + kExperts + 1) * 4);
        CHECK(std::equal(g.begin(), g.begin() + (BLUE_MOE_H_WORDS + kExperts + 1) * 4, r.begin()));
        const uint32_t* words = reinterpret_cast<const uint32_t*>(g.data());
        CHECK(words[BLUE_MOE_H_WORDS + kExperts] == items * kSlots);
        CHECK(words[BLUE_MOE_H_TILE] == (items == 1 ? 1u : BLUE_MOE_TILE_ROWS));
    }

    // 256 experts, 8 a row, 600 rows: the one workgroup walks every row's router logits k times
    // and every expert's pairs; one element an iteration that was about 112,000 loop iterations
    // an invocation, past lavapipe's 65,535 (KernelChoice::loop_limit), and the routing came out
    // wrong. Every row has its own logits; the chosen ids must be equal.
    constexpr uint32_t kWideExperts = 256, kWideSlots = 8, kWideRows = 600;
    OpModule om(kWideRows + 8, kWideRows, kTokens + 160, 0x40E3);  // a token per row
    uint32_t logits = om.rowsInput("logits", kWideExperts, -3, 3);
    uint32_t sel = om.tensor("sel", BLUE_TC_ROWS, DType::F32, {2 * kWideSlots});
    uint32_t map = om.tensor("map", BLUE_TC_GLOBAL, DType::I32,
                             {BLUE_MOE_MAP_WORDS(kWideExperts, kWideRows * kWideSlots)});
    om.step(Op::MOEROUTE, {sel, logits, map, kWideSlots, 1});
    std::vector<InstancePlan> plans = raggedPlans(om, {150, 150, 150, 150}, {0, 0, 0, 0});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    expectClose(*both, sel, kWideRows, 1e-5, "MOEROUTE softmax over all, 256 experts, 600 rows");
    std::vector<uint8_t> g = both->gpuBytes(map);
    const std::vector<uint8_t>& r = both->refBytes(map);
    REQUIRE(g.size() >= (BLUE_MOE_H_WORDS + kWideExperts + 1) * 4);
    CHECK(std::equal(g.begin(), g.begin() + (BLUE_MOE_H_WORDS + kWideExperts + 1) * 4, r.begin()));
    CHECK(reinterpret_cast<const uint32_t*>(g.data())[BLUE_MOE_H_WORDS + kWideExperts] == kWideRows * kWideSlots);
}

// MOEMM with [K, N, 5] experts of type t (K = 172 rounded up to the type's block, N = 172), 2
// slots per row, routed by a MOEROUTE: the gate/up form (x shared by the slots) and the down form
// (x one part per slot). The products are those of MATMUL (same loops): its bound, 1e-4.
// Then again under a VRAM budget that leaves room for two of the five experts: the experts stay
// in host memory, MOEROUTE pages those it can into a two-slot cache (MOECOPY copies them) and the
// `moemmc` kernels read cached experts from the cache and the rest in place: the ragged run asks
// for all five (two cached, three in place), the single row for two (both cached).
void moemmCase(DType t) {
    constexpr uint32_t kExperts = 5, kSlots = 2, kN = 172;
    const uint32_t k = (172 + dtypeInfo(t)->block_elems - 1) / dtypeInfo(t)->block_elems * dtypeInfo(t)->block_elems;
    for (const auto& [rows, starts] : kRuns) {
        OpModule om(kVocab, kMaxRows, kTokens + 8, 0x40E2 + uint32_t(t));
        uint32_t logits = om.rowsInput("logits", kExperts, -2, 2);
        uint32_t x = om.rowsInput("x", k, -1, 1);
        uint32_t xs = om.rowsInput("x_per_slot", kSlots * k, -1, 1);
        uint32_t w = om.data("w", BLUE_TC_WEIGHT, t, {k, kN, kExperts}, om.random(size_t(k) * kN * kExperts, -1, 1));
        uint32_t sel = om.tensor("sel", BLUE_TC_ROWS, DType::F32, {2 * kSlots});
        uint32_t map = mapTensor(om, kExperts, kSlots);
        uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {kSlots * kN});
        uint32_t ys = om.tensor("y_per_slot", BLUE_TC_ROWS, DType::F32, {kSlots * kN});
        om.step(Op::MOEROUTE, {sel, logits, map, kSlots, 0});
        om.step(Op::MOEMM, {y, w, x, map});
        om.step(Op::MOEMM, {ys, w, xs, map});
        std::vector<InstancePlan> plans = raggedPlans(om, rows, starts);
        Module m = om.build(plans);
        auto both = runOnBoth(m, uint32_t(plans.size()));
        if (!both) return;
        const uint32_t items = totalRows(plans);
        const std::string name = "MOEMM " + lowerName(t) + (items == 1 ? " one pair per tile" : " tiles");
        if (items == 1) kernelsRun().insert(kernelName(m, uint32_t(Op::MOEMM), {y, w, x, map}) + "_b1");
        expectClose(*both, y, items, 1e-4, name + ", x shared");
        expectClose(*both, ys, items, 1e-4, name + ", x per slot");

        WeightLayout wl;
        REQUIRE(weightLayout(t, k, kN, &wl));
        const uint64_t vram = both->gpu->stats().vram_bytes;
        auto cached = runOnBoth(m, uint32_t(plans.size()), nullptr, vram - (kExperts - 2) * wl.bytes + wl.bytes / 2);
        if (!cached) return;
        const GpuStats& s = cached->gpu->stats();
        REQUIRE(s.expert_cache_slots == 2);
        // One MOEROUTE run on a cold cache: two of the experts the rows chose are copied in, the
        // others read in place.
        std::vector<uint8_t> mw = cached->gpuBytes(map);
        REQUIRE(mw.size() >= (BLUE_MOE_H_WORDS + kExperts + 1) * 4);
        const uint32_t* offsets = reinterpret_cast<const uint32_t*>(mw.data()) + BLUE_MOE_H_WORDS;
        uint32_t chosen = 0;
        for (uint32_t e = 0; e < kExperts; ++e) chosen += offsets[e + 1] > offsets[e] ? 1 : 0;
        CHECK(s.expert_misses == std::min(chosen, 2u));
        CHECK(s.expert_inplace == chosen - std::min(chosen, 2u));
        CHECK(s.expert_hits == 0u);
        if (items > 1) CHECK(s.expert_inplace > 0u);
        CHECK(s.expert_paged_bytes == s.expert_misses * wl.bytes);
        kernelsRun().insert("moecopy");
        kernelsRun().insert("moemmc_" + lowerName(t) + (items == 1 ? "_b1" : ""));
        expectClose(*cached, y, items, 1e-4, name + ", x shared, experts cached");
        expectClose(*cached, ys, items, 1e-4, name + ", x per slot, experts cached");
    }
}

// MOEMIX without and with a gated shared expert, 3 slots of 300 (two 256-wide workgroups). A sum
// of 4 products and a sigmoid (exp, division): a few ULP of values near 10; 1e-5.
void moemixCase() {
    constexpr uint32_t kExperts = 6, kSlots = 3, kN = 300;
    OpModule om(kVocab, kMaxRows, kTokens + 8, 0x40E3);
    uint32_t logits = om.rowsInput("logits", kExperts, -2, 2);
    uint32_t a = om.rowsInput("a", kN, -2, 2);
    uint32_t src = om.rowsInput("src", kSlots * kN, -3, 3);
    uint32_t sh = om.rowsInput("shared", kN, -3, 3);
    uint32_t gate = om.rowsInput("gate", 1, -4, 4);
    uint32_t sel = om.tensor("sel", BLUE_TC_ROWS, DType::F32, {2 * kSlots});
    uint32_t map = mapTensor(om, kExperts, kSlots);
    uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {kN});
    uint32_t ys = om.tensor("y_shared", BLUE_TC_ROWS, DType::F32, {kN});
    uint32_t yu = om.tensor("y_shared_ungated", BLUE_TC_ROWS, DType::F32, {kN});
    om.step(Op::MOEROUTE, {sel, logits, map, kSlots, 1});
    om.step(Op::MOEMIX, {y, a, src, sel, 0xFFFFFFFFu, 0xFFFFFFFFu});
    om.step(Op::MOEMIX, {ys, a, src, sel, sh, gate});
    om.step(Op::MOEMIX, {yu, a, src, sel, sh, 0xFFFFFFFFu});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2, 4, 1}, {0, 4, 8, 1, 2});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const uint32_t items = totalRows(plans);
    expectClose(*both, y, items, 1e-5, "MOEMIX");
    expectClose(*both, ys, items, 1e-5, "MOEMIX with a gated shared expert");
    expectClose(*both, yu, items, 1e-5, "MOEMIX with an ungated shared expert");
}

TEST_CASE("ops gpu: MOEMM reading a map that no MOEROUTE before it fills is refused at load") {
    OpModule om(kVocab, kMaxRows, kTokens + 8, 0x40E4);
    uint32_t x = om.rowsInput("x", 64, -1, 1);
    uint32_t w = om.data("w", BLUE_TC_WEIGHT, DType::F32, {64, 8, 4}, om.random(64 * 8 * 4, -1, 1));
    uint32_t map = mapTensor(om, 4, 2);
    uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {16});
    om.step(Op::MOEMM, {y, w, x, map});
    std::vector<InstancePlan> plans = raggedPlans(om, {1}, {0});
    Module m = om.build(plans);
    Result<WeightSource> ws = WeightSource::open(m, "");
    REQUIRE(ws.isOk());
    auto g = GpuMachine::create(*gpu().device, *gpu().pipelines, m, ws.value(), GpuOptions{});
    REQUIRE(!g.isOk());
    CHECK(g.message().find("MOEMM reads the expert map 'map', which no MOEROUTE before it") != std::string::npos);
}

TEST_CASE("verify: the MoE ops' shape rules name the operand") {
    OpModule om(kVocab, kMaxRows, kTokens + 8, 0x40E5);
    uint32_t logits = om.tensor("logits", BLUE_TC_ROWS, DType::F32, {8});
    uint32_t sel = om.tensor("sel", BLUE_TC_ROWS, DType::F32, {4});
    uint32_t map = mapTensor(om, 8, 2);
    uint32_t small_map = om.tensor("small_map", BLUE_TC_GLOBAL, DType::I32, {16});
    uint32_t x = om.tensor("x", BLUE_TC_ROWS, DType::F32, {64});
    uint32_t w = om.data("w", BLUE_TC_WEIGHT, DType::F32, {64, 8, 8}, om.random(64 * 8 * 8, -1, 1));
    uint32_t w2 = om.data("w2d", BLUE_TC_WEIGHT, DType::F32, {64, 8}, om.random(64 * 8, -1, 1));
    uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {16});
    uint32_t y3 = om.tensor("y3", BLUE_TC_ROWS, DType::F32, {17});
    auto message = [&](Op op, std::vector<uint32_t> args) {
        return checkTensorOp(om.module(), TensorInstr{op, 0, std::move(args)}).message();
    };
    CHECK(checkTensorOp(om.module(), TensorInstr{Op::MOEROUTE, 0, {sel, logits, map, 2, 0}}).isOk());
    CHECK(message(Op::MOEROUTE, {sel, logits, map, 9, 0}).find("9 experts per row") != std::string::npos);
    CHECK(message(Op::MOEROUTE, {sel, logits, map, 2, 2}).find("gating rule 2") != std::string::npos);
    CHECK(message(Op::MOEROUTE, {sel, logits, small_map, 2, 0}).find("'small_map'") != std::string::npos);
    CHECK(checkTensorOp(om.module(), TensorInstr{Op::MOEMM, 0, {y, w, x, map}}).isOk());
    CHECK(message(Op::MOEMM, {y, w2, x, map}).find("3-D [K, N, experts]") != std::string::npos);
    CHECK(message(Op::MOEMM, {y3, w, x, map}).find("'y3'") != std::string::npos);
    CHECK(message(Op::MOEMM, {y, w, logits, map}).find("'logits'") != std::string::npos);
    CHECK(message(Op::MOEMIX, {x, x, y, y3, 0xFFFFFFFFu, 0xFFFFFFFFu}).find("'y3'") != std::string::npos);
}

}  // namespace blue::test
