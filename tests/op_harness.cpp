// The per-op test harness (see op_harness.h).
#include "tests/op_harness.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "host/machine_plan.h"
#include "tests/gpu_fixture.h"
#include "vm/abi.h"
#include "vm/half.h"
#include "vm/quant.h"
#include "vm/verify.h"

namespace blue::test {

namespace {

constexpr uint64_t kMaxCycles = 1000;
constexpr uint32_t kNoBlock = 0xFFFFFFFFu;
// Registers of the generated program: r0 zero, r1 the instance id, r3-r7 scratch, r8-r12 the
// block arguments RUN passes.
constexpr uint8_t kArgReg = 8;

void runBlock(CodeBuilder& cb, uint32_t block, uint32_t rows, uint32_t pos) {
    cb.li(kArgReg + BLUE_FA_ROWS, rows);
    cb.li(kArgReg + BLUE_FA_POS, pos);
    cb.li(kArgReg + BLUE_FA_TOKENS, kTokens);
    cb.li(kArgReg + BLUE_FA_SAMPLING, BLUE_LM_SAMPLING);
    cb.li(kArgReg + BLUE_FA_SPEC, kSpecBlock);
    cb.op(Op::RUN, {kArgReg}, block);
}

std::vector<float> decodeFloats(DType t, const std::vector<uint8_t>& bytes) {
    std::vector<float> out;
    if (t == DType::F16) {
        out.resize(bytes.size() / 2);
        for (size_t i = 0; i < out.size(); ++i) {
            out[i] = halfToF32(uint16_t(bytes[2 * i] | bytes[2 * i + 1] << 8));
        }
    } else {
        REQUIRE(t == DType::F32);
        out.resize(bytes.size() / 4);
        for (size_t i = 0; i < out.size(); ++i) std::memcpy(&out[i], &bytes[4 * i], 4);
    }
    return out;
}

}  // namespace

OpModule::OpModule(uint32_t vocab, uint32_t max_rows, uint32_t local_words, uint32_t seed)
    : vocab_(vocab), rng_(seed) {
    m_.layout.regs = 16;
    m_.layout.local_words = local_words;
    m_.layout.max_rows = max_rows;
    m_.layout.max_steps = BLUE_MAX_STEPS;
    m_.layout.stack_depth = 1;
    m_.layout.mailbox_cap = 1;
    std::vector<float> tags(vocab);
    for (uint32_t v = 0; v < vocab; ++v) tags[v] = float(v + 1);
    uint32_t table = data("tag_table", BLUE_TC_WEIGHT, DType::F32, {1, vocab}, tags);
    tag_ = tensor("tag", BLUE_TC_ROWS, DType::F32, {1});
    inputs_.push_back({tag_, table});
}

uint32_t OpModule::tensor(const std::string& name, uint32_t cls, DType t,
                          std::vector<uint64_t> ne) {
    TensorDecl d;
    d.name = name;
    d.dtype = t;
    d.cls = cls;
    d.ndim = uint32_t(ne.size());
    for (size_t i = 0; i < ne.size(); ++i) d.ne[i] = ne[i];
    m_.tensors.push_back(d);
    return uint32_t(m_.tensors.size() - 1);
}

uint32_t OpModule::data(const std::string& name, uint32_t cls, DType t, std::vector<uint64_t> ne,
                        const std::vector<float>& values) {
    uint32_t index = tensor(name, cls, t, ne);
    TensorDecl& d = m_.tensors[index];
    const uint64_t row = d.ne[0], rows = d.elements() / row;
    REQUIRE(values.size() == d.elements());
    const uint64_t row_bytes = *dtypeRowBytes(t, row);
    m_.data.resize((m_.data.size() + 63) & ~size_t(63));
    d.source = DataSource::DATA;
    d.offset = m_.data.size();
    d.bytes = row_bytes * rows;
    m_.data.resize(d.offset + d.bytes);
    for (uint64_t r = 0; r < rows; ++r) {
        quantizeRow(t, values.data() + r * row, m_.data.data() + d.offset + r * row_bytes,
                    int64_t(row));
    }
    return index;
}

std::vector<float> OpModule::random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
}

uint32_t OpModule::rowsInput(const std::string& name, uint32_t width, float lo, float hi) {
    return rowsInput(name, width, random(size_t(width) * vocab_, lo, hi));
}

uint32_t OpModule::rowsInput(const std::string& name, uint32_t width,
                             const std::vector<float>& table_values) {
    uint32_t table =
        data(name + "_table", BLUE_TC_WEIGHT, DType::F32, {width, vocab_}, table_values);
    uint32_t rows = tensor(name, BLUE_TC_ROWS, DType::F32, {width});
    inputs_.push_back({rows, table});
    return rows;
}

uint32_t OpModule::emitBlock(CodeBuilder& cb, const char* name, const std::vector<Instr>& instrs) {
    uint32_t block = cb.beginBlock(name, kBlockArgs);
    for (auto [rows, table] : inputs_) cb.tensor(Op::EMBED, {rows, table, BLUE_FA_TOKENS});
    for (const Instr& in : instrs) {
        m_.tcode.push_back(encodeTensorHeader(uint8_t(in.op), uint32_t(in.operands.size())));
        m_.tcode.insert(m_.tcode.end(), in.operands.begin(), in.operands.end());
    }
    cb.endBlock();
    return block;
}

void OpModule::emitInstance(CodeBuilder& cb, const InstancePlan& plan, uint32_t fill_block,
                            uint32_t step_block) {
    for (const auto& [t, values] : plan.tensor_words) {
        for (uint32_t j = 0; j < values.size(); ++j) {
            // Both machines start every tensor at zero: a zero word needs no store (wide tables
            // that are mostly zero stay small programs).
            if (std::bit_cast<uint32_t>(values[j]) == 0) continue;
            cb.li(3, std::bit_cast<uint32_t>(values[j]));
            cb.li(4, j);
            cb.op(Op::TST, {3, 4}, t);
        }
    }
    for (auto [addr, word] : plan.local_words) {
        cb.li(3, word);
        cb.op(Op::ST, {3, 0}, addr);
    }
    if (fill_block != kNoBlock) {
        REQUIRE(plan.prefill > 0);
        cb.li(5, plan.prefill_token);
        cb.li(6, plan.prefill_token + plan.prefill);
        cb.li(7, kTokens);
        CodeBuilder::Label loop = cb.newLabel();
        cb.bind(loop);
        cb.op(Op::ST, {5, 7}, 0);
        cb.op(Op::ADDI, {5, 5}, 1);
        cb.op(Op::ADDI, {7, 7}, 1);
        cb.jump(Op::BLTU, {5, 6}, loop);
        runBlock(cb, fill_block, plan.prefill, 0);
    }
    REQUIRE(plan.tokens.size() == plan.rows);
    for (uint32_t j = 0; j < plan.rows; ++j) {
        cb.li(3, plan.tokens[j]);
        cb.op(Op::ST, {3, 0}, kTokens + j);
    }
    for (uint32_t r = 0; r < plan.runs; ++r) {
        runBlock(cb, step_block, plan.rows, plan.pos);
        for (uint32_t addr : output_words_) {
            cb.op(Op::LD, {3, 0}, addr);
            cb.op(Op::OUT, {3});
        }
        if (!outputs_after_run_) continue;
        const Op kinds[] = {Op::OUT, Op::OUTF, Op::OUTF};
        const uint32_t words[] = {BLUE_SP_OUT_TOKEN, BLUE_SP_OUT_ENTROPY, BLUE_SP_OUT_LOGPROB};
        for (int k = 0; k < 3; ++k) {
            cb.op(Op::LD, {3, 0}, BLUE_LM_SAMPLING + words[k]);
            cb.op(kinds[k], {3});
        }
    }
}

Module OpModule::build(const std::vector<InstancePlan>& plans) {
    REQUIRE_MESSAGE(m_.blocks.empty(), "OpModule::build runs once");
    CodeBuilder cb(&m_);
    uint32_t fill_block = fill_.empty() ? kNoBlock : emitBlock(cb, "fill", fill_);
    uint32_t step_block = emitBlock(cb, "step", step_);
    cb.li(0, 0);
    cb.op(Op::IID, {1});
    for (uint32_t i = 0; i < plans.size(); ++i) {
        CodeBuilder::Label next = cb.newLabel();
        cb.li(2, i);
        cb.jump(Op::BNE, {1, 2}, next);
        emitInstance(cb, plans[i], fill_block, step_block);
        cb.op(Op::HALT);
        cb.bind(next);
    }
    cb.op(Op::HALT);
    Status s = cb.finish();
    REQUIRE_MESSAGE(s.isOk(), s.message());
    s = verifyModule(m_);
    REQUIRE_MESSAGE(s.isOk(), s.message());
    for (const BlockDecl& b : m_.blocks) {
        std::vector<TensorInstr> instrs;
        REQUIRE(decodeBlock(m_, b, &instrs).isOk());
        for (const TensorInstr& ti : instrs) {
            kernelsRun().insert(kernelName(m_, uint32_t(ti.op), ti.args));
        }
    }
    return m_;
}

std::set<std::string>& kernelsRun() {
    static std::set<std::string> names;
    return names;
}

std::vector<uint8_t> BothMachines::gpuBytes(uint32_t tensor) const {
    std::vector<uint8_t> out;
    Status s = gpu->readTensor(tensor, &out);
    REQUIRE_MESSAGE(s.isOk(), s.message());
    return out;
}

const std::vector<uint8_t>& BothMachines::refBytes(uint32_t tensor) const {
    return ref->tensors().data[tensor];
}

std::unique_ptr<BothMachines> runOnBoth(const Module& m, uint32_t instances, Gpu* on, uint64_t vram_budget,
                                        const std::function<void(GpuOptions&)>& tweak) {
    auto b = std::make_unique<BothMachines>();
    b->module = &m;
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE_MESSAGE(w.isOk(), w.message());
    b->weights = std::make_unique<WeightSource>(std::move(w.value()));
    b->ref = std::make_unique<RefMachine>(m, *b->weights, MachineOptions{instances, kMaxCycles});
    b->ref->closeInput();
    b->ref_report = b->ref->run();
    GpuOptions opt;
    opt.instances = instances;
    opt.max_cycles = kMaxCycles;
    opt.chain_cycles = 8;
    opt.vram_budget = vram_budget;
    // One plan on every device: AUTO streams on a discrete GPU, whose two stream slots would take
    // the budget the cases size for their expert caches (seen on an H100: one cache slot, not two).
    if (vram_budget) opt.host_weights = GpuOptions::HostWeights::READ;
    if (tweak) tweak(opt);
    Gpu& dev = on ? *on : gpu();
    auto g = GpuMachine::create(*dev.device, *dev.pipelines, m, *b->weights, opt);
    // Under an emulated device profile (BLUE_DEVICE_LIMITS) a test tensor may be larger than the
    // profile's page: refused at load with the tensor's name, as a user would see it.
    const char* limits = std::getenv("BLUE_DEVICE_LIMITS");
    if (!g && limits && *limits &&
        g.message().find("more than the device's largest") != std::string::npos) {
        MESSAGE("refused under the device profile " << std::string(limits) << ": " << g.message());
        return nullptr;
    }
    REQUIRE_MESSAGE(g.isOk(), g.message());
    b->gpu = std::move(g.value());
    b->gpu->closeInput();
    Result<RunReport> r = b->gpu->run();
    REQUIRE_MESSAGE(r.isOk(), r.message());
    b->gpu_report = std::move(r.value());
    for (const RunReport* rep : {&b->ref_report, &b->gpu_report}) {
        REQUIRE_MESSAGE(rep->status.isOk(), rep->status.message());
        REQUIRE(rep->instances.size() == instances);
        for (const InstanceReport& ir : rep->instances) {
            INFO(describeFaults(m, rep->instances));
            REQUIRE(ir.status == BLUE_ST_HALTED);
        }
    }
    return b;
}

void ErrorStat::add(double gpu, double ref) {
    ++compared;
    if (!std::isfinite(gpu) || !std::isfinite(ref)) {
        if (!(gpu == ref)) max_err = INFINITY;
        return;
    }
    max_err = std::max(max_err, std::fabs(gpu - ref));
    max_ref = std::max(max_ref, std::fabs(ref));
}

std::vector<uint32_t> rowTags(const BothMachines& b, uint32_t rows, bool on_gpu) {
    const std::vector<TensorDecl>& ts = b.module->tensors;
    auto it =
        std::find_if(ts.begin(), ts.end(), [](const TensorDecl& t) { return t.name == "tag"; });
    REQUIRE(it != ts.end());
    const uint32_t tag = uint32_t(it - ts.begin());
    std::vector<float> v = decodeFloats(DType::F32, on_gpu ? b.gpuBytes(tag) : b.refBytes(tag));
    REQUIRE(v.size() >= rows);
    return std::vector<uint32_t>(v.begin(), v.begin() + rows);
}

ErrorStat compareTensor(const BothMachines& b, uint32_t tensor, uint32_t rows) {
    const TensorDecl& t = b.module->tensors[tensor];
    CAPTURE(t.name);
    std::vector<float> g = decodeFloats(t.dtype, b.gpuBytes(tensor));
    std::vector<float> r = decodeFloats(t.dtype, b.refBytes(tensor));
    REQUIRE(g.size() == r.size());
    ErrorStat e;
    if (t.cls != BLUE_TC_ROWS) {
        for (size_t i = 0; i < g.size(); ++i) e.add(g[i], r[i]);
        return e;
    }
    const std::vector<uint32_t> gt = rowTags(b, rows, true), rt = rowTags(b, rows, false);
    std::map<uint32_t, uint32_t> ref_row;
    for (uint32_t i = 0; i < rows; ++i) REQUIRE(ref_row.emplace(rt[i], i).second);
    const uint64_t n = t.elements();
    for (uint32_t i = 0; i < rows; ++i) {
        auto it = ref_row.find(gt[i]);
        INFO("GPU row " << i << " has tag " << gt[i]);
        REQUIRE(it != ref_row.end());
        for (uint64_t k = 0; k < n; ++k) e.add(g[i * n + k], r[it->second * n + k]);
    }
    return e;
}

}  // namespace blue::test
