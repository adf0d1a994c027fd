// GpuMachine's load-time planning (host/machine_plan.h), without a GPU: the control and I/O
// buffer layouts, the packing of tensors into pages, and the push constants and grid of every
// tensor dispatch. Expected offsets and sizes are derived here from the layout documented in
// shaders/blue_config.h.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <set>

#include "compiler/asm.h"
#include "compiler/lower_model.h"
#include "host/machine.h"
#include "host/machine_plan.h"
#include "host/pipelines.h"
#include "host/weight_layout.h"
#include "vm/abi.h"
#include "vm/tensor_ops.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

Module assembleOrFail(const std::string& source) {
    Result<Module> m = assemble(source, "plan");
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return m.value();
}

constexpr const char* kControlSource = R"(.layout regs=12 local=5 heap=40 heap_static=8 stack=3
.layout mailbox=4 in_slots=3 in_slot_words=7 max_rows=6
.const k 1 2 3
.tensor w weight f32 [4, 2] data f32 1 2 3 4 5 6 7 8
.tensor x rows f32 [4]
.tensor y rows f32 [2]
.block a args=1
    matmul y, w, x
.end
.block b args=0
    tscale y, y, 2.0
.end
main:
    halt
)";

TEST_CASE("plan: every index word of the control and I/O headers is distinct and in range") {
    const uint32_t header_words[] = {
        BLUE_H_NINST,         BLUE_H_NREGS,      BLUE_H_LOCAL_WORDS,  BLUE_H_STACK_DEPTH,
        BLUE_H_MAILBOX_CAP,   BLUE_H_HEAP_WORDS, BLUE_H_MAX_STEPS,    BLUE_H_NBLOCKS,
        BLUE_H_MAX_ROWS,      BLUE_H_CODE_WORDS, BLUE_H_CONST_WORDS,  BLUE_H_IN_SLOTS,
        BLUE_H_IN_SLOT_WORDS, BLUE_H_NDISPATCH,  BLUE_H_OUT_CAP,      BLUE_H_MAX_CYCLES,
        BLUE_H_NTENSORS,      BLUE_H_IO_ORDER,   BLUE_H_IO_SLOTSTATE, BLUE_H_IO_SLOTS,
        BLUE_H_IO_OUT,        BLUE_O_STATE,      BLUE_O_REGS,         BLUE_O_STACK,
        BLUE_O_LOCAL,         BLUE_O_MAILBOX,    BLUE_O_HEAP,         BLUE_O_BARGS,
        BLUE_O_CODE,          BLUE_O_CONST,      BLUE_O_BLOCKS,       BLUE_O_LISTS,
        BLUE_O_ROWMAP,        BLUE_O_DISPATCH,   BLUE_O_INDIRECT,     BLUE_O_TENSORS,
        BLUE_C_CYCLE,         BLUE_C_LIVE,       BLUE_C_LIVE_ACC,     BLUE_C_BUMP,
        BLUE_C_IN_CLAIM,      BLUE_C_OUT_HEAD,   BLUE_C_BLOCK_RUNS,   BLUE_C_IN_PUBLISHED,
        BLUE_C_IN_CLOSED,     BLUE_C_OUT_TAIL,   BLUE_H_IO_FLAGS,     BLUE_O_EXPERT_CACHE,
        BLUE_C_MOE_TEXELS_LO, BLUE_C_MOE_TEXELS_HI, BLUE_C_XC_HITS,   BLUE_C_XC_MISSES,
        BLUE_C_XC_INPLACE,    BLUE_C_XC_TEXELS_LO, BLUE_C_XC_TEXELS_HI};
    std::set<uint32_t> seen;
    for (uint32_t w : header_words) {
        CAPTURE(w);
        CHECK(seen.insert(w).second);
        CHECK(w < BLUE_HEADER_WORDS);
    }
    // The snapshot copies the counters from BLUE_C_CYCLE on: they must be the GPU counters.
    CHECK(BLUE_C_BLOCK_RUNS - BLUE_C_CYCLE < BLUE_SNAP_COUNTERS);
    CHECK(BLUE_C_LIVE - BLUE_C_CYCLE < BLUE_SNAP_COUNTERS);
    CHECK(BLUE_C_OUT_HEAD - BLUE_C_CYCLE < BLUE_SNAP_COUNTERS);
    CHECK(BLUE_SNAP_COUNTERS <= BLUE_IO_SNAP_WORDS);
    // The host's staging words are copied over the three counters from BLUE_C_IN_PUBLISHED on.
    CHECK(BLUE_C_IN_CLOSED == BLUE_C_IN_PUBLISHED + 1);
    CHECK(BLUE_C_OUT_TAIL == BLUE_C_IN_PUBLISHED + 2);
    CHECK(BLUE_C_IN_PUBLISHED >= BLUE_C_CYCLE + BLUE_SNAP_COUNTERS);
    // Staging quarters, then snapshots, then the dynamic I/O regions.
    CHECK(BLUE_MAX_CHAINS * BLUE_IO_STAGE_WORDS <= BLUE_IO_SNAP_BASE);
    CHECK(BLUE_IO_SNAP_BASE + BLUE_MAX_CHAINS * BLUE_IO_SNAP_WORDS <= BLUE_IO_SNAP2_BASE);
    CHECK(BLUE_IO_SNAP2_BASE + BLUE_MAX_CHAINS * BLUE_IO_SNAP2_WORDS <= BLUE_IO_SNAP3_BASE);
    CHECK(BLUE_IO_SNAP3_BASE + BLUE_MAX_CHAINS * BLUE_IO_SNAP3_WORDS <= BLUE_IO_DYNAMIC);
    // The second snapshot holds the MoE counters, the expert caches' included.
    CHECK(BLUE_C_XC_TEXELS_HI - BLUE_C_MOE_TEXELS_LO < BLUE_SNAP2_COUNTERS);
    CHECK(BLUE_SNAP2_COUNTERS <= BLUE_IO_SNAP2_WORDS);
    // Push words of the expert cache: MOEROUTE's state word sits between its scalars and its
    // byte count; moemmc's cache reference after MOEMM's shape.
    CHECK(BLUE_PC_MOE_CACHE >= BLUE_PC_OPERANDS + 3 * BLUE_TREF_WORDS + 2);
    CHECK(BLUE_PC_MOE_CACHE < BLUE_PC_MOE_TEXELS);
    CHECK(BLUE_PC_MOE_PATCH + 1 + BLUE_MOE_MAX_PATCH <= BLUE_PUSH_WORDS);
    CHECK(BLUE_PC_MOE_CACHE_REF >= BLUE_PC_MOE_SHAPE + 4);
    CHECK(BLUE_PC_MOE_CACHE_REF + BLUE_TREF_WORDS <= BLUE_PUSH_WORDS);
    CHECK(BLUE_PC_COPY_PAIRS + 8 * BLUE_COPY_MAX_MATRICES <= BLUE_PUSH_WORDS);
    // Push constants: the header, then up to 6 tensor operands fit.
    CHECK(BLUE_PC_OPERANDS + 6 * BLUE_TREF_WORDS <= BLUE_PUSH_WORDS);
    CHECK(BLUE_PUSH_WORDS * 4 <= 128);  // the minimum maxPushConstantsSize Vulkan guarantees
}

TEST_CASE(
    "plan: control regions follow the header in order, sized as documented, without overlap") {
    Module m = assembleOrFail(kControlSource);
    GpuOptions opt;
    opt.instances = 10;
    opt.out_records = 100;
    opt.max_cycles = 1234;
    const uint32_t ndispatch = 2;
    Result<ControlLayout> c = planControl(m, opt, ndispatch, 128u << 20);
    REQUIRE_MESSAGE(c.isOk(), c.message());
    const ControlLayout& cl = c.value();
    const uint64_t n = 10, nblocks = 2, ntensors = 3;
    // {index word, expected size in words} in buffer order.
    const std::pair<uint32_t, uint64_t> regions[] = {
        {BLUE_O_STATE, n * 6},
        {BLUE_O_REGS, n * 12},
        {BLUE_O_STACK, n * 3},
        {BLUE_O_LOCAL, n * 5},
        {BLUE_O_MAILBOX, n * (2 + 2 * 4)},
        {BLUE_O_HEAP, 40},
        {BLUE_O_BARGS, n * 8},
        {BLUE_O_CODE, 2},
        {BLUE_O_CONST, 3},
        {BLUE_O_BLOCKS, nblocks * 8},
        {BLUE_O_LISTS, nblocks * 3 * n},
        {BLUE_O_ROWMAP, nblocks * 6 * 2},
        {BLUE_O_DISPATCH, ndispatch * BLUE_DISPATCH_WORDS},
        {BLUE_O_INDIRECT, (ndispatch + 1) * 3},
        {BLUE_O_TENSORS, ntensors * 4},
    };
    uint64_t at = BLUE_HEADER_WORDS;
    for (const auto& [index, words] : regions) {
        CAPTURE(index);
        CHECK(cl.at(index) == at);
        at += words;
    }
    CHECK(cl.control_words == at);
    // Header values the shaders read.
    CHECK(cl.at(BLUE_H_NINST) == 10);
    CHECK(cl.at(BLUE_H_NREGS) == 12);
    CHECK(cl.at(BLUE_H_LOCAL_WORDS) == 5);
    CHECK(cl.at(BLUE_H_STACK_DEPTH) == 3);
    CHECK(cl.at(BLUE_H_MAILBOX_CAP) == 4);
    CHECK(cl.at(BLUE_H_HEAP_WORDS) == 40);
    CHECK(cl.at(BLUE_H_MAX_STEPS) == 4096);
    CHECK(cl.at(BLUE_H_NBLOCKS) == 2);
    CHECK(cl.at(BLUE_H_MAX_ROWS) == 6);
    CHECK(cl.at(BLUE_H_CODE_WORDS) == 2);
    CHECK(cl.at(BLUE_H_CONST_WORDS) == 3);
    CHECK(cl.at(BLUE_H_IN_SLOTS) == 3);
    CHECK(cl.at(BLUE_H_IN_SLOT_WORDS) == 7);
    CHECK(cl.at(BLUE_H_NDISPATCH) == 2);
    CHECK(cl.at(BLUE_H_OUT_CAP) == 100);
    CHECK(cl.at(BLUE_H_MAX_CYCLES) == 1234);
    CHECK(cl.at(BLUE_H_NTENSORS) == 3);
    // I/O buffer: order ring, slot states, slots, output records.
    CHECK(cl.at(BLUE_H_IO_ORDER) == BLUE_IO_DYNAMIC);
    CHECK(cl.at(BLUE_H_IO_SLOTSTATE) == BLUE_IO_DYNAMIC + 3);
    CHECK(cl.at(BLUE_H_IO_SLOTS) == BLUE_IO_DYNAMIC + 6);
    CHECK(cl.at(BLUE_H_IO_OUT) == BLUE_IO_DYNAMIC + 6 + 21);
    CHECK(cl.at(BLUE_H_IO_FLAGS) == BLUE_IO_DYNAMIC + 6 + 21 + 200);
    CHECK(cl.io_words == BLUE_IO_DYNAMIC + 6 + 21 + 200 + n);  // one host-flag word per instance

    // A watchdog bound past 32 bits saturates rather than wrapping to a small number.
    opt.max_cycles = (uint64_t(1) << 32) + 5;
    c = planControl(m, opt, ndispatch, 128u << 20);
    REQUIRE(c.isOk());
    CHECK(c.value().at(BLUE_H_MAX_CYCLES) == 0xFFFFFFFFu);
}

TEST_CASE("plan: control or I/O buffers larger than a binding are refused with the reason") {
    Module m = assembleOrFail(kControlSource);
    GpuOptions opt;
    opt.instances = 100000;
    Result<ControlLayout> c = planControl(m, opt, 2, 1u << 20);
    REQUIRE(!c.isOk());
    CHECK(c.message() ==
          "the control buffer for 100000 instances needs more than the device's largest storage "
          "binding (1 MiB); use fewer instances or smaller per-instance memory");
    opt.instances = 1;
    opt.out_records = 1u << 20;  // 8 MiB of records
    c = planControl(m, opt, 2, 1u << 20);
    REQUIRE(!c.isOk());
    CHECK(c.message() ==
          "the I/O rings (3 input slots of 7 words, 1048576 output records) exceed "
          "the device's largest storage binding");
}

// Tensors: two weights declared after the activations, so the weights-first order shows.
constexpr const char* kPageSource = R"(.layout regs=4 max_rows=3
.tensor r rows f32 [100]
.tensor i instance f32 [10, 2]
.tensor g global i32 [7]
.tensor w weight f32 [64] data f32 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
.tensor h weight f16 [6] data hex 000000000000000000000000
halt
)";

TEST_CASE(
    "plan: tensors are packed weights first, 256-byte aligned, without overlap, under the limit") {
    Module m = assembleOrFail(kPageSource);
    const uint32_t instances = 5;
    // slice bytes and count of each tensor, from its class and shape
    const uint64_t slice[] = {400, 80, 32, 256, 16};  // activations padded to whole texels
    const uint64_t count[] = {3, instances, 1, 1, 1};
    for (uint64_t limit : {uint64_t(1) << 20, uint64_t(2048), uint64_t(1200)}) {
        CAPTURE(limit);
        Result<PagePlan> plan = planPages(m, instances, limit);
        REQUIRE_MESSAGE(plan.isOk(), plan.message());
        const PagePlan& p = plan.value();
        REQUIRE(p.places.size() == 5);
        for (uint64_t bytes : p.page_bytes) CHECK(bytes <= limit);
        for (size_t t = 0; t < 5; ++t) {
            CAPTURE(t);
            const TensorPlace& tp = p.places[t];
            CHECK(tp.slice == slice[t]);
            CHECK(tp.bytes == slice[t] * count[t]);
            CHECK(tp.offset % 256 == 0);
            REQUIRE(tp.page < p.page_bytes.size());
            CHECK(tp.offset + tp.bytes <= p.page_bytes[tp.page]);
            for (size_t u = 0; u < t; ++u) {
                const TensorPlace& o = p.places[u];
                if (o.page != tp.page) continue;
                CHECK((tp.offset + tp.bytes <= o.offset || o.offset + o.bytes <= tp.offset));
            }
        }
        // The weights (tensors 3 and 4) come before every activation.
        auto key = [&](size_t t) { return std::make_pair(p.places[t].page, p.places[t].offset); };
        for (size_t a : {0, 1, 2}) {
            CHECK(key(3) < key(a));
            CHECK(key(4) < key(a));
        }
    }
    // 1 MiB: one page holding w @0, h @256, r @512 (1200 bytes), i @1792 (400), g @2304 (32).
    Result<PagePlan> one = planPages(m, instances, 1 << 20);
    REQUIRE(one.isOk());
    CHECK(one.value().page_bytes == std::vector<uint64_t>{2336});
    CHECK(one.value().places[0].offset == 512);
    CHECK(one.value().places[1].offset == 1792);
    CHECK(one.value().places[2].offset == 2304);
    // 1200 bytes: r alone fills a page.
    Result<PagePlan> tight = planPages(m, instances, 1200);
    REQUIRE(tight.isOk());
    CHECK(tight.value().page_bytes.size() == 3);
}

TEST_CASE("plan: a tensor larger than a page, or too many pages, is refused naming the tensor") {
    Module m = assembleOrFail(kPageSource);
    Result<PagePlan> p = planPages(m, 5, 1024);  // r needs 1200 bytes
    REQUIRE(!p.isOk());
    CHECK(p.message().rfind("tensor 'r' needs ", 0) == 0);
    Result<PagePlan> big = planPages(m, 1u << 20, 64u << 20);  // i: 80 bytes x 2^20 instances
    REQUIRE(!big.isOk());
    CHECK(big.message() ==
          "tensor 'i' needs 80.0 MiB, more than the device's largest storage "
          "binding (64.0 MiB)");
    std::string src = ".layout regs=4\n";
    for (uint32_t t = 0; t <= BLUE_MAX_PAGES; ++t)
        src += strFormat(".tensor t%u global f32 [200]\n", t);
    Module many = assembleOrFail(src + "halt\n");
    Result<PagePlan> pages = planPages(many, 1, 1000);  // 800 bytes each: one per page
    REQUIRE(!pages.isOk());
    CHECK(pages.message() ==
          strFormat("the module's tensors need more than %u pages of 0.0 MiB", BLUE_MAX_PAGES));
    Result<PagePlan> fits = planPages(many, 1, 4096);
    REQUIRE(fits.isOk());
    CHECK(fits.value().page_bytes.size() == (BLUE_MAX_PAGES + 1 + 3) / 4);
}

constexpr const char* kDispatchSource = R"(.layout regs=4 max_rows=8
.tensor w global f32 [1024, 130]
.tensor x rows f32 [1024]
.tensor y rows f32 [1024]
.tensor n rows f32 [130]
.tensor s instance f32 [1]
.block first args=0
    tadd y, x, x
    tscale y, y, -1.5
.end
.block second args=2
    matmul n, w, x
    tsum s, n
.end
halt
)";

// The matrix is made a WEIGHT after assembly (planning needs its shape, not its bytes): MATMUL
// kernels read matrices in the GPU weight layout, which only weights have.
Module dispatchModule() {
    Module m = assembleOrFail(kDispatchSource);
    m.tensors[0].cls = BLUE_TC_WEIGHT;
    return m;
}

std::string kernelSuffix(DType t) {
    std::string r(dtypeName(t));
    for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

TEST_CASE("plan: each tensor instruction becomes a dispatch with its operands in push constants") {
    Module m = dispatchModule();
    Result<PagePlan> pages = planPages(m, 4, 1u << 20);
    REQUIRE(pages.isOk());
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    // MATMUL has a single-item, a 4-item and a GEMM dispatch, each 16 lanes wide on a CPU driver
    // for its 130 rows (matmulWidth).
    REQUIRE(d.value().size() == 6);
    const PagePlan& p = pages.value();
    auto tref = [&](const DispatchDesc& desc, size_t operand, uint32_t tensor) {
        INFO("operand " << operand << " tensor " << tensor);
        const uint32_t* w = desc.push.data() + BLUE_PC_OPERANDS + operand * BLUE_TREF_WORDS;
        CHECK(w[0] == (p.places[tensor].page | m.tensors[tensor].cls << 16));
        CHECK(w[1] == p.places[tensor].offset);
        CHECK(w[2] == p.places[tensor].slice);
        CHECK(w[3] == m.tensors[tensor].elements());
    };
    const DispatchDesc& add = d.value()[0];
    CHECK(add.pipeline == "tadd");
    CHECK(add.block == 0);
    CHECK(add.mode == 0);
    CHECK(add.fixed == 16);  // ceil(1024 / 64)
    CHECK(add.axis == 0);
    CHECK(add.tile == 1);
    CHECK(add.push[BLUE_PC_BLOCK] == 0);
    CHECK(add.push[BLUE_PC_MODE] == 0);
    CHECK(add.push[BLUE_PC_TILE] == 1);
    tref(add, 0, 2);
    tref(add, 1, 1);
    tref(add, 2, 1);
    const DispatchDesc& scale = d.value()[1];
    CHECK(scale.pipeline == "tscale");
    tref(scale, 0, 2);
    tref(scale, 1, 2);
    CHECK(scale.push[BLUE_PC_OPERANDS + 2 * BLUE_TREF_WORDS] == std::bit_cast<uint32_t>(-1.5f));
    const DispatchDesc& mm1 = d.value()[2];
    CHECK(mm1.pipeline == "matmul_f32_b1@16");
    CHECK(mm1.fixed == 5);  // ceil(130 / (16 invocations x 2 rows))
    CHECK(mm1.max_items == 1);
    CHECK(mm1.push[BLUE_PC_TILE] == 1);
    const DispatchDesc& mm = d.value()[3];
    CHECK(mm.pipeline == "matmul_f32@16");
    CHECK(mm.block == 1);
    CHECK(mm.push[BLUE_PC_BLOCK] == 1);
    CHECK(mm.axis == 1);  // items along x, weight rows along y
    CHECK(mm.fixed == 5);
    CHECK(mm.min_items == 2);
    CHECK(mm.max_items == BLUE_MATMUL_GEMM_TILE - 1);
    CHECK(mm.tile == BLUE_MATMUL_TILE);
    CHECK(mm.push[BLUE_PC_TILE] == BLUE_MATMUL_TILE);
    tref(mm, 0, 3);
    tref(mm, 1, 0);
    tref(mm, 2, 1);
    const DispatchDesc& gemm = d.value()[4];
    CHECK(gemm.pipeline == "matmul_f32_g@16");
    CHECK(gemm.fixed == 3);  // ceil(130 / (16 invocations x 4 rows))
    CHECK(gemm.min_items == BLUE_MATMUL_GEMM_TILE);
    const DispatchDesc& sum = d.value()[5];
    CHECK(sum.pipeline == "tsum");
    CHECK(sum.mode == 1);  // an INSTANCE destination: one item per instance
    CHECK(sum.push[BLUE_PC_MODE] == 1);
    CHECK(sum.fixed == 1);
    tref(sum, 0, 4);
    tref(sum, 1, 3);
    CHECK(kernelName(m, uint32_t(Op::MATMUL), {3, 0, 1}) == "matmul_f32");
    CHECK(kernelName(m, uint32_t(Op::TADD), {2, 1, 1}) == "tadd");
    // As on a GPU: the single item and the 4-item tile take the split-K kernels, a workgroup per
    // 8 rows, and 16 items or more the shared-memory tiled GEMM, a workgroup per 64 rows and 64
    // items.
    Result<std::vector<DispatchDesc>> gpu = planDispatches(m, pages.value(), 65535, KernelChoice{true, false});
    REQUIRE_MESSAGE(gpu.isOk(), gpu.message());
    REQUIRE(gpu.value().size() == 6);
    CHECK(gpu.value()[4].pipeline == "matmul_f32_t");
    CHECK(gpu.value()[4].fixed == 3);  // ceil(130 / 64)
    CHECK(gpu.value()[4].axis == 1);
    CHECK(gpu.value()[4].min_items == BLUE_MATMUL_GEMM_TILE);
    CHECK(gpu.value()[4].tile == BLUE_MATMUL_TILED_ITEMS);
    CHECK(gpu.value()[3].max_items == BLUE_MATMUL_GEMM_TILE - 1);
    CHECK(gpu.value()[5].pipeline == "tsum");
    CHECK(gpu.value()[2].pipeline == "matmul_f32_b1s");
    CHECK(gpu.value()[2].fixed == 17);  // ceil(130 / 8)
    CHECK(gpu.value()[2].axis == 1);
    CHECK(gpu.value()[2].max_items == 1);
    CHECK(gpu.value()[3].pipeline == "matmul_f32_s");
    CHECK(gpu.value()[3].fixed == 17);
    CHECK(gpu.value()[3].tile == BLUE_MATMUL_TILE);
}

// Q, K and V projections of one x, in two blocks (a model's forward and verify). `v_type`,
// `k_rows` and `k_reader` vary what stacks: the matrices must share a type and have rows in whole
// groups of 8, and the destinations be read only by ops that address them by slice.
// `layers` 2: the second block runs another layer's matrices (wq2, wk2, wv2 of `v2_type`) into
// the same q, k, v.
Module qkvModule(const std::string& v_type = "f32", uint32_t k_rows = 16, const std::string& k_reader = "tadd k, k, v",
                 uint32_t layers = 1, std::string v2_type = "") {
    const char* l = layers == 2 ? "2" : "";
    if (v2_type.empty()) v2_type = v_type;
    Module m = assembleOrFail(strFormat(R"(.layout regs=4 max_rows=8
.tensor wq global f32 [64, 32]
.tensor wk global f32 [64, %u]
.tensor wv global %s [64, 16]
.tensor x rows f32 [64]
.tensor q rows f32 [32]
.tensor k rows f32 [%u]
.tensor v rows f32 [16]
.tensor s rows f32 [1]
.tensor wq2 global f32 [64, 32]
.tensor wk2 global f32 [64, %u]
.tensor wv2 global %s [64, 16]
.block forward args=0
    matmul q, wq, x
    matmul k, wk, x
    matmul v, wv, x
    %s
.end
.block verify args=0
    tadd x, x, x
    matmul q, wq%s, x
    matmul k, wk%s, x
    matmul v, wv%s, x
.end
halt
)", k_rows, v_type.c_str(), k_rows, k_rows, v2_type.c_str(), k_reader.c_str(), l, l, l));
    for (uint32_t w : {0u, 1u, 2u, 8u, 9u, 10u}) m.tensors[w].cls = BLUE_TC_WEIGHT;
    return m;
}

TEST_CASE("plan: MATMULs over one x run as one dispatch over their stacked matrices and interleaved rows") {
    enum : uint32_t { WQ, WK, WV, X, Q, K, V };
    Module m = qkvModule();
    Result<PagePlan> pages = planPages(m, 4, 1u << 20, 0, false, true, true);
    REQUIRE_MESSAGE(pages.isOk(), pages.message());
    const PagePlan& p = pages.value();
    REQUIRE(p.matmul_groups.size() == 1);
    const MatmulGroup& g = p.matmul_groups[0];
    CHECK(g.weights == std::vector<uint32_t>{WQ, WK, WV});
    CHECK(g.dsts == std::vector<uint32_t>{Q, K, V});
    CHECK(g.runs == std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {1, 1}});
    // The matrices back to back: [64, 32 + 16 + 16] in the GPU weight layout.
    WeightLayout stacked;
    REQUIRE(weightLayout(DType::F32, 64, 64, &stacked));
    CHECK(p.places[WK].page == p.places[WQ].page);
    CHECK(p.places[WV].page == p.places[WQ].page);
    CHECK(p.places[WK].offset == p.places[WQ].offset + p.places[WQ].bytes);
    CHECK(p.places[WV].offset == p.places[WK].offset + p.places[WK].bytes);
    CHECK(p.places[WQ].bytes + p.places[WK].bytes + p.places[WV].bytes == stacked.bytes);
    // The destinations as views of one row of 64 floats: q at 0, k at 32, v at 48.
    for (uint32_t t : {Q, K, V}) {
        CHECK(p.places[t].page == p.places[Q].page);
        CHECK(p.places[t].slice == 64 * 4);
        CHECK(p.places[t].bytes == 8 * 64 * 4);  // max_rows rows
    }
    CHECK(p.places[K].offset == p.places[Q].offset + 32 * 4);
    CHECK(p.places[V].offset == p.places[Q].offset + 48 * 4);
    // No other tensor inside the row's region (its rows and one more).
    for (uint32_t t = 0; t < m.tensors.size(); ++t) {
        if (t == Q || t == K || t == V || p.places[t].page != p.places[Q].page) continue;
        INFO("tensor " << m.tensors[t].name);
        const bool before = p.places[t].offset + p.places[t].bytes <= p.places[Q].offset;
        const bool after = p.places[t].offset >= p.places[Q].offset + 9 * 64 * 4;
        CHECK((before || after));
    }

    Result<std::vector<DispatchDesc>> d = planDispatches(m, p, 65535);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    // Each block: the stack's single-item, 4-item and GEMM variants (and the blocks' TADDs).
    REQUIRE(d->size() == 3 + 1 + 1 + 3);
    for (size_t i : {0u, 1u, 2u, 5u, 6u, 7u}) {
        const DispatchDesc& mm = d.value()[i];
        INFO("dispatch " << i << " " << mm.pipeline);
        CHECK(mm.pipeline.rfind("matmul_f32", 0) == 0);
        const uint32_t* dst = mm.push.data() + BLUE_PC_OPERANDS;
        CHECK(dst[0] == (p.places[Q].page | BLUE_TC_ROWS << 16));
        CHECK(dst[1] == p.places[Q].offset);
        CHECK(dst[2] == 64 * 4);
        CHECK(dst[3] == 64);  // the stacked row's elements: the kernels' N
        const uint32_t* w = dst + BLUE_TREF_WORDS;
        CHECK(w[0] == (p.places[WQ].page | BLUE_TC_WEIGHT << 16));
        CHECK(w[1] == p.places[WQ].offset);
        CHECK(w[2] == stacked.bytes);
        CHECK(mm.weight_offset == p.places[WQ].offset);
        CHECK(mm.weight_bytes == stacked.bytes);
    }
    CHECK(d.value()[3].pipeline == "tadd");
    CHECK(d.value()[4].pipeline == "tadd");
    // The GPU shapes stack the same way.
    Result<std::vector<DispatchDesc>> gpu = planDispatches(m, p, 65535, KernelChoice{true, true});
    REQUIRE_MESSAGE(gpu.isOk(), gpu.message());
    CHECK(gpu->size() == d->size());

    // Two layers' stacks writing the same q, k and v: one row layout for both.
    Result<PagePlan> two = planPages(qkvModule("f32", 16, "tadd k, k, v", 2), 4, 1u << 20, 0, false, true, true);
    REQUIRE_MESSAGE(two.isOk(), two.message());
    CHECK(two->matmul_groups.size() == 2);
    for (uint32_t t : {Q, K, V}) {
        CHECK(two->places[t].slice == 64 * 4);
        CHECK(two->places[t].offset - two->places[Q].offset == p.places[t].offset - p.places[Q].offset);
    }
    // A layer whose V has another type stacks Q and K into the row the other layer's Q, K and V
    // share, and runs V alone into its view there.
    Module mixed = qkvModule("f32", 16, "tadd k, k, v", 2, "f16");
    Result<PagePlan> part = planPages(mixed, 4, 1u << 20, 0, false, true, true);
    REQUIRE_MESSAGE(part.isOk(), part.message());
    REQUIRE(part->matmul_groups.size() == 2);
    CHECK(part->matmul_groups[1].weights == std::vector<uint32_t>{8, 9});
    CHECK(part->matmul_groups[1].row == std::vector<uint32_t>{Q, K, V});
    for (uint32_t t : {Q, K, V}) CHECK(part->places[t].slice == 64 * 4);
    Result<std::vector<DispatchDesc>> pd = planDispatches(mixed, part.value(), 65535);
    REQUIRE_MESSAGE(pd.isOk(), pd.message());
    size_t pair = 0, alone = 0;
    for (const DispatchDesc& mm : pd.value()) {
        if (mm.block != 1 || mm.pipeline.rfind("matmul", 0) != 0) continue;
        const uint32_t* dst = mm.push.data() + BLUE_PC_OPERANDS;
        CHECK(dst[2] == 64 * 4);
        pair += dst[1] == part->places[Q].offset && dst[3] == 48;
        alone += dst[1] == part->places[V].offset && dst[3] == 16;
    }
    CHECK(pair >= 2);
    CHECK(alone >= 2);
    // Off (planPages' default), and where streaming copies matrix by matrix: three of everything.
    for (bool stream : {false, true}) {
        Result<PagePlan> off = planPages(m, 4, 1u << 20, stream ? 1u << 30 : 0, stream, true, stream);
        REQUIRE_MESSAGE(off.isOk(), off.message());
        CHECK(off->matmul_groups.empty());
        CHECK(off->places[K].slice == 16 * 4);
        Result<std::vector<DispatchDesc>> three = planDispatches(m, off.value(), 65535);
        REQUIRE(three.isOk());
        CHECK(three->size() > d->size());
        for (uint32_t t : {Q, K, V}) {  // each MATMUL's own dispatches, in both blocks
            size_t own = 0;
            for (const DispatchDesc& mm : three.value()) {
                own += mm.push[BLUE_PC_OPERANDS + 1] == off->places[t].offset && mm.push[BLUE_PC_OPERANDS + 3] ==
                       m.tensors[t].elements() && mm.pipeline.rfind("matmul", 0) == 0;
            }
            CHECK(own >= 4);
        }
    }
}

TEST_CASE("plan: MATMULs stack only matrices of one type in whole groups of 8 rows, into rows every reader takes by slice") {
    auto stacks = [](const Module& m, uint64_t page_limit = 1u << 20) {
        Result<PagePlan> pages = planPages(m, 4, page_limit, 0, false, true, true);
        REQUIRE_MESSAGE(pages.isOk(), pages.message());
        std::vector<size_t> sizes;
        for (const MatmulGroup& g : pages->matmul_groups) sizes.push_back(g.weights.size());
        // Whatever stacks, every MATMUL still gets its dispatches.
        Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535);
        REQUIRE_MESSAGE(d.isOk(), d.message());
        return sizes;
    };
    CHECK(stacks(qkvModule()) == std::vector<size_t>{3});
    CHECK(stacks(qkvModule("f16")) == std::vector<size_t>{2});  // V's type differs: Q and K
    CHECK(stacks(qkvModule("f32", 12, "tscale k, k, 2.0")).empty());  // K's 12 rows: neither pair
    CHECK(stacks(qkvModule("f32", 16, "tsum s, k")).empty());     // TSUM reads k as a whole row
    CHECK(stacks(qkvModule("f32", 16, "tsum s, v")) == std::vector<size_t>{2});
    // A page that cannot hold the stack's matrices (each fits alone): unstacked, still planned.
    WeightLayout q;
    REQUIRE(weightLayout(DType::F32, 64, 32, &q));
    CHECK(stacks(qkvModule(), q.bytes + 512).empty());
}

TEST_CASE("pipelines: a kernel's name may ask for a width (@W) and an attention head size (#Q)") {
    auto k = splitKernelWidth("attn_f16_split#16");
    REQUIRE(k);
    CHECK(k->kernel == "attn_f16_split");
    CHECK(k->width == 0);
    CHECK(k->head_quads == 16);
    k = splitKernelWidth("sampleg@8");
    REQUIRE(k);
    CHECK(k->kernel == "sampleg");
    CHECK(k->width == 8);
    CHECK(k->head_quads == 0);
    k = splitKernelWidth("attn_f16@64#2");
    REQUIRE(k);
    CHECK((k->kernel == "attn_f16" && k->width == 64 && k->head_quads == 2));
    for (const char* bad : {"attn_f16#", "attn_f16#0", "attn_f16#x", "attn_f16#12345", "sample@", "sample@0#2"}) {
        CAPTURE(bad);
        CHECK_FALSE(splitKernelWidth(bad));
    }
    CHECK(Pipelines::exists("attn_f16#16"));
    CHECK_FALSE(Pipelines::exists("attn_f16#0"));
    CHECK_FALSE(Pipelines::exists("no_such_kernel#2"));
}

TEST_CASE("plan: an absent optional tensor and a HEADS grid") {
    Module m = assembleOrFail(R"(.layout regs=4 max_rows=4
.tensor q rows f32 [16]
.tensor ff weight f32 [2] data f32 1 2
.tensor kc instance f16 [8, 32]
.tensor vc instance f16 [8, 32]
.block b args=2
    rope q, q, none, 1, 8, 4, 0, 10000, 1.0
    rope q, q, ff, 1, 8, 4, 2, 10000, 1.0
    attn q, kc, vc, q, 2, 1, 1, 0.5
.end
halt
)");
    Result<PagePlan> pages = planPages(m, 2, 1u << 20);
    REQUIRE(pages.isOk());
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    REQUIRE(d.value().size() == 3);
    const uint32_t ff_at = BLUE_PC_OPERANDS + 2 * BLUE_TREF_WORDS;
    const uint32_t scalars_at = BLUE_PC_OPERANDS + 3 * BLUE_TREF_WORDS;
    const DispatchDesc& none = d.value()[0];
    CHECK(none.pipeline == "rope");
    CHECK(none.fixed == 1);  // ceil(16 / 64)
    // `none` is a reference to page 0xFFFF that the kernel tests; the scalars follow it in place.
    CHECK(none.push[ff_at] == 0xFFFFFFFFu);
    CHECK(none.push[scalars_at] == 1);
    CHECK(none.push[scalars_at + 1] == 8);
    CHECK(none.push[scalars_at + 2] == 4);
    CHECK(none.push[scalars_at + 3] == 0);
    CHECK(none.push[scalars_at + 4] == std::bit_cast<uint32_t>(10000.0f));
    CHECK(none.push[scalars_at + 5] == std::bit_cast<uint32_t>(1.0f));
    const DispatchDesc& with = d.value()[1];
    const TensorPlace& ffp = pages.value().places[1];
    CHECK(with.push[ff_at] == ffp.page);  // class WEIGHT is 0
    CHECK(with.push[ff_at + 1] == ffp.offset);
    CHECK(with.push[ff_at + 3] == 2);
    CHECK(with.push[scalars_at + 3] == 2);
    const DispatchDesc& attn = d.value()[2];
    CHECK(attn.pipeline == "attn_f16");
    CHECK(attn.fixed == 1);  // one invocation per query head, BLUE_ATTN_WG heads per group
    CHECK(attn.tile == 1);
    CHECK(attn.mode == 0);
    // The split kernel: a workgroup per query head (2 heads).
    Result<std::vector<DispatchDesc>> split = planDispatches(m, pages.value(), 65535, KernelChoice{false, true});
    REQUIRE_MESSAGE(split.isOk(), split.message());
    REQUIRE(split.value().size() == 3);
    CHECK(split.value()[2].pipeline == "attn_f16_split");
    CHECK(split.value()[2].fixed == 2);
    CHECK(split.value()[0].pipeline == "rope");
    // A CPU driver (a loop limit): specialized for heads of 2 quads, 8 elements (attn.comp
    // HEAD_QUADS), and the ROPEs, 8 lanes an item, put 8 items in a workgroup.
    KernelChoice cpu;
    cpu.loop_limit = deviceLoopLimit(true);
    Result<std::vector<DispatchDesc>> c = planDispatches(m, pages.value(), 65535, cpu);
    REQUIRE_MESSAGE(c.isOk(), c.message());
    CHECK(c.value()[2].pipeline == "attn_f16#2");
    CHECK(c.value()[0].tile == 16);  // 4 frequencies of one chunk of 2 heads: 4 lanes, 16 items
    CHECK(c.value()[0].push[BLUE_PC_TILE] == 16);
    CHECK(c.value()[0].fixed == 1);
}

// A driver that ends an invocation's loops after 65535 iterations in all (lavapipe): attention
// keeps the lane-per-head kernel while one lane's walk over the context stays under it, takes the
// split kernel past that, and a context even the split kernel would cut short is refused.
TEST_CASE("plan: under a loop limit, attention over a long context takes the split kernel, or is refused") {
    // Two query heads over one KV head of `head` elements, `ctx` positions; `limit` 0: a GPU.
    auto plan = [](uint32_t head, uint32_t ctx, uint32_t limit) {
        Module m = assembleOrFail(strFormat(R"(.layout regs=4 max_rows=4
.tensor q rows f32 [%u]
.tensor kc instance f16 [%u, %u]
.tensor vc instance f16 [%u, %u]
.block b args=2
    attn q, kc, vc, q, 2, 1, 1, 0.5
.end
halt
)", 2 * head, head, ctx, head, ctx));
        Result<PagePlan> pages = planPages(m, 1, 1u << 30);
        REQUIRE_MESSAGE(pages.isOk(), pages.message());
        KernelChoice kernels;
        kernels.loop_limit = limit;
        return planDispatches(m, pages.value(), 65535, kernels);
    };
    // Head 64, 2048 positions: 2048 x 2 x (4 + 1 + 0 + 1) + ... = 26,660 iterations per lane.
    Result<std::vector<DispatchDesc>> ok = plan(64, 2048, 65535);
    REQUIRE_MESSAGE(ok.isOk(), ok.message());
    CHECK(ok.value()[0].pipeline == "attn_f16#16");
    // Head 256, 2048 positions: 2048 x 2 x (16 + 1 + 0 + 1) + ... = 75,907: the split kernel.
    Result<std::vector<DispatchDesc>> wide = plan(256, 2048, 65535);
    REQUIRE_MESSAGE(wide.isOk(), wide.message());
    CHECK(wide.value()[0].pipeline == "attn_f16_split#64");
    CHECK(wide.value()[0].fixed == 2);
    // Head 256, 65536 positions: 2048 per lane of the split kernel, 2048 x 36 + ... > 65535.
    Result<std::vector<DispatchDesc>> cut = plan(256, 65536, 65535);
    REQUIRE_FALSE(cut.isOk());
    CHECK(cut.message().find("ATTN over 65536 positions of head size 256 needs") != std::string::npos);
    CHECK(cut.message().find("LP_MAX_TGSI_LOOP_ITERATIONS") != std::string::npos);
    // Without a limit (a GPU) the lane-per-head kernel stays wherever it is asked for.
    Result<std::vector<DispatchDesc>> gpu = plan(256, 4096, 0);
    REQUIRE(gpu.isOk());
    CHECK(gpu.value()[0].pipeline == "attn_f16");  // GPUs: not specialized
}

// ATTNP's context under the loop limit is the positions its page table covers, U_n * PS, not
// the pool's NP * PS: a pool of twice the table's pages of 16, read through tables of 128
// entries (2,048 positions), takes the split kernel at head 256 as ATTN over 2,048 does, and
// tables of 4,096 entries (65,536 positions) are refused. The page size and count follow the
// operands.
TEST_CASE("plan: ATTNP counts the positions of its page table, U_n * PS") {
    auto plan = [](uint32_t head, uint32_t tab_n, uint32_t limit) {
        Module m = assembleOrFail(strFormat(R"(.layout regs=4 max_rows=4 local=%u
.tensor q rows f32 [%u]
.tensor kp global f16 [%u, 16, %u]
.tensor vp global f16 [%u, 16, %u]
.block b args=2
    attnp q, kp, vp, q, 2, 1, 1, 0.5, 0, 0.0, 3, %u
.end
halt
)", tab_n + 3, 2 * head, head, 2 * tab_n, head, 2 * tab_n, tab_n));
        Result<PagePlan> pages = planPages(m, 1, 1u << 30);
        REQUIRE_MESSAGE(pages.isOk(), pages.message());
        KernelChoice kernels;
        kernels.loop_limit = limit;
        return planDispatches(m, pages.value(), 65535, kernels);
    };
    Result<std::vector<DispatchDesc>> ok = plan(64, 128, 65535);
    REQUIRE_MESSAGE(ok.isOk(), ok.message());
    const DispatchDesc& d = ok.value()[0];
    CHECK(d.pipeline == "attnp_f16#16");
    CHECK(d.push[BLUE_PC_OPERANDS + 22] == 3);    // U_tab
    CHECK(d.push[BLUE_PC_OPERANDS + 23] == 128);  // U_n
    CHECK(d.push[BLUE_PC_KVP_PAGE] == 16);
    CHECK(d.push[BLUE_PC_KVP_PAGES] == 256);
    Result<std::vector<DispatchDesc>> wide = plan(256, 128, 65535);
    REQUIRE_MESSAGE(wide.isOk(), wide.message());
    CHECK(wide.value()[0].pipeline == "attnp_f16_split#64");
    CHECK(wide.value()[0].fixed == 2);
    Result<std::vector<DispatchDesc>> cut = plan(256, 4096, 65535);
    REQUIRE_FALSE(cut.isOk());
    CHECK(cut.message().find("ATTNP over 65536 positions of head size 256 needs") != std::string::npos);
    Result<std::vector<DispatchDesc>> gpu = plan(256, 4096, 0);
    REQUIRE(gpu.isOk());
    CHECK(gpu.value()[0].pipeline == "attnp_f16");
}

// The paged copies' destination is a whole pool; their grid covers one page (PGCOPY) or one store
// slot (KVCOPYP) of 32-bit words, not the pool's elements (1,000 pages here: 5,375 workgroups).
TEST_CASE("plan: PGCOPY and KVCOPYP size their grid by a page and a store slot") {
    Module m = assembleOrFail(R"(.layout regs=4 max_rows=4 local=8
.tensor kp global f16 [172, 8, 1000]
.tensor st global f16 [172, 20, 2]
.block b args=3
    pgcopy kp, 0, 1, 2
    kvcopyp kp, st, 1, 0, 1, 2, 4, 2
.end
halt
)");
    Result<PagePlan> pages = planPages(m, 1, 1u << 30);
    REQUIRE_MESSAGE(pages.isOk(), pages.message());
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    REQUIRE(d.value().size() == 2);
    const DispatchDesc& pg = d.value()[0];
    CHECK(pg.pipeline == "pgcopy");
    CHECK(pg.mode == 1);  // a GLOBAL first operand: one item per instance
    CHECK(pg.fixed == 11);  // 86 words a row x 8 rows / 64
    CHECK(pg.push[BLUE_PC_KV_ROW_WORDS] == 86);
    CHECK(pg.push[BLUE_PC_KVP_PAGE] == 8);
    CHECK(pg.push[BLUE_PC_KVP_PAGES] == 1000);
    const DispatchDesc& cp = d.value()[1];
    CHECK(cp.pipeline == "kvcopyp");
    CHECK(cp.fixed == 27);  // 86 x 20 / 64
    CHECK(cp.push[BLUE_PC_KV_ROW_WORDS] == 86);
    CHECK(cp.push[BLUE_PC_KV_CTX] == 20);
    CHECK(cp.push[BLUE_PC_KVP_PAGE] == 8);
    CHECK(cp.push[BLUE_PC_KVP_PAGES] == 1000);
}

// Instructions the op's rules accept (the reference machine runs them) but whose kernel cannot:
// the plan refuses them at load with the reason, and accepts the nearest shape that fits.
TEST_CASE("plan: shapes a kernel cannot run are refused with the reason") {
    struct Case {
        const char* tensors;
        const char* instr;
        const char* message;  // empty: plans
    };
    const Case cases[] = {
        {".tensor q rows f32 [15]", "rope q, q, none, 1, 5, 4, 0, 10000, 1.0",
         "block 'b': ROPE: head size 5 is odd; the kernel rotates pairs of dims"},
        {".tensor q rows f32 [16]", "rope q, q, none, 1, 8, 4, 0, 10000, 1.0", ""},
        {".tensor k rows f32 [7]\n.tensor kc instance f16 [7, 4]\n.tensor vc instance f16 [7, 4]",
         "kvstore k, kc, k, vc, 1",
         "block 'b': KVSTORE: an F16 KV cache needs an even row length, not 7"},
        {".tensor k rows f32 [7]\n.tensor kc instance f32 [7, 4]\n.tensor vc instance f32 [7, 4]",
         "kvstore k, kc, k, vc, 1", ""},
        {".tensor q rows f32 [14]\n.tensor kc instance f16 [7, 4]\n.tensor vc instance f16 [7, 4]",
         "attn q, kc, vc, q, 2, 1, 1, 0.5",
         "block 'b': ATTN: an F16 KV cache needs an even row length, not 7"},
        {".tensor q rows f32 [640]\n.tensor kc instance f32 [320, 4]\n.tensor vc instance f32 "
         "[320, 4]",
         "attn q, kc, vc, q, 2, 1, 1, 0.5",
         "block 'b': ATTN: head size 320 is more than the kernel's 256"},
        {".tensor q rows f32 [512]\n.tensor kc instance f32 [256, 4]\n.tensor vc instance f32 "
         "[256, 4]",
         "attn q, kc, vc, q, 2, 1, 1, 0.5", ""},
    };
    for (const Case& c : cases) {
        CAPTURE(c.instr);
        Module m = assembleOrFail(std::string(".layout regs=4 max_rows=2\n") + c.tensors +
                                  "\n.block b args=2\n    " + c.instr + "\n.end\nhalt\n");
        REQUIRE(verifyModule(m).isOk());
        Result<PagePlan> pages = planPages(m, 2, 1u << 20);
        REQUIRE(pages.isOk());
        Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535);
        CHECK(d.isOk() == (*c.message == 0));
        if (!d.isOk()) CHECK(d.message() == c.message);
    }
    CHECK(BLUE_ATTN_MAX_HEAD % 4 == 0);  // attn.comp: one head in vec4 registers per invocation
}

TEST_CASE("plan: a grid past the device limit is refused; every matrix type has its kernels") {
    Module m = dispatchModule();
    Result<PagePlan> pages = planPages(m, 4, 1u << 20);
    REQUIRE(pages.isOk());
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 3);
    REQUIRE(!d.isOk());
    CHECK(d.message() ==
          "block 'first': TADD on tensor 'y' needs 16 workgroups, the device allows 3");
    // Every matrix type the verifier accepts for MATMUL (and EMBED) plans to its own kernels:
    // no accepted module can reach the "no GPU kernel" refusal through a weight type.
    Module q = m;
    const std::vector<DType> types = {DType::F32,  DType::F16,    DType::BF16,  DType::Q8_0,
                                      DType::Q4_0, DType::Q4_1,   DType::Q5_0,  DType::Q5_1,
                                      DType::Q2_K, DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                                      DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
    for (DType t : types) {
        CAPTURE(dtypeName(t));
        q.tensors[0].dtype = t;
        std::vector<TensorInstr> instrs;
        REQUIRE(decodeBlock(q, q.blocks[1], &instrs).isOk());
        REQUIRE(checkTensorOp(q, instrs[0]).isOk());
        const std::string name = "matmul_" + kernelSuffix(t);
        CHECK(kernelName(q, uint32_t(Op::MATMUL), {3, 0, 1}) == name);
        CHECK(Pipelines::exists(name));
        CHECK(Pipelines::exists(name + "_b1"));
        CHECK(Pipelines::exists("embed_" + kernelSuffix(t)));
        Result<PagePlan> qp = planPages(q, 4, 1u << 20);
        REQUIRE(qp.isOk());
        Result<std::vector<DispatchDesc>> qd = planDispatches(q, qp.value(), 65535);
        REQUIRE_MESSAGE(qd.isOk(), qd.message());
        CHECK(qd.value()[2].pipeline == name + "_b1@16");  // 130 rows: 16 lanes (matmulWidth)
        CHECK(qd.value()[3].pipeline == name + "@16");
    }
    // A plain-type matrix gets a third dispatch, the GEMM tile, and the 4-item tile stops below
    // it; the quantized types have no GEMM kernel. 256 rows fill a workgroup of 64 lanes of each.
    q.tensors[0].dtype = DType::F32;
    q.tensors[0].ne[1] = BLUE_MATMUL_WG * BLUE_MM_R_GEMM;
    q.tensors[3].ne[0] = q.tensors[0].ne[1];
    Result<PagePlan> gp = planPages(q, 4, 4u << 20);
    REQUIRE(gp.isOk());
    Result<std::vector<DispatchDesc>> gd = planDispatches(q, gp.value(), 65535);
    REQUIRE_MESSAGE(gd.isOk(), gd.message());
    REQUIRE(gd.value().size() == 6);  // tadd, tscale, three MATMUL variants, tsum
    CHECK(gd.value()[3].pipeline == "matmul_f32");
    CHECK(gd.value()[3].max_items == BLUE_MATMUL_GEMM_TILE - 1);
    const DispatchDesc& g = gd.value()[4];
    CHECK(g.pipeline == "matmul_f32_g");
    CHECK(g.min_items == BLUE_MATMUL_GEMM_TILE);
    CHECK(g.max_items == 0);
    CHECK(g.tile == BLUE_MATMUL_GEMM_TILE);
    CHECK(g.push[BLUE_PC_TILE] == BLUE_MATMUL_GEMM_TILE);
    CHECK(g.fixed == 1);  // 256 / (64 invocations x 4 rows)
    CHECK(gd.value()[2].pipeline == "matmul_f32_b1");
    CHECK(gd.value()[2].fixed == 2);  // 256 / (64 invocations x 2 rows)
    CHECK(!Pipelines::exists("matmul_q8_0_g"));
    CHECK(!Pipelines::exists("matmul_q6_k_g"));
    CHECK(Pipelines::exists("matmul_f16_g"));
    CHECK(!Pipelines::exists("matmul"));
    CHECK(Pipelines::exists("matmul_q8_0"));
    CHECK(Pipelines::exists("matmul_q4_0"));
    CHECK(Pipelines::exists("sequencer"));
    CHECK(Pipelines::exists("plan"));
    // A block type on a CPU driver: the lanes-over-items `_i` from a workgroup's 32 items on (the
    // 4-item tiles below it), where F32's `_g` starts at 16; BLUE_GEMM_MIN_ITEMS (given) moves both.
    q.tensors[0].dtype = DType::Q4_0;
    for (const bool given : {false, true}) {
        CAPTURE(given);
        KernelChoice cpu;
        cpu.loop_limit = deviceLoopLimit(true);
        cpu.gemm_min_items_given = given;
        Result<std::vector<DispatchDesc>> qd = planDispatches(q, gp.value(), 65535, cpu);
        REQUIRE_MESSAGE(qd.isOk(), qd.message());
        REQUIRE(qd.value().size() == 6);
        const DispatchDesc& tile = qd.value()[3];
        const DispatchDesc& items = qd.value()[4];
        CHECK(tile.pipeline == "matmul_q4_0@32");  // 256 rows of 4-bit blocks: 32 lanes (matmulWidth)
        CHECK(items.pipeline == "matmul_q4_0_i");
        const uint32_t from = given ? BLUE_MATMUL_GEMM_TILE : kItemsGemmTile;
        CHECK(items.min_items == from);
        CHECK(items.tile == kItemsGemmTile);
        CHECK(tile.max_items == from - 1);
    }
    CHECK(kItemsGemmTile == 32);
}

}  // namespace
}  // namespace blue::test

namespace blue::test {
namespace {

// Two 64x64 F32 matrices (16 KiB each) that MATMUL reads and a 64x100 table (25 KiB) that only
// EMBED reads, with small activations.
std::string budgetSource() {
    std::string s = ".layout regs=8 local=8 max_rows=2\n";
    auto data = [&](const char* name, int n) {
        s += strFormat(".tensor %s weight f32 [64, %d] data f32", name, n);
        for (int i = 0; i < 64 * n; ++i) s += i % 7 ? " 0" : " 1";
        s += "\n";
    };
    data("table", 100);
    data("w1", 64);
    data("w2", 64);
    s += R"(.tensor e rows f32 [64]
.tensor h rows f32 [64]
.tensor y rows f32 [64]
.block b args=4
    embed e, table, 2
    matmul h, w1, e
    matmul y, w2, h
.end
main:
    halt
)";
    return s;
}

// Two MoE layers sharing one expert map (as lowered models do), 4 experts of [64, 32], top-2,
// and a dense matrix.
std::string expertBudgetSource() {
    std::string s = ".layout regs=8 local=8 max_rows=2\n";
    auto data = [&](const char* name, const char* shape, int n) {
        s += strFormat(".tensor %s weight f32 %s data f32", name, shape);
        for (int i = 0; i < n; ++i) s += i % 5 ? " 0" : " 1";
        s += "\n";
    };
    data("wa", "[64, 32, 4]", 64 * 32 * 4);
    data("wb", "[64, 32, 4]", 64 * 32 * 4);
    data("dense", "[64, 4]", 64 * 4);
    s += strFormat(".tensor map global i32 [%u]\n", BLUE_MOE_MAP_WORDS(4u, 4u));
    s += R"(.tensor x rows f32 [64]
.tensor lg rows f32 [4]
.tensor sel rows f32 [4]
.tensor y rows f32 [64]
.block b args=4
    matmul lg, dense, x
    moeroute sel, lg, map, 2, 0
    moemm y, wa, x, map
    moeroute sel, lg, map, 2, 0
    moemm y, wb, x, map
.end
main:
    halt
)";
    return s;
}

TEST_CASE("plan: MoE experts under a budget the weights do not fit: host memory, and equal caches per layer") {
    Module m = assembleOrFail(expertBudgetSource());
    const uint32_t wa = 0, wb = 1, dense = 2;
    WeightLayout wl;
    REQUIRE(weightLayout(DType::F32, 64, 32, &wl));
    Result<PagePlan> all = planPages(m, 1, 1 << 20);
    REQUIRE(all.isOk());
    CHECK(all->expert_caches.empty());
    const uint64_t everything = all->tierBytes(0);
    // Room for the activations, the dense matrix and two slots of each layer (plus alignment).
    const uint64_t budget = everything - 2 * 2 * wl.bytes + 4096;
    for (bool stream : {false, true}) {
        CAPTURE(stream);
        Result<PagePlan> p = planPages(m, 1, 1 << 20, budget + (stream ? 2 * 64 * 4 * 4 + 1024 : 0), stream);
        REQUIRE_MESSAGE(p.isOk(), p.message());
        CHECK(p->places[dense].tier == 0);
        for (uint32_t t : {wa, wb}) {
            CHECK(p->places[t].tier == 1);
            CHECK(p->places[t].expert);
            // The page says so, and holds nothing else: it is bound to the kernels, not streamed.
            REQUIRE(p->places[t].page < p->page_experts.size());
            CHECK(p->page_experts[p->places[t].page] == 1);
            for (uint32_t o = 0; o < m.tensors.size(); ++o) {
                if (o != wa && o != wb) CHECK(p->places[o].page != p->places[t].page);
            }
        }
        REQUIRE(p->expert_caches.size() == 2);  // one per MOEROUTE, though they share the map
        for (uint32_t l = 0; l < 2; ++l) {
            const ExpertCache& c = p->expert_caches[l];
            CHECK(c.route == l);
            CHECK(c.experts == 4u);
            CHECK(c.slots == 2u);
            REQUIRE(c.tensors == std::vector<uint32_t>{l == 0 ? wa : wb});
            CHECK(p->page_tier[c.caches[0].page] == 0);
            CHECK(c.caches[0].bytes == 2 * wl.bytes);
        }
        CHECK(p->expert_caches[1].state == BLUE_XC_WORDS(4u, 2u));
        CHECK(p->expertStateWords() == 2 * BLUE_XC_WORDS(4u, 2u));
        // The dispatches: each MOEROUTE says where its state is and is followed by its MOECOPY,
        // whose items axis it writes; the MOEMMs read through the cache and never stream.
        Result<std::vector<DispatchDesc>> d = planDispatches(m, *p, 65535);
        REQUIRE_MESSAGE(d.isOk(), d.message());
        std::vector<std::string> names;
        for (const DispatchDesc& x : *d) names.push_back(x.pipeline);
        CHECK(std::count(names.begin(), names.end(), "moecopy") == 2);
        CHECK(std::count(names.begin(), names.end(), "moemmc_f32") == 2);
        CHECK(std::count(names.begin(), names.end(), "moemmc_f32_b1") == 2);
        CHECK(std::count(names.begin(), names.end(), "moemm_f32") == 0);
        for (size_t i = 0; i < d->size(); ++i) {
            const DispatchDesc& x = (*d)[i];
            if (x.pipeline.rfind("moemmc", 0) == 0) CHECK(x.weight_page == DispatchDesc::kNoPage);
            if (x.pipeline != "moeroute") continue;
            REQUIRE(i + 1 < d->size());
            CHECK((*d)[i + 1].pipeline == "moecopy");
            CHECK(x.push[BLUE_PC_MOE_CACHE] != 0u);
            const uint32_t patches = x.push[BLUE_PC_MOE_PATCH];
            CHECK(std::count(x.push.begin() + BLUE_PC_MOE_PATCH + 1, x.push.begin() + BLUE_PC_MOE_PATCH + 1 + patches,
                             uint32_t(i + 1) | BLUE_MOE_PATCH_COPY) == 1);
        }
        if (stream) {
            StreamPlan sp = planStreams(*p, &*d, uint32_t(p->page_bytes.size()));
            for (const StreamGroup& g : sp.groups) {
                for (const StreamCopy& c : g.copies) CHECK(c.src_page != p->places[wa].page);
            }
        }
    }
    // No room for a slot: the experts stay in host memory, read in place; no caches.
    Result<PagePlan> tight = planPages(m, 1, 1 << 20, everything - 4 * 2 * wl.bytes);
    REQUIRE(tight.isOk());
    CHECK(tight->expert_caches.empty());
    CHECK(tight->places[wa].tier == 1);
    // Off: experts are weights like any other.
    Result<PagePlan> off = planPages(m, 1, 1 << 20, budget, false, false);
    REQUIRE(off.isOk());
    CHECK(off->expert_caches.empty());
    CHECK_FALSE(off->places[wa].expert);
    for (uint8_t e : off->page_experts) CHECK(e == 0);
    // Everything fits: nothing moves.
    Result<PagePlan> fits = planPages(m, 1, 1 << 20, everything + 4096);
    REQUIRE(fits.isOk());
    CHECK(fits->expert_caches.empty());
    CHECK(fits->tierBytes(1) == 0u);
}

TEST_CASE("plan: under a VRAM budget, activations stay device-local, then dense weights, then tables") {
    Module m = assembleOrFail(budgetSource());
    Result<PagePlan> all = planPages(m, 1, 1 << 20);
    REQUIRE_MESSAGE(all.isOk(), all.message());
    CHECK(all->tierBytes(1) == 0u);
    // Activations: three ROWS tensors of 2 rows x 256 bytes (1536 bytes, aligned).
    const uint64_t act = 3 * 512;
    const uint64_t matrix = 64 * 64 * 4, table = 64 * 100 * 4;
    auto tiers = [&](uint64_t budget) {
        Result<PagePlan> p = planPages(m, 1, 1 << 20, budget);
        REQUIRE_MESSAGE(p.isOk(), p.message());
        CHECK(p->tierBytes(0) <= budget);
        for (uint32_t t = 0; t < m.tensors.size(); ++t) {
            const TensorPlace& tp = p->places[t];
            CHECK(p->page_tier[tp.page] == tp.tier);  // a page holds one tier
            if (m.tensors[t].cls != BLUE_TC_WEIGHT) CHECK(tp.tier == 0);
        }
        return std::vector<int>{p->places[0].tier, p->places[1].tier, p->places[2].tier};
    };
    CHECK(tiers(act + 2 * matrix + table + 4096) == std::vector<int>{0, 0, 0});
    CHECK(tiers(act + 2 * matrix + 1024) == std::vector<int>{1, 0, 0});  // the table goes first
    CHECK(tiers(act + matrix + 1024) == std::vector<int>{1, 0, 1});      // then later matrices
    CHECK(tiers(act + 1024) == std::vector<int>{1, 1, 1});
    Result<PagePlan> none = planPages(m, 1, 1 << 20, 1000);
    REQUIRE_FALSE(none.isOk());
    CHECK(none.message() ==
          "the activations, KV caches and logits need 0.0 MiB of device memory, more than the VRAM "
          "budget of 0.0 MiB (weights could go to host memory; these cannot)");
}

}  // namespace
}  // namespace blue::test

namespace blue::test {

TEST_CASE("plan: maxGrammarWords leaves the copy cycle's steps and other loops 7,168 loop iterations") {
    CHECK(maxGrammarWords(0) == UINT32_MAX);  // no limit (GPUs)
    CHECK(maxGrammarWords(65535) == 58368);   // lavapipe
    CHECK(maxGrammarWords(65535) + 7168 <= 65536);
    CHECK(maxGrammarWords(65535) % 4 == 0);
    CHECK(maxGrammarWords(100) == 0);
    // bluec's generation program runs 4,096 steps a cycle at most; every module at most
    // maxCycleSteps on such a device.
    CHECK(maxCycleSteps(0) == UINT32_MAX);
    CHECK(maxCycleSteps(65535) == 8191);
    CHECK(maxGrammarWords(65535) + 4096 + 3000 <= 65535);
    // bluec's default runs on every device.
    CHECK(kDefaultGrammarWords <= maxGrammarWords(65535));
}

TEST_CASE("plan: maxPenaltyWindow is the longest window whose walk stays under the loop limit") {
    CHECK(maxPenaltyWindow(0, 32000) == UINT32_MAX);  // no limit (GPUs)
    const uint32_t llama = maxPenaltyWindow(65535, 32000), qwen = maxPenaltyWindow(65535, 152064);
    // applyPenalties' count at L lanes: ceil(W / L) * (ceil(W / 16) + 1) + ceil(W / L) + 1.
    auto loops = [](uint64_t w, uint64_t lanes) {
        return (w + lanes - 1) / lanes * ((w + 15) / 16 + 1) + (w + lanes - 1) / lanes + 1;
    };
    // At 32,000 tokens (256 lanes) the rest of sampling takes 60 * 16 + 70 * 32 + 8 * 1 + 64 =
    // 3,272: the window is the longest that fits beside it.
    CHECK(llama > 14000);
    CHECK(loops(llama, 256) + 3272 <= 65535);
    CHECK(loops(llama + 1, 256) + 3272 > 65535);
    // A larger vocabulary leaves less of the limit for the window.
    CHECK(qwen < llama);
    CHECK(qwen > 12000);
    CHECK(loops(qwen, 256) + 60 * (152064 / 2048 + 1) + 70 * (152064 / 1024 + 1) + 8 + 64 <= 65535);
    // A small vocabulary samples on 64 lanes (sampleWidth), so each lane walks 4 times the window
    // positions: at 512 tokens the rest takes 60 + 70 * 2 + 8 * 4 + 64 = 296.
    const uint32_t small = maxPenaltyWindow(65535, 512);
    CHECK(small > 8000);
    CHECK(loops(small, 64) + 296 <= 65535);
    CHECK(loops(small + 1, 64) + 296 > 65535);
    // Given the longest history a request can have (a model's context), sampling takes the fewest
    // lanes whose window still covers it, or the widest's window: the same requests fit.
    CHECK(maxPenaltyWindow(65535, 512, 512) >= 512);
    CHECK(maxPenaltyWindow(65535, 512, 1u << 20) == small);
    CHECK(maxPenaltyWindow(65535, 32000, 4096) >= 4096);
    CHECK(maxPenaltyWindow(65535, 32000, 1u << 20) == llama);
    CHECK(maxPenaltyWindow(0, 32000, 4096) == UINT32_MAX);
    // A vocabulary whose own walks take the whole limit leaves no window.
    CHECK(maxPenaltyWindow(65535, 1u << 30) == 0);
}

TEST_CASE("plan: int8 mode on a CPU driver packs x first for Q4_0 and Q6_K (PACKX), keeps float kernels for other types") {
    Module m = assembleOrFail(R"(.layout regs=4 max_rows=40 local=64
.tensor w4 global q4_0 [512, 256]
.tensor w6 global q6_k [256, 64]
.tensor w8 global q8_0 [64, 64]
.tensor x rows f32 [512]
.tensor h rows f32 [256]
.tensor z rows f32 [64]
.tensor y rows f32 [64]
.tensor h2 rows f32 [256]
.block b args=2
    matmul h, w4, x
    matmul h2, w4, x
    matmul z, w6, h
    matmul y, w8, z
.end
halt
)");
    m.tensors[0].cls = BLUE_TC_WEIGHT;
    m.tensors[1].cls = BLUE_TC_WEIGHT;
    m.tensors[2].cls = BLUE_TC_WEIGHT;
    Result<PagePlan> pages = planPages(m, 70, 1u << 20);
    REQUIRE_MESSAGE(pages.isOk(), pages.message());
    KernelChoice cpu;
    cpu.loop_limit = deviceLoopLimit(true);
    cpu.int8_matmul = true;
    // Without the region the plan keeps the float GEMM.
    Result<std::vector<DispatchDesc>> plain = planDispatches(m, pages.value(), 65535, cpu);
    REQUIRE_MESSAGE(plain.isOk(), plain.message());
    std::vector<std::string> names;
    for (const DispatchDesc& desc : plain.value()) names.push_back(desc.pipeline);
    CHECK(std::count(names.begin(), names.end(), "matmul_q4_0_i") == 2);
    CHECK(std::count(names.begin(), names.end(), "matmul_q6_k_i") == 1);
    CHECK(std::count(names.begin(), names.end(), "packx") == 0);
    // The region: records for max(max_rows, instances) = 70 items of K = 512 (two gblocks of 36
    // texels), device-local, after the tensors of the last page.
    const uint64_t before = pages->page_bytes.back();
    REQUIRE(planPackedX(m, 70, 1u << 20, &pages.value()).isOk());
    const PackedX& px = pages->packed_x;
    CHECK(px.k == 512);
    CHECK(px.items == 70);
    CHECK(px.item_bytes == 2 * BLUE_XQ_GBLOCK_TEXELS * 16);
    CHECK(px.page == pages->page_bytes.size() - 1);
    CHECK(px.offset >= before);
    CHECK(pages->page_bytes.back() == px.offset + 70 * px.item_bytes);
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535, cpu);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    names.clear();
    for (const DispatchDesc& desc : d.value()) names.push_back(desc.pipeline.substr(0, desc.pipeline.find('@')));
    // Q4_0 and Q6_K: PACKX, then the single-item, 4-item and GEMM kernels on its packed x (the
    // second MATMUL over the same x reads the same packed x); Q8_0 keeps its float kernels and
    // `_i` (no `_tq` on a CPU driver).
    CHECK(names == std::vector<std::string>{"packx", "matmul_q4_0_b1q", "matmul_q4_0_q", "matmul_q4_0_iq",
                                            "matmul_q4_0_b1q", "matmul_q4_0_q", "matmul_q4_0_iq", "packx",
                                            "matmul_q6_k_b1q", "matmul_q6_k_q", "matmul_q6_k_iq", "matmul_q8_0_b1",
                                            "matmul_q8_0", "matmul_q8_0_i"});
    REQUIRE(names.size() == 14);
    CHECK(d.value()[7].push[BLUE_PC_MM_XQ + 3] == 256);  // Q6_K's K
    const DispatchDesc& pack = d.value()[0];
    CHECK(pack.min_items == 0);  // every cycle: the one-item kernel reads it too
    CHECK(pack.max_items == 0);
    CHECK(pack.tile == 1);  // a workgroup per item
    CHECK(pack.fixed == 1);
    CHECK(pack.weight_page == DispatchDesc::kNoPage);
    const DispatchDesc& iq = d.value()[3];
    CHECK(pack.mode == iq.mode);
    for (size_t i : {0, 1, 2, 3, 4, 5, 6}) {
        const DispatchDesc& q = d.value()[i];
        CHECK(q.push[BLUE_PC_MM_XQ] == (px.page | BLUE_TC_GLOBAL << 16));
        CHECK(q.push[BLUE_PC_MM_XQ + 1] == px.offset);
        CHECK(q.push[BLUE_PC_MM_XQ + 2] == px.item_bytes);
        CHECK(q.push[BLUE_PC_MM_XQ + 3] == 512);
        if (i > 0) CHECK(q.operand_pages[BLUE_MM_XQ_OPERAND] == px.page);
    }
    CHECK(iq.operand_pages[BLUE_MM_XQ_OPERAND] == px.page);
    CHECK(pack.operand_pages[2] == iq.operand_pages[2]);  // x's view
    // GPU shapes: the int8 tiles, no PACKX.
    KernelChoice gpu = cpu;
    gpu.split_matmul = true;
    Result<std::vector<DispatchDesc>> g = planDispatches(m, pages.value(), 65535, gpu);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    names.clear();
    for (const DispatchDesc& desc : g.value()) names.push_back(desc.pipeline);
    CHECK(names == std::vector<std::string>{"matmul_q4_0_b1s", "matmul_q4_0_s", "matmul_q4_0_tq", "matmul_q4_0_b1s",
                                            "matmul_q4_0_s", "matmul_q4_0_tq", "matmul_q6_k_b1s",
                                            "matmul_q6_k_s", "matmul_q6_k_tq", "matmul_q8_0_b1s", "matmul_q8_0_s",
                                            "matmul_q8_0_tq"});
    // Anything but a MATMUL between two MATMULs over the same x (here one writing x) packs again.
    Module w = assembleOrFail(R"(.layout regs=4 max_rows=40 local=64
.tensor w4 global q4_0 [512, 256]
.tensor x rows f32 [512]
.tensor h rows f32 [256]
.block b args=2
    matmul h, w4, x
    tadd x, x, x
    matmul h, w4, x
.end
halt
)");
    w.tensors[0].cls = BLUE_TC_WEIGHT;
    Result<PagePlan> wp = planPages(w, 70, 1u << 20);
    REQUIRE(wp.isOk());
    REQUIRE(planPackedX(w, 70, 1u << 20, &wp.value()).isOk());
    Result<std::vector<DispatchDesc>> wd = planDispatches(w, wp.value(), 65535, cpu);
    REQUIRE_MESSAGE(wd.isOk(), wd.message());
    CHECK(std::count_if(wd->begin(), wd->end(), [](const DispatchDesc& x) { return x.pipeline == "packx"; }) == 2);
    // A module without Q4_0, Q4_K, Q5_K or Q6_K matrices gets no region.
    Module f = m;
    f.tensors[0].dtype = DType::F32;
    f.tensors[1].dtype = DType::Q3_K;
    Result<PagePlan> fp = planPages(f, 70, 1u << 20);
    REQUIRE(fp.isOk());
    const size_t pages_before = fp->page_bytes.size();
    const uint64_t bytes_before = fp->page_bytes.back();
    REQUIRE(planPackedX(f, 70, 1u << 20, &fp.value()).isOk());
    CHECK(fp->packed_x.item_bytes == 0);
    CHECK(fp->page_bytes.size() == pages_before);
    CHECK(fp->page_bytes.back() == bytes_before);
    // A region larger than what the last page has left gets a page of its own; one larger than
    // a page is refused with the way out.
    Result<PagePlan> tight = planPages(m, 70, 1u << 20);
    REQUIRE(tight.isOk());
    const size_t tight_pages = tight->page_bytes.size();
    REQUIRE(planPackedX(m, 70, 70 * px.item_bytes, &tight.value()).isOk());
    CHECK(tight->page_bytes.size() == tight_pages + 1);
    CHECK(tight->packed_x.page == tight_pages);
    CHECK(tight->packed_x.offset == 0);
    CHECK(tight->page_tier.back() == 0);
    Result<PagePlan> small = planPages(m, 70, 1u << 20);
    REQUIRE(small.isOk());
    const Status refused = planPackedX(m, 70, 70 * px.item_bytes - 1, &small.value());
    REQUIRE(!refused.isOk());
    CHECK(refused.message().find("the int8 GEMM's packed activations") != std::string::npos);
    CHECK(refused.message().find("BLUE_MATMUL_INT8=0") != std::string::npos);
}

TEST_CASE("plan: kernels run narrow on a CPU driver where wide workgroups would idle") {
    // MATMUL's lanes-over-rows kernels: the widest of 64, 32, 16 lanes computing at most a fifth
    // more rows than the matrix has (stories260K: 64-row attention matrices, 172-row FFN ones).
    CHECK(matmulWidth(64, 4) == 16);
    CHECK(matmulWidth(64, 2) == 32);
    CHECK(matmulWidth(172, 2) == 32);  // 3 x 64 rows
    CHECK(matmulWidth(172, 4) == 16);  // 3 x 64 rows; 32 lanes would compute 256
    CHECK(matmulWidth(768, 4) == 64);
    CHECK(matmulWidth(32000, 4) == 64);
    CHECK(matmulWidth(1, 4) == 16);
    // SAMPLE: 64 lanes for small vocabularies under a loop limit (CPU drivers) only.
    CHECK(sampleWidth(65535, 512) == 64);
    CHECK(sampleWidth(65535, kNarrowSampleVocab) == 64);
    CHECK(sampleWidth(65535, kNarrowSampleVocab + 1) == 256);
    CHECK(sampleWidth(0, 512) == 256);
    // With the longest history (the context): the fewest lanes, from 8, whose penalty window
    // still reaches it (or the widest width's window); no limit, no narrowing.
    CHECK(sampleWidth(65535, 512, 512) == 8);          // stories260K at its context
    CHECK(sampleWidth(65535, 512, 1u << 20) == 64);    // past the widest's window: the widest
    CHECK(sampleWidth(65535, 32000, 64) == 16);        // 8 lanes' own walks pass the limit
    CHECK(sampleWidth(65535, 32000, 2048) == 32);
    CHECK(sampleWidth(65535, 32000, 1u << 20) == 256);
    CHECK(sampleWidth(0, 512, 512) == 256);
    for (uint32_t history : {64u, 512u, 2048u, 8192u}) {
        for (uint32_t vocab : {512u, 4096u, 32000u, 152064u}) {
            CAPTURE(history);
            CAPTURE(vocab);
            const uint32_t w = sampleWidth(65535, vocab, history);
            CHECK(maxPenaltyWindow(65535, vocab, history) >= std::min(history, maxPenaltyWindow(65535, vocab)));
            CHECK(w <= sampleWidth(65535, vocab));
        }
    }
    // In a plan: the width is in the kernel's name and the grid follows it; GPU shapes keep their
    // own kernels at the widths they were built with.
    Module m = assembleOrFail(R"(.layout regs=4 max_rows=8 local=64
.tensor w global f32 [64, 64]
.tensor nw global f32 [64]
.tensor x rows f32 [64]
.tensor y rows f32 [64]
.tensor l instance f32 [512]
.block b args=2
    rmsnorm y, x, nw, 0.00001, 0
    matmul y, w, x
    sample l, 1
.end
halt
)");
    m.tensors[0].cls = BLUE_TC_WEIGHT;
    m.tensors[1].cls = BLUE_TC_WEIGHT;
    Result<PagePlan> pages = planPages(m, 2, 1u << 20);
    REQUIRE_MESSAGE(pages.isOk(), pages.message());
    KernelChoice cpu;
    cpu.loop_limit = deviceLoopLimit(true);
    Result<std::vector<DispatchDesc>> d = planDispatches(m, pages.value(), 65535, cpu);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    std::vector<std::string> names;
    for (const DispatchDesc& desc : d.value()) names.push_back(desc.pipeline);
    CHECK(names == std::vector<std::string>{"rmsnorm", "matmul_f32_b1@32", "matmul_f32@32", "matmul_f32_g@16",
                                            "sample@64"});
    CHECK(d.value()[0].tile == BLUE_RMS_ITEMS);  // RMSNORM: a lane per item
    CHECK(d.value()[1].fixed == 1);  // 64 rows / (32 lanes x 2 rows)
    KernelChoice gpu;
    gpu.split_matmul = true;
    gpu.split_attn = true;
    Result<std::vector<DispatchDesc>> g = planDispatches(m, pages.value(), 65535, gpu);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    names.clear();
    for (const DispatchDesc& desc : g.value()) names.push_back(desc.pipeline);
    CHECK(names == std::vector<std::string>{"rmsnorm_w", "matmul_f32_b1s", "matmul_f32_s", "matmul_f32_t", "sample"});
    // A width is a number after '@'; anything else names no kernel.
    CHECK(Pipelines::exists("matmul_q4_0@16"));
    CHECK(!Pipelines::exists("matmul_q4_0@"));
    CHECK(!Pipelines::exists("matmul_q4_0@0"));
    CHECK(!Pipelines::exists("matmul_q4_0@x16"));
    CHECK(!Pipelines::exists("nosuch@16"));
}

}  // namespace blue::test
