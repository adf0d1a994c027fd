// Programs shared by the VM core's tests: the golden programs under programs/, and a program
// generated from the opcode table that uses every control opcode (with operands that let it run
// to HALT on one instance) and every tensor opcode in a block (with operand tensors found by
// searching a pool for a combination that the op's rules accept, and scalar operands from a
// short list of hints where they carry meaning). The block runs with the forward block's
// arguments (vm/llm_abi.h) over a local memory holding a sampling block and a token history, so
// the LLM ops read meaningful values; the program outputs the sampled token. A new opcode is
// covered by the generated program without touching the tests.
#pragma once

#include <string>
#include <vector>

#include "vm/interp.h"
#include "vm/module.h"

namespace blue::test {

// Paths of every programs/*.blue, sorted.
std::vector<std::string> goldenProgramPaths();

// The every-opcode program's source. Fails naming the tensor op when no combination of pool
// tensors satisfies its rules (extend the pool in vm_programs.cpp then).
Result<std::string> everyOpSource();
// The input the every-opcode program expects (one message, pushed before the run).
std::vector<std::vector<uint32_t>> everyOpInput();

// Opcode bytes used by a module: control code and the tensor code of every block.
std::vector<uint8_t> opcodesUsed(const Module& m);

// The records of one instance, in order.
std::vector<OutputRecord> recordsOf(const std::vector<OutputRecord>& all, uint32_t inst);

}  // namespace blue::test
