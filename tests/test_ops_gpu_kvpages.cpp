// The per-op GPU-vs-reference cases of the paged-KV ops (see test_ops_gpu.cpp and
// vm/tensor_ops_kvpages.cpp): KVSTOREP, ATTNP (a lane per head and the split kernel), PGCOPY and
// KVCOPYP over F32 and F16 pools seeded with random rows, through page tables in each instance's
// local memory with ragged rows, unmapped entries (0xFFFFFFFF), ids of NP and more, and positions
// past the table. Then the property paging rests on: ATTNP through a shuffled page table gives
// ATTN's (and ATTNX's) bits over the same rows in a contiguous cache, on the reference machine
// and on the GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tests/test_ops_gpu.h"
#include "vm/abi.h"

namespace blue::test {

namespace {

constexpr uint32_t kUnmapped = 0xFFFFFFFFu;

uint32_t bits(float f) {
    return std::bit_cast<uint32_t>(f);
}

// Stores `table` at local[at ..] of the plan's instance.
void putTable(InstancePlan& plan, uint32_t at, const std::vector<uint32_t>& table) {
    for (uint32_t j = 0; j < table.size(); ++j) plan.local_words.push_back({at + j, table[j]});
}

// An attention module whose instances each store `prefill` positions (the fill block) and then
// run `rows` rows after them (the step block: store, then attend). The pools [kv_dim, PS, NP]
// are read through tables[i] (tab_n entries at local kTab); with `contiguous`, the same rows also
// go to INSTANCE caches of tab_n * PS positions, read by ATTN (out_attn) and ATTNX (out_attnx)
// beside ATTNP without (out_p) and with (out_px) the window and cap.
struct PagedAttn {
    uint32_t head, n_head, n_kv;
    uint32_t window = 0;
    float cap = 0;
    std::vector<uint32_t> prefill, rows;
    uint32_t ps = 16, np = 64, tab_n = 36;
    std::vector<std::vector<uint32_t>> tables;
    bool contiguous = false;
};

struct PagedAttnModule {
    Module m;
    uint32_t kpool = 0, vpool = 0, out_p = 0, out_px = 0, out_attn = 0, out_attnx = 0, rows = 0;
};

constexpr uint32_t kTab = kTokens + 600;

PagedAttnModule buildPagedAttn(const PagedAttn& s, DType cache, uint32_t seed) {
    const uint32_t q_dim = s.head * s.n_head, kv_dim = s.head * s.n_kv;
    const uint32_t prefill = std::accumulate(s.prefill.begin(), s.prefill.end(), 0u);
    REQUIRE(prefill < 900);
    OpModule om(1024, std::max(prefill, 16u), kTab + s.tab_n, seed);
    uint32_t q = om.rowsInput("q", q_dim, -2, 2), k = om.rowsInput("k", kv_dim, -1, 1);
    uint32_t v = om.rowsInput("v", kv_dim, -0.5f, 1.5f);
    PagedAttnModule r;
    // Pools seeded with rows no position stores: a read of an unmapped or unwritten row shows.
    const size_t pool_elems = size_t(kv_dim) * s.ps * s.np;
    r.kpool =
        om.data("kpool", BLUE_TC_GLOBAL, cache, {kv_dim, s.ps, s.np}, om.random(pool_elems, -3, 3));
    r.vpool =
        om.data("vpool", BLUE_TC_GLOBAL, cache, {kv_dim, s.ps, s.np}, om.random(pool_elems, -3, 3));
    r.out_p = om.tensor("out_p", BLUE_TC_ROWS, DType::F32, {q_dim});
    r.out_px = om.tensor("out_px", BLUE_TC_ROWS, DType::F32, {q_dim});
    const uint32_t scale = bits(1.0f / std::sqrt(float(s.head))), pos = BLUE_FA_POS;
    const std::vector<uint32_t> storep = {k, r.kpool, v, r.vpool, pos, kTab, s.tab_n};
    om.fill(Op::KVSTOREP, storep);
    om.step(Op::KVSTOREP, storep);
    om.step(Op::ATTNP,
            {r.out_p, r.kpool, r.vpool, q, s.n_head, s.n_kv, pos, scale, 0, 0, kTab, s.tab_n});
    om.step(Op::ATTNP, {r.out_px, r.kpool, r.vpool, q, s.n_head, s.n_kv, pos, scale, s.window,
                        bits(s.cap), kTab, s.tab_n});
    if (s.contiguous) {
        const uint64_t ctx = uint64_t(s.tab_n) * s.ps;
        uint32_t kc = om.tensor("kcache", BLUE_TC_INSTANCE, cache, {kv_dim, ctx});
        uint32_t vc = om.tensor("vcache", BLUE_TC_INSTANCE, cache, {kv_dim, ctx});
        r.out_attn = om.tensor("out_attn", BLUE_TC_ROWS, DType::F32, {q_dim});
        r.out_attnx = om.tensor("out_attnx", BLUE_TC_ROWS, DType::F32, {q_dim});
        om.fill(Op::KVSTORE, {k, kc, v, vc, pos});
        om.step(Op::KVSTORE, {k, kc, v, vc, pos});
        om.step(Op::ATTN, {r.out_attn, kc, vc, q, s.n_head, s.n_kv, pos, scale});
        om.step(Op::ATTNX,
                {r.out_attnx, kc, vc, q, s.n_head, s.n_kv, pos, scale, s.window, bits(s.cap)});
    }
    std::vector<InstancePlan> plans(s.prefill.size());
    uint32_t token = 0, step_token = 900;
    for (size_t i = 0; i < plans.size(); ++i) {
        plans[i].prefill = s.prefill[i];
        plans[i].prefill_token = token;
        token += s.prefill[i];
        plans[i].rows = s.rows[i];
        plans[i].pos = s.prefill[i];
        for (uint32_t j = 0; j < s.rows[i]; ++j) plans[i].tokens.push_back(step_token++);
        REQUIRE(s.tables[i].size() == s.tab_n);
        putTable(plans[i], kTab, s.tables[i]);
    }
    r.rows = totalRows(plans);
    r.m = om.build(plans);
    return r;
}

// Page tables for `positions[i]` positions per instance: distinct pages of a shuffled [0, np),
// unused entries unmapped.
std::vector<std::vector<uint32_t>> shuffledTables(const std::vector<uint32_t>& positions,
                                                  uint32_t ps, uint32_t np, uint32_t tab_n,
                                                  uint32_t seed) {
    std::vector<uint32_t> pages(np);
    std::iota(pages.begin(), pages.end(), 0u);
    std::mt19937 rng(seed);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<std::vector<uint32_t>> out;
    size_t next = 0;
    for (uint32_t n : positions) {
        std::vector<uint32_t> t(tab_n, kUnmapped);
        for (uint32_t j = 0; j < std::min(tab_n, (n + ps - 1) / ps); ++j) t[j] = pages.at(next++);
        out.push_back(t);
    }
    return out;
}

}  // namespace

// K and V rows of 172 into pools of 6 pages of 8 positions, through tables of 3 entries at
// local[kTab]. Instance 0 stores positions 7 (page 4) and 8 (its entry 0xFFFFFFFF: dropped);
// instance 1 positions 15 (entry 6 = NP: dropped), 16 and 17 (page 3); instance 2 position 24
// (past the table's 24: dropped); instance 3 positions 3 and 4 (page 0). The pools start with
// random rows, so a dropped store that lands anywhere shows.
void kvstorepCase(DType cache) {
    constexpr uint32_t kDim = 172, kPs = 8, kNp = 6;
    OpModule om(64, 8, kTab + 3, 0x57A + uint32_t(cache));
    uint32_t k = om.rowsInput("k", kDim, -2, 2), v = om.rowsInput("v", kDim, -2, 2);
    const size_t n = size_t(kDim) * kPs * kNp;
    uint32_t kp = om.data("kpool", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(n, -2, 2));
    uint32_t vp = om.data("vpool", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(n, -2, 2));
    om.step(Op::KVSTOREP, {k, kp, v, vp, BLUE_FA_POS, kTab, 3});
    std::vector<InstancePlan> plans = raggedPlans(om, {2, 3, 1, 2}, {7, 15, 24, 3});
    putTable(plans[0], kTab, {4, kUnmapped, 1});
    putTable(plans[1], kTab, {2, kNp, 3});
    putTable(plans[2], kTab, {5, 1, 2});
    putTable(plans[3], kTab, {0, 0x80000000u, kUnmapped});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // As KVSTORE: F32 a copy; F16 one conversion (at most one half ULP, 2^-10 relative).
    const double bound = cache == DType::F32 ? 0.0 : 1e-3;
    const std::string name = "KVSTOREP " + lowerName(cache);
    expectClose(*both, kp, 0, bound, name + " K pool");
    expectClose(*both, vp, 0, bound, name + " V pool");
}

// ATTNP over pools of 64 pages of 16 positions, tables of 36 entries (576 positions). Instance 0
// attends over 301 positions whose pages 5 (0xFFFFFFFF), 9 (id NP) and 12 (0x80000000) are
// unmapped: their positions are neither stored nor read; instance 1 over 8 in one page; instance
// 2's rows sit at positions 574-576, past the table for the last (stored nowhere, attending over
// 0..575); instance 3 has no mapped page at all (zeros). Windows of 37 and 400, caps of 0.75 and
// 2.5, head sizes 8, 64 and 256, lanes and split.
void attnpCase(DType cache) {
    struct Shape {
        uint32_t head, n_head, n_kv, window;
        float cap;
    };
    for (auto kernel : {GpuOptions::AttnKernel::LANES, GpuOptions::AttnKernel::SPLIT}) {
        for (const Shape& sh :
             {Shape{8, 4, 2, 37, 0.75f}, Shape{64, 8, 2, 400, 0.0f}, Shape{256, 2, 1, 0, 2.5f}}) {
            PagedAttn s{sh.head, sh.n_head, sh.n_kv, sh.window, sh.cap, {}, {}};
            s.prefill = {300, 5, 574, 20};
            s.rows = {1, 3, 3, 2};
            s.tables = shuffledTables({301, 8, 577, 0}, s.ps, s.np, s.tab_n, 0xA770 + sh.head);
            s.tables[0][5] = kUnmapped;
            s.tables[0][9] = s.np;
            s.tables[0][12] = 0x80000000u;
            s.tables[3] = std::vector<uint32_t>(s.tab_n, kUnmapped);
            s.tables[3][1] = s.np + 7;
            PagedAttnModule pm = buildPagedAttn(s, cache, 0xA77 + sh.head + uint32_t(cache));
            auto both = runOnBoth(pm.m, uint32_t(s.prefill.size()), nullptr, 0,
                                  [&](GpuOptions& o) { o.attn_kernel = kernel; });
            if (!both) continue;  // refused under an emulated device profile
            const bool split = kernel == GpuOptions::AttnKernel::SPLIT;
            if (split) kernelsRun().insert("attnp_" + lowerName(cache) + "_split");
            // As ATTN (test_ops_gpu_llm.cpp attnShapeCase): F32 1e-4, F16 2e-3.
            const double bound = cache == DType::F32 ? 1e-4 : 2e-3;
            const std::string name =
                strFormat("ATTNP %s head %u, %u/%u heads%s", lowerName(cache).c_str(), sh.head,
                          sh.n_head, sh.n_kv, split ? " split" : "");
            expectClose(*both, pm.out_p, pm.rows, bound, name);
            expectClose(
                *both, pm.out_px, pm.rows, bound,
                strFormat("%s, window %u, cap %g", name.c_str(), sh.window, double(sh.cap)));
            expectClose(*both, pm.kpool, 0, cache == DType::F32 ? 0.0 : 1e-3, name + " K pool");
            expectClose(*both, pm.vpool, 0, cache == DType::F32 ? 0.0 : 1e-3, name + " V pool");
            // Instance 3 has no mapped position: its rows (the last two step tokens, 907 and
            // 908: tags 908 and 909) are zeros on the GPU, not NaN (0/0); the reference's too,
            // by the comparison above.
            const std::vector<uint32_t> tags = rowTags(*both, pm.rows, true);
            std::vector<uint8_t> g = both->gpuBytes(pm.out_p);
            const uint64_t row_bytes = uint64_t(sh.head) * sh.n_head * 4;
            uint32_t zero_rows = 0;
            for (uint32_t i = 0; i < pm.rows; ++i) {
                if (tags[i] < 908) continue;
                ++zero_rows;
                CHECK(std::all_of(g.begin() + i * row_bytes, g.begin() + (i + 1) * row_bytes,
                                  [](uint8_t b) { return b == 0; }));
            }
            CHECK(zero_rows == 2);
        }
    }
}

// PGCOPY on two pools of 6 pages of 8 positions: page arg 1 (the position) to page arg 0 (the row
// count), arg 0 rows (pool A) or arg 4's 80 rows, clamped to the page's 8 (pool B). Instance 0
// copies page 1 to 3; instance 1 page 2 to itself (nothing); instance 2 page 9 (past NP: nothing)
// to 4; instance 3 page 0 to 5; instance 4 page 4 to 7 (past NP: nothing).
void pgcopyCase(DType cache) {
    constexpr uint32_t kDim = 172, kPs = 8, kNp = 6;
    OpModule om(64, 24, kTokens + 8, 0x9C0 + uint32_t(cache));
    const size_t n = size_t(kDim) * kPs * kNp;
    uint32_t a = om.data("pool_a", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(n, -2, 2));
    uint32_t b = om.data("pool_b", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(n, -2, 2));
    om.step(Op::PGCOPY, {a, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_ROWS});
    om.step(Op::PGCOPY, {b, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_SPEC});
    std::vector<InstancePlan> plans = raggedPlans(om, {3, 2, 4, 5, 7}, {1, 2, 9, 0, 4});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const std::string name = "PGCOPY " + lowerName(cache);
    expectClose(*both, a, 0, 0.0, name + " partial pages");  // copies of the same bits
    expectClose(*both, b, 0, 0.0, name + " whole pages");
}

// KVCOPYP both ways through tables of 2 entries (16 positions) against stores of 20 positions and
// 3 slots: `pool` loaded from a seeded store, then `saved` from a second seeded pool. As in
// kvcopyCase the slot is arg 1 and the rows run from arg 0 to arg 4 (80, clamped to 20), so
// positions 16-19 are past the table. Instance 0: slot 0, table {3, unmapped}; 1: slot 2, {NP, 1};
// 2: slot 1, {0, 5}; 3: slot 5 (past the store's 3: nothing), {2, 4}.
void kvcopypCase(DType cache) {
    constexpr uint32_t kDim = 172, kPs = 8, kNp = 6, kCtx = 20, kSlots = 3;
    OpModule om(64, 16, kTab + 2, 0x5C9 + uint32_t(cache));
    const size_t pn = size_t(kDim) * kPs * kNp, sn = size_t(kDim) * kCtx * kSlots;
    uint32_t pool = om.data("pool", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(pn, -2, 2));
    uint32_t src =
        om.data("pool_src", BLUE_TC_GLOBAL, cache, {kDim, kPs, kNp}, om.random(pn, -2, 2));
    uint32_t store =
        om.data("store", BLUE_TC_GLOBAL, cache, {kDim, kCtx, kSlots}, om.random(sn, -2, 2));
    uint32_t saved =
        om.data("saved", BLUE_TC_GLOBAL, cache, {kDim, kCtx, kSlots}, std::vector<float>(sn, 0.5f));
    om.step(Op::KVCOPYP, {pool, store, 0, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_SPEC, kTab, 2});
    om.step(Op::KVCOPYP, {src, saved, 1, BLUE_FA_POS, BLUE_FA_ROWS, BLUE_FA_SPEC, kTab, 2});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2, 4}, {0, 2, 1, 5});
    putTable(plans[0], kTab, {3, kUnmapped});
    putTable(plans[1], kTab, {kNp, 1});
    putTable(plans[2], kTab, {0, 5});
    putTable(plans[3], kTab, {2, 4});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    const std::string name = "KVCOPYP " + lowerName(cache);
    expectClose(*both, pool, 0, 0.0, name + " load");  // copies of the same bits
    expectClose(*both, saved, 0, 0.0, name + " save");
}

// The same K and V rows stored contiguously (KVSTORE into INSTANCE caches) and through shuffled
// page tables (KVSTOREP into pools); ATTNP without window and cap must give ATTN's bits, and with
// them ATTNX's, on the reference machine (attnRows by construction) and on the GPU (the same
// arithmetic per position; only the row a position is read from differs). Three instances over
// 301, 8 and 522 positions of pools of 64 pages of 16 (the tables cover all 576 positions the
// caches have), F32 and F16, both kernels.
TEST_CASE(
    "ops gpu: ATTNP through shuffled page tables gives the bits of ATTN and ATTNX over contiguous "
    "caches") {
    for (DType cache : {DType::F32, DType::F16}) {
        for (auto kernel : {GpuOptions::AttnKernel::LANES, GpuOptions::AttnKernel::SPLIT}) {
            PagedAttn s{64, 4, 2, 100, 1.5f, {300, 5, 520}, {1, 3, 2}};
            s.contiguous = true;
            s.tables = shuffledTables({301, 8, 522}, s.ps, s.np, s.tab_n, 0xB17 + uint32_t(cache));
            PagedAttnModule pm = buildPagedAttn(s, cache, 0xB17);
            auto both =
                runOnBoth(pm.m, 3, nullptr, 0, [&](GpuOptions& o) { o.attn_kernel = kernel; });
            REQUIRE(both);
            const bool split = kernel == GpuOptions::AttnKernel::SPLIT;
            CAPTURE(lowerName(cache));
            CAPTURE(split);
            // The rows of the last run, in the same order in both outputs of one machine.
            const size_t bytes = size_t(pm.rows) * pm.m.tensors[pm.out_p].elements() * 4;
            auto same = [bytes](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
                return x.size() >= bytes && y.size() >= bytes &&
                       std::memcmp(x.data(), y.data(), bytes) == 0;
            };
            CHECK(same(both->refBytes(pm.out_p), both->refBytes(pm.out_attn)));
            CHECK(same(both->refBytes(pm.out_px), both->refBytes(pm.out_attnx)));
            CHECK(same(both->gpuBytes(pm.out_p), both->gpuBytes(pm.out_attn)));
            CHECK(same(both->gpuBytes(pm.out_px), both->gpuBytes(pm.out_attnx)));
            // Not vacuous: the window and cap change the output, and the GPU matches the reference.
            CHECK_FALSE(same(both->refBytes(pm.out_p), both->refBytes(pm.out_px)));
            ErrorStat e = compareTensor(*both, pm.out_p, pm.rows);
            CHECK(e.normalised() <= (cache == DType::F32 ? 1e-4 : 2e-3));
        }
    }
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace blue::test
