// The generic per-op test: every tensor opcode of the table (vm/opcodes.def), in every kernel
// variant built (each MATMUL/EMBED weight type, F32 and F16 KV caches), runs on the GPU and on the
// reference machine (vm/tensor_ops*.cpp, the specification), and the tensors it writes must
// match by normalised error max |gpu - ref| / (max |ref| + 1e-30), within a bound stated and
// justified beside each case. Instances ask for the block together with ragged row counts
// (1, 3, 2, ...), at positions that do not start at 0, with widths that are not multiples of
// the workgroup sizes; inputs are seeded random values (embedded ROWS rows, TST-written INSTANCE
// slices, WEIGHT and GLOBAL data, quantized with quantizeRow). SAMPLE is checked draw by draw
// (test_ops_gpu_sample.cpp); RoPE, KV store and attention live in test_ops_gpu_llm.cpp, their paged
// forms (KVSTOREP, ATTNP, PGCOPY, KVCOPYP) in test_ops_gpu_kvpages.cpp. A tensor op
// without a case here fails the test, and so does a kernel that is built but that no case
// dispatches.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "host/pipelines.h"
#include "shaders/embedded.h"
#include "tests/gpu_fixture.h"
#include "host/machine_plan.h"
#include "tests/op_harness.h"
#include "tests/test_ops_gpu.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/tensor_ops.h"
#include "vm/verify.h"

namespace blue::test {

std::vector<OpMeasure>& opMeasures() {
    static std::vector<OpMeasure> all;
    return all;
}

void expectClose(const BothMachines& b, uint32_t tensor, uint32_t rows, double bound,
                 const std::string& what, double abs_bound) {
    ErrorStat e = compareTensor(b, tensor, rows);
    bound += abs_bound / (e.max_ref + 1e-30);
    INFO(what << ": max normalised error " << e.normalised() << " (max error " << e.max_err << ", max |ref| "
              << e.max_ref << ") over " << e.compared << " values (bound " << bound << ")");
    CHECK(e.compared > 0);
    CHECK(e.normalised() <= bound);
    opMeasures().push_back({what, e.normalised(), bound});
}

std::vector<InstancePlan> raggedPlans(OpModule& om, const std::vector<uint32_t>& rows,
                                      const std::vector<uint32_t>& pos) {
    std::vector<uint32_t> tokens(om.vocab());
    std::iota(tokens.begin(), tokens.end(), 0u);
    std::shuffle(tokens.begin(), tokens.end(), om.rng());
    std::vector<InstancePlan> plans(rows.size());
    size_t next = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        plans[i].rows = rows[i];
        plans[i].pos = pos[i];
        for (uint32_t r = 0; r < rows[i]; ++r) plans[i].tokens.push_back(tokens.at(next++));
    }
    return plans;
}

uint32_t totalRows(const std::vector<InstancePlan>& plans) {
    uint32_t n = 0;
    for (const InstancePlan& p : plans) n += p.rows;
    return n;
}

std::string lowerName(DType t) {
    std::string r(dtypeName(t));
    for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

namespace {

constexpr uint32_t kVocab = 64;
constexpr uint32_t kWide = 172;  // a row width that is no multiple of 32, 64 or 256

// Variants that must be built: MATMUL and EMBED weight types, KVSTORE and ATTN cache types.
// Whatever else shaders/CMakeLists.txt builds is found and tested too.
constexpr std::initializer_list<DType> kWeightTypes = {
    DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::IQ4_NL, DType::IQ4_XS};
constexpr std::initializer_list<DType> kCacheTypes = {DType::F32, DType::F16};

uint32_t roundUp(uint32_t n, uint32_t block) {
    return (n + block - 1) / block * block;
}

std::vector<DType> allTypes() {
#define BLUE_TYPE_ITEM(name, id, be, bb, sup) DType::name,
    return {BLUE_DTYPES(BLUE_TYPE_ITEM)};
#undef BLUE_TYPE_ITEM
}

// The types `<op>_<type>` kernels are built for, e.g. every MATMUL weight type.
std::vector<DType> kernelTypes(const char* op) {
    std::vector<DType> out;
    for (DType t : allTypes()) {
        if (Pipelines::exists(std::string(op) + "_" + lowerName(t))) out.push_back(t);
    }
    return out;
}

// The types of `op`'s typed kernels, checking that `required` are among them.
std::vector<DType> kernelTypes(const char* op, std::initializer_list<DType> required) {
    std::vector<DType> types = kernelTypes(op);
    for (DType t : required) {
        CHECK_MESSAGE(std::count(types.begin(), types.end(), t) == 1,
                      "no " << op << "_" << lowerName(t) << " kernel");
    }
    return types;
}

// TADD, TMUL, SWIGLU, GEGLU (binary) and TSCALE, SOFTCAP (with a float): a ROWS destination from two ROWS
// inputs and from a ROWS input and a broadcast WEIGHT; an INSTANCE destination from a ROWS input
// (the instance's last row) and a broadcast GLOBAL, and from an INSTANCE input. Variants the
// op's rules reject (SWIGLU writes only ROWS) are left out.
void elementwiseCase(Op op, double bound) {
    constexpr uint32_t kWidth = 300;  // two 256-wide workgroups, the second partial
    OpModule om(kVocab, 8, kTokens + 8, 0xE1E0 + uint32_t(op));
    const bool binary = opInfo(op).format[2] == 't';
    uint32_t a = om.rowsInput("a", kWidth, -4, 4), b = om.rowsInput("b", kWidth, -4, 4);
    uint32_t w = om.data("w", BLUE_TC_WEIGHT, DType::F32, {kWidth}, om.random(kWidth, -2, 2));
    uint32_t g = om.data("g", BLUE_TC_GLOBAL, DType::F32, {kWidth}, om.random(kWidth, -2, 2));
    uint32_t bi = om.tensor("b_inst", BLUE_TC_INSTANCE, DType::F32, {kWidth});
    struct Variant {
        const char* what;
        uint32_t cls, in1, in2;
    };
    std::vector<Variant> variants = {{"rows", BLUE_TC_ROWS, a, b},
                                     {"rows x weight", BLUE_TC_ROWS, a, w},
                                     {"instance x global", BLUE_TC_INSTANCE, a, g},
                                     {"instance", BLUE_TC_INSTANCE, bi, a}};
    if (!binary) {
        // SOFTCAP's cap must be positive; 1.75 against inputs in [-4, 4] bends most of them.
        variants = {{"rows", BLUE_TC_ROWS, a, std::bit_cast<uint32_t>(op == Op::SOFTCAP ? 1.75f : -1.75f)},
                    {"instance", BLUE_TC_INSTANCE, bi, std::bit_cast<uint32_t>(0.3f)}};
    }
    std::vector<std::pair<uint32_t, std::string>> outputs;
    for (const Variant& v : variants) {
        uint32_t dst = om.tensor(std::string("out ") + v.what, v.cls, DType::F32, {kWidth});
        TensorInstr ti{op, 0, {dst, v.in1, v.in2}};
        if (!checkTensorOp(om.module(), ti).isOk()) continue;
        om.step(op, ti.args);
        outputs.push_back({dst, std::string(opInfo(op).name) + " " + v.what});
    }
    REQUIRE(outputs.size() >= 2);
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {5, 0, 9});
    for (InstancePlan& p : plans) p.tensor_words.push_back({bi, om.random(kWidth, -4, 4)});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    for (const auto& [dst, what] : outputs) expectClose(*both, dst, totalRows(plans), bound, what);
}

// MATMUL with a [K, N] weight of type t: K = 172 rounded up to the type's block, N = 172 (three
// 64-row workgroups, the last partial); a ROWS and an INSTANCE destination. Run twice: 11 rows in
// 5 instances (three 4-item tiles, the last partial: the batched kernel), and one row in one
// instance (the plan kernel picks the single-item `_b1` variant when one item asks). Both run once
// more as on a GPU, where the plan gives them the split-K kernels (`_s`, `_b1s`: 22 row groups of
// 8, the last partial, and more lanes per row than K has units). Types with
// a CPU GEMM kernel run a third time: 21 rows against N = 300, which the plan gives to `_g` (a
// full 16-item tile and a partial one; two workgroups of 256 rows, the second partial) or `_i` (a
// partial 32-item tile, 19 workgroups of 16 rows, the last partial), then 70 rows (several item
// tiles, the last partial). Every
// type runs those 21 rows once more as on a GPU, where the plan gives them the shared-memory tiled
// `_t` (one partial 64-item tile; N = 300: five 64-row tiles, the last partial). On a CPU driver
// these small matrices run narrowed workgroups (matmulWidth: 32 or 16 lanes for N = 172, 16 for
// `_g` at N = 300), so each lanes-over-rows kernel runs once more at its built 64 lanes, N = 512.
// The CPU GEMM and the 4-item tile run once more over K = 600 (block types: three 256-element
// groups of blocks, the last partial; the kernels walk them with their scales reloaded per group).
// Block types run the int8 GEMM (where the device has integer dot products) twice: `_tq` over 70
// items with GPU shapes (a full 64-item tile and a partial one), and 21 items over K = 600 with
// CPU shapes, where Q4_0, Q4_K, Q5_K and Q6_K run their SWAR `_iq` on x packed by PACKX (the same
// rounding and bound) and the other types keep `_i`; those four then run one item and 4-item
// tiles over K = 600 on packed x too (`_b1q`, `_q`). Every other run turns it off, whatever the
// device prefers.
void matmulCase(DType t) {
    struct Run {
        std::vector<uint32_t> rows, starts;
        uint32_t n;
        GpuOptions::DecodeKernel decode;  // one item's and the 4-item tile's kernels: `_b1`/tile (ROWS), `_b1s`/`_s` (SPLIT)
        uint32_t k = kWide;               // rounded up to the type's block
        bool int8 = false;                // the int8 GEMM (`_tq`) for the GEMM's items
    };
    using DK = GpuOptions::DecodeKernel;
    std::vector<Run> runs = {{{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}, kWide, DK::ROWS},
                             {{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}, kWide, DK::SPLIT},
                             {{1}, {3}, kWide, DK::ROWS},
                             {{1}, {3}, kWide, DK::SPLIT}};
    // The CPU drivers' GEMM: lanes over items (`_i`) where the type has it, else register tiles (`_g`).
    const std::string prefix = "matmul_" + lowerName(t);
    const std::string gemm = Pipelines::exists(prefix + "_i") ? prefix + "_i" : prefix + "_g";
    if (Pipelines::exists(gemm)) runs.push_back({{6, 5, 8, 2}, {1, 3, 0, 5}, 300, DK::AUTO});
    if (Pipelines::exists(gemm)) runs.push_back({{30, 25, 15}, {0, 2, 1}, 300, DK::AUTO});  // 70 items: tiles of 32 or 16
    // K = 600: three 256-element groups of blocks, the last partial (block types), for the GEMMs
    // and the 4-item tile.
    if (Pipelines::exists(gemm)) runs.push_back({{6, 5, 8, 2}, {1, 3, 0, 5}, 300, DK::AUTO, 600});
    runs.push_back({{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}, 300, DK::ROWS, 600});
    runs.push_back({{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}, 512, DK::ROWS});
    runs.push_back({{1}, {3}, 512, DK::ROWS});
    if (Pipelines::exists(gemm)) runs.push_back({{6, 5, 8, 2}, {1, 3, 0, 5}, 512, DK::AUTO});
    runs.push_back({{6, 5, 8, 2}, {1, 3, 0, 5}, 300, DK::SPLIT});  // 21 items: split-K tiles on GPUs
    runs.push_back({{30, 25, 15}, {0, 2, 1}, 300, DK::SPLIT});  // 70 items: a full GEMM tile and a partial one
    if (Pipelines::exists(prefix + "_tq") && gpu().device->info().int_dot) {
        runs.push_back({{30, 25, 15}, {0, 2, 1}, 300, DK::SPLIT, kWide, true});
        runs.push_back({{6, 5, 8, 2}, {1, 3, 0, 5}, 300, DK::ROWS, 600, true});
        if (Pipelines::exists(prefix + "_iq")) {  // the one-item and 4-item kernels on packed x
            runs.push_back({{1}, {3}, kWide, DK::ROWS, 600, true});
            runs.push_back({{1, 3, 2, 4, 1}, {0, 4, 8, 1, 2}, 300, DK::ROWS, 600, true});
        }
    }
    for (const Run& run : runs) {
        const uint32_t k = roundUp(run.k, dtypeInfo(t)->block_elems), n = run.n;
        const uint32_t total = std::accumulate(run.rows.begin(), run.rows.end(), 0u);
        OpModule om(std::max(kVocab, total), std::max(24u, total), kTokens + std::max(8u, total), 0x3A7 + uint32_t(t));
        uint32_t x = om.rowsInput("x", k, -1, 1);
        std::vector<float> wv = om.random(size_t(k) * n, -1, 1);
        uint32_t w = om.data("w", BLUE_TC_WEIGHT, t, {k, n}, wv);
        uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {n});
        uint32_t yi = om.tensor("y_inst", BLUE_TC_INSTANCE, DType::F32, {n});
        uint32_t acc = om.tensor("y_acc", BLUE_TC_ROWS, DType::F32, {n});
        om.step(Op::MATMUL, {y, w, x});
        om.step(Op::MATMUL, {yi, w, x});
        // MATMULADD (the same kernels, adding into dst): y_acc = y + W x = 2 W x.
        om.step(Op::TSCALE, {acc, y, std::bit_cast<uint32_t>(1.0f)});
        om.step(Op::MATMULADD, {acc, w, x});
        // MATMULGLU (the same kernels, gating dst): y_silu = silu(W x) * (0.5 W x), y_gelu alike.
        uint32_t silu = om.tensor("y_silu", BLUE_TC_ROWS, DType::F32, {n});
        uint32_t gelu = om.tensor("y_gelu", BLUE_TC_ROWS, DType::F32, {n});
        om.step(Op::TSCALE, {silu, y, std::bit_cast<uint32_t>(0.5f)});
        om.step(Op::MATMULGLU, {silu, w, x, BLUE_GLU_SILU});
        om.step(Op::TSCALE, {gelu, y, std::bit_cast<uint32_t>(0.5f)});
        om.step(Op::MATMULGLU, {gelu, w, x, BLUE_GLU_GELU});
        // Three MATMULs over x stacked into one dispatch (host/matmul_groups.h: matrices of 24, 8
        // and 16 rows back to back, the results views of one interleaved row), one view then read
        // by TADD through its stride.
        std::vector<uint32_t> stack;
        for (uint32_t r : {24u, 8u, 16u}) {
            const std::string rs = std::to_string(r);
            const uint32_t ws = om.data("ws" + rs, BLUE_TC_WEIGHT, t, {k, r}, om.random(size_t(k) * r, -1, 1));
            stack.push_back(om.tensor("z" + rs, BLUE_TC_ROWS, DType::F32, {r}));
            om.step(Op::MATMUL, {stack.back(), ws, x});
        }
        const uint32_t twice = om.tensor("z8_twice", BLUE_TC_ROWS, DType::F32, {8});
        om.step(Op::TADD, {twice, stack[1], stack[1]});
        std::vector<InstancePlan> plans = raggedPlans(om, run.rows, run.starts);
        Module m = om.build(plans);
        Result<PagePlan> stacked = planPages(m, uint32_t(plans.size()), 1u << 20, 0, false, true, true);
        REQUIRE_MESSAGE(stacked.isOk(), stacked.message());
        CHECK(stacked->matmul_groups.size() == 1);
        auto both = runOnBoth(m, uint32_t(plans.size()), nullptr, 0,
                              [&](GpuOptions& o) {
                                  o.decode_kernel = run.decode;
                                  o.int8_matmul = run.int8 ? GpuOptions::Int8Matmul::ON : GpuOptions::Int8Matmul::OFF;
                              });
        if (!both) return;
        const uint32_t items = totalRows(plans);
        const bool split = run.decode == DK::SPLIT;
        const bool single = items == 1, tiled = items >= defaultGemmMinItems(split);
        const std::string kernel = kernelName(m, uint32_t(Op::MATMUL), {y, w, x});
        // On a CPU driver the int8 mode gives Q4_0, Q4_K, Q5_K and Q6_K kernels on x packed first
        // by PACKX (`_b1q`, `_q`, `_iq`) and keeps the float ones for the other types.
        const bool swar = run.int8 && !split && Pipelines::exists(kernel + "_iq");
        if (swar) kernelsRun().insert("packx");
        if (single) kernelsRun().insert(kernel + (split ? "_b1s" : swar ? "_b1q" : "_b1"));
        if (!single && !tiled) kernelsRun().insert(split ? kernel + "_s" : swar ? kernel + "_q" : kernel);
        if (tiled) kernelsRun().insert(swar ? kernel + "_iq" : run.int8 && split ? kernel + "_tq" : split ? kernel + "_t" : gemm);
        // The GPU accumulates K products in float, the reference in double. Recursive summation
        // errs by at most K * 2^-24 * sum |w x| (~1.1e-5 * 48 for K = 192, |w|, |x| <= 1),
        // against max |ref| of about 10: 1e-4 holds in any summation order. Weights dequantize
        // exactly (d * q has at most 19 significant bits) on both machines. The worst case grows
        // with K: the K = 600 runs get it scaled.
        const double bound = 1e-4 * std::max(1.0, k / 192.0);
        const std::string name = "MATMUL " + lowerName(t) + (single ? " single item" : tiled ? " GEMM tile" : "") +
                                 (split ? " GPU shape" : "") + (run.int8 ? " int8" : "");
        // The int8 GEMM rounds each x to its unit's step dx = max |x| / 127 <= 1/127: an error
        // uniform in +-dx/2 (variance <= dx^2 / 12), independent across elements, times a weight
        // of mean square 1/3 (uniform in [-1, 1]). A row's sum then errs with a standard deviation
        // of at most sqrt(K / 36) / 127 (0.018 for K = 192, 0.032 for K = 600); the test allows
        // six of them on top of the float bound (a chance below 1e-8 per value of failing a
        // correct kernel), against max |ref| of about 10: a wrong scale, half or sign is off by
        // whole units.
        const double int8_abs = run.int8 ? 6.0 * std::sqrt(k / 36.0) / 127.0 : 0.0;
        auto check = [&](uint32_t tensor, uint32_t rows, double factor, const std::string& what) {
            expectClose(*both, tensor, rows, factor * bound, what, factor * int8_abs);
        };
        check(y, items, 1, name + " rows");
        check(yi, 0, 1, name + " instance");
        check(acc, items, 2, name + " accumulated (MATMULADD)");
        // The product's error (1e-4 of max |W x|, about 10) through the activation (slope <= 1.1)
        // times the gated value (up to 5), and the gated value's own: a few 1e-4 of max |ref|.
        check(silu, items, 10, name + " gating (MATMULGLU silu)");
        check(gelu, items, 10, name + " gating (MATMULGLU gelu)");
        for (uint32_t z : stack) check(z, items, 1, name + " stacked (" + m.tensors[z].name + ")");
        check(twice, items, 2, name + " stacked, read through its view (TADD)");
    }
}

// A matrix that is not a WEIGHT is refused at load with the reason: the kernels read matrices in
// the GPU weight layout.
TEST_CASE("ops gpu: a MATMUL over a GLOBAL matrix is refused at load") {
    OpModule om(kVocab, 16, kTokens + 8, 0x3A7);
    uint32_t x = om.rowsInput("x", 64, -1, 1);
    uint32_t wg = om.data("wg", BLUE_TC_GLOBAL, DType::F32, {64, 8}, om.random(64 * 8, -1, 1));
    uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {8});
    om.step(Op::MATMUL, {y, wg, x});
    std::vector<InstancePlan> plans = raggedPlans(om, {1}, {0});
    Module m = om.build(plans);
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    GpuOptions opt;
    auto g = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w.value(), opt);
    REQUIRE(!g.isOk());
    CHECK(g.message().find("MATMUL: the matrix 'wg' is not a WEIGHT tensor") != std::string::npos);
}

// EMBED from a [D, vocab] table of type t (D = 172 rounded up to the block); the rows' tokens
// include the last one and one past the vocabulary (a zero row).
void embedCase(DType t) {
    const uint32_t d = roundUp(kWide, dtypeInfo(t)->block_elems);
    OpModule om(kVocab, 8, kTokens + 8, 0xE3B + uint32_t(t));
    uint32_t table =
        om.data("table", BLUE_TC_WEIGHT, t, {d, kVocab}, om.random(size_t(d) * kVocab, -2, 2));
    uint32_t e = om.tensor("e", BLUE_TC_ROWS, DType::F32, {d});
    om.step(Op::EMBED, {e, table, BLUE_FA_TOKENS});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {0, 0, 0});
    plans[0].tokens = {kVocab - 1};
    plans[1].tokens = {3, kVocab + 7, 0};
    plans[2].tokens = {17, 42};
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // Dequantization is exact in float for the plain types, Q8_0, Q4_0 and the IQ4 types (a copy,
    // or d * q with at most 19 significant bits; IQ4_XS's d * code * level at most 11 + 6 + 7):
    // identical rows. Formats with a second term (d * q - m) may round once more where a device
    // fuses the multiply-add: 1e-6.
    const bool exact = dtypeInfo(t)->block_elems == 1 || t == DType::Q8_0 || t == DType::Q4_0 ||
                       t == DType::IQ4_NL || t == DType::IQ4_XS;
    expectClose(*both, e, totalRows(plans), exact ? 0.0 : 1e-6, "EMBED " + lowerName(t));
}

// TSUM of 300-wide slices: ROWS into ROWS, an INSTANCE slice, and a row read per instance.
void tsumCase() {
    constexpr uint32_t kWidth = 300;
    OpModule om(kVocab, 8, kTokens + 8, 0x75);
    uint32_t a = om.rowsInput("a", kWidth, -1, 3);
    uint32_t ai = om.tensor("a_inst", BLUE_TC_INSTANCE, DType::F32, {kWidth});
    uint32_t s = om.tensor("s", BLUE_TC_ROWS, DType::F32, {1});
    uint32_t si = om.tensor("s_inst", BLUE_TC_INSTANCE, DType::F32, {1});
    uint32_t sl = om.tensor("s_last", BLUE_TC_INSTANCE, DType::F32, {1});
    om.step(Op::TSUM, {s, a});
    om.step(Op::TSUM, {si, ai});
    om.step(Op::TSUM, {sl, a});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {2, 0, 1});
    for (InstancePlan& p : plans) p.tensor_words.push_back({ai, om.random(kWidth, -1, 3)});
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // A float tree sum of n = 300 terms errs by at most log2(n) * 2^-24 * sum |a| (~5e-7 * 900)
    // against sums of about 300 (values in [-1, 3)): 1e-5 is ample.
    expectClose(*both, s, totalRows(plans), 1e-5, "TSUM rows");
    expectClose(*both, si, 0, 1e-5, "TSUM instance");
    expectClose(*both, sl, 0, 1e-5, "TSUM last row per instance");
}

// POOL in its three modes over ragged instances, some at position 0 (mean and first start afresh)
// and some later (mean folds the rows into the slice's earlier mean, first keeps it), the slices
// seeded with values of their own.
void poolCase() {
    constexpr uint32_t kWidth = 200;
    OpModule om(kVocab, 16, kTokens + 8, 0x9001);
    uint32_t a = om.rowsInput("a", kWidth, -2, 2);
    uint32_t mean = om.tensor("mean", BLUE_TC_INSTANCE, DType::F32, {kWidth});
    uint32_t first = om.tensor("first", BLUE_TC_INSTANCE, DType::F32, {kWidth});
    uint32_t last = om.tensor("last", BLUE_TC_INSTANCE, DType::F32, {kWidth});
    om.step(Op::POOL, {mean, a, BLUE_POOL_MEAN, BLUE_FA_POS});
    om.step(Op::POOL, {first, a, BLUE_POOL_FIRST, BLUE_FA_POS});
    om.step(Op::POOL, {last, a, BLUE_POOL_LAST, BLUE_FA_POS});
    std::vector<InstancePlan> plans = raggedPlans(om, {1, 5, 3, 4}, {0, 0, 7, 2});
    for (InstancePlan& p : plans) {
        for (uint32_t t : {mean, first, last}) p.tensor_words.push_back({t, om.random(kWidth, -2, 2)});
    }
    Module m = om.build(plans);
    auto both = runOnBoth(m, uint32_t(plans.size()));
    if (!both) return;
    // first and last copy a row: exact. mean: a float sum of at most 5 rows plus the scaled old
    // mean, then one division (Vulkan: 2.5 ULP), against doubles: a few 1e-7 relative.
    expectClose(*both, first, 0, 0.0, "POOL first");
    expectClose(*both, last, 0, 0.0, "POOL last");
    expectClose(*both, mean, 0, 1e-6, "POOL mean");

    // The mean of 640 rows of n_embd 8192 in one run: each lane sums its 128 elements over every
    // row, one row an iteration that was 82,000 loop iterations an invocation, past lavapipe's
    // 65,535 (KernelChoice::loop_limit): the last elements were never written there.
    constexpr uint32_t kWideWidth = 8192, kWideRows = 640;
    OpModule wide(kWideRows + 8, kWideRows, kTokens + kWideRows + 8, 0x9002);  // a token per row
    uint32_t wa = wide.rowsInput("a", kWideWidth, -2, 2);
    uint32_t wmean = wide.tensor("mean", BLUE_TC_INSTANCE, DType::F32, {kWideWidth});
    wide.step(Op::POOL, {wmean, wa, BLUE_POOL_MEAN, BLUE_FA_POS});
    Module wm = wide.build(raggedPlans(wide, {kWideRows}, {0}));
    auto wboth = runOnBoth(wm, 1);
    if (!wboth) return;
    // Float sums of 640 terms in row order against doubles: about 1e-6 of the largest mean; an
    // element left unwritten is off by its whole value.
    expectClose(*wboth, wmean, 0, 1e-4, "POOL mean, n_embd 8192 over 640 rows");
}

// RMSNORM over whole 172-wide rows, over groups of 64 and of 32 (the latter with a weight that is
// itself a ROWS tensor, read per row), into an INSTANCE destination, over 170-wide rows (no
// vec4 alignment) and over 96-wide rows. On a CPU driver a lane per item (texels where aligned,
// floats for the 170-wide rows). Run once more with GPU shapes: the wide `_w` kernel (vec4 reads
// where aligned, floats for the 170-wide rows).
void rmsnormCase() {
    for (auto decode : {GpuOptions::DecodeKernel::ROWS, GpuOptions::DecodeKernel::SPLIT}) {
        OpModule om(kVocab, 8, kTokens + 8, 0x4A5);
        uint32_t a = om.rowsInput("a", kWide, -3, 3), c = om.rowsInput("c", 192, -3, 3);
        uint32_t odd = om.rowsInput("odd", 170, -3, 3), mid = om.rowsInput("mid", 96, -3, 3);
        uint32_t wr = om.rowsInput("w_rows", 32, 0.5f, 1.5f);
        uint32_t w172 =
            om.data("w172", BLUE_TC_WEIGHT, DType::F32, {kWide}, om.random(kWide, 0.5f, 1.5f));
        uint32_t w170 = om.data("w170", BLUE_TC_WEIGHT, DType::F32, {170}, om.random(170, 0.5f, 1.5f));
        uint32_t w64 = om.data("w64", BLUE_TC_WEIGHT, DType::F32, {64}, om.random(64, 0.5f, 1.5f));
        uint32_t w96 = om.data("w96", BLUE_TC_WEIGHT, DType::F32, {96}, om.random(96, 0.5f, 1.5f));
        uint32_t n1 = om.tensor("n_row", BLUE_TC_ROWS, DType::F32, {kWide});
        uint32_t n2 = om.tensor("n_group64", BLUE_TC_ROWS, DType::F32, {192});
        uint32_t n3 = om.tensor("n_group32_rowweight", BLUE_TC_ROWS, DType::F32, {192});
        uint32_t ni = om.tensor("n_inst", BLUE_TC_INSTANCE, DType::F32, {kWide});
        uint32_t n5 = om.tensor("n_odd", BLUE_TC_ROWS, DType::F32, {170});
        uint32_t n6 = om.tensor("n_mid", BLUE_TC_ROWS, DType::F32, {96});
        const uint32_t eps5 = std::bit_cast<uint32_t>(1e-5f), eps6 = std::bit_cast<uint32_t>(1e-6f);
        om.step(Op::RMSNORM, {n1, a, w172, eps5, 0});
        om.step(Op::RMSNORM, {n2, c, w64, eps6, 64});
        om.step(Op::RMSNORM, {n3, c, wr, eps5, 32});
        om.step(Op::RMSNORM, {ni, a, w172, eps5, 0});
        om.step(Op::RMSNORM, {n5, odd, w170, eps5, 0});
        om.step(Op::RMSNORM, {n6, mid, w96, eps5, 0});
        std::vector<InstancePlan> plans = raggedPlans(om, {1, 3, 2}, {3, 0, 6});
        Module m = om.build(plans);
        auto both = runOnBoth(m, uint32_t(plans.size()), nullptr, 0, [&](GpuOptions& o) { o.decode_kernel = decode; });
        if (!both) return;
        const bool wide = decode == GpuOptions::DecodeKernel::SPLIT;
        if (wide) kernelsRun().insert("rmsnorm_w");
        // Float sum of squares (a few 2^-24 relative per term, tree order), inversesqrt (2 ULP in
        // Vulkan) and two products: a few 1e-7 relative per element; 1e-5 leaves margin.
        const uint32_t rows = totalRows(plans);
        const std::string kind = wide ? " (wide)" : "";
        expectClose(*both, n1, rows, 1e-5, "RMSNORM row" + kind);
        expectClose(*both, n2, rows, 1e-5, "RMSNORM groups of 64" + kind);
        expectClose(*both, n3, rows, 1e-5, "RMSNORM groups of 32, per-row weight" + kind);
        expectClose(*both, ni, 0, 1e-5, "RMSNORM instance" + kind);
        expectClose(*both, n5, rows, 1e-5, "RMSNORM 170-wide rows" + kind);
        expectClose(*both, n6, rows, 1e-5, "RMSNORM 96-wide rows" + kind);
    }
}

void runOpCase(Op op) {
    switch (op) {
        // Single IEEE operations, correctly rounded in Vulkan as in C++: identical results.
        case Op::TADD:
        case Op::TMUL:
        case Op::TSCALE:
            elementwiseCase(op, 0.0);
            return;
        // silu uses exp (3 + 2|x| ULP in Vulkan, |x| <= 4 here) and a division (2.5 ULP):
        // ~2e-6 relative at worst; 1e-5.
        case Op::SWIGLU:
            elementwiseCase(op, 1e-5);
            return;
        // GEGLU: exp of up to ~11 in magnitude (|x| <= 4: 25 ULP, 3e-6 relative), a division and
        // the cubic; SOFTCAP: exp of up to 2|x|/cap < 5 and a division: 1e-5 for both.
        case Op::GEGLU:
        case Op::SOFTCAP:
            elementwiseCase(op, 1e-5);
            return;
        case Op::MATMUL:
            for (DType t : kernelTypes("matmul", kWeightTypes)) matmulCase(t);
            return;
        case Op::EMBED:
            for (DType t : kernelTypes("embed", kWeightTypes)) embedCase(t);
            return;
        case Op::TSUM:
            tsumCase();
            return;
        case Op::RMSNORM:
            rmsnormCase();
            return;
        case Op::ROPE:
            ropeCase();
            return;
        case Op::ROPEQK:
            ropeqkCase();
            return;
        case Op::KVSTORE:
            for (DType t : kernelTypes("kvstore", kCacheTypes)) {
                kvstoreCase(t);
                ropekvCase(t);  // ROPEQK and KVSTORE as one dispatch
            }
            return;
        case Op::ATTN:
            for (DType t : kernelTypes("attn", kCacheTypes)) attnCase(t);
            return;
        case Op::ATTNX:
            for (DType t : kernelTypes("attnx", kCacheTypes)) attnxCase(t);
            return;
        case Op::SAMPLE:
            for (uint32_t h : kSampleHistories) sampleCase(h);
            return;
        case Op::SAMPLEQ:
            for (uint32_t h : kSampleHistories) sampleqCase(h);
            return;
        case Op::SAMPLEG:
            for (uint32_t h : kSampleHistories) samplegCase(h);
            return;
        case Op::SPEC:
            specCase();
            return;
        case Op::SCORE:
            scoreCase();
            return;
        case Op::POOL:
            poolCase();
            return;
        case Op::KVCOPY:
            for (DType t : {DType::F32, DType::F16}) kvcopyCase(t);
            return;
        case Op::KVSTOREP:
            for (DType t : kernelTypes("kvstorep", kCacheTypes)) kvstorepCase(t);
            return;
        case Op::ATTNP:
            for (DType t : kernelTypes("attnp", kCacheTypes)) attnpCase(t);
            return;
        case Op::PGCOPY:
            for (DType t : {DType::F32, DType::F16}) pgcopyCase(t);
            return;
        case Op::KVCOPYP:
            for (DType t : {DType::F32, DType::F16}) kvcopypCase(t);
            return;
        case Op::MOEROUTE:
            moerouteCase();
            return;
        case Op::MOEMM:
            for (DType t : kernelTypes("moemm", kWeightTypes)) moemmCase(t);
            return;
        case Op::MATMULADD:
        case Op::MATMULGLU:
            return;  // in every MATMUL case (matmulCase), through every kernel variant
        case Op::MOEMIX:
            moemixCase();
            return;
        default:
            FAIL(
                "tensor op " << opInfo(op).name
                             << " has no GPU-vs-reference case: add one to tests/test_ops_gpu.cpp");
    }
}

// MATMUL and EMBED over matrices larger than a page of a device whose texel views hold 2048
// texels (32 KiB pages): planPages splits them by rows into pieces, one dispatch per piece.
void splitCases(Gpu& small) {
    struct Case {
        DType t;
        uint32_t pieces_w, pieces_table;  // pieces of the [256, 300] matrix and [256, 64] table
    };
    // 8 rows of K = 256: F32 8 KiB, Q4_0 and IQ4_XS 1152 bytes, Q6_K 1792 bytes
    // (host/weight_layout.h).
    for (const Case& c : {Case{DType::F32, 10, 2}, Case{DType::Q4_0, 2, 1}, Case{DType::Q6_K, 3, 1},
                          Case{DType::IQ4_XS, 2, 1}}) {
        INFO("type " << lowerName(c.t));
        const uint32_t k = 256, n = 300;
        for (const std::vector<uint32_t>& rows : {std::vector<uint32_t>{1}, {3, 2, 1}, {6, 5, 8}}) {
            OpModule om(kVocab, 24, kTokens + 8, 0x5B1 + uint32_t(c.t));
            uint32_t x = om.rowsInput("x", k, -1, 1);
            uint32_t w = om.data("w", BLUE_TC_WEIGHT, c.t, {k, n}, om.random(size_t(k) * n, -1, 1));
            uint32_t table = om.data("table", BLUE_TC_WEIGHT, c.t, {k, kVocab},
                                     om.random(size_t(k) * kVocab, -2, 2));
            uint32_t y = om.tensor("y", BLUE_TC_ROWS, DType::F32, {n});
            uint32_t yi = om.tensor("y_inst", BLUE_TC_INSTANCE, DType::F32, {n});
            uint32_t e = om.tensor("e", BLUE_TC_ROWS, DType::F32, {k});
            om.step(Op::MATMUL, {y, w, x});
            om.step(Op::MATMUL, {yi, w, x});
            om.step(Op::EMBED, {e, table, BLUE_FA_TOKENS});
            std::vector<InstancePlan> plans = raggedPlans(om, rows, std::vector<uint32_t>(rows.size(), 0));
            // Sets a row's token, swapping with the row that held it: rows keep distinct tokens,
            // which the comparison uses to pair GPU and reference rows.
            auto place = [&plans](size_t p, size_t r, uint32_t token) {
                const uint32_t displaced = plans[p].tokens[r];
                for (InstancePlan& q : plans) {
                    std::replace(q.tokens.begin(), q.tokens.end(), token, displaced);
                }
                plans[p].tokens[r] = token;
            };
            place(0, 0, kVocab - 1);  // the last row of the last piece
            if (rows.size() > 1) {
                place(1, 0, 3);
                place(1, 1, kVocab + 7);  // past the vocabulary: zeros
            }
            Module m = om.build(plans);
            Result<PagePlan> pages = planPages(m, uint32_t(plans.size()), small.device->maxPageBytes());
            REQUIRE_MESSAGE(pages.isOk(), pages.message());
            CHECK(pages->places[w].pieces.size() == c.pieces_w);
            CHECK(pages->places[table].pieces.size() == (c.pieces_table > 1 ? c.pieces_table : 0u));
            auto both = runOnBoth(m, uint32_t(plans.size()), &small);
            REQUIRE(both);
            const uint32_t items = totalRows(plans);
            // The same kernels as unsplit (see matmulCase and embedCase for the bounds).
            expectClose(*both, y, items, 1e-4, "MATMUL split " + lowerName(c.t) + " rows");
            expectClose(*both, yi, 0, 1e-4, "MATMUL split " + lowerName(c.t) + " instance");
            expectClose(*both, e, items, c.t == DType::Q6_K ? 1e-6 : 0.0, "EMBED split " + lowerName(c.t));
        }
    }
}

}  // namespace

TEST_CASE("ops gpu: MATMUL and EMBED over matrices split by rows across pages match the reference") {
    Gpu small;
    small.device = emulatedDevice(R"({"name": "split-pages", "device": "test",
  "source": "tests/test_ops_gpu.cpp", "limits": {"maxTexelBufferElements": 2048}})");
    REQUIRE(small.device->maxPageBytes() == 32768u);
    auto pipelines = Pipelines::create(*small.device);
    REQUIRE_MESSAGE(pipelines.isOk(), pipelines.message());
    small.pipelines = std::move(pipelines.value());
    splitCases(small);
    small.pipelines.reset();
    INFO("last validation message: " << small.device->lastValidationMessage());
    CHECK(small.device->validationErrors() == 0u);
}

TEST_CASE("ops gpu: every tensor op of the table matches the reference, in every kernel variant") {
    opMeasures().clear();
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        // KERNEL runs the module's own SPIR-V, which has no reference: tests/test_kernel.cpp runs it.
        if (!op->tensor || op->op == Op::KERNEL) continue;
        INFO("op " << op->name);
        runOpCase(op->op);
    }
    for (size_t i = 0; i < kEmbeddedShaderCount; ++i) {
        std::string name = kEmbeddedShaders[i].name;
        // Control kernels, run by every GPU test (sequencer_noballot: test_device_limits.cpp).
        if (name == "sequencer" || name == "sequencer_noballot" || name == "plan") continue;
        if (name.rfind("peak_", 0) == 0) continue;  // device ceilings: tests/test_peak.cpp
        if (!kernelChosen(name, gpu().device->info())) continue;  // e.g. `_tq` without integer dot products
        CHECK_MESSAGE(kernelsRun().count(name) == 1,
                      "kernel " << name << " is built but no case in test_ops_gpu.cpp runs it");
    }
    std::string table = "max normalised GPU-vs-reference error per op (bound):";
    for (const OpMeasure& m : opMeasures()) {
        table += strFormat("\n  %-44s %.3g (%.3g)", m.what.c_str(), m.err, m.bound);
    }
    MESSAGE(table);
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace blue::test
