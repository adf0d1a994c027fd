// The module verifier: every semantic check that must pass before a module runs anywhere
// (reference interpreter or GPU). Together with parseModule()'s structural checks it guarantees
// that a malformed module is rejected with a message naming what and where, and that a module
// that passes cannot make the VM read or write outside its memory: remaining dynamic checks
// (computed addresses, division by zero) fault the instance instead.
#pragma once

#include <vector>

#include "vm/isa.h"
#include "vm/module.h"

namespace blue {

// A tensor instruction inside a block's TCODE range.
struct TensorInstr {
    Op op;
    uint32_t word;                // offset of its header word in TCODE
    std::vector<uint32_t> args;   // operand words, in format order
};

// Decodes a block's tensor instructions, checking that each is a known tensor opcode with the
// operand count its format asks for. Does not check operand values (verifyModule does).
Status decodeBlock(const Module& m, const BlockDecl& b, std::vector<TensorInstr>* out);

// Checks everything: layout ranges, tensors (types, shapes, sizes, data ranges), every control
// instruction (known opcode, register fields, immediates, jump targets, blocks, tensors), every
// block and tensor instruction (operand tensors, shapes and types via the op's rules), symbols.
Status verifyModule(const Module& m);

// Reads, parses and verifies a module file.
Result<Module> loadModuleFile(const std::string& path);

}  // namespace blue
