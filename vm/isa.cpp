// The opcode table and encoding helpers (see isa.h). The table is the single source: it is built
// from vm/opcodes.def here and in every other consumer.
#include "vm/isa.h"

#include <array>
#include <cassert>
#include <cctype>

namespace blue {

namespace {

constexpr OpInfo kOps[] = {
#define BLUE_OP(name, code, fmt, grid, doc) {Op::name, #name, fmt, Grid::grid, doc, (code) >= 0x80},
#include "vm/opcodes.def"
#undef BLUE_OP
};

struct CodeIndex {
    std::array<const OpInfo*, 256> by_code{};
    CodeIndex() {
        for (const OpInfo& info : kOps) {
            assert(by_code[uint8_t(info.op)] == nullptr && "duplicate opcode in opcodes.def");
            by_code[uint8_t(info.op)] = &info;
        }
    }
};

const CodeIndex& codeIndex() {
    static const CodeIndex index;
    return index;
}

bool sameIgnoringCase(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::toupper(static_cast<unsigned char>(a[i])) !=
            std::toupper(static_cast<unsigned char>(b[i]))) {
            return false;
        }
    }
    return true;
}

}  // namespace

const OpInfo* opInfo(uint32_t code) { return code < 256 ? codeIndex().by_code[code] : nullptr; }

const OpInfo* opByName(std::string_view name) {
    for (const OpInfo& info : kOps) {
        if (sameIgnoringCase(info.name, name)) return &info;
    }
    return nullptr;
}

const OpInfo* opTableBegin() { return std::begin(kOps); }
const OpInfo* opTableEnd() { return std::end(kOps); }

FormatShape formatShape(std::string_view format) {
    FormatShape shape;
    for (char c : format) {
        if (c == 'r') {
            ++shape.regs;
        } else {
            assert(shape.imm == 0 && "a control format has at most one immediate");
            shape.imm = c;
        }
    }
    return shape;
}

}  // namespace blue
