// CodeBuilder (see code_builder.h).
#include "compiler/code_builder.h"

#include <cassert>

namespace blue {

CodeBuilder::Label CodeBuilder::newLabel(std::string name) {
    label_pc_.push_back(-1);
    label_names_.push_back(std::move(name));
    return Label(label_pc_.size() - 1);
}

void CodeBuilder::bind(Label l) {
    assert(label_pc_[l] < 0 && "label bound twice");
    label_pc_[l] = m_->instrCount();
}

void CodeBuilder::op(Op op, std::initializer_list<uint8_t> regs, uint32_t imm) {
    assert(regs.size() <= 3);
    uint8_t r[3] = {0, 0, 0};
    size_t i = 0;
    for (uint8_t v : regs) r[i++] = v;
    m_->code.push_back(encodeWord0(uint8_t(op), r[0], r[1], r[2]));
    m_->code.push_back(imm);
}

void CodeBuilder::jump(Op o, std::initializer_list<uint8_t> regs, Label target) {
    op(o, regs, 0);
    fixups_.emplace_back(m_->code.size() - 1, target);
}

uint32_t CodeBuilder::beginBlock(const std::string& name, uint32_t nargs) {
    assert(open_block_ < 0 && "blocks do not nest");
    BlockDecl b;
    b.name = name;
    b.nargs = nargs;
    b.tcode_offset = uint32_t(m_->tcode.size());
    m_->blocks.push_back(b);
    open_block_ = int32_t(m_->blocks.size() - 1);
    return uint32_t(open_block_);
}

void CodeBuilder::tensor(Op o, std::initializer_list<uint32_t> operands) {
    assert(open_block_ >= 0 && "tensor instruction outside a block");
    assert(operands.size() == opInfo(o).format.size());
    m_->tcode.push_back(encodeTensorHeader(uint8_t(o), uint32_t(operands.size())));
    m_->tcode.insert(m_->tcode.end(), operands.begin(), operands.end());
}

void CodeBuilder::endBlock() {
    BlockDecl& b = m_->blocks[size_t(open_block_)];
    b.tcode_words = uint32_t(m_->tcode.size()) - b.tcode_offset;
    open_block_ = -1;
}

Status CodeBuilder::finish() {
    for (auto [word, label] : fixups_) {
        if (label_pc_[label] < 0) {
            return BLUE_ERROR("code builder: label %u '%s' is never bound", label,
                              label_names_[label].c_str());
        }
        m_->code[word] = uint32_t(label_pc_[label]);
    }
    for (size_t l = 0; l < label_pc_.size(); ++l) {
        if (!label_names_[l].empty() && label_pc_[l] >= 0) {
            m_->syms.push_back({SymKind::LABEL, uint32_t(label_pc_[l]), label_names_[l]});
        }
    }
    return Status::ok();
}

}  // namespace blue
