// CodeBuilder: emits Blue-IR control code from C++ with forward-referenced labels, and tensor
// instructions into blocks. Used by the model compiler; the result still goes through
// verifyModule like any other module.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "vm/isa.h"
#include "vm/module.h"

namespace blue {

class CodeBuilder {
public:
    explicit CodeBuilder(Module* m) : m_(m) {}

    using Label = uint32_t;
    Label newLabel(std::string name = "");
    void bind(Label l);  // the next instruction gets label l

    // Emits a control instruction; registers in format order, then the immediate.
    void op(Op op, std::initializer_list<uint8_t> regs = {}, uint32_t imm = 0);
    // Emits a control instruction whose immediate is a label (jumps, branches, CALL).
    void jump(Op op, std::initializer_list<uint8_t> regs, Label target);
    void li(uint8_t r, uint32_t v) { op(Op::LI, {r}, v); }

    // Starts a block; tensor() appends to it until endBlock().
    uint32_t beginBlock(const std::string& name, uint32_t nargs);
    void tensor(Op op, std::initializer_list<uint32_t> operands);
    void endBlock();

    // Resolves labels into the module's code and symbol table. Fails for unbound labels.
    Status finish();

private:
    Module* m_;
    std::vector<int64_t> label_pc_;  // -1: unbound
    std::vector<std::string> label_names_;
    std::vector<std::pair<size_t, Label>> fixups_;  // code word index of the immediate, label
    int32_t open_block_ = -1;
};

}  // namespace blue
