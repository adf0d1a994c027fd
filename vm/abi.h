// Constants shared by C++ and GLSL: the machine's status codes, fault codes, output record kinds,
// tensor storage classes and limits. Included by the reference interpreter, the host and the
// shaders, so each value is defined once. Plain #defines only (the common subset of both
// languages).
#ifndef BLUE_VM_ABI_H
#define BLUE_VM_ABI_H

// Instance status (control block word kInstStatus).
#define BLUE_ST_RUNNING 0u  // runs control code when the sequencer reaches it
#define BLUE_ST_PARKED 1u   // asked for a block this cycle; resumes next cycle
#define BLUE_ST_HALTED 2u   // executed HALT
#define BLUE_ST_FAULT 3u    // stopped by a fault; fault code in kInstFault

// Fault codes (why an instance stopped with BLUE_ST_FAULT). Keep in sync with faultName().
#define BLUE_FAULT_NONE 0u
#define BLUE_FAULT_DIV_ZERO 1u
#define BLUE_FAULT_LOCAL_OOB 2u
#define BLUE_FAULT_HEAP_OOB 3u
#define BLUE_FAULT_CONST_OOB 4u
#define BLUE_FAULT_STACK_OVERFLOW 5u
#define BLUE_FAULT_STACK_UNDERFLOW 6u
#define BLUE_FAULT_BAD_INSTANCE 7u
#define BLUE_FAULT_INPUT_OOB 8u
#define BLUE_FAULT_TENSOR_OOB 9u
#define BLUE_FAULT_BLOCK_ROWS 10u
#define BLUE_FAULT_PC_OOB 11u
#define BLUE_FAULT_BAD_OPCODE 12u
#define BLUE_FAULT_WALK 13u  // HASHL, HCMPL or HCPYL over more than BLUE_MAX_WALK words
#define BLUE_FAULT_COUNT 14u

// Output ring record kinds (record = {instance | kind << 24, value}).
#define BLUE_OUT_INT 1u
#define BLUE_OUT_UINT 2u
#define BLUE_OUT_FLOAT 3u
#define BLUE_OUT_CHAR 4u
#define BLUE_OUT_STR 5u
#define BLUE_OUT_TOKEN 6u
#define BLUE_OUT_END 7u
#define BLUE_OUT_BEGIN 8u
#define BLUE_OUT_INST_MASK 0x00FFFFFFu

// Tensor storage classes.
#define BLUE_TC_WEIGHT 0u    // read-only, shared by all instances, data from the module or a file
#define BLUE_TC_ROWS 1u      // one row per block row this cycle (activations); max_rows rows
#define BLUE_TC_INSTANCE 2u  // one slice per instance (KV caches, per-instance state)
#define BLUE_TC_GLOBAL 3u    // one read-write tensor shared by all instances

// MATMULGLU's activation (operand 3): the gate projection's silu (SwiGLU) or tanh gelu (GeGLU).
#define BLUE_GLU_SILU 0u
#define BLUE_GLU_GELU 1u

// Limits a module may ask for (the verifier rejects more; devices may allow less).
#define BLUE_MAX_REGS 256u
#define BLUE_MAX_BLOCK_ARGS 8u
#define BLUE_MAX_LOCAL_WORDS (1u << 20)
#define BLUE_MAX_HEAP_WORDS (1u << 26)
#define BLUE_MAX_STACK_DEPTH 256u
#define BLUE_MAX_MAILBOX 64u
#define BLUE_MAX_ROWS 65535u
#define BLUE_MAX_INSTANCES (1u << 24)
#define BLUE_MAX_STEPS (1u << 20)
#define BLUE_MAX_WALK 8u  // words one HASHL, HCMPL or HCPYL walks: one step, unrolled on the GPU
#define BLUE_MAX_IN_SLOTS 4096u
#define BLUE_MAX_IN_SLOT_WORDS (1u << 20)

// Mixture of experts: the map MOEROUTE writes and MOEMM reads (a GLOBAL I32 tensor). With P =
// max_rows * k (row, slot) pairs at most, its words are: the header below, the expert offsets
// [E + 1] (pairs of experts before e; [E] = all pairs), the pair list [P] (row * k + slot,
// grouped by expert, rows in run order within an expert) and the tiles [P + E][2] (expert, first
// pair; a tile holds up to BLUE_MOE_TILE pairs of one expert).
#define BLUE_MOE_MAX_EXPERTS 256u
#define BLUE_MOE_MAX_SLOTS 16u
#define BLUE_MOE_TILE_ROWS 4u  // pairs per tile when the run has more than one row (else 1)
#define BLUE_MOE_H_TILES 0u    // tiles this run
#define BLUE_MOE_H_TILE 1u     // pairs per tile this run
#define BLUE_MOE_H_SLOTS 2u    // k
#define BLUE_MOE_H_EXPERTS 3u  // E
#define BLUE_MOE_H_WORDS 4u    // the offsets start here
#define BLUE_MOE_MAP_WORDS(e, pairs) (BLUE_MOE_H_WORDS + (e) + 1u + (pairs) + 2u * ((pairs) + (e)))
// A tile's first word is its expert, plus (slot + 1) << 16 when the machine pages experts and
// the expert sits in cache slot `slot` this run (0: read in place).
#define BLUE_MOE_TILE_EXPERT 0xFFFFu
#define BLUE_MOE_TILE_SLOT_SHIFT 16u

// An expert cache's state (the machine's, in the control buffer; not part of a module): words
// from its offset: slots C, experts E, the LRU clock, experts copied this run, one slot's bytes
// (all its matrices) in 16-byte units, then per expert its slot + 1 (0: not cached) [E], per
// slot its expert + 1 [C] and last use [C], and the copy list [C][2] (expert, slot) that the
// MOECOPY dispatches read.
#define BLUE_XC_SLOTS 0u
#define BLUE_XC_EXPERTS 1u
#define BLUE_XC_CLOCK 2u
#define BLUE_XC_COPIES 3u
#define BLUE_XC_TEXELS 4u
#define BLUE_XC_HEAD 5u
#define BLUE_XC_WORDS(e, c) (BLUE_XC_HEAD + (e) + 4u * (c))

#endif  // BLUE_VM_ABI_H
