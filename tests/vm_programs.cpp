// Shared test programs (see vm_programs.h).
#include "tests/vm_programs.h"

#include <algorithm>
#include <filesystem>

#include "compiler/asm.h"
#include "host/machine_plan.h"
#include "host/pipelines.h"
#include "tests/test_paths.h"
#include "vm/isa.h"
#include "vm/tensor_ops.h"
#include "vm/verify.h"

namespace blue::test {

namespace {

// Tensors the generated block draws its operands from, f32 first so that the search prefers
// combinations the GPU has kernels for. Weights hold small integers (exact in any order).
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
.tensor n4 instance i32 [4]
.tensor k4 rows i32 [4]
.tensor k1 rows i32 [1]
.tensor h44 weight f16 [4, 4] data hex 003c0040004200440045004600470048003c0040004200440045004600470048
.tensor q324 weight q8_0 [32, 4] data hex 003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101003c0101010101010101010101010101010101010101010101010101010101010101
)";
constexpr const char* kLayout =
    ".layout regs=8 local=16 heap=16 heap_static=4 stack=4 mailbox=2 in_slots=2 in_slot_words=8 "
    "max_rows=4 max_steps=4096\n";

// Finds tensor operands for a tensor op that checkTensorOp accepts, searching the pool in order
// with fixed values for scalar operands; combinations the GPU has a kernel for are preferred.
// Returns the operand text, or empty when no combination passes.
std::string tensorOperands(const Module& pool, const OpInfo& info) {
    const std::string fmt(info.format);
    std::vector<size_t> tensor_slots;
    TensorInstr ti{info.op, 0, std::vector<uint32_t>(fmt.size(), 0)};
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] == 't') tensor_slots.push_back(i);
        if (fmt[i] == 'f') ti.args[i] = 0x3F000000u;  // 0.5
        if (fmt[i] == 'u' || fmt[i] == 'i') ti.args[i] = 1;
    }
    const size_t n = pool.tensors.size();
    uint64_t combos = 1;
    for (size_t k = 0; k < tensor_slots.size() && combos < (1u << 22); ++k) combos *= n;
    for (bool need_kernel : {true, false}) {
        for (uint64_t c = 0; c < combos; ++c) {
            uint64_t rest = c;
            for (size_t slot : tensor_slots) {
                ti.args[slot] = uint32_t(rest % n);
                rest /= n;
            }
            if (!checkTensorOp(pool, ti).isOk()) continue;
            if (need_kernel && !Pipelines::exists(kernelName(pool, uint32_t(info.op), ti.args)))
                continue;
            std::string text;
            for (size_t i = 0; i < fmt.size(); ++i) {
                text += i ? ", " : " ";
                if (fmt[i] == 't')
                    text += pool.tensors[ti.args[i]].name;
                else if (fmt[i] == 'f')
                    text += "0.5";
                else
                    text += "1";
            }
            return text;
        }
    }
    return {};
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
    Result<Module> pool = assemble(std::string(kTensorPool) + "halt\n", "pool");
    if (!pool) return pool.status();
    std::string block = ".block all args=0\n";
    std::string code = ".entry main\nmain:\n";
    uint32_t label = 0;
    for (const OpInfo* op = opTableBegin(); op != opTableEnd(); ++op) {
        if (op->tensor) {
            std::string operands = tensorOperands(pool.value(), *op);
            if (operands.empty()) {
                return BLUE_ERROR(
                    "no combination of pool tensors satisfies the rules of %s; "
                    "extend kTensorPool in tests/vm_programs.cpp",
                    std::string(op->name).c_str());
            }
            block += "    " + lower(op->name) + operands + "\n";
            continue;
        }
        // HALT ends the program and RET ends the subroutine CALL goes to; both come last.
        if (op->op == Op::HALT || op->op == Op::RET) continue;
        std::string next = "n" + std::to_string(label++);
        code += "    li r1, 0\n    li r2, 0\n    li r3, 1\n";
        code += "    " + lower(op->name) + controlOperands(*op, next) + "\n" + next + ":\n";
    }
    code += "    halt\nsub:\n    ret\n";
    return std::string(kLayout) + ".const tbl 1 2 3 4\n.string str \"every op\\n\"\n" +
           kTensorPool + block + ".end\n" + code;
}

std::vector<std::vector<uint32_t>> everyOpInput() {
    return {{5, 6, 7}};
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
