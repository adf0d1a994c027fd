// The control semantics of Blue-IR (vm/interp.h is the specification): table-driven cases for
// every control op with expected results worked out here, by hand, from the op's definition in
// vm/opcodes.def; then the same programs on the GPU sequencer, which must match the reference
// machine record for record, with the final status, pc and fault of every instance.
#include <doctest/doctest.h>

#include <bit>
#include <climits>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "compiler/asm.h"
#include "tests/gpu_fixture.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/output.h"

namespace doctest {
template <>
struct StringMaker<std::vector<uint32_t>> {
    static String convert(const std::vector<uint32_t>& v) {
        std::string s = "{";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + blue::strFormat("0x%x", v[i]);
        return (s + "}").c_str();
    }
};
}  // namespace doctest

namespace blue::test {
namespace {

uint32_t I(int64_t v) {
    return uint32_t(v);
}
uint32_t F(float f) {
    return std::bit_cast<uint32_t>(f);
}
constexpr uint32_t kNaN = 0x7FC00000u, kInf = 0x7F800000u, kNegInf = 0xFF800000u;
constexpr uint32_t kNegZero = 0x80000000u;

// ---- ALU: one instruction per case, result printed as raw bits --------------------------------

// How a result may differ from the expectation: exact bits (any NaN where a NaN is expected),
// or, for the ops the reference computes with the C library's correctly rounded functions,
// within a few units in the last place of the literal.
struct Tol {
    uint32_t ulp = 0;
};
constexpr Tol kExact{0};
constexpr Tol kTranscendental{1};

struct AluCase {
    Op op;
    uint32_t b, c;  // register operands (or the immediate for c)
    uint32_t want;
    Tol tol = kExact;
};

// Expected values are literals derived from each op's definition (two's complement wrap, shifts
// by the low 5 bits, IEEE binary32 round to nearest even), not computed by the code under test.
const std::vector<AluCase>& aluCases() {
    // Two cases per line, aligned.
    // clang-format off
    static const std::vector<AluCase> cases = {
        {Op::ADD, 0x7FFFFFFF, 1, 0x80000000},     {Op::ADD, 0xFFFFFFFF, 1, 0},
        {Op::ADD, 5, I(-7), I(-2)},               {Op::SUB, 0, 1, 0xFFFFFFFF},
        {Op::SUB, 0x80000000, 1, 0x7FFFFFFF},     {Op::MUL, 0x10000, 0x10000, 0},
        {Op::MUL, 0xFFFFFFFF, 0xFFFFFFFF, 1},     {Op::MUL, I(-3), 7, I(-21)},
        {Op::MUL, 0x12345678, 0x10, 0x23456780},  {Op::DIVS, 7, 2, 3},
        {Op::DIVS, I(-7), 2, I(-3)},              {Op::DIVS, 7, I(-2), I(-3)},
        {Op::DIVS, I(-7), I(-2), 3},              {Op::DIVS, 0x80000000, I(-1), 0x80000000},
        {Op::DIVS, 0x80000000, 1, 0x80000000},    {Op::DIVS, 0, I(-5), 0},
        {Op::DIVU, 0xFFFFFFFF, 2, 0x7FFFFFFF},    {Op::DIVU, I(-7), 2, 0x7FFFFFFC},
        {Op::REMS, 7, 2, 1},                      {Op::REMS, I(-7), 2, I(-1)},
        {Op::REMS, 7, I(-2), 1},                  {Op::REMS, I(-7), I(-2), I(-1)},
        {Op::REMS, 0x80000000, I(-1), 0},         {Op::REMS, 0x80000000, 3, I(-2)},
        {Op::REMU, 0xFFFFFFFF, 10, 5},            {Op::REMU, 7, 2, 1},
        {Op::AND, 0xF0F0F0F0, 0xFF00FF00, 0xF000F000},
        {Op::OR, 0xF0F0F0F0, 0xFF00FF00, 0xFFF0FFF0},
        {Op::XOR, 0xF0F0F0F0, 0xFF00FF00, 0x0FF00FF0},
        {Op::SHL, 1, 31, 0x80000000},             {Op::SHL, 1, 32, 1},
        {Op::SHL, 1, 33, 2},                      {Op::SHL, 3, I(-1), 0x80000000},
        {Op::SHRL, 0x80000000, 31, 1},            {Op::SHRL, 0x80000000, 32, 0x80000000},
        {Op::SHRL, 0xF0000000, 36, 0x0F000000},   {Op::SHRA, 0x80000000, 31, 0xFFFFFFFF},
        {Op::SHRA, 0x80000000, 4, 0xF8000000},    {Op::SHRA, 0x40000000, 30, 1},
        {Op::SHRA, I(-1), 63, I(-1)},             {Op::SHRA, 0x80000000, 64, 0x80000000},
        {Op::MINS, I(-1), 1, I(-1)},              {Op::MAXS, I(-1), 1, 1},
        {Op::MINU, I(-1), 1, 1},                  {Op::MAXU, I(-1), 1, 0xFFFFFFFF},
        {Op::ADDI, 0x7FFFFFFF, 1, 0x80000000},    {Op::ADDI, 5, I(-6), I(-1)},
        {Op::MULI, 3, I(-4), I(-12)},             {Op::MULI, 0x40000000, 4, 0},
        {Op::ANDI, 0xFFFF, 0xF0F0, 0xF0F0},       {Op::ORI, 0x0F, 0xF0, 0xFF},
        {Op::XORI, 0xFF, 0xFFFFFFFF, 0xFFFFFF00}, {Op::SHLI, 1, 35, 8},
        {Op::SHRLI, 0x80000000, 63, 1},           {Op::SHRAI, 0x80000000, 33, 0xC0000000},
        {Op::SEQ, 5, 5, 1},                       {Op::SEQ, 5, 6, 0},
        {Op::SNE, 5, 6, 1},                       {Op::SNE, 5, 5, 0},
        {Op::SLTS, I(-1), 0, 1},                  {Op::SLTS, 0, I(-1), 0},
        {Op::SLES, I(-1), I(-1), 1},              {Op::SLES, 0, I(-1), 0},
        {Op::SLTU, I(-1), 0, 0},                  {Op::SLTU, 0, I(-1), 1},
        {Op::SLEU, 5, 5, 1},                      {Op::SLEU, 6, 5, 0},
        {Op::SEQI, I(-1), I(-1), 1},              {Op::SEQI, 3, 4, 0},
        {Op::SLTSI, I(-5), I(-4), 1},             {Op::SLTSI, 0x80000000, 0x7FFFFFFF, 1},
        {Op::SLTSI, 0x7FFFFFFF, 0x80000000, 0},
        // floats
        {Op::FADD, F(1.5f), F(2.25f), F(3.75f)},  {Op::FADD, 0x3DCCCCCD, 0x3E4CCCCD, 0x3E99999A},
        {Op::FADD, F(3e38f), F(3e38f), kInf},     {Op::FADD, kInf, kNegInf, kNaN},
        {Op::FADD, kNegZero, kNegZero, kNegZero}, {Op::FADD, kNegZero, 0, 0},
        {Op::FSUB, F(1.0f), F(1.0f), 0},          {Op::FSUB, kNegZero, 0, kNegZero},
        {Op::FSUB, F(1.0f), F(0.25f), F(0.75f)},  {Op::FMUL, F(1.5f), F(-2.0f), F(-3.0f)},
        {Op::FMUL, F(1e-30f), F(1e-30f), 0},      {Op::FMUL, kInf, 0, kNaN},
        {Op::FMUL, 0x00800000, F(0.5f), 0x00400000},  // a subnormal result
        {Op::FMUL, F(-2.0f), 0, kNegZero},
        {Op::FDIV, F(6.0f), F(3.0f), F(2.0f)},    {Op::FDIV, F(1.0f), F(3.0f), 0x3EAAAAAB},
        {Op::FDIV, F(1.0f), 0, kInf},             {Op::FDIV, F(-1.0f), 0, kNegInf},
        {Op::FDIV, 0, 0, kNaN},                   {Op::FDIV, F(1.0f), F(7.0f), 0x3E124925},
        {Op::FMIN, F(1.0f), F(2.0f), F(1.0f)},    {Op::FMIN, kNaN, F(1.0f), F(1.0f)},
        {Op::FMIN, F(1.0f), kNaN, F(1.0f)},       {Op::FMIN, kNaN, kNaN, kNaN},
        {Op::FMIN, kNegInf, F(5.0f), kNegInf},    {Op::FMAX, kNaN, F(-1.0f), F(-1.0f)},
        {Op::FMAX, F(1.0f), F(2.0f), F(2.0f)},    {Op::FMAX, F(-1.0f), kNaN, F(-1.0f)},
        {Op::FNEG, F(1.0f), 0, F(-1.0f)},         {Op::FNEG, 0, 0, kNegZero},
        {Op::FNEG, kNaN, 0, 0xFFC00000},          {Op::FABS, F(-2.5f), 0, F(2.5f)},
        {Op::FABS, kNegZero, 0, 0},               {Op::FABS, 0xFFC00000, 0, kNaN},
        {Op::FSQRT, F(4.0f), 0, F(2.0f)},         {Op::FSQRT, F(2.0f), 0, 0x3FB504F3},
        {Op::FSQRT, F(-1.0f), 0, kNaN},           {Op::FSQRT, kInf, 0, kInf},
        {Op::FSQRT, kNegZero, 0, kNegZero},       {Op::FEXP, 0, 0, F(1.0f), kTranscendental},
        {Op::FEXP, F(1.0f), 0, 0x402DF854, kTranscendental},
        {Op::FEXP, kNegInf, 0, 0, kTranscendental},
        {Op::FEXP, F(100.0f), 0, kInf, kTranscendental},
        {Op::FEXP, F(-2.0f), 0, 0x3E0A9555, kTranscendental},
        {Op::FLOG, F(1.0f), 0, 0, kTranscendental},
        {Op::FLOG, F(2.0f), 0, 0x3F317218, kTranscendental},
        {Op::FLOG, 0, 0, kNegInf, kTranscendental},
        {Op::FLOG, F(-1.0f), 0, kNaN, kTranscendental},
        {Op::FLOG, kInf, 0, kInf, kTranscendental},
        {Op::FFLOOR, F(-1.5f), 0, F(-2.0f)},      {Op::FFLOOR, F(2.5f), 0, F(2.0f)},
        {Op::FFLOOR, kNegZero, 0, kNegZero},      {Op::FFLOOR, kNegInf, 0, kNegInf},
        {Op::ITOF, I(-3), 0, 0xC0400000},         {Op::ITOF, 0x7FFFFFFF, 0, 0x4F000000},
        {Op::ITOF, 16777217, 0, 0x4B800000},      {Op::ITOF, 0x80000000, 0, 0xCF000000},
        {Op::UTOF, 0xFFFFFFFF, 0, 0x4F800000},    {Op::UTOF, 3, 0, 0x40400000},
        {Op::FTOI, kNaN, 0, 0},                   {Op::FTOI, 0xFFC00001, 0, 0},
        {Op::FTOI, kInf, 0, 0x7FFFFFFF},          {Op::FTOI, kNegInf, 0, 0x80000000},
        {Op::FTOI, F(3e9f), 0, 0x7FFFFFFF},       {Op::FTOI, F(-3e9f), 0, 0x80000000},
        {Op::FTOI, F(-2.7f), 0, I(-2)},           {Op::FTOI, F(2.7f), 0, 2},
        {Op::FTOI, 0x4EFFFFFF, 0, 2147483520},    {Op::FTOI, 0xCF000000, 0, 0x80000000},
        {Op::FTOI, 0x4F000000, 0, 0x7FFFFFFF},    {Op::FTOI, kNegZero, 0, 0},
        {Op::FEQ, kNaN, kNaN, 0},                 {Op::FEQ, 0, kNegZero, 1},
        {Op::FEQ, F(1.0f), F(1.0f), 1},           {Op::FLT, kNaN, F(1.0f), 0},
        {Op::FLT, F(1.0f), kNaN, 0},              {Op::FLT, F(1.0f), F(2.0f), 1},
        {Op::FLT, kNegInf, kInf, 1},              {Op::FLT, F(2.0f), F(1.0f), 0},
        {Op::FLE, kNaN, kNaN, 0},                 {Op::FLE, F(2.0f), F(2.0f), 1},
        {Op::FLE, 0, kNegZero, 1},
        // moves and branches (a branch prints 1 when taken)
        {Op::MOV, 0xDEADBEEF, 0, 0xDEADBEEF},     {Op::LI, 0, 0x80000000, 0x80000000},
        {Op::LF, 0, kNaN, kNaN},                  {Op::BEQZ, 0, 0, 1},
        {Op::BEQZ, 5, 0, 0},                      {Op::BNEZ, 0x80000000, 0, 1},
        {Op::BNEZ, 0, 0, 0},                      {Op::BEQ, 5, 5, 1},
        {Op::BEQ, 5, 6, 0},                       {Op::BNE, 5, 6, 1},
        {Op::BNE, 5, 5, 0},                       {Op::BLTS, I(-1), 0, 1},
        {Op::BLTS, 0, I(-1), 0},                  {Op::BGES, I(-1), 0, 0},
        {Op::BGES, 0, 0, 1},                      {Op::BLTU, I(-1), 0, 0},
        {Op::BLTU, 0, I(-1), 1},                  {Op::BGEU, I(-1), 0, 1},
        {Op::BGEU, 0, 1, 0},
    };
    // clang-format on
    return cases;
}

std::string lowerName(Op op) {
    std::string s(opInfo(op).name);
    for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
}

// One case as assembly: operands in r1 (and r2), the result in r3, printed with OUTU.
std::string aluCaseSource(const AluCase& c, size_t index) {
    const OpInfo& info = opInfo(c.op);
    const std::string name = lowerName(c.op);
    const std::string fmt(info.format);
    std::string s = strFormat("    li r1, 0x%x\n    li r2, 0x%x\n", c.b, c.c);
    if (fmt == "rrr")
        s += "    " + name + " r3, r1, r2\n";
    else if (fmt == "rri" || fmt == "rru")
        s += strFormat("    %s r3, r1, 0x%x\n", name.c_str(), c.c);
    else if (fmt == "rr")
        s += "    " + name + " r3, r1\n";
    else if (fmt == "ri" || fmt == "rf")
        s += strFormat("    %s r3, 0x%x\n", name.c_str(), c.c);
    else if (fmt == "rl" || fmt == "rrl") {
        std::string taken = strFormat("t%zu", index);
        s += "    li r3, 1\n    " + name + (fmt == "rl" ? " r1, " : " r1, r2, ") + taken +
             "\n    li r3, 0\n" + taken + ":\n";
    } else {
        FAIL("no ALU form for format " << fmt);
    }
    return s + "    outu r3\n";
}

std::string aluSource() {
    std::string s = ".layout regs=4 max_steps=100000\n";
    for (size_t i = 0; i < aluCases().size(); ++i) s += aluCaseSource(aluCases()[i], i);
    return s + "    halt\n";
}

bool isNaN(uint32_t bits) {
    return std::isnan(std::bit_cast<float>(bits));
}

// Distance in units in the last place between two floats' bit patterns (same sign assumed by
// the ordering trick: negative floats map below positive ones).
uint64_t ulpDistance(uint32_t a, uint32_t b) {
    auto ordered = [](uint32_t u) -> int64_t {
        return (u & 0x80000000u) ? -int64_t(u & 0x7FFFFFFFu) : int64_t(u);
    };
    int64_t d = ordered(a) - ordered(b);
    return uint64_t(d < 0 ? -d : d);
}

bool withinTol(uint32_t got, uint32_t want, Tol tol) {
    if (isNaN(want)) return isNaN(got);
    if (got == want) return true;
    return tol.ulp > 0 && !isNaN(got) && ulpDistance(got, want) <= tol.ulp;
}

bool isSubnormal(uint32_t bits) {
    return (bits & 0x7F800000u) == 0 && (bits & 0x007FFFFFu) != 0;
}

// Whether the GPU's result of a float op may differ from the reference machine's, per the
// tolerance vm/opcodes.def documents: the reference computes FDIV, FSQRT, FEXP and FLOG with the
// C library (correctly rounded); a GPU has Vulkan's precision for them (FDIV 2.5 ULP for divisors
// of magnitude in [2^-126, 2^126], FSQRT that of 1/inversesqrt (2 + 2.5 ULP), FEXP 3 + 2|x| ULP,
// FLOG 3 ULP, absolute 2^-21 within [0.5, 2]), may flush subnormal results to zero, and gives
// device-dependent results for subnormal operands. Every other op must be bit-exact.
// A subnormal as the zero of its sign: what a GPU that flushes subnormals reads or writes.
uint32_t flushSubnormal(uint32_t bits) { return isSubnormal(bits) ? (bits & 0x80000000u) : bits; }

// The reference machine's result of an exact float op computed as a GPU that flushes subnormals
// does (operands and result); nothing for the other ops. The NaN rules of FMIN/FMAX are the
// reference's (vm/interp.cpp): a NaN operand gives the other one.
std::optional<uint32_t> flushedResult(Op op, uint32_t b, uint32_t c) {
    const float x = std::bit_cast<float>(flushSubnormal(b)), y = std::bit_cast<float>(flushSubnormal(c));
    auto value = [](float v) { return std::optional<uint32_t>(flushSubnormal(std::bit_cast<uint32_t>(v))); };
    switch (op) {
        case Op::FADD: return value(x + y);
        case Op::FSUB: return value(x - y);
        case Op::FMUL: return value(x * y);
        case Op::FMIN: return value(std::isnan(x) ? y : std::isnan(y) ? x : (y < x ? y : x));
        case Op::FMAX: return value(std::isnan(x) ? y : std::isnan(y) ? x : (y > x ? y : x));
        case Op::FEQ: return uint32_t(x == y);
        case Op::FLT: return uint32_t(x < y);
        case Op::FLE: return uint32_t(x <= y);
        case Op::FFLOOR: return value(std::floor(x));
        default: return std::nullopt;
    }
}

bool gpuAgrees(Op op, uint32_t b, uint32_t c, uint32_t gpu, uint32_t ref) {
    if (gpu == ref || (isNaN(gpu) && isNaN(ref))) return true;
    // A GPU may flush subnormal operands and results to zero (Vulkan's default without float
    // controls; NVIDIA does, lavapipe does not): then the exact ops must give the flushed result,
    // a zero of either sign where that is zero.
    if (isSubnormal(b) || isSubnormal(c) || isSubnormal(ref)) {
        if (std::optional<uint32_t> f = flushedResult(op, b, c)) {
            return gpu == *f || (isNaN(gpu) && isNaN(*f)) ||
                   ((gpu & 0x7FFFFFFFu) == 0 && (*f & 0x7FFFFFFFu) == 0);
        }
    }
    const float x = std::bit_cast<float>(b), y = std::bit_cast<float>(c);
    uint64_t ulp = 0;
    switch (op) {
        case Op::FDIV:
            if (isSubnormal(b) || isSubnormal(c) ||
                !(std::fabs(y) >= 0x1p-126f && std::fabs(y) <= 0x1p126f)) {
                return true;
            }
            ulp = 3;
            break;
        case Op::FSQRT:
            ulp = 5;
            break;
        case Op::FEXP:
            ulp = 3 + 2 * uint64_t(std::min(std::fabs(x), 1e6f));
            break;
        case Op::FLOG:
            if (x >= 0.5f && x <= 2.0f) {
                return std::fabs(std::bit_cast<float>(gpu) - std::bit_cast<float>(ref)) < 0x1p-21f;
            }
            ulp = 3;
            break;
        default:
            return false;
    }
    if (isSubnormal(b)) return true;
    if (isSubnormal(ref) && (gpu & 0x7FFFFFFFu) == 0) return true;
    return !isNaN(gpu) && !isNaN(ref) && ulpDistance(gpu, ref) <= ulp;
}

std::vector<uint32_t> values(const std::vector<OutputRecord>& records) {
    std::vector<uint32_t> out;
    for (const OutputRecord& r : records) out.push_back(r.value);
    return out;
}

RunReport runRef(const Module& m, uint32_t instances,
                 const std::vector<std::vector<uint32_t>>& input = {}, uint64_t max_cycles = 1000,
                 bool close = true) {
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    RefMachine ref(m, w.value(), MachineOptions{instances, max_cycles});
    for (const auto& msg : input) ref.pushInput(msg);
    if (close) ref.closeInput();
    return ref.run();
}

Module assembleOrFail(const std::string& source, const std::string& name) {
    Result<Module> m = assemble(source, name);
    REQUIRE_MESSAGE(m.isOk(), (m.message() + "\n" + source));
    return m.value();
}

TEST_CASE("interp: every ALU, compare, float, move and branch case gives its expected bits") {
    Module m = assembleOrFail(aluSource(), "alu");
    RunReport r = runRef(m, 1);
    REQUIRE(r.status.isOk());
    REQUIRE(r.instances[0].status == BLUE_ST_HALTED);
    std::vector<uint32_t> got = values(r.output);
    REQUIRE(got.size() == aluCases().size());
    std::map<Op, int> per_op;
    for (size_t i = 0; i < got.size(); ++i) {
        const AluCase& c = aluCases()[i];
        INFO(opInfo(c.op).name << strFormat("(0x%08x, 0x%08x): got 0x%08x, want 0x%08x", c.b, c.c,
                                            got[i], c.want));
        CHECK(r.output[i].kind == BLUE_OUT_UINT);
        CHECK(withinTol(got[i], c.want, c.tol));
        ++per_op[c.op];
    }
    // Every control op that computes a value or branches has cases.
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        std::string fmt(op->format);
        bool alu = !op->tensor && (fmt == "rrr" || fmt == "rri" || fmt == "rru" || fmt == "rr" ||
                                   fmt == "ri" || fmt == "rf" || fmt == "rl" || fmt == "rrl");
        bool not_alu = op->op == Op::LD || op->op == Op::ST || op->op == Op::LDG ||
                       op->op == Op::STG || op->op == Op::SEND || op->op == Op::INLEN ||
                       op->op == Op::INLD || op->op == Op::INCPY || op->op == Op::INCMP || op->op == Op::ALLOC ||
                       op->op == Op::INFLAG || op->op == Op::HASHL || op->op == Op::HCMPL ||
                       op->op == Op::HCPYL ||  // memory walks: tests/test_interp_walks.cpp
                       (op->op >= Op::ATOMADD && op->op <= Op::ATOMCAS);
        if (alu && !not_alu) {
            CAPTURE(op->name);
            CHECK(per_op[op->op] >= 1);
        }
    }
}

TEST_CASE("interp gpu: the ALU cases on the GPU match the reference machine") {
    Module m = assembleOrFail(aluSource(), "alu");
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns runs = runBoth(m, w.value(), 1);
    REQUIRE(runs.gpu.status.isOk());
    CHECK(runs.gpu.instances[0].status == BLUE_ST_HALTED);
    CHECK(runs.gpu.instances[0].pc == runs.ref.instances[0].pc);
    std::vector<uint32_t> gpu = values(runs.gpu.output), ref = values(runs.ref.output);
    REQUIRE(gpu.size() == ref.size());
    REQUIRE(gpu.size() == aluCases().size());
    std::map<Op, uint64_t> worst;
    for (size_t i = 0; i < gpu.size(); ++i) {
        const AluCase& c = aluCases()[i];
        INFO(opInfo(c.op).name << strFormat("(0x%08x, 0x%08x): gpu 0x%08x, reference 0x%08x", c.b,
                                            c.c, gpu[i], ref[i]));
        CHECK(gpuAgrees(c.op, c.b, c.c, gpu[i], ref[i]));
        if (!isNaN(ref[i]) && !isNaN(gpu[i]))
            worst[c.op] = std::max(worst[c.op], ulpDistance(gpu[i], ref[i]));
    }
    std::string measured;
    for (Op op : {Op::FDIV, Op::FSQRT, Op::FEXP, Op::FLOG}) {
        measured += strFormat(" %s %llu", std::string(opInfo(op).name).c_str(),
                              (unsigned long long)worst[op]);
    }
    MESSAGE("largest GPU-vs-reference difference in ULP:" << measured);
    CHECK_NO_VALIDATION_ERRORS();
}

// ---- scenarios: one instance per case, each ending in a halt or a fault ---------------------

// An expected output record. `sym` names a string whose pool offset is the value (OUTS);
// kind kInstId / kInstCount stand for the instance's id / the instance count (OUT records).
struct Rec {
    uint32_t kind, value;
    const char* sym = nullptr;
};
constexpr uint32_t kInstId = 100, kInstCount = 101;
Rec Int(int64_t v) {
    return {BLUE_OUT_INT, uint32_t(v)};
}
Rec Uns(uint32_t v) {
    return {BLUE_OUT_UINT, v};
}

struct Scenario {
    const char* name;
    std::string body;  // assembly; {L} is replaced by a prefix unique to the scenario
    std::vector<Rec> want;
    uint32_t fault = BLUE_FAULT_NONE;  // BLUE_FAULT_NONE: the body falls through to a HALT
};

// The scenario a fault stops at is labelled {L}at; one that halts stops at {L}end.
const std::vector<Scenario>& scenarios() {
    static const std::vector<Scenario> list = {
        {"DIVS by zero faults",
         "li r1, 5\nli r2, 0\n{L}at: divs r3, r1, r2",
         {},
         BLUE_FAULT_DIV_ZERO},
        {"DIVU by zero faults", "li r1, 5\n{L}at: divu r3, r1, r0", {}, BLUE_FAULT_DIV_ZERO},
        {"REMS by zero faults", "li r1, -5\n{L}at: rems r3, r1, r0", {}, BLUE_FAULT_DIV_ZERO},
        {"REMU by zero faults after earlier output",
         "li r1, 7\nout r1\n{L}at: remu r3, r1, r0",
         {Int(7)},
         BLUE_FAULT_DIV_ZERO},
        {"LD past local memory", "li r1, 8\n{L}at: ld r2, r1, 0", {}, BLUE_FAULT_LOCAL_OOB},
        {"LD past local memory by the immediate", "{L}at: ld r2, r0, 8", {}, BLUE_FAULT_LOCAL_OOB},
        {"ST far past local memory",
         "li r1, 0xFFFFFFF0\n{L}at: st r2, r1, 0",
         {},
         BLUE_FAULT_LOCAL_OOB},
        {"LD/ST addresses wrap modulo 2^32",
         "li r1, -1\nli r2, 77\nst r2, r1, 1\nld r4, r0, 0\nout r4\nld r5, r1, 8\nout r5\n"
         "ld r6, r1, 1\nout r6",
         {Int(77), Int(0), Int(77)}},
        {"LDG past the heap", "li r1, 8\n{L}at: ldg r2, r1, 0", {}, BLUE_FAULT_HEAP_OOB},
        {"STG past the heap", "li r1, 4\n{L}at: stg r2, r1, 4", {}, BLUE_FAULT_HEAP_OOB},
        {"ATOMADD past the heap", "li r1, 8\n{L}at: atomadd r2, r1, r3", {}, BLUE_FAULT_HEAP_OOB},
        {"LDK reads the pool; past it faults",
         "li r1, 1\nldk r2, r1, tbl\nout r2\nldk r3, r0, tbl+2\nout r3\nli r1, 4\nldk r4, r1, tbl\n"
         "out r4\nli r1, 5\n{L}at: ldk r5, r1, tbl",
         {Int(20), Int(30), Int(0x6968)},
         BLUE_FAULT_CONST_OOB},
        {"CALL and RET nest",
         "call {L}f\nli r1, 4\nout r1\njmp {L}end\n{L}f: li r1, 1\nout r1\ncall {L}g\nli r1, 3\n"
         "out r1\nret\n{L}g: li r1, 2\nout r1\nret",
         {Int(1), Int(2), Int(3), Int(4)}},
        {"CALL past the stack depth overflows",
         "li r1, 0\n{L}rec: addi r1, r1, 1\nout r1\n{L}at: call {L}rec",
         {Int(1), Int(2), Int(3)},
         BLUE_FAULT_STACK_OVERFLOW},
        {"RET with an empty stack underflows",
         "li r1, 9\nout r1\n{L}at: ret",
         {Int(9)},
         BLUE_FAULT_STACK_UNDERFLOW},
        {"YIELD resumes at the next instruction next cycle",
         "cycle r1\nout r1\nyield\ncycle r1\nout r1\nyield\nyield\ncycle r1\nout r1",
         {Int(0), Int(1), Int(3)}},
        {"IID and NINST", "iid r1\nout r1\nninst r2\nout r2", {{kInstId, 0}, {kInstCount, 0}}},
        {"every OUT kind writes its record",
         "li r1, -5\nout r1\noutu r1\nlf r2, 1.5\noutf r2\nli r3, 0x141\noutc r3\nouts hi\n"
         "li r4, 7\noutt r4\nli r5, 9\noutend r5",
         {Int(-5),
          Uns(0xFFFFFFFB),
          {BLUE_OUT_FLOAT, 0x3FC00000},
          {BLUE_OUT_CHAR, 0x141},
          {BLUE_OUT_STR, 0, "hi"},
          {BLUE_OUT_TOKEN, 7},
          {BLUE_OUT_END, 9}}},
        {"SEND to a nonexistent instance",
         "ninst r1\n{L}at: send r1, r2",
         {},
         BLUE_FAULT_BAD_INSTANCE},
        {"SEND to instance -1", "li r1, -1\n{L}at: send r1, r2", {}, BLUE_FAULT_BAD_INSTANCE},
        {"a message to oneself is received from the next cycle",
         "iid r1\nli r2, 42\nsend r1, r2\ncycle r3\nout r3\nrecv r4\nout r4\ncycle r5\nout r5",
         {Int(0), Int(42), Int(1)}},
        {"messages arrive in the order sent",
         "iid r1\nli r2, 1\nsend r1, r2\nli r2, 2\nsend r1, r2\nrecv r3\nout r3\nrecv r3\nout r3",
         {Int(1), Int(2)}},
        {"INLEN of a slot not held", "{L}at: inlen r2, r0", {}, BLUE_FAULT_INPUT_OOB},
        {"INFREE of a slot not held", "li r1, 1\n{L}at: infree r1", {}, BLUE_FAULT_INPUT_OOB},
        {"INLD of a slot out of range",
         "li r1, 7\n{L}at: inld r2, r1, r0",
         {},
         BLUE_FAULT_INPUT_OOB},
        {"INRECV gives -1 once input is closed and drained",
         "inrecv r1\nout r1\ninrecv r1\nout r1",
         {Int(-1), Int(-1)}},
        {"TST/TLD on this instance's slice",
         "iid r1\nmuli r2, r1, 10\naddi r2, r2, 1\nli r3, 3\ntst r2, r3, vi\ntld r4, r3, vi\n"
         "sub r5, r4, r2\nout r5\nyield\ntld r6, r3, vi\nsub r6, r6, r2\nout r6",
         {Int(0), Int(0)}},
        {"TLD of a GLOBAL tensor's initial data",
         "li r1, 1\ntld r2, r1, gf\noutu r2",
         {Uns(0xC0000000)}},
        {"TLD past an INSTANCE slice",
         "li r1, 4\n{L}at: tld r2, r1, vi",
         {},
         BLUE_FAULT_TENSOR_OOB},
        {"TST past a GLOBAL tensor", "li r1, 2\n{L}at: tst r2, r1, gf", {}, BLUE_FAULT_TENSOR_OOB},
        {"RUN with 0 rows", "{L}at: run b, r0", {}, BLUE_FAULT_BLOCK_ROWS},
        {"RUN with more rows than max_rows",
         "li r1, 5\n{L}at: run b, r1",
         {},
         BLUE_FAULT_BLOCK_ROWS},
        {"RUN parks the instance until the block has run",
         "lf r1, 1.5\nli r2, 1\ntst r1, r2, vf\nli r3, 2\ncycle r4\nout r4\nrun b, r3\ncycle r4\n"
         "out r4\ntld r5, r2, vo\noutu r5",
         {Int(0), Int(1), Uns(0x40400000)}},
    };
    return list;
}

constexpr const char* kScenarioHeader =
    R"(.layout regs=16 local=8 heap=8 heap_static=8 stack=2 mailbox=2
.layout in_slots=2 in_slot_words=4 max_rows=4
.const tbl 10 20 30
.string hi "hi"
.tensor vi instance i32 [4]
.tensor vf instance f32 [2]
.tensor vo instance f32 [2]
.tensor gf global f32 [2] data f32 1.5 -2
.block b args=1
    tscale vo, vf, 2.0
.end
)";

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
        s.replace(at, from.size(), to);
    }
    return s;
}

// Instance i runs scenario i; the last instance runs off the end of the code.
std::string scenarioSource() {
    const auto& list = scenarios();
    std::string s = std::string(kScenarioHeader) + "main:\n    iid r15\n";
    for (size_t i = 0; i < list.size(); ++i)
        s += strFormat("    li r14, %zu\n    beq r15, r14, s%zu\n", i, i);
    s += "    jmp last\n";
    for (size_t i = 0; i < list.size(); ++i) {
        std::string prefix = strFormat("s%zu_", i);
        s += strFormat("s%zu:\n", i) + replaceAll(list[i].body, "{L}", prefix) + "\n" + prefix +
             "end: halt\n";
    }
    return s + "last:\n    nop\n";  // the code ends here: PC_OOB
}

uint32_t labelValue(const Module& m, const std::string& name) {
    for (const Symbol& sym : m.syms) {
        if (sym.name == name) return sym.value;
    }
    FAIL("no symbol " << name);
    return 0;
}

std::vector<OutputRecord> expectedRecords(const Module& m, const Scenario& sc, uint32_t inst,
                                          uint32_t instances) {
    std::vector<OutputRecord> out;
    for (const Rec& r : sc.want) {
        OutputRecord rec{inst, r.kind, r.value};
        if (r.sym) rec.value = labelValue(m, r.sym);
        if (r.kind == kInstId) rec = {inst, BLUE_OUT_INT, inst};
        if (r.kind == kInstCount) rec = {inst, BLUE_OUT_INT, instances};
        out.push_back(rec);
    }
    return out;
}

TEST_CASE("interp: scenarios end with the expected records, status, fault and pc") {
    Module m = assembleOrFail(scenarioSource(), "scenarios");
    const uint32_t n = uint32_t(scenarios().size()) + 1;
    RunReport r = runRef(m, n);
    CHECK(r.status.isOk());
    REQUIRE(r.instances.size() == n);
    for (uint32_t i = 0; i + 1 < n; ++i) {
        const Scenario& sc = scenarios()[i];
        INFO("scenario " << i << ": " << std::string(sc.name));
        std::string prefix = strFormat("s%u_", i);
        const InstanceReport& ir = r.instances[i];
        CHECK(recordsOf(r.output, i) == expectedRecords(m, sc, i, n));
        if (sc.fault == BLUE_FAULT_NONE) {
            CHECK(ir.status == BLUE_ST_HALTED);
            CHECK(ir.pc == labelValue(m, prefix + "end"));
        } else {
            CHECK(ir.status == BLUE_ST_FAULT);
            CHECK(ir.fault == sc.fault);
            CHECK(ir.pc == labelValue(m, prefix + "at"));
        }
    }
    CHECK(r.instances[n - 1].status == BLUE_ST_FAULT);
    CHECK(r.instances[n - 1].fault == BLUE_FAULT_PC_OOB);
    CHECK(r.instances[n - 1].pc == m.instrCount());
    // The fault listing names each faulted instance, its fault and the instruction.
    std::string faults = describeFaults(m, r.instances, 100);
    CHECK(faults.find("instance 0: integer division by zero at instruction " +
                      std::to_string(labelValue(m, "s0_at")) + " (DIVS)\n") != std::string::npos);
    CHECK(faults.find(strFormat("instance %u: ran past the end of the code at instruction %u (?)",
                                n - 1, m.instrCount())) != std::string::npos);
}

// ---- programs over shared state: heap, allocator, mailboxes, input, step and cycle limits ------

struct Program {
    std::string name;
    std::string source;
    uint32_t instances = 1;
    std::vector<std::vector<uint32_t>> input;
    uint64_t max_cycles = 1000;
    // Whether cycle counts and step totals are a function of the program alone. Where instances
    // race within a cycle (who frees mailbox space first), the GPU may take a cycle less or more.
    bool exact_timing = true;
};

Program heapProgram() {
    return {"heap", R"(.layout regs=16 heap=16 heap_static=4
    li r1, 100
    alloc r2, r1
    out r2
    li r1, 5
    alloc r2, r1
    out r2
    li r1, 7
    alloc r2, r1
    out r2
    li r1, 1
    alloc r2, r1
    out r2
    alloc r2, r0
    out r2
    li r1, -1
    alloc r2, r1
    out r2
    li r1, 1
    li r2, 10
    stg r2, r1, 0
    li r3, 5
    atomadd r4, r1, r3
    out r4
    ldg r4, r1, 0
    out r4
    li r3, -5
    atomxchg r4, r1, r3
    out r4
    li r3, 3
    atommaxs r4, r1, r3
    out r4
    li r3, -10
    atommaxs r4, r1, r3
    out r4
    atommins r4, r1, r3
    out r4
    li r4, 99
    li r3, 7
    atomcas r4, r1, r3
    out r4
    ldg r5, r1, 0
    out r5
    li r4, -10
    atomcas r4, r1, r3
    out r4
    ldg r5, r1, 0
    out r5
    li r1, 2
    li r2, 0x7FFFFFFF
    stg r2, r1, 0
    li r3, 1
    atomadd r4, r1, r3
    ldg r5, r1, 0
    outu r5
    li r2, -1
    stg r2, r1, 0
    atommaxs r4, r1, r3
    ldg r5, r1, 0
    out r5
    halt
)"};
}

TEST_CASE("interp: ALLOC hands out the heap past heap_static, -1 when exhausted; atomics") {
    Program p = heapProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, 1);
    REQUIRE(r.instances[0].status == BLUE_ST_HALTED);
    // ALLOC 100 of 12 free: -1 and nothing taken; 5 -> 4; 7 -> 9; 1 of 0 free -> -1; 0 -> 16;
    // 0xFFFFFFFF -> -1. Heap[1]: 10 +5; xchg -5; maxs 3; maxs -10 keeps 3; mins -10; cas 99 fails;
    // cas -10 swaps in 7. Heap[2]: 0x7FFFFFFF + 1 wraps; maxs(-1, 1) is 1 (signed).
    const std::vector<uint32_t> want = {I(-1), 4, 9, I(-1),  16,     I(-1),  10, 15,         15,
                                        I(-5), 3, 3, I(-10), I(-10), I(-10), 7,  0x80000000, 1};
    CHECK(values(r.output) == want);
}

Program sharedProgram() {
    // Cycle 0: every instance adds id + 1 to heap[0], allocates 2 words and fills them with its
    // id, writes its own tensor slice; instance 0 stores 555 into the GLOBAL tensor and 123 into
    // heap[1]. Cycle 1: everyone reads the totals, its words and slice back, and instance 0's
    // plain stores. Cycle 2: the heap is exhausted for everyone.
    return {"shared", R"(.layout regs=16 heap=20 heap_static=4
.tensor vi instance i32 [2]
.tensor gi global i32 [1]
    iid r1
    addi r2, r1, 1
    atomadd r3, r0, r2
    li r4, 2
    alloc r5, r4
    stg r1, r5, 0
    stg r1, r5, 1
    muli r6, r1, 10
    li r7, 1
    tst r6, r7, vi
    bnez r1, wait
    li r8, 555
    tst r8, r0, gi
    li r8, 123
    li r9, 1
    stg r8, r9, 0
wait:
    yield
    ldg r3, r0, 0
    out r3
    ldg r8, r5, 0
    ldg r9, r5, 1
    seq r8, r8, r1
    seq r9, r9, r1
    and r8, r8, r9
    out r8
    tld r8, r7, vi
    sub r8, r8, r6
    out r8
    tld r8, r0, gi
    out r8
    li r9, 1
    ldg r8, r9, 0
    out r8
    yield
    li r4, 1
    alloc r5, r4
    out r5
    halt
)",
            8};
}

TEST_CASE(
    "interp: instances share the heap, the allocator and GLOBAL tensors; slices are private") {
    Program p = sharedProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, p.instances);
    REQUIRE(r.status.isOk());
    for (uint32_t i = 0; i < p.instances; ++i) {
        CAPTURE(i);
        CHECK(r.instances[i].status == BLUE_ST_HALTED);
        // 1 + 2 + ... + 8 = 36; own words intact; own slice intact; 555; 123; heap exhausted.
        CHECK(values(recordsOf(r.output, i)) == std::vector<uint32_t>{36, 1, 0, 555, 123, I(-1)});
    }
}

Program mailboxProgram() {
    // Instance 0 sends 99 to instance 2, then 11, 22, 33 to instance 1, whose mailbox holds 2:
    // the third SEND yields until instance 1, idle until cycle 5, receives. Instance 2 receives
    // in cycle 1 what instance 0 sent in cycle 0, whichever ran first within cycle 0.
    return {"mailbox", R"(.layout regs=16 mailbox=2
    iid r1
    li r2, 1
    beq r1, r2, one
    li r2, 2
    beq r1, r2, two
    li r3, 99
    send r2, r3
    li r2, 1
    li r3, 11
    send r2, r3
    li r3, 22
    send r2, r3
    li r3, 33
    send r2, r3
    cycle r4
    sltsi r5, r4, 5
    out r5
    halt
one:
    cycle r4
    li r5, 5
    bgeu r4, r5, take
    yield
    jmp one
take:
    recv r6
    out r6
    recv r6
    out r6
    recv r6
    out r6
    halt
two:
    recv r6
    out r6
    cycle r4
    out r4
    halt
)", 3, {}, 1000, false};
}

TEST_CASE("interp: mailboxes deliver in order, from the next cycle, and SEND yields while full") {
    Program p = mailboxProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, p.instances);
    REQUIRE(r.status.isOk());
    for (const InstanceReport& ir : r.instances) CHECK(ir.status == BLUE_ST_HALTED);
    CHECK(values(recordsOf(r.output, 0)) == std::vector<uint32_t>{0});  // third SEND after cycle 5
    CHECK(values(recordsOf(r.output, 1)) == std::vector<uint32_t>{11, 22, 33});
    CHECK(values(recordsOf(r.output, 2)) == std::vector<uint32_t>{99, 1});
    // On the reference machine instances run in id order within a cycle: in cycle 5 instance 0
    // still finds the mailbox full, sends 33 in cycle 6, and instance 1 receives it in cycle 7.
    CHECK(r.cycles == 8);
}

Program inputProgram() {
    return {"input",
            R"(.layout regs=16 local=4 in_slots=2 in_slot_words=4
    inrecv r1
    out r1
    inlen r2, r1
    out r2
    li r3, 2
    inld r4, r1, r3
    out r4
    li r5, 1
    incpy r5, r1, r5
    out r5
    li r6, 1
    ld r7, r6, 0
    out r7
    ld r7, r6, 1
    out r7
    infree r1
    inrecv r1
    out r1
    inlen r2, r1
    out r2
    inld r4, r1, r0
    out r4
    li r9, 1
    incpy r9, r1, r9
    out r9
    infree r1
    inrecv r1
    out r1
    li r1, 0
fault:
    inld r4, r1, r0
    halt
)",
            1,
            {{7, 8, 9}, {42}}};
}

TEST_CASE("interp: INRECV, INLEN, INLD, INCPY, INFREE, then -1 once closed; a freed slot faults") {
    Program p = inputProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, 1, p.input);
    REQUIRE(r.status.isOk());
    // slot 0: length 3, word 2 is 9, INCPY from word 1 copies 2 words (8, 9) to local[1..2];
    // slot 1: length 1, word 0 is 42, INCPY from word 1 copies nothing; then -1.
    CHECK(values(r.output) == std::vector<uint32_t>{0, 3, 9, 2, 8, 9, 1, 1, 42, 0, I(-1)});
    CHECK(r.instances[0].status == BLUE_ST_FAULT);
    CHECK(r.instances[0].fault == BLUE_FAULT_INPUT_OOB);
    CHECK(r.instances[0].pc == labelValue(m, "fault"));
}

Program inputFaultProgram() {
    // Three instances each take one 3-word message (which one depends on timing; all have the
    // same length) and misuse it differently.
    return {"input faults",
            R"(.layout regs=16 local=4 in_slots=4 in_slot_words=4
    inrecv r1
    iid r2
    li r3, 1
    beq r2, r3, one
    li r3, 2
    beq r2, r3, two
    li r4, 3
word:
    inld r5, r1, r4
    halt
one:
    li r4, 4
start:
    incpy r0, r1, r4
    halt
two:
    li r4, 2
    li r5, 0
local:
    incpy r4, r1, r5
    halt
)",
            3,
            {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}};
}

TEST_CASE(
    "interp: INLD past the message, INCPY from past its end or into too little local memory") {
    Program p = inputFaultProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, p.instances, p.input);
    const std::pair<const char*, uint32_t> want[] = {{"word", BLUE_FAULT_INPUT_OOB},
                                                     {"start", BLUE_FAULT_INPUT_OOB},
                                                     {"local", BLUE_FAULT_LOCAL_OOB}};
    for (uint32_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(r.instances[i].status == BLUE_ST_FAULT);
        CHECK(r.instances[i].fault == want[i].second);
        CHECK(r.instances[i].pc == labelValue(m, want[i].first));
    }
}

TEST_CASE(
    "interp: INRECV yields while the input is open and empty; messages queue behind busy slots") {
    Program p = inputProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport open_empty = runRef(m, 1, {}, 20, false);
    CHECK(open_empty.instances[0].status == BLUE_ST_RUNNING);
    CHECK(open_empty.instances[0].pc == 0);
    CHECK(open_empty.cycles == 20);
    CHECK(open_empty.output.empty());
    CHECK(open_empty.status.message() ==
          "watchdog: the program did not finish within 20 cycles (--max-cycles); 1 instance "
          "still running: 0 (pc 0)");
    // Five messages through two slots: each is published when its slot is freed.
    Module q = assembleOrFail(R"(.layout regs=8 in_slots=2 in_slot_words=2
next:
    inrecv r1
    li r2, -1
    beq r1, r2, done
    inld r3, r1, r0
    out r3
    infree r1
    jmp next
done:
    halt
)",
                              "queue");
    RunReport r = runRef(q, 1, {{10}, {11}, {12}, {13}, {14}});
    CHECK(values(r.output) == std::vector<uint32_t>{10, 11, 12, 13, 14});
    CHECK(r.instances[0].status == BLUE_ST_HALTED);
}

Program blockFullProgram() {
    // Three instances ask for 2 rows each of a block that takes 4 rows a cycle: one of them
    // (on the reference machine, instance 2) finds the block full and retries next cycle.
    // Rows: [id, 1] * 3; then each instance's sum over its last row: 3 id + 3.
    return {"block full", R"(.layout regs=8 max_rows=4
.tensor vf instance f32 [2]
.tensor vo instance f32 [1]
.tensor xr rows f32 [2]
.block b args=1
    tscale xr, vf, 3.0
    tsum vo, xr
.end
    iid r1
    itof r2, r1
    tst r2, r0, vf
    lf r2, 1.0
    li r3, 1
    tst r2, r3, vf
    li r4, 2
    run b, r4
    tld r5, r0, vo
    outf r5
    halt
)",
            3};
}

TEST_CASE("interp: RUN retries next cycle when the block's rows are taken") {
    Program p = blockFullProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, p.instances);
    REQUIRE(r.status.isOk());
    for (uint32_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(r.instances[i].status == BLUE_ST_HALTED);
        CHECK(values(recordsOf(r.output, i)) == std::vector<uint32_t>{F(3.0f * float(i) + 3.0f)});
    }
    CHECK(r.cycles == 3);  // the block ran in cycles 0 and 1; everyone halted in cycle 2
    CHECK(r.block_runs == 2);
    CHECK(r.steps == 3 * 11 + 1);  // 11 instructions each, and one retried RUN
}

Program stepsProgram() {
    return {"max_steps", R"(.layout regs=8 max_steps=5
    li r2, 10
    li r1, 0
loop:
    addi r1, r1, 1
    bltu r1, r2, loop
    cycle r3
    out r3
    halt
)"};
}

TEST_CASE("interp: an instance runs at most max_steps instructions per cycle") {
    Program p = stepsProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, 1);
    REQUIRE(r.status.isOk());
    // CYCLE is instruction 2 + 10 * 2 + 1 = 23: with 5 per cycle it runs in cycle 22 / 5 = 4.
    CHECK(values(r.output) == std::vector<uint32_t>{4});
    CHECK(r.steps == 25);
    CHECK(r.cycles == 5);
}

Program watchdogProgram() {
    return {"watchdog",
            R"(.layout regs=8 max_steps=10
    iid r1
    li r2, 1
    beq r1, r2, stop
loop:
    addi r3, r3, 1
    jmp loop
stop:
    halt
)",
            3,
            {},
            7};
}

TEST_CASE("interp: the watchdog stops a run at max_cycles and names the instances still live") {
    Program p = watchdogProgram();
    Module m = assembleOrFail(p.source, p.name);
    RunReport r = runRef(m, p.instances, {}, p.max_cycles);
    CHECK(r.cycles == 7);
    // 7 cycles of 10 steps; 3 before the loop leave 67 loop steps: the loop's second instruction.
    const uint32_t pc = 3 + (7 * 10 - 3) % 2;
    CHECK(r.instances[0].status == BLUE_ST_RUNNING);
    CHECK(r.instances[0].pc == pc);
    CHECK(r.instances[1].status == BLUE_ST_HALTED);
    CHECK(r.instances[2].pc == pc);
    CHECK(r.status.message() ==
          strFormat("watchdog: the program did not finish within 7 cycles (--max-cycles); 2 "
                    "instances still running: 0 (pc %u), 2 (pc %u)",
                    pc, pc));
    CHECK(r.steps == 2 * 7 * 10 + 4);  // instance 1: IID, LI, BEQ, HALT
}

TEST_CASE("interp: the every-opcode program halts on one instance") {
    Result<std::string> src = everyOpSource();
    REQUIRE(src.isOk());
    Module m = assembleOrFail(src.value(), "every_op");
    RunReport r = runRef(m, 1, everyOpInput());
    CHECK(r.status.isOk());
    CHECK(r.instances[0].status == BLUE_ST_HALTED);
    CHECK(r.block_runs == 1);
    // The block's SAMPLE draws token 2, worked out by hand from the sampling block the generator
    // writes: penalised logits 1.0, 1.77, 1.39, -1.45; top-k 3, top-p 0.95 and min-p keep tokens
    // 0-2; at T = 0.8 their shares end at 0.19, 0.69 and 1; Philox(1234, 0) gives u = 0.916.
    REQUIRE(!r.output.empty());
    CHECK(r.output[0] == OutputRecord{0, BLUE_OUT_INT, 2});
    std::set<uint32_t> kinds;
    for (const OutputRecord& rec : r.output) kinds.insert(rec.kind);
    CHECK(kinds == std::set<uint32_t>{BLUE_OUT_INT, BLUE_OUT_UINT, BLUE_OUT_FLOAT, BLUE_OUT_CHAR,
                                      BLUE_OUT_STR, BLUE_OUT_TOKEN, BLUE_OUT_END, BLUE_OUT_BEGIN});
}

// ---- the same programs on the GPU ------------------------------------------------------------

std::vector<Program> gpuPrograms() {
    std::vector<Program> list = {heapProgram(),     sharedProgram(),     mailboxProgram(),
                                 inputProgram(),    inputFaultProgram(), stepsProgram(),
                                 watchdogProgram(), blockFullProgram()};
    list.push_back({"scenarios", scenarioSource(), uint32_t(scenarios().size()) + 1});
    Result<std::string> every = everyOpSource();
    REQUIRE(every.isOk());
    list.push_back({"every_op", every.value(), 1, everyOpInput()});
    return list;
}

void compareWithReference(const Program& p, const Module& m, const BothRuns& runs) {
    const RunReport &gpu = runs.gpu, &ref = runs.ref;
    REQUIRE(gpu.instances.size() == ref.instances.size());
    CHECK(gpu.status.isOk() == ref.status.isOk());
    for (uint32_t i = 0; i < p.instances; ++i) {
        CAPTURE(i);
        CHECK(gpu.instances[i].status == ref.instances[i].status);
        CHECK(gpu.instances[i].fault == ref.instances[i].fault);
        CHECK(gpu.instances[i].pc == ref.instances[i].pc);
        CHECK(recordsOf(gpu.output, i) == recordsOf(ref.output, i));
    }
    CHECK(gpu.output.size() == ref.output.size());
    CHECK(describeFaults(m, gpu.instances, 100) == describeFaults(m, ref.instances, 100));
    if (p.exact_timing) {
        CHECK(gpu.status.message() == ref.status.message());
        CHECK(gpu.cycles == ref.cycles);
        CHECK(runs.stats.steps == ref.steps);
        CHECK(gpu.block_runs == ref.block_runs);
    }
}

TEST_CASE("interp gpu: every program ends on the GPU exactly as on the reference machine") {
    for (const Program& p : gpuPrograms()) {
        INFO("program: " << p.name);
        Module m = assembleOrFail(p.source, p.name);
        Result<WeightSource> w = WeightSource::open(m, "");
        REQUIRE(w.isOk());
        BothRuns runs = runBoth(m, w.value(), p.instances, p.input, p.max_cycles);
        compareWithReference(p, m, runs);
        CHECK(runs.stats.round_trips == 0);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

// INPOLL is INRECV that never waits: -2 while the input is open and empty, a slot once a message
// is there, -1 once the input is closed and drained. The program polls once a cycle and gives up
// after five empty polls (INRECV would wait for ever).
const char* kPollProgram = R"(.layout regs=8 in_slots=2 in_slot_words=4
    li r3, 0
poll:
    inpoll r1
    li r2, -2
    bne r1, r2, got
    addi r3, r3, 1
    li r6, 5
    bgeu r3, r6, bored
    yield
    jmp poll
bored:
    outu r3
    halt
got:
    out r1
    li r2, -1
    beq r1, r2, done
    li r4, 0
    inld r5, r1, r4
    out r5
    infree r1
    jmp poll
done:
    halt
)";

// INCMP: local[0..3] = {5, 6, 7, 8}; message {0, 5, 6, 9, 8} from word 1 shares 2 words with it,
// from word 0 none, from word 5 (its end) none; a message longer than local memory compares only
// what local memory holds; from past the end, or from a local address past local memory, faults.
const char* kIncmpProgram = R"(.layout regs=16 local=4 in_slots=2 in_slot_words=8
    li r2, 5
    st r2, r0, 0
    li r2, 6
    st r2, r0, 1
    li r2, 7
    st r2, r0, 2
    li r2, 8
    st r2, r0, 3
    inrecv r1
    li r3, 1
    li r4, 0
    incmp r4, r1, r3
    outu r4
    li r4, 0
    incmp r4, r1, r0
    outu r4
    li r3, 5
    li r4, 0
    incmp r4, r1, r3
    outu r4
    li r3, 1
    li r4, 2
    incmp r4, r1, r3
    outu r4
    infree r1
    inrecv r1
    li r4, 0
    incmp r4, r1, r0
    outu r4
    li r4, 3
    incmp r4, r1, r0
    outu r4
    li r3, 7
past_end:
    incmp r4, r1, r3
    halt
)";

TEST_CASE("interp: INCMP counts the leading words a message shares with local memory; both machines agree") {
    Module m = assembleOrFail(kIncmpProgram, "incmp");
    const std::vector<std::vector<uint32_t>> input = {{0, 5, 6, 9, 8}, {5, 6, 7, 8, 9, 9}};
    RunReport r = runRef(m, 1, input);
    REQUIRE(r.status.isOk());
    // {5,6,9,8} vs {5,6,7,8}: 2; {0,...}: 0; from the end: 0; from word 1 vs local[2..3] = {7, 8}: 0;
    // {5,6,7,8,9,9} vs local[0..3]: all 4 local words; from local[3] = {8} vs 5: 0.
    CHECK(values(r.output) == std::vector<uint32_t>{2, 0, 0, 0, 4, 0});
    CHECK(r.instances[0].status == BLUE_ST_FAULT);
    CHECK(r.instances[0].fault == BLUE_FAULT_INPUT_OOB);
    CHECK(r.instances[0].pc == labelValue(m, "past_end"));
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns both = runBoth(m, w.value(), 1, input);
    REQUIRE(both.gpu.status.isOk());
    CHECK(values(both.gpu.output) == values(r.output));
    CHECK(both.gpu.instances[0].fault == BLUE_FAULT_INPUT_OOB);
    CHECK(both.gpu.instances[0].pc == labelValue(m, "past_end"));
    CHECK_NO_VALIDATION_ERRORS();
}

// Runs `src` on one instance with one input message on the reference machine and the GPU; both
// must print `expected`.
void checkOneMessage(const std::string& src, const char* name, const std::vector<uint32_t>& message,
                     const std::vector<uint32_t>& expected) {
    Module m = assembleOrFail(src, name);
    RunReport r = runRef(m, 1, {message});
    REQUIRE(r.status.isOk());
    CHECK(values(r.output) == expected);
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns both = runBoth(m, w.value(), 1, {message});
    REQUIRE(both.gpu.status.isOk());
    CHECK(values(both.gpu.output) == expected);
    CHECK_NO_VALIDATION_ERRORS();
}

// A prompt of 40,000 tokens copied into local memory (INCPY) and compared with it (INCMP) in one
// cycle, as the generation program does with prefix reuse: one word an iteration, the two walks
// took 80,000 loop iterations in one sequencer invocation, past lavapipe's 65,535
// (KernelChoice::loop_limit), and the comparison stopped short there.
TEST_CASE("interp gpu: INCPY and INCMP of a 40,000-word message in one cycle agree with the reference") {
    constexpr uint32_t kWords = 40000;
    const std::string src = ".layout regs=16 local=" + std::to_string(kWords) + " in_slots=1 in_slot_words=" +
                            std::to_string(kWords + 1) + R"(
    inrecv r1
    li r2, 0
    incpy r2, r1, r0
    outu r2
    li r4, 0
    incmp r4, r1, r0
    outu r4
    li r5, 39999
    ld r6, r5, 0
    outu r6
    halt
)";
    std::vector<uint32_t> message(kWords);
    for (uint32_t i = 0; i < kWords; ++i) message[i] = i * 7 + 3;
    checkOneMessage(src, "long_copy", message, {kWords, kWords, 39999 * 7 + 3});
}

// Grammar automata as large as lavapipe allows (maxGrammarWords: 58,368 words, a 58,365-word
// section) copied into two instances' tensors (INTCPY) in one cycle, the way the generation
// program copies them: after a yield, so that both copies run in the same round of the
// sequencer's slow instructions, together. Instance 0 is a round behind before the yield (it calls
// a subroutine first); without the yield, lavapipe ran the two copies one after the other, one
// word a loop iteration, and the second stopped short of its 65,535 iterations a cycle (with
// 40,001-word sections: instance tensor words from about 25,500 on were never written).
// Each message's section starts one word in, after a word INTCPY skips.
TEST_CASE("interp gpu: INTCPY of 58,365-word sections by two instances after a yield agrees with the reference") {
    constexpr uint32_t kWords = 58365;
    constexpr uint32_t kSlice = kWords + 2;
    const std::string src = ".layout regs=16 stack=2 in_slots=2 in_slot_words=" + std::to_string(kWords + 3) +
                            "\n.tensor g instance i32 [" + std::to_string(kSlice) + "]\n" + R"(
    iid r7
    bnez r7, go
    call sub
go:
    inrecv r1
    li r2, 1
    yield
    intcpy r2, r1, g
    outu r2
    li r5, 0
    tld r6, r5, g
    outu r6
    li r5, 7
    tld r6, r5, g
    outu r6
    li r5, 32768
    tld r6, r5, g
    outu r6
    li r5, 58363
    tld r6, r5, g
    outu r6
    li r5, 58364
    tld r6, r5, g
    outu r6
    li r5, 58365
    tld r6, r5, g
    outu r6
    halt
sub:
    ret
)";
    Module m = assembleOrFail(src, "long_tensor_copy");
    std::vector<std::vector<uint32_t>> messages;
    for (uint32_t k = 0; k < 2; ++k) {
        std::vector<uint32_t> msg = {99, kWords};
        for (uint32_t i = 0; i < kWords; ++i) msg.push_back(i * 5 + 11 + k * 1000003u);
        messages.push_back(msg);
    }
    // Which message an instance takes is the ring's order: its first word says which.
    auto check = [&](const std::vector<OutputRecord>& out) {
        std::vector<uint32_t> taken;
        for (uint32_t inst = 0; inst < 2; ++inst) {
            CAPTURE(inst);
            std::vector<uint32_t> v;
            for (const OutputRecord& o : out)
                if (o.inst == inst) v.push_back(o.value);
            REQUIRE(v.size() == 7);
            uint32_t k = (v[1] - 11u) / 1000003u;
            REQUIRE(k < 2);
            taken.push_back(k);
            auto word = [&](uint32_t i) { return i * 5 + 11 + k * 1000003u; };
            CHECK(v == std::vector<uint32_t>{kWords + 2, word(0), word(7), word(32768), word(58363),
                                             word(58364), 0u});
        }
        CHECK(taken[0] != taken[1]);
    };
    RunReport r = runRef(m, 2, messages);
    REQUIRE(r.status.isOk());
    check(r.output);
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns both = runBoth(m, w.value(), 2, messages);
    REQUIRE(both.gpu.status.isOk());
    check(both.gpu.output);
    CHECK_NO_VALIDATION_ERRORS();
}

// A module that lets one cycle run 100,000 steps: 58,000 of them between copying a 40,000-word
// message into local memory and comparing it (INCPY, INCMP: 5,000 loop iterations each). On
// lavapipe the step loop's iterations and the walks' share the 65,535 an invocation gets, and
// INCMP stopped after about 20,000 words; the machine caps a cycle's steps there
// (maxCycleSteps), so the loop goes on over several cycles and INCMP runs whole.
TEST_CASE("interp gpu: a long step loop between INCPY and INCMP in one cycle's budget agrees with the reference") {
    constexpr uint32_t kWords = 40000;
    const std::string src = ".layout regs=16 max_steps=100000 local=" + std::to_string(kWords) +
                            " in_slots=1 in_slot_words=" + std::to_string(kWords + 1) + R"(
    inrecv r1
    li r2, 0
    incpy r2, r1, r0
    li r3, 29000
spin:
    addi r3, r3, -1
    bnez r3, spin
    li r4, 0
    incmp r4, r1, r0
    outu r4
    halt
)";
    std::vector<uint32_t> message(kWords);
    for (uint32_t i = 0; i < kWords; ++i) message[i] = i * 3 + 1;
    checkOneMessage(src, "long_steps", message, {kWords});
}

TEST_CASE("interp: INPOLL gives -2 while the input is open and empty, never yields") {
    Module m = assembleOrFail(kPollProgram, "poll");
    RunReport open_empty = runRef(m, 1, {}, 20, false);
    REQUIRE(open_empty.status.isOk());
    CHECK(open_empty.instances[0].status == BLUE_ST_HALTED);
    CHECK(values(open_empty.output) == std::vector<uint32_t>{5});
    CHECK(open_empty.cycles == 5);  // one poll per cycle, each answered at once
    RunReport fed = runRef(m, 1, {{7}, {8}});
    REQUIRE(fed.status.isOk());
    CHECK(values(fed.output) == std::vector<uint32_t>{0, 7, 1, 8, I(-1)});
    CHECK(fed.instances[0].status == BLUE_ST_HALTED);
}

TEST_CASE("interp gpu: INPOLL answers at once on the GPU too") {
    Module m = assembleOrFail(kPollProgram, "poll");
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    GpuOptions opt;
    opt.max_cycles = 20;
    opt.chain_cycles = 8;
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w.value(), opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    Result<RunReport> r = machine.value()->run();
    REQUIRE(r.isOk());
    RunReport ref = runRef(m, 1, {}, 20, false);
    REQUIRE(r.value().status.isOk());
    CHECK(r.value().instances[0].status == BLUE_ST_HALTED);
    CHECK(values(r.value().output) == values(ref.output));
    auto fed = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w.value(), GpuOptions{});
    REQUIRE_MESSAGE(fed.isOk(), fed.message());
    REQUIRE(fed.value()->pushInput({7}).isOk());
    REQUIRE(fed.value()->pushInput({8}).isOk());
    fed.value()->closeInput();
    Result<RunReport> got = fed.value()->run();
    REQUIRE(got.isOk());
    REQUIRE(got.value().status.isOk());
    CHECK(values(got.value().output) == std::vector<uint32_t>{0, 7, 1, 8, I(-1)});
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("interp gpu: INRECV waits while the input is open, on the GPU too") {
    Program p = inputProgram();
    Module m = assembleOrFail(p.source, p.name);
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    GpuOptions opt;
    opt.max_cycles = 20;
    opt.chain_cycles = 8;
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w.value(), opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    Result<RunReport> r = machine.value()->run();
    REQUIRE(r.isOk());
    RunReport ref = runRef(m, 1, {}, 20, false);
    CHECK(r.value().status.message() == ref.status.message());
    CHECK(r.value().instances[0].pc == 0);
    CHECK(r.value().instances[0].status == BLUE_ST_RUNNING);
    CHECK(r.value().output.empty());
    CHECK_NO_VALIDATION_ERRORS();
}

// Random operands, including NaNs, infinities and subnormals: + - * and every comparison are
// bit-exact on the GPU; division, square root, exp and log within the stated tolerance.
TEST_CASE("interp gpu: float ops on random operands match the reference") {
    const Op ops[] = {Op::FADD,   Op::FSUB, Op::FMUL, Op::FDIV,  Op::FMIN, Op::FMAX,
                      Op::FEQ,    Op::FLT,  Op::FLE,  Op::FSQRT, Op::FEXP, Op::FLOG,
                      Op::FFLOOR, Op::ITOF, Op::UTOF, Op::FTOI,  Op::FNEG, Op::FABS};
    std::mt19937 rng(77);
    auto operand = [&]() -> uint32_t {
        switch (rng() % 4) {
            case 0:
                return rng();  // any bits
            case 1:
                return F(float(int32_t(rng() % 20001) - 10000) / 64.0f);  // exact-ish
            case 2:
                return F(std::ldexp(float(rng() % 1000 + 1) / 1000.0f, int(rng() % 40) - 20));
            default: {
                const uint32_t special[] = {0, kNegZero,   kInf,       kNegInf, kNaN,
                                            1, 0x00800000, 0x7F7FFFFF, F(1.0f), F(-1.0f)};
                return special[rng() % 10];
            }
        }
    };
    std::vector<AluCase> cases;
    for (Op op : ops) {
        for (int k = 0; k < 48; ++k) {
            uint32_t b = operand(), c = operand();
            if (op == Op::FLOG || op == Op::FSQRT) b &= 0x7FFFFFFFu;  // mostly in the domain
            bool approx = op == Op::FDIV || op == Op::FSQRT || op == Op::FEXP || op == Op::FLOG;
            cases.push_back({op, b, c, 0, approx ? kTranscendental : kExact});
        }
    }
    std::string src = ".layout regs=4 max_steps=100000\n";
    for (size_t i = 0; i < cases.size(); ++i) src += aluCaseSource(cases[i], i);
    Module m = assembleOrFail(src + "    halt\n", "floats");
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns runs = runBoth(m, w.value(), 1);
    std::vector<uint32_t> gpu = values(runs.gpu.output), ref = values(runs.ref.output);
    REQUIRE(gpu.size() == cases.size());
    REQUIRE(ref.size() == cases.size());
    std::map<Op, uint64_t> worst;
    for (size_t i = 0; i < cases.size(); ++i) {
        const AluCase& c = cases[i];
        INFO(opInfo(c.op).name << strFormat("(0x%08x, 0x%08x): gpu 0x%08x, reference 0x%08x", c.b,
                                            c.c, gpu[i], ref[i]));
        CHECK(gpuAgrees(c.op, c.b, c.c, gpu[i], ref[i]));
        bool normal = !isSubnormal(c.b) && !isSubnormal(ref[i]) && !isNaN(ref[i]) && !isNaN(gpu[i]);
        if (normal) worst[c.op] = std::max(worst[c.op], ulpDistance(gpu[i], ref[i]));
    }
    std::string measured;  // subnormal operands and results left out
    for (auto [op, ulp] : worst) {
        if (ulp)
            measured += strFormat(" %s %llu", std::string(opInfo(op).name).c_str(),
                                  (unsigned long long)ulp);
    }
    MESSAGE("ops differing from the reference (largest ULP):" << (measured.empty() ? " none"
                                                                                   : measured));
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test
