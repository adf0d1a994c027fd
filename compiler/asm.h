// Blue-IR text: the assembler (`bluec asm`) and disassembler (`bluec dis`).
//
// Syntax, one statement per line; `;` or `#` starts a comment:
//
//   .layout regs=16 local=64 heap=256 heap_static=8 stack=8 mailbox=4
//           in_slots=4 in_slot_words=64 max_rows=64 max_steps=4096
//   .const  NAME  1 -2 0x10 1.5            ; words in the constant pool (floats as bits)
//   .string NAME  "text\n"                 ; a string in the constant pool
//   .words  1 2 3                          ; raw pool words without a name
//   .extern "model.gguf"                   ; an external data file (index in order)
//   .tensor NAME CLASS DTYPE [d0, d1]      ; CLASS: weight | rows | instance | global
//           [data f32 1 2 3 | data hex 0a0b.. | file N offset BYTES]
//   .meta   "key" "value"
//   .block  NAME args=N                    ; tensor instructions until .end
//       matmul y, w, x
//   .end
//   .entry  LABEL
//   LABEL:  li r1, 5                       ; control instructions
//
// Operands: registers r0..r255; integers (decimal, 0x hex, 'c' characters); floats (1.5, -2e3,
// or raw bits written 0x... where a float is expected); labels (or @N for an instruction index),
// blocks, tensors, constants (NAME or NAME+offset) and strings by name.
//
// The disassembler's output reassembles to the same bytes for any module whose pool, data and
// tensor code are laid out canonically (as the assembler and the model compiler lay them out).
#pragma once

#include <string>
#include <string_view>

#include "vm/module.h"

namespace blue {

// Assembles source text into a verified module. Errors read "NAME:LINE:COL: message".
Result<Module> assemble(std::string_view source, const std::string& name);

// Assembles a file (name in errors = path).
Result<Module> assembleFile(const std::string& path);

// Prints a module as assembly text.
std::string disassemble(const Module& m);

// Appends tensor data to the module's DATA section at the canonical 64-byte alignment and points
// the tensor at it.
void appendTensorData(Module* m, TensorDecl* t, const void* bytes, uint64_t size);

}  // namespace blue
