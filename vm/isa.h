// Blue-IR instruction set: the opcode enum and per-opcode information generated from
// vm/opcodes.def, and the helpers that encode and decode instructions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace blue {

// How the host sizes the dispatch of a tensor instruction (none for control instructions).
//   ELEM:   x = ceil(row elements / kElemGroup), y = items
//   ITEM:   x = 1, y = items (one workgroup per item)
//   MATMUL: x = ceil(N / rows per group), y = ceil(items / batch tile)
//   HEADS:  x = the first uint operand (a head count), y = items
//   ONE:    one workgroup whenever the block has items (it walks all of them itself)
//   MOE:    as MATMUL, but the items axis is written by the MOEROUTE that fills the map: the
//           number of (expert, rows) tiles it made
enum class Grid : uint8_t { NONE, ELEM, ITEM, MATMUL, HEADS, ONE, MOE };

enum class Op : uint8_t {
#define BLUE_OP(name, code, fmt, grid, doc) name = code,
#include "vm/opcodes.def"
#undef BLUE_OP
};

struct OpInfo {
    Op op;
    std::string_view name;    // upper case, as in the table; the assembler accepts any case
    std::string_view format;  // operand letters (see opcodes.def)
    Grid grid;
    std::string_view doc;
    bool tensor;  // code >= 0x80
};

// Returns the information of an opcode byte, or nullptr when no opcode has that code.
const OpInfo* opInfo(uint32_t code);
inline const OpInfo& opInfo(Op op) { return *opInfo(uint32_t(op)); }
// Case-insensitive lookup by mnemonic; nullptr when unknown.
const OpInfo* opByName(std::string_view name);
// Every defined opcode, in table order (for tests driven by the table).
const OpInfo* opTableBegin();
const OpInfo* opTableEnd();

// A decoded control instruction.
struct Instr {
    uint8_t op = 0;
    uint8_t a = 0, b = 0, c = 0;
    uint32_t imm = 0;
};

constexpr uint32_t kInstrWords = 2;

inline uint32_t encodeWord0(uint8_t op, uint8_t a, uint8_t b, uint8_t c) {
    return uint32_t(op) | uint32_t(a) << 8 | uint32_t(b) << 16 | uint32_t(c) << 24;
}
inline Instr decodeInstr(uint32_t w0, uint32_t w1) {
    return Instr{uint8_t(w0), uint8_t(w0 >> 8), uint8_t(w0 >> 16), uint8_t(w0 >> 24), w1};
}

// Tensor instruction header: opcode | operand count << 8.
inline uint32_t encodeTensorHeader(uint8_t op, uint32_t nops) { return op | nops << 8; }
inline uint8_t tensorHeaderOp(uint32_t w) { return uint8_t(w); }
inline uint32_t tensorHeaderOperands(uint32_t w) { return w >> 8; }

// Counts the register operands and tells whether the format has an immediate-class operand.
struct FormatShape {
    int regs = 0;
    char imm = 0;  // 0 when none, else the immediate's letter
};
FormatShape formatShape(std::string_view format);

}  // namespace blue
