// Shared by C++ (host/) and GLSL (shaders/): workgroup sizes, binding numbers, the push-constant
// layout and the word layout of the control and I/O buffers. Each value is defined once here.
// Plain #defines only (the common subset of both languages).
#ifndef BLUE_SHADERS_CONFIG_H
#define BLUE_SHADERS_CONFIG_H

// ---- bindings (descriptor set 0) ---------------------------------------------------------
#define BLUE_BIND_CONTROL 0  // control buffer: device-local, u32 words (layout below)
#define BLUE_BIND_PAGES 1    // array of BLUE_MAX_PAGES data pages (tensors)
#define BLUE_BIND_IO 2       // I/O buffer: host-visible (rings, staging halves, snapshots)
// Set 1, bound per dispatch: binding 0 is an array with one rgba32ui storage texel view per tensor
// operand (the page that holds it), indexed by the operand's constant position. Texel loads are
// the fast read path on CPU-backed drivers, and constant indices need no dynamic-indexing feature.
#define BLUE_SET_OPERANDS 1
#define BLUE_MAX_TEX_OPERANDS 6
#define BLUE_MAX_PAGES 24  // + 2 bindings: within the 32 storage buffers lavapipe allows per stage

// ---- workgroup sizes ---------------------------------------------------------------------
#define BLUE_SEQ_WG 64        // sequencer: one invocation per instance
#define BLUE_PLAN_WG 64       // plan: one workgroup
// ELEM grid: elements per workgroup along x. 64 rather than 256: lavapipe pays for every lane of a
// workgroup, busy or not, and a 256-lane workgroup for a 64-element row (rope, kvstore at small
// head counts) cost 4x the dispatch (README, Measured: narrow workgroups).
#define BLUE_ELEM_WG 64
// The specialization constant of kernels built with a variable workgroup width (`local_size_x_id`):
// the plan names them "kernel@W" (host/pipelines.h) to run them W lanes wide.
#define BLUE_SPEC_WG 0
// Specialization constant: the attention kernels' quads of elements per head (shaders/attn.comp;
// 0: read from the push constants). The plan names it "#Q" (host/pipelines.h).
#define BLUE_SPEC_HEAD_QUADS 1
#define BLUE_ITEM_WG 64       // ITEM grid: invocations per item's workgroup
#define BLUE_MATMUL_WG 64     // MATMUL grid: invocations per workgroup
#define BLUE_MATMUL_TILE 4    // MATMUL grid: items per workgroup (x) in the batched variant
// MATMUL GEMM variant (`_g`: the plain weight types F32, F16, BF16): items per workgroup and
// rows per invocation. Chosen when a cycle has at least BLUE_MATMUL_GEMM_TILE items and the
// matrix at least one workgroup's rows (WG * R). On lavapipe each x texel then serves 4 rows and
// each weight vec4 16 items; for F16 it measures level with the 4-item tile (pp64 86.6 / 89.2
// tok/s, 64 instances 18.9 / 16.3, stories110M shape). The block types measured 0.6-1.0x of the
// 4-item tile with this GEMM; they have the lanes-over-items `_i` (below) instead.
#define BLUE_MATMUL_GEMM_TILE 16
#define BLUE_MM_R_GEMM 4
// MATMUL: weight rows per invocation, by weight type (a workgroup covers WG * R rows along y).
// Each x texel a lane loads (the same in every lane: a gather of ~40 instructions on lavapipe)
// serves R rows. 8 for the block types but Q8_0 (README, Measured: "Eight rows a lane"): 16
// was slower than 8, and Q8_0, whose rows take two weight texels a block, slower at 8 than at 4.
// MOEMM keeps 4 (BLUE_MM_R_MOE): an expert's few rows would fill fewer workgroups.
#define BLUE_MM_R_PLAIN 2     // F32, F16, BF16
#define BLUE_MM_R_Q8 4        // Q8_0
#define BLUE_MM_R_SMALLQ 8    // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4
#define BLUE_MM_R_KQ 8        // Q2_K .. Q6_K, IQ4_XS, TQ1_0, TQ2_0
#define BLUE_MM_R_MOE 4       // MOEMM, block types
// MATMUL variants for GPUs (split K; `_b1s` for one item, `_s` for the 4-item tile): a
// workgroup of BLUE_MATMUL_SPLIT_WG lanes owns one group of 8 interleaved rows, WG / 8 lanes per
// row taking every (WG/8)-th group of 32 elements. The lanes-over-rows `_b1` gives a GPU only
// N / 256 workgroups of lanes walking all of K alone: an NVIDIA H100 read 14 GB/s of its 2367
// that way (README). On lavapipe the lanes-over-rows kernels stay: `_b1s` measured 4x slower.
#define BLUE_MATMUL_SPLIT_WG 128
#define BLUE_MATMUL_SPLIT_ROWS 8
// MATMUL `_t` (matmul_tiled.comp), the GEMM for GPUs: a workgroup of 256 lanes computes a tile of
// 64 rows x 64 items from 16 KiB of shared memory. The plan gives it BLUE_MATMUL_GEMM_TILE items
// or more where the machine uses GPU shapes (split K); on lavapipe `_g` stays.
#define BLUE_MATMUL_TILED_ROWS 64u
#define BLUE_MATMUL_TILED_ITEMS 64u
// MATMUL `_i` (matmul_items.comp), the GEMM for CPU drivers (every block type): lanes over items,
// MI_C items per lane and MI_R rows per workgroup of 8 lanes (one lavapipe vector). The plan gives
// it a cycle's items from BLUE_MATMUL_GEMM_TILE on, where the machine uses CPU shapes. Against the
// 4-item tile (2026-11-27, stories110M shape, pure files, pp64): 1.2-1.6x for every block type
// measured; 4 items x 16 rows, 8 x 16, 4 x 32 and 2 x 32 came out within this machine's noise.
#define BLUE_MATMUL_ITEMS_LANES 8u
#define BLUE_MATMUL_ITEMS_PER_LANE 4u
#define BLUE_MATMUL_ITEMS_ROWS 16u
// The int8 kernels of CPU drivers (`_b1q`, `_q`, `_iq`: Q4_0, Q4_K, Q5_K, Q6_K) read x rounded to
// int8 and packed once per input by PACKX (packx.comp; the plan records it before the first MATMUL
// over an x; common/swar.glsl reads it): per gblock of 256 elements,
// BLUE_XQ_GBLOCK_TEXELS texels: 8 blocks of 32 as 4 texels of crosswise int16 pairs each, then 4
// texels of the blocks' (step, sum) word pairs. Its record of an item is a gblock's texels per
// ceil(K / 256), in a device-local region of the pages (host/machine_plan.h PagePlan::packed_x),
// read as texel operand BLUE_MM_XQ_OPERAND through the reference at BLUE_PC_MM_XQ.
#define BLUE_XQ_GBLOCK_TEXELS 36u
#define BLUE_MM_XQ_OPERAND 3
// ROPE, ROPEQK: heads an invocation rotates with the one angle it computes (pow, cos, sin), so the
// angle is computed once per 8 heads where it was once per pair; chunks keep a GPU's many lanes busy.
#define BLUE_ROPE_HEADS 8u
// KVSTORE, KVSTOREP: cache words an invocation writes per row (the position looked up once for them).
#define BLUE_KV_WORDS 8u
// RMSNORM (CPU drivers; GPUs run `rmsnorm_w`): items a workgroup, a lane each.
#define BLUE_RMS_ITEMS 8u
#define BLUE_ATTN_WG 8        // ATTN: invocations (one per head) per workgroup
#define BLUE_ATTN_SPLIT_WG 32   // ATTN `_split` (GPUs): lanes, over positions, per (head, item)
#define BLUE_ATTN_MAX_HEAD 256  // ATTN: largest head size (attn.comp keeps one head in registers)

// ---- push constants (u32 words) ----------------------------------------------------------
// Tensor dispatches: a header, then one 4-word reference per tensor operand and one word per
// scalar operand, in the instruction's operand order.
#define BLUE_PUSH_WORDS 32
#define BLUE_PC_BLOCK 0     // block index
#define BLUE_PC_MODE 1      // 0: items are the block's rows; 1: its instances
#define BLUE_PC_TILE 2      // items per workgroup along y
#define BLUE_PC_OPERANDS 4  // first operand word
// A tensor reference: {page | class << 16, byte offset, slice stride in bytes, slice elements}.
#define BLUE_TREF_WORDS 4
// Words the planner adds after the operands of some ops (host/machine_plan.cpp):
// MOEMM: K, N, experts, slots of the instruction (checked shapes; the map's words are not trusted).
#define BLUE_PC_MOE_SHAPE 20
// MOEROUTE: bytes of one expert's matrices over the MOEMMs that read its map, in 16-byte units;
// then the number of those MOEMM dispatches and their indices, whose items axis it writes.
#define BLUE_PC_MOE_TEXELS 19
#define BLUE_PC_MOE_PATCH 20
#define BLUE_MOE_MAX_PATCH 11
// A patch word with this bit set names a MOECOPY dispatch: its items axis gets the number of
// experts copied into the cache this run instead of the number of tiles.
#define BLUE_MOE_PATCH_COPY 0x80000000u
// MOEROUTE with an expert cache (host/machine_plan.h ExpertCache): 1 + the cache's state offset
// within the control buffer's expert-cache region (0: no cache).
#define BLUE_PC_MOE_CACHE 18
// MOEMM reading through an expert cache (`moemmc_*`): the cache tensor's reference (texel
// operand BLUE_MOE_CACHE_OPERAND); cached tiles read their expert's matrix from it.
#define BLUE_PC_MOE_CACHE_REF 24
#define BLUE_MOE_CACHE_OPERAND 4u
// MOECOPY: the cache's state offset (as BLUE_PC_MOE_CACHE), the texels each workgroup copies,
// the number of matrices it copies (a layer's gate, up and down: at most
// BLUE_COPY_MAX_MATRICES), then per matrix two references: its expert tensor (host memory) at
// BLUE_PC_COPY_PAIRS + 8 m, its cache at + 4.
#define BLUE_PC_COPY_STATE 4
#define BLUE_PC_COPY_CHUNK 5
#define BLUE_PC_COPY_COUNT 6
#define BLUE_PC_COPY_PAIRS 7
#define BLUE_COPY_MAX_MATRICES 3
#define BLUE_COPY_CHUNK_TEXELS 4096u
// EMBED over one piece of a table split by rows: its first row, and 1 on the last piece (which
// writes the zeros of out-of-range tokens). Unsplit tables: 0 and 1.
#define BLUE_PC_EMBED_BASE 20
#define BLUE_PC_EMBED_LAST 21
// MATMUL: what the kernels do with a product v at dst (MATMULADD adds it; MATMULGLU gates dst
// with it, silu or gelu: common/activations.glsl).
#define BLUE_PC_MM_EPILOGUE 20
#define BLUE_MM_STORE 0
#define BLUE_MM_ADD 1
#define BLUE_MM_SILU 2
#define BLUE_MM_GELU 3
// MATMUL `_b1q`, `_q`, `_iq` and PACKX: the packed x's reference {page | class << 16, byte offset, bytes per
// item, K}; an item's record is at offset + item * bytes.
#define BLUE_PC_MM_XQ 24
// `ropekv_*` (ROPEQK and the KVSTORE after it, made one dispatch by the plan): after ROPEQK's
// operand words, the K cache's reference, the V cache's, and v's page | class << 16 and offset
// (v's stride and elements are k's: the plan fuses only then).
#define BLUE_PC_ROPEKV_KC 22
#define BLUE_PC_ROPEKV_VC 26
#define BLUE_PC_ROPEKV_V 30
// KVCOPY: 32-bit words of one cache row, and the context (rows of a cache, and of a store's slot).
#define BLUE_PC_KV_ROW_WORDS 20
#define BLUE_PC_KV_CTX 21
// KVSTOREP, ATTNP, PGCOPY and KVCOPYP: the pools' positions per page (PS) and pages (NP). After
// ATTNP's 28 operand words, the longest; PGCOPY and KVCOPYP also get BLUE_PC_KV_ROW_WORDS, and
// KVCOPYP BLUE_PC_KV_CTX (the store's context).
#define BLUE_PC_KVP_PAGE 28
#define BLUE_PC_KVP_PAGES 29

// ---- control buffer: header words ----------------------------------------------------------
#define BLUE_H_NINST 0
#define BLUE_H_NREGS 1
#define BLUE_H_LOCAL_WORDS 2
#define BLUE_H_STACK_DEPTH 3
#define BLUE_H_MAILBOX_CAP 4
#define BLUE_H_HEAP_WORDS 5
#define BLUE_H_MAX_STEPS 6
#define BLUE_H_NBLOCKS 7
#define BLUE_H_MAX_ROWS 8
#define BLUE_H_CODE_WORDS 9
#define BLUE_H_CONST_WORDS 10
#define BLUE_H_IN_SLOTS 11
#define BLUE_H_IN_SLOT_WORDS 12
#define BLUE_H_NDISPATCH 13
#define BLUE_H_OUT_CAP 14
#define BLUE_H_MAX_CYCLES 15
#define BLUE_H_NTENSORS 16
// region offsets (in words)
#define BLUE_O_STATE 20    // [ninst][BLUE_STATE_WORDS]
#define BLUE_O_REGS 21     // [ninst][nregs]
#define BLUE_O_STACK 22    // [ninst][stack_depth]
#define BLUE_O_LOCAL 23    // [ninst][local_words]
#define BLUE_O_MAILBOX 24  // [ninst][2 + 2 * mailbox_cap]: head, tail, then {flag, value} slots
#define BLUE_O_HEAP 25     // [heap_words]
#define BLUE_O_BARGS 26    // [ninst][BLUE_MAX_BLOCK_ARGS]
#define BLUE_O_CODE 27     // [code words]
#define BLUE_O_CONST 28    // [const words]
#define BLUE_O_BLOCKS 29   // [nblocks][BLUE_BLOCK_WORDS]
#define BLUE_O_LISTS 30    // [nblocks][3][ninst]: instance, first row, row count
#define BLUE_O_ROWMAP 31   // [nblocks][max_rows][2]: instance, local row
#define BLUE_O_DISPATCH 32 // [ndispatch][BLUE_DISPATCH_WORDS]
#define BLUE_O_INDIRECT 33 // [ndispatch + 1][3] VkDispatchIndirectCommand; last: the sequencer
#define BLUE_O_TENSORS 34  // [ntensors][BLUE_TREF_WORDS] for TLD/TST
#define BLUE_O_EXPERT_CACHE 37  // expert caches' state (vm/abi.h BLUE_XC_*), one region each
// counters written by the GPU
#define BLUE_C_CYCLE 40      // cycles in which an instance was live
#define BLUE_C_LIVE 41       // instances live at the start of the last cycle
#define BLUE_C_LIVE_ACC 42   // live count being accumulated by this cycle's sequencer
#define BLUE_C_BUMP 43       // bump allocator: next free heap word
#define BLUE_C_IN_CLAIM 44   // input messages claimed so far
#define BLUE_C_OUT_HEAD 45   // output records written so far
#define BLUE_C_BLOCK_RUNS 46 // (cycle, block) pairs that had items
// counters copied in from the host's staging half at the start of each chain
#define BLUE_C_IN_PUBLISHED 48
#define BLUE_C_IN_CLOSED 49
#define BLUE_C_OUT_TAIL 50
// expert weights the MOEMMs read (MOEROUTE adds the chosen experts' bytes, in 16-byte units, 64-bit)
#define BLUE_C_MOE_TEXELS_LO 52
#define BLUE_C_MOE_TEXELS_HI 53
// expert caches (MOEROUTE): experts found in the cache, copied into it, read in place (no slot
// free this run), and the bytes copied in 16-byte units (64-bit)
#define BLUE_C_XC_HITS 54
#define BLUE_C_XC_MISSES 55
#define BLUE_C_XC_INPLACE 56
#define BLUE_C_XC_TEXELS_LO 57
#define BLUE_C_XC_TEXELS_HI 58
#define BLUE_HEADER_WORDS 64

#define BLUE_STATE_WORDS 6  // pc, status, fault, sp, steps lo, steps hi
#define BLUE_S_PC 0
#define BLUE_S_STATUS 1
#define BLUE_S_FAULT 2
#define BLUE_S_SP 3
#define BLUE_S_STEPS_LO 4
#define BLUE_S_STEPS_HI 5

#define BLUE_BLOCK_WORDS 8  // acc rows, acc instances, rows, instances, nargs
#define BLUE_B_ACC_ROWS 0
#define BLUE_B_ACC_INSTS 1
#define BLUE_B_ROWS 2
#define BLUE_B_INSTS 3
#define BLUE_B_NARGS 4

#define BLUE_DISPATCH_WORDS 6  // block, mode, fixed groups, items per group, axis, item range
#define BLUE_D_BLOCK 0
#define BLUE_D_MODE 1
#define BLUE_D_FIXED 2   // groups along the fixed axis
#define BLUE_D_TILE 3    // items per group along the items axis
#define BLUE_D_AXIS 4    // 0: items along y (fixed along x); 1: items along x (fixed along y)
#define BLUE_D_RANGE 5   // runs only when min <= items <= max: min | max << 16 (max 0: no limit)

// ---- I/O buffer (host-visible) -------------------------------------------------------------
// Words [0, 16): one staging quarter per chain (host -> GPU, copied into the control counters at
// the chain's start); [16, 96): snapshots per chain (GPU -> host, copied at its end); from
// BLUE_IO_DYNAMIC on: the input order ring, slot states, input slots and the output ring, at
// offsets the host computes and mirrors in the header words below.
#define BLUE_MAX_CHAINS 4
#define BLUE_IO_STAGE_WORDS 4     // per chain: published, closed, out tail, (pad)
#define BLUE_IO_SNAP_BASE 16
#define BLUE_IO_SNAP_WORDS 8      // per chain: a copy of control words [BLUE_C_CYCLE, +7)
#define BLUE_SNAP_COUNTERS 7
// [48, 80): a second snapshot per chain, BLUE_IO_SNAP2_WORDS apart: control words
// [BLUE_C_MOE_TEXELS_LO, +BLUE_SNAP2_COUNTERS).
#define BLUE_IO_SNAP2_BASE 48
#define BLUE_IO_SNAP2_WORDS 8
#define BLUE_SNAP2_COUNTERS 7
// [80, 96): a third per chain, BLUE_IO_SNAP3_WORDS apart: the heap words GpuOptions::heap_watch
// names (a paged KV pool's counters), when it names any.
#define BLUE_IO_SNAP3_BASE 80
#define BLUE_IO_SNAP3_WORDS 4
#define BLUE_IO_DYNAMIC 96
#define BLUE_H_IO_ORDER 17   // [in_slots] slot of message c at c % in_slots
#define BLUE_H_IO_SLOTSTATE 18  // [in_slots] 1 full (host), 0 free (GPU, after INFREE)
#define BLUE_H_IO_SLOTS 19   // [in_slots][in_slot_words]; word 0 = message length
#define BLUE_H_IO_OUT 35     // [out_cap][2] records
#define BLUE_H_IO_FLAGS 36   // [ninst] host flag words (INFLAG)
#define BLUE_IO_SLOT_FREE 0u
#define BLUE_IO_SLOT_FULL 1u

#endif  // BLUE_SHADERS_CONFIG_H
