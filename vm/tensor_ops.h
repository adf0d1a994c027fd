// Reference semantics of tensor instructions: the shape and type rules the verifier applies, and
// a plain CPU implementation that defines what each op computes. GPU kernels are checked against
// these (tests/test_ops_gpu.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "vm/module.h"
#include "vm/verify.h"

namespace blue {

// The items a block runs over in one cycle. Rows are packed in the order instances asked.
struct BlockRun {
    std::vector<uint32_t> row_inst;   // [rows] instance of each row
    std::vector<uint32_t> row_local;  // [rows] index of the row within its instance's rows
    std::vector<uint32_t> insts;      // [k] instances that asked, in order
    std::vector<uint32_t> inst_base;  // [k] first row of each
    std::vector<uint32_t> inst_rows;  // [k] row count of each
};

// Storage of every tensor of a module for the reference machine.
struct RefTensors {
    std::vector<std::vector<uint8_t>> data;  // per tensor, sized by allocRefTensors
    std::vector<uint64_t> slice_bytes;       // per tensor: bytes of one row/instance slice
};

// State of the machine a tensor op may read or write besides tensors.
struct TensorOpEnv {
    const Module* module = nullptr;
    RefTensors* tensors = nullptr;
    const BlockRun* run = nullptr;
    uint32_t instances = 0;
    std::span<const uint32_t> block_args;  // [instances * BLUE_MAX_BLOCK_ARGS]
    std::span<uint32_t> local;             // [instances * layout.local_words]
};

// Bytes of one slice of a tensor: the whole tensor for WEIGHT and GLOBAL, one row for ROWS, one
// instance's part for INSTANCE.
uint64_t tensorSliceBytes(const TensorDecl& t);

// Sizes reference storage for `instances` instances; WEIGHT data is filled by the caller.
void allocRefTensors(const Module& m, uint32_t instances, RefTensors* out);

// Checks one tensor instruction's operands (classes, types, shapes). Messages name the operand.
Status checkTensorOp(const Module& m, const TensorInstr& ti);

// Runs one tensor instruction over the items of `env.run` on the CPU.
void runTensorOpRef(const TensorOpEnv& env, const TensorInstr& ti);

}  // namespace blue
