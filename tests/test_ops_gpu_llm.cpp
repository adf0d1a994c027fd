// The per-op GPU-vs-reference cases of the position-dependent LLM ops (see test_ops_gpu.cpp):
// ROPE in both pair layouts, with and without frequency factors, in place; KVSTORE into F32 and
// F16 caches, up to and past the end of the context; ATTN over several hundred cached positions
// (so the kernel's 256-position chunks of online softmax are crossed), head sizes 8 and 64,
// grouped-query ratios 2 and 4; ATTNX the same with sliding windows shorter and longer than the
// positions and soft caps that bend the scores.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>

#include "host/machine_plan.h"
#include "tests/test_ops_gpu.h"
#include "vm/abi.h"

namespace blue::test {

namespace {

uint32_t bits(float f) {
    return std::bit_cast<uint32_t>(f);
}

}  // namespace

// Positions 7, 299-301 and 1030-1031. Rows of 176 (22 heads of 8) and of 192 (3 heads of 64).
void ropeCase() {
    OpModule om(64, 8, kTokens + 8, 0x809E);
    uint32_t x8 = om.rowsInput("x8", 176, -2, 2), x = om.rowsInput("x", 192, -2, 2);
    uint32_t z = om.rowsInput("z", 192, -2, 2);
    uint32_t ffr = om.rowsInput("ff_rows", 32, 0.5f, 2.0f);
    uint32_t ffw = om.data("ff", BLUE_TC_WEIGHT, DType::F32, {16}, om.random(16, 1.0f, 8.0f));
    uint32_t r1 = om.tensor("r_head8", BLUE_TC_ROWS, DType::F32, {176});
    uint32_t r2 = om.tensor("r_neox_ff", BLUE_TC_ROWS, DType::F32, {192});
    uint32_t r3 = om.tensor("r_ff_rows", BLUE_TC_ROWS, DType::F32, {192});
    uint32_t r4 = om.tensor("r_adjacent_partial", BLUE_TC_ROWS, DType::F32, {192});
    const uint32_t kNone = 0xFFFFFFFFu, pos = BLUE_FA_POS;
    // dst, src, factors, position arg, head size, rotated dims, mode, base, scale
    om.step(Op::ROPE, {r1, x8, kNone, pos, 8, 8, 0, bits(10000.0f), bits(1.0f)});
    om.step(Op::ROPE, {r2, x, ffw, pos, 64, 32, 2, bits(1e6f), bits(0.25f)});
    om.step(Op::ROPE, {r3, x, ffr, pos, 64, 64, 0, bits(10000.0f), bits(1.0f)});
    om.step(Op::ROPE, {z, z, kNone, pos, 64, 48, 2, bits(500000.0f), bits(1.0f)});
    om.step(Op::ROPE, {r4, x, kNone, pos, 64, 16, 0, bits(10000.0f), bits(1.0f)});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {7, 299, 1030});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // The GPU forms the angle pos * scale * base^(-2i/n) / ff in float (pow within a few ULP),
    // an absolute error of up to ~1e-4 rad at position 1031, then takes sin and cos, which
    // Vulkan only bounds to 2^-11 absolute; the reference works in double. Each output is
    // x0 * c -/+ x1 * s with |x| <= 2: 2e-3 of max |ref| covers both.
    const uint32_t rows = totalRows(plans);
    expectClose(*both, r1, rows, 2e-3, "ROPE head 8, adjacent pairs");
    expectClose(*both, r2, rows, 2e-3, "ROPE head 64, neox, half rotated, factors");
    expectClose(*both, r3, rows, 2e-3, "ROPE head 64, per-row factors");
    expectClose(*both, z, rows, 2e-3, "ROPE in place, neox, 48 of 64 rotated");
    expectClose(*both, r4, rows, 2e-3, "ROPE adjacent pairs, 16 of 64 rotated");
}

// ROPEQK: q and k of different widths (12 and 4 heads of 16; 3 and 1 of 64) rotated in place in
// one dispatch, adjacent and neox pairs, part of a head rotated, with factors; each against the
// reference's two ROPEs. Same bound as ROPE (same angles and rotations).
void ropeqkCase() {
    OpModule om(64, 8, kTokens + 8, 0x809F);
    uint32_t q = om.rowsInput("q", 192, -2, 2), k = om.rowsInput("k", 64, -2, 2);
    uint32_t q2 = om.rowsInput("q2", 192, -2, 2), k2 = om.rowsInput("k2", 64, -2, 2);
    uint32_t ffw = om.data("ff", BLUE_TC_WEIGHT, DType::F32, {16}, om.random(16, 1.0f, 8.0f));
    const uint32_t kNone = 0xFFFFFFFFu, pos = BLUE_FA_POS;
    // q, k, factors, position arg, head size, rotated dims, mode, base, scale
    om.step(Op::ROPEQK, {q, k, kNone, pos, 16, 12, 0, bits(10000.0f), bits(1.0f)});
    om.step(Op::ROPEQK, {q2, k2, ffw, pos, 64, 32, 2, bits(1e6f), bits(0.25f)});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {7, 299, 1030});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const uint32_t rows = totalRows(plans);
    expectClose(*both, q, rows, 2e-3, "ROPEQK q, head 16, adjacent pairs, 12 of 16 rotated");
    expectClose(*both, k, rows, 2e-3, "ROPEQK k, head 16, adjacent pairs, 12 of 16 rotated");
    expectClose(*both, q2, rows, 2e-3, "ROPEQK q, head 64, neox, half rotated, factors");
    expectClose(*both, k2, rows, 2e-3, "ROPEQK k, head 64, neox, half rotated, factors");
}

// K and V rows of 172 into caches of 16 positions: rows at 15-16, 9-11 and 3. Position 16 is
// past the context and must be dropped; instance 0 has it, so a store past its slice would land
// in instance 1's untouched position 0 and show.
void kvstoreCase(DType cache) {
    constexpr uint32_t kDim = 172, kCtx = 16;
    OpModule om(64, 8, kTokens + 8, 0x5703 + uint32_t(cache));
    uint32_t k = om.rowsInput("k", kDim, -2, 2), v = om.rowsInput("v", kDim, -2, 2);
    uint32_t kc = om.tensor("kcache", BLUE_TC_INSTANCE, cache, {kDim, kCtx});
    uint32_t vc = om.tensor("vcache", BLUE_TC_INSTANCE, cache, {kDim, kCtx});
    om.step(Op::KVSTORE, {k, kc, v, vc, BLUE_FA_POS});
    std::vector<InstancePlan> plans = raggedPlans(om, {2, 3, 1}, {15, 9, 3});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // F32: a copy. F16: one conversion, whose rounding Vulkan leaves to the device (nearest or
    // toward zero): at most one half ULP, 2^-10 relative.
    const double bound = cache == DType::F32 ? 0.0 : 1e-3;
    const std::string name = "KVSTORE " + lowerName(cache);
    expectClose(*both, kc, 0, bound, name + " K cache");
    expectClose(*both, vc, 0, bound, name + " V cache");
}

// ROPEQK then a KVSTORE of its k: one `ropekv_*` dispatch (the plan's fusion, KernelChoice::fuse)
// where the store's v is laid out as k: adjacent pairs, and neox pairs (into F16 caches two
// frequencies an invocation) with part of the head copied and frequency factors. Against the
// reference's ROPEQK then KVSTORE: q and k within ROPE's bound, the K cache that and KVSTORE's
// conversion, the V cache KVSTORE's. Positions 300, 301, 1030 and 1031 are past the caches' 300
// and dropped (instance 2 stores nothing).
void ropekvCase(DType cache) {
    constexpr uint32_t kCtx = 300;
    OpModule om(64, 8, kTokens + 8, 0x80A0 + uint32_t(cache));
    uint32_t q = om.rowsInput("q", 192, -2, 2), k = om.rowsInput("k", 64, -2, 2), v = om.rowsInput("v", 64, -2, 2);
    uint32_t q2 = om.rowsInput("q2", 192, -2, 2), k2 = om.rowsInput("k2", 64, -2, 2);
    uint32_t v2 = om.rowsInput("v2", 64, -2, 2);
    uint32_t ffw = om.data("ff", BLUE_TC_WEIGHT, DType::F32, {16}, om.random(16, 1.0f, 8.0f));
    std::vector<uint32_t> caches;
    for (const char* name : {"kc", "vc", "kc2", "vc2"}) caches.push_back(om.tensor(name, BLUE_TC_INSTANCE, cache, {64, kCtx}));
    const uint32_t kNone = 0xFFFFFFFFu, pos = BLUE_FA_POS;
    om.step(Op::ROPEQK, {q, k, kNone, pos, 16, 12, 0, bits(10000.0f), bits(1.0f)});
    om.step(Op::KVSTORE, {k, caches[0], v, caches[1], pos});
    om.step(Op::ROPEQK, {q2, k2, ffw, pos, 64, 32, 2, bits(1e6f), bits(0.25f)});
    om.step(Op::KVSTORE, {k2, caches[2], v2, caches[3], pos});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {7, 299, 1030});
    Module m = om.build(plans);
    // Fused: both.
    const std::string kernel = "ropekv_" + lowerName(cache);
    KernelChoice fuse;
    fuse.fuse = true;
    Result<PagePlan> pages = planPages(m, uint32_t(plans.size()), 1u << 20);
    REQUIRE_MESSAGE(pages.isOk(), pages.message());
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535, fuse);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    size_t fused = 0, stores = 0;
    for (const DispatchDesc& x : d.value()) {
        fused += x.pipeline == kernel;
        stores += x.pipeline.rfind("kvstore", 0) == 0;
    }
    CHECK(fused == 2u);
    CHECK(stores == 0u);
    kernelsRun().insert(kernel);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const uint32_t rows = totalRows(plans);
    const std::string name = "ROPEQK+KVSTORE " + lowerName(cache);
    const double conversion = cache == DType::F32 ? 0.0 : 1e-3;
    for (uint32_t t : {q, k, q2, k2}) expectClose(*both, t, rows, 2e-3, name + " " + m.tensors[t].name);
    expectClose(*both, caches[0], 0, 2e-3 + conversion, name + " K cache, adjacent pairs");
    expectClose(*both, caches[1], 0, conversion, name + " V cache");
    expectClose(*both, caches[2], 0, 2e-3 + conversion, name + " K cache, neox pairs");
    expectClose(*both, caches[3], 0, conversion, name + " V cache (neox pairs' store)");
}

// KVCOPY both ways: the caches loaded from a seeded store, then saved into a second one. The
// harness's block arguments stand in: the slot is arg 1 (the position: slots 0, 2 and 1, and 5,
// past the store's 3), the rows run from arg 0 (the row count) to arg 4 (the speculation block's
// address, 80: past the context, so clamped to it).
void kvcopyCase(DType cache) {
    constexpr uint32_t kDim = 172, kCtx = 16, kSlots = 3;
    OpModule om(64, 16, kTokens + 8, 0x5C0 + uint32_t(cache));
    const std::vector<float> seeded = om.random(size_t(kDim) * kCtx * kSlots, -2, 2);
    uint32_t store = om.data("store", BLUE_TC_GLOBAL, cache, {kDim, kCtx, kSlots}, seeded);
    uint32_t saved = om.data("saved", BLUE_TC_GLOBAL, cache, {kDim, kCtx, kSlots},
                             std::vector<float>(seeded.size(), 0.5f));
    uint32_t kc = om.tensor("cache", BLUE_TC_INSTANCE, cache, {kDim, kCtx});
    om.step(Op::KVCOPY, {kc, store, 0, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_SPEC});
    om.step(Op::KVCOPY, {kc, saved, 1, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_SPEC});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2, 4}, {0, 2, 1, 5});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const std::string name = "KVCOPY " + lowerName(cache);
    expectClose(*both, kc, 0, 0.0, name + " load");  // copies of the same bits
    expectClose(*both, saved, 0, 0.0, name + " save");
}

namespace {

struct AttnShape {
    uint32_t head, n_head, n_kv;
    uint32_t window = 0;  // ATTNX: sliding window (0: all positions)
    float cap = 0;        // ATTNX: logit soft cap (0: none)
    bool ext = false;     // ATTNX rather than ATTN
};

// Each instance first stores `prefill` positions (the fill block), then runs rows at the
// positions after them: the step block stores their K and V and attends over everything.
void attnShapeCase(DType cache, AttnShape s, GpuOptions::AttnKernel kernel) {
    const uint32_t q_dim = s.head * s.n_head, kv_dim = s.head * s.n_kv;
    const std::vector<uint32_t> prefill = {300, 5, 520}, rows = {1, 3, 2};
    constexpr uint32_t kCtx = 600, kVocab = 1024, kMaxRows = 832;
    OpModule om(kVocab, kMaxRows, kTokens + 528, 0xA77 + s.head * 7 + uint32_t(cache));
    uint32_t q = om.rowsInput("q", q_dim, -2, 2), k = om.rowsInput("k", kv_dim, -1, 1);
    uint32_t v = om.rowsInput("v", kv_dim, -0.5f, 1.5f);
    uint32_t kc = om.tensor("kcache", BLUE_TC_INSTANCE, cache, {kv_dim, kCtx});
    uint32_t vc = om.tensor("vcache", BLUE_TC_INSTANCE, cache, {kv_dim, kCtx});
    uint32_t out = om.tensor("out", BLUE_TC_ROWS, DType::F32, {q_dim});
    const float scale = 1.0f / std::sqrt(float(s.head));
    om.fill(Op::KVSTORE, {k, kc, v, vc, BLUE_FA_POS});
    om.step(Op::KVSTORE, {k, kc, v, vc, BLUE_FA_POS});
    if (s.ext) {
        om.step(Op::ATTNX, {out, kc, vc, q, s.n_head, s.n_kv, BLUE_FA_POS, bits(scale), s.window, bits(s.cap)});
    } else {
        om.step(Op::ATTN, {out, kc, vc, q, s.n_head, s.n_kv, BLUE_FA_POS, bits(scale)});
    }
    std::vector<InstancePlan> plans(prefill.size());
    uint32_t token = 0, step_token = 900;
    for (size_t i = 0; i < plans.size(); ++i) {
        plans[i].prefill = prefill[i];
        plans[i].prefill_token = token;
        token += prefill[i];
        plans[i].rows = rows[i];
        plans[i].pos = prefill[i];
        for (uint32_t r = 0; r < rows[i]; ++r) plans[i].tokens.push_back(step_token++);
    }
    REQUIRE(token <= 900);
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()), nullptr, 0, [&](GpuOptions& o) { o.attn_kernel = kernel; });
    if (!both) return;
    const bool split = kernel == GpuOptions::AttnKernel::SPLIT;
    if (split) {
        kernelsRun().insert(std::string(s.ext ? "attnx_" : "attn_") + lowerName(cache) + "_split");
    }
    // F32 caches: the GPU's float scores, exp (3 + 2|x| ULP, |x| < 20) and float sums over at
    // most 522 positions, rescaled per chunk of positions, against the reference's double:
    // ~1e-5 relative at worst; 1e-4. F16 caches may also differ by one half ULP where the
    // conversion rounds differently (2^-10 relative in K and V): 2e-3.
    const double bound = cache == DType::F32 ? 1e-4 : 2e-3;
    const std::string name = strFormat("%s %s head %u, %u/%u heads, window %u, cap %g%s", s.ext ? "ATTNX" : "ATTN",
                                       lowerName(cache).c_str(), s.head, s.n_head, s.n_kv, s.window, double(s.cap),
                                       split ? " split" : "");
    expectClose(*both, out, totalRows(plans), bound, name);
    expectClose(*both, kc, 0, cache == DType::F32 ? 0.0 : 1e-3, name + " K cache");
    expectClose(*both, vc, 0, cache == DType::F32 ? 0.0 : 1e-3, name + " V cache");
}

}  // namespace

// Head size 8 with 4 query heads over 2 KV heads (ratio 2); head size 64 with 8 over 2 (ratio 4);
// 80 (the split kernel's 128 lanes: one per element, 48 idle for values) with 4 over 2; 256
// (two elements per lane) with 2 over 1. Each once more with the split kernel (a workgroup per
// head; the instance with 520 positions takes two of its 512-position chunks).
void attnCase(DType cache) {
    for (auto kernel : {GpuOptions::AttnKernel::LANES, GpuOptions::AttnKernel::SPLIT}) {
        attnShapeCase(cache, {8, 4, 2}, kernel);
        attnShapeCase(cache, {64, 8, 2}, kernel);
        attnShapeCase(cache, {80, 4, 2}, kernel);
        attnShapeCase(cache, {256, 2, 1}, kernel);
        attnShapeCase(cache, {256, 4, 2}, kernel);
        attnShapeCase(cache, {248, 2, 1}, kernel);
        attnShapeCase(cache, {256, 1, 1}, kernel);
    }
}

// ATTNX: a window shorter than every instance's positions (37), one longer than some (400), and
// none; soft caps that bend the logits (0.75: scores of a few units) or leave them (0).
void attnxCase(DType cache) {
    for (auto kernel : {GpuOptions::AttnKernel::LANES, GpuOptions::AttnKernel::SPLIT}) {
        attnShapeCase(cache, {8, 4, 2, 37, 0.75f, true}, kernel);
        attnShapeCase(cache, {64, 8, 2, 400, 0.0f, true}, kernel);
        attnShapeCase(cache, {64, 8, 2, 0, 2.5f, true}, kernel);
    }
}

}  // namespace blue::test
