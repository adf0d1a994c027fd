// Shared test programs (see vm_programs.h).
#include "tests/vm_programs.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "compiler/asm.h"
#include "host/machine_plan.h"
#include "host/pipelines.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/llm_abi.h"
#include "vm/tensor_ops.h"
#include "vm/verify.h"

namespace blue::test {

namespace {

// Tensors the generated block draws its operands from, f32 first so that the search prefers
// combinations the GPU has kernels for. Weights hold small integers (exact in any order); `ff2`
// is a RoPE frequency-factor table, `kc48`/`vc48` are KV caches of 8 positions and `kp483`/`vp483`
// KV pools of 3 pages of 8 positions.
constexpr const char* kTensorPool =
    R"(.tensor m44 weight f32 [4, 4] data f32 1 2 3 4 5 6 7 8 -1 -2 -3 -4 0 1 0 1
.tensor w4 weight f32 [4] data f32 0.5 1 -1 2
.tensor x4 rows f32 [4]
.tensor y4 rows f32 [4]
.tensor s1 rows f32 [1]
.tensor v4 instance f32 [4]
.tensor t1 instance f32 [1]
.tensor g4 global f32 [4] data f32 1 1 2 2
.tensor x8 rows f32 [8]
.tensor m84 weight f32 [8, 4] data f32 1 0 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 1 0 0 0 0
.tensor m48 weight f32 [4, 8] data f32 1 0 0 0 0 1 0 0 0 0 1 0 0 0 0 1 1 0 0 0 0 1 0 0 0 0 1 0 0 0 0 1
.tensor c84 instance f32 [8, 4]
.tensor ff2 weight f32 [2] data f32 1 4
.tensor kc48 instance f32 [4, 8]
.tensor vc48 instance f32 [4, 8]
.tensor st483 global f32 [4, 8, 3]
.tensor n4 instance i32 [4]
.tensor k4 rows i32 [4]
.tensor k1 rows i32 [1]
.tensor h44 weight f16 [4, 4] data hex 003c0040004200440045004600470048003c0040004200440045004600470048
.tensor e444 weight f32 [4, 4, 4] data f32 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1 1 -2 0 2 -1
.tensor map41 global i32 [41]
.tensor gr80 instance i32 [80]
.tensor r4 rows f32 [4]
.tensor q324 weight q8_0 [32, 4] data hex 003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101
.tensor kp483 global f32 [4, 8, 3]
.tensor vp483 global f32 [4, 8, 3]
)";

// Local memory follows vm/llm_abi.h: the sampling block at BLUE_LM_SAMPLING, stop tokens, then
// the token history. The block takes the forward block's arguments (BLUE_FA_*).
constexpr const char* kLayout =
    ".layout regs=8 local=32 heap=16 heap_static=4 stack=4 mailbox=2 in_slots=2 in_slot_words=8 "
    "max_rows=4 max_steps=4096\n";
constexpr uint32_t kHistory[] = {1, 3, 2};  // at BLUE_LM_HISTORY; the block runs the last 2
constexpr uint32_t kBlockRows = 2;
constexpr uint32_t kBlockPos = 5;

// Scalar operands (in format order) of ops whose scalars carry meaning: which block argument an
// op reads (BLUE_FA_*), head counts and sizes that must divide the rows. Ops not listed get 1
// for integers and 0.5 for floats.
struct ScalarHint {
    Op op;
    std::vector<std::string> values;
};
const std::vector<ScalarHint>& scalarHints() {
    static const std::vector<ScalarHint> hints = {
        {Op::RMSNORM, {"1e-5", "0"}},
        {Op::EMBED, {std::to_string(BLUE_FA_TOKENS)}},
        // position arg, head size 4, 4 rotated dims, neox pairs, base, scale
        {Op::ROPE, {std::to_string(BLUE_FA_POS), "4", "4", "2", "10000", "0.5"}},
        {Op::ROPEQK, {std::to_string(BLUE_FA_POS), "4", "4", "2", "10000", "0.5"}},
        {Op::KVSTORE, {std::to_string(BLUE_FA_POS)}},
        // save into slot arg 0 (the rows: 2) the rows from arg 0 to arg 1 (the position: 5)
        {Op::KVCOPY, {"1", std::to_string(BLUE_FA_ROWS), std::to_string(BLUE_FA_ROWS), std::to_string(BLUE_FA_POS)}},
        // 2 query heads of 2 dims over 2 KV heads, position arg, scale
        {Op::ATTN, {"2", "2", std::to_string(BLUE_FA_POS), "0.7"}},
        {Op::SAMPLE, {std::to_string(BLUE_FA_SAMPLING)}},
        // Paged KV: the page table is the 2 words at local 28, the history's first tokens 1 and 3
        // (page 1 maps positions 0-7; 3 is past the pools' 3 pages: 8-15 unmapped).
        {Op::KVSTOREP, {std::to_string(BLUE_FA_POS), "28", "2"}},
        {Op::ATTNP, {"2", "2", std::to_string(BLUE_FA_POS), "0.7", "0", "0.5", "28", "2"}},
        // page arg 3 (the sampling block's address: 0) to page arg 0 (the rows: 2), 2 rows
        {Op::PGCOPY, {"3", "0", "0"}},
        // save into slot arg 0 (2) the rows from arg 0 (2) to arg 1 (5)
        {Op::KVCOPYP, {"1", std::to_string(BLUE_FA_ROWS), std::to_string(BLUE_FA_ROWS), std::to_string(BLUE_FA_POS), "28", "2"}},
        // 2 of 4 experts per row, top-k renormalised: the map of 4 rows is 41 words (vm/abi.h)
        {Op::MOEROUTE, {"2", "0"}},
    };
    return hints;
}

std::vector<std::string> scalarValues(const OpInfo& info) {
    for (const ScalarHint& h : scalarHints()) {
        if (h.op == info.op) return h.values;
    }
    std::vector<std::string> out;
    for (char c : info.format) {
        if (c == 'f') out.push_back("0.5");
        if (c == 'u' || c == 'i') out.push_back("1");
    }
    return out;
}

uint32_t scalarWord(char letter, const std::string& text) {
    if (letter != 'f') return uint32_t(std::stoul(text));
    float f = std::stof(text);
    uint32_t w;
    std::memcpy(&w, &f, 4);
    return w;
}

bool distinctTensors(const std::vector<uint32_t>& args, const std::vector<size_t>& slots) {
    for (size_t i = 0; i < slots.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            if (args[slots[i]] == args[slots[j]] && args[slots[i]] != 0xFFFFFFFFu) return false;
        }
    }
    return true;
}

// Finds tensor operands for a tensor op that checkTensorOp accepts, searching the pool in order
// (an optional operand tries `none` after every pool tensor, or first where an op has several)
// with the op's scalar values.
// Preferred, in this order: combinations the GPU has a kernel for, then ones whose tensors are
// all different (so data flows from inputs to a separate output). Returns the operand text, or
// empty when no combination passes.
std::string tensorOperands(const Module& pool, const OpInfo& info) {
    const std::string fmt(info.format);
    const std::vector<std::string> scalars = scalarValues(info);
    std::vector<size_t> tensor_slots;
    std::vector<std::string> scalar_text(fmt.size());
    TensorInstr ti{info.op, 0, std::vector<uint32_t>(fmt.size(), 0)};
    size_t next_scalar = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] == 't' || fmt[i] == 'o') {
            tensor_slots.push_back(i);
            continue;
        }
        if (next_scalar == scalars.size()) return {};  // a hint with too few values
        scalar_text[i] = scalars[next_scalar++];
        ti.args[i] = scalarWord(fmt[i], scalar_text[i]);
    }
    const size_t n = pool.tensors.size();
    uint64_t combos = 1;
    for (size_t slot : tensor_slots) {
        if (combos < (1u << 22)) combos *= fmt[slot] == 'o' ? n + 1 : n;
    }
    // With several optional operands (MOEMIX) the search bound is reached before the last ones
    // get to `none`: there they try `none` first.
    const bool none_first = std::count(fmt.begin(), fmt.end(), 'o') > 1;
    for (int pass = 0; pass < 4; ++pass) {
        const bool need_kernel = pass < 2, distinct = pass % 2 == 0;
        for (uint64_t c = 0; c < combos; ++c) {
            uint64_t rest = c;
            for (size_t slot : tensor_slots) {
                const size_t choices = fmt[slot] == 'o' ? n + 1 : n;
                size_t pick = rest % choices;
                if (fmt[slot] == 'o' && none_first) pick = pick == 0 ? n : pick - 1;
                ti.args[slot] = pick == n ? 0xFFFFFFFFu : uint32_t(pick);
                rest /= choices;
            }
            if (distinct && !distinctTensors(ti.args, tensor_slots)) continue;
            if (!checkTensorOp(pool, ti).isOk()) continue;
            if (need_kernel && !Pipelines::exists(kernelName(pool, uint32_t(info.op), ti.args)))
                continue;
            std::string text;
            for (size_t i = 0; i < fmt.size(); ++i) {
                text += i ? ", " : " ";
                if (fmt[i] != 't' && fmt[i] != 'o')
                    text += scalar_text[i];
                else if (ti.args[i] == 0xFFFFFFFFu)
                    text += "none";
                else
                    text += pool.tensors[ti.args[i]].name;
            }
            return text;
        }
    }
    return {};
}

// Stores a word into local memory (r5 holds the value, r6 zero).
std::string storeLocal(uint32_t addr, const std::string& li) {
    return "    " + li + "\n    st r5, r6, " + std::to_string(addr) + "\n";
}

// Fills local memory as vm/llm_abi.h lays it out (a sampling block with every filter and
// penalty on, a token history) and v4, the logits SAMPLE finds in the pool.
std::string llmSetup() {
    const uint32_t sp = BLUE_LM_SAMPLING;
    std::string s = "    li r6, 0\n";
    s += storeLocal(sp + BLUE_SP_TEMP, "lf r5, 0.8");
    s += storeLocal(sp + BLUE_SP_TOP_K, "li r5, 3");
    s += storeLocal(sp + BLUE_SP_TOP_P, "lf r5, 0.95");
    s += storeLocal(sp + BLUE_SP_MIN_P, "lf r5, 0.05");
    s += storeLocal(sp + BLUE_SP_REPEAT_PENALTY, "lf r5, 1.3");
    s += storeLocal(sp + BLUE_SP_REPEAT_LAST_N, "li r5, 8");
    s += storeLocal(sp + BLUE_SP_PRESENCE, "lf r5, 0.1");
    s += storeLocal(sp + BLUE_SP_FREQUENCY, "lf r5, 0.05");
    s += storeLocal(sp + BLUE_SP_SEED, "li r5, 1234");
    s += storeLocal(sp + BLUE_SP_HIST_ADDR, "li r5, " + std::to_string(BLUE_LM_HISTORY));
    s += storeLocal(sp + BLUE_SP_HIST_LEN, "li r5, " + std::to_string(std::size(kHistory)));
    for (size_t i = 0; i < std::size(kHistory); ++i) {
        s += storeLocal(uint32_t(BLUE_LM_HISTORY + i), "li r5, " + std::to_string(kHistory[i]));
    }
    const char* logits[] = {"1.0", "2.5", "2.0", "-1.0"};
    for (size_t i = 0; i < std::size(logits); ++i) {
        s += std::string("    lf r5, ") + logits[i] + "\n    li r7, " + std::to_string(i) +
             "\n    tst r5, r7, v4\n";
    }
    return s;
}

// RUN with the forward block's arguments in r1..r4, then outputs the sampled token.
std::string runBlock() {
    const uint32_t first_token = BLUE_LM_HISTORY + uint32_t(std::size(kHistory)) - kBlockRows;
    return "    li r1, " + std::to_string(kBlockRows) + "\n    li r2, " +
           std::to_string(kBlockPos) + "\n    li r3, " + std::to_string(first_token) +
           "\n    li r4, " + std::to_string(BLUE_LM_SAMPLING) +
           "\n    run all, r1\n    li r5, 0\n    ld r5, r5, " +
           std::to_string(BLUE_LM_SAMPLING + BLUE_SP_OUT_TOKEN) + "\n    out r5\n";
}

// A control instruction's operands: registers r1, r2, r3 in turn; immediates that keep the
// program running (labels point at the next instruction).
std::string controlOperands(const OpInfo& info, const std::string& next_label) {
    std::string text;
    int reg = 1;
    for (size_t i = 0; i < info.format.size(); ++i) {
        text += i ? ", " : " ";
        switch (info.format[i]) {
            case 'r':
                text += "r" + std::to_string(reg++);
                break;
            case 'i':
                text += "1";
                break;
            case 'u':
                text += "3";
                break;
            case 'f':
                text += "0.5";
                break;
            case 'l':
                text += info.op == Op::CALL ? "sub" : next_label;
                break;
            case 'b':
                text += "all";
                break;
            case 'k':
                text += "tbl";
                break;
            case 's':
                text += "str";
                break;
            case 't':
                text += "v4";
                break;
            default:
                text += "?";
                break;
        }
    }
    return text;
}

std::string lower(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

}  // namespace

std::vector<std::string> goldenProgramPaths() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(sourceDir() + "/programs")) {
        if (e.path().extension() == ".blue") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

Result<std::string> everyOpSource() {
    Result<Module> pool = assemble(std::string(kLayout) + kTensorPool + "halt\n", "pool");
    if (!pool) return pool.status();
    std::string block = ".block all args=" + std::to_string(BLUE_FA_COUNT) + "\n";
    std::string code = ".entry main\nmain:\n" + llmSetup();
    uint32_t label = 0;
    std::string last;  // INFREE: after every op that reads the input slot (INCMP comes later)
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        // KERNEL runs a module's own SPIR-V (section KERNELS), which assembly cannot declare and
        // the reference interpreter cannot run: tests/test_kernel.cpp covers it.
        if (op->op == Op::KERNEL) continue;
        if (op->tensor) {
            std::string operands = tensorOperands(pool.value(), *op);
            if (operands.empty()) {
                return BLUE_ERROR(
                    "no combination of pool tensors satisfies the rules of %s; "
                    "extend kTensorPool or scalarHints() in tests/vm_programs.cpp",
                    std::string(op->name).c_str());
            }
            block += "    " + lower(op->name) + operands + "\n";
            continue;
        }
        // HALT ends the program and RET ends the subroutine CALL goes to; both come last.
        if (op->op == Op::HALT || op->op == Op::RET) continue;
        if (op->op == Op::RUN) {
            code += runBlock();
            continue;
        }
        std::string next = "n" + std::to_string(label++);
        std::string& to = op->op == Op::INFREE ? last : code;
        to += "    li r1, 0\n    li r2, 0\n    li r3, 1\n";
        to += "    " + lower(op->name) + controlOperands(*op, next) + "\n" + next + ":\n";
    }
    code += last;
    code += "    halt\nsub:\n    ret\n";
    return std::string(kLayout) + ".const tbl 1 2 3 4\n.string str \"every op\\n\"\n" +
           kTensorPool + block + ".end\n" + code;
}

std::vector<std::vector<uint32_t>> everyOpInput() {
    return {{1, 6, 7}};  // INTCPY at word 0: a one-word section
}

std::vector<uint8_t> opcodesUsed(const Module& m) {
    std::vector<uint8_t> out;
    for (uint32_t pc = 0; pc < m.instrCount(); ++pc) out.push_back(uint8_t(m.code[pc * 2]));
    for (const BlockDecl& b : m.blocks) {
        std::vector<TensorInstr> instrs;
        if (!decodeBlock(m, b, &instrs)) continue;
        for (const TensorInstr& ti : instrs) out.push_back(uint8_t(ti.op));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

std::vector<OutputRecord> recordsOf(const std::vector<OutputRecord>& all, uint32_t inst) {
    std::vector<OutputRecord> out;
    for (const OutputRecord& r : all) {
        if (r.inst == inst) out.push_back(r);
    }
    return out;
}

}  // namespace blue::test
