// Load-time planning for GpuMachine: where everything lives in the control and I/O buffers,
// which page each tensor goes to, and the dispatch (pipeline, push constants, grid) of every
// tensor instruction. Pure functions of the module, options and device limits, so they are
// tested without a GPU.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "host/matmul_groups.h"
#include "shaders/blue_config.h"
#include "vm/abi.h"
#include "vm/module.h"
#include "vm/status.h"

namespace blue {

struct GpuOptions;

struct ControlLayout {
    std::array<uint32_t, BLUE_HEADER_WORDS> header{};  // the control buffer's first words
    uint64_t control_words = 0;
    uint64_t io_words = 0;

    uint32_t at(uint32_t index) const { return header[index]; }
};

// Lays out the control and I/O buffers for `ndispatch` tensor dispatches and the expert caches'
// state (PagePlan::expertStateWords).
Result<ControlLayout> planControl(const Module& m, const GpuOptions& options, uint32_t ndispatch,
                                  uint64_t max_binding_bytes, uint64_t expert_state_words = 0);

// A run of rows of a matrix larger than one page, stored as its own [K, rows] matrix in the GPU
// weight layout.
struct TensorPiece {
    uint32_t page = 0;
    uint64_t offset = 0;     // bytes into the page
    uint64_t bytes = 0;      // the piece's weight-layout size
    uint32_t row_begin = 0;  // first row (a multiple of 8)
    uint32_t rows = 0;
};

struct TensorPlace {
    bool repacked = false;  // a matrix in the GPU weight layout (host/weight_layout.h)
    uint32_t page = 0;
    uint64_t offset = 0;  // bytes into the page
    uint64_t slice = 0;   // bytes of one slice (row, instance or whole tensor)
    uint64_t bytes = 0;   // total bytes
    // A 2-D WEIGHT matrix larger than a page is split by rows into pieces (page and offset then
    // name the first); MATMUL and EMBED run one dispatch per piece. Empty when not split.
    std::vector<TensorPiece> pieces;
    uint8_t tier = 0;  // 0: device-local memory; 1: host memory the kernels read directly
    // An MoE expert matrix kept in host memory for the expert caches (planPages): read in place
    // or copied into a cache by MOECOPY, never streamed.
    bool expert = false;
};

// An MoE layer's expert cache: under a VRAM budget that the weights do not fit, the experts'
// matrices (3-D WEIGHT tensors only MOEMM reads) stay in host memory and `slots` of them per
// layer live in device-local cache tensors. The layer's MOEROUTE decides on the GPU which experts
// the run needs, keeps them in the cache least-recently-used, and writes a copy list that MOECOPY
// dispatches (one per matrix) carry out before the MOEMMs, which read cached experts from the
// cache and any the cache cannot hold this run (all slots taken by experts this run needs) in
// place. Its state (vm/abi.h BLUE_XC_*) is in the control buffer.
struct ExpertCache {
    uint32_t route = 0;    // the layer's MOEROUTE: its ordinal in block and instruction order
    uint32_t experts = 0;  // E
    uint32_t slots = 0;    // experts the cache holds
    uint32_t state = 0;    // word offset of its state within the expert-cache region
    std::vector<uint32_t> tensors;   // the expert matrices it caches (MOEMM operand 1)
    std::vector<TensorPlace> caches; // per tensor: its device-local cache, `slots` slices
};

// Where the int8 GEMM for CPU drivers (`_iq`: Q4_0, Q4_K, Q5_K, Q6_K) finds its x rounded and packed by
// PACKX (shaders/packx.comp): one record of `item_bytes` per item, for every MATMUL of such a
// matrix with K up to `k`; one region reused by every such MATMUL in turn (a barrier separates each
// dispatch from the next). `item_bytes` 0: none planned (the plan then keeps the float kernels).
struct PackedX {
    uint32_t page = 0;
    uint64_t offset = 0;
    uint64_t item_bytes = 0;
    uint64_t items = 0;
    uint64_t k = 0;
    uint64_t bytes() const { return items * item_bytes; }
};

struct PagePlan {
    std::vector<uint64_t> page_bytes;  // size of each page
    std::vector<uint8_t> page_tier;    // per page: 0 device-local, 1 host (beyond the VRAM budget)
    std::vector<uint8_t> page_experts; // per page (may be shorter): 1 where experts for a cache sit
    std::vector<TensorPlace> places;   // per tensor
    uint64_t slot_bytes = 0;  // streaming: the size of each of the two device-local slots
    std::vector<ExpertCache> expert_caches;
    PackedX packed_x;
    // MATMULs stacked into one dispatch (host/matmul_groups.h), each placed so that its stack
    // exists: the matrices back to back, the destinations interleaved (views of one row each).
    std::vector<MatmulGroup> matmul_groups;
    uint64_t expertStateWords() const {
        uint64_t n = 0;
        for (const ExpertCache& c : expert_caches) n += BLUE_XC_WORDS(c.experts, c.slots);
        return n;
    }
    const ExpertCache* expertCacheOf(uint32_t route) const {
        for (const ExpertCache& c : expert_caches) {
            if (c.route == route) return &c;
        }
        return nullptr;
    }
    uint64_t tierBytes(uint8_t tier) const {
        uint64_t n = 0;
        for (size_t p = 0; p < page_bytes.size(); ++p) {
            n += (p < page_tier.size() ? page_tier[p] : 0) == tier ? page_bytes[p] : 0;
        }
        return n;
    }
};

// Packs tensors into pages of at most `page_limit` bytes (each tensor inside one page, aligned to
// 256 bytes). 2-D WEIGHT tensors take their GPU weight layout's size; other slices are padded to
// 16 bytes so kernels read them in whole texels. A 2-D WEIGHT larger than a page is split by rows
// (multiples of 8) into pieces that each fill at most a page. Fails naming the tensor when any
// other tensor is larger than a page, when 8 rows of a matrix are, or when pages run out.
//
// `vram_budget` (bytes, 0: none) bounds the device-local pages (tier 0): activations, KV caches
// and logits always live there, then WEIGHT tensors while they fit, in this order: those that
// some op other than EMBED reads (every row is read per token), in module order, then tables
// only EMBED reads (one row per token). The rest go to host pages (tier 1) that the kernels read
// directly. Fails with the numbers when the activations alone exceed the budget.
//
// `stream`: host-page weights are copied into two device-local slots ahead of their dispatches
// (planStreams) instead of read in place. Only matrices that MATMUL, EMBED and MOEMM alone read
// can stream, so every other weight stays device-local; the two slots (each as large as the
// largest streamable matrix or piece, PagePlan::slot_bytes) come out of the budget first.
//
// `expert_cache`: when the weights do not all fit the budget, MoE experts go to host memory
// first (they neither stream nor count as dense), and the budget the other weights leave holds
// one ExpertCache per layer, every layer the same number of slots (at most E; none when less
// than one slot per layer fits, and the experts are then read in place).
//
// `fuse_matmuls`: runs of MATMULs over one x (findMatmulGroups) that fit a page unsplit are
// placed as stacks (PagePlan::matmul_groups), so that planDispatches runs each as one dispatch.
// Not with `stream`.
Result<PagePlan> planPages(const Module& m, uint32_t instances, uint64_t page_limit,
                           uint64_t vram_budget = 0, bool stream = false, bool expert_cache = true,
                           bool fuse_matmuls = false);

// Adds the PackedX region (device-local) for the int8 GEMM of CPU drivers to `plan`: records
// for the larger of max_rows and `instances` items and the largest K of any MATMUL over a matrix
// whose type has `_iq`, after the last device-local page's tensors when it fits there, else in a new page.
// Nothing when the module has no such MATMUL. Fails when the region needs a page and none is left.
Status planPackedX(const Module& m, uint32_t instances, uint64_t page_limit, PagePlan* plan);

// What planPages and planControl cannot see alone, checked against the device once both ran:
// the pages and the control buffer (device-local memory) together fit `device_local_bytes`,
// and the sequencer's grid (BLUE_SEQ_WG instances per workgroup, along x) fits `max_groups_x`.
// Fails naming the numbers.
Status checkDeviceFit(const PagePlan& pages, const ControlLayout& layout, uint32_t instances,
                      uint64_t device_local_bytes, uint32_t max_groups_x);

struct DispatchDesc {
    uint32_t block = 0;
    std::string pipeline;
    std::array<uint32_t, BLUE_PUSH_WORDS> push{};
    uint32_t mode = 0;       // 0 rows, 1 instances
    uint32_t fixed = 1;      // groups along the fixed axis
    uint32_t tile = 1;       // items per group along the items axis
    uint32_t axis = 0;       // 0: items along y; 1: items along x
    uint32_t min_items = 0;  // runs only when min_items <= items <= max_items (0: no limit)
    uint32_t max_items = 0;
    // Page of each tensor operand, by operand position (kNoPage for scalars and absent tensors):
    // the texel views the dispatch's descriptor set 1 binds.
    std::array<uint32_t, BLUE_MAX_TEX_OPERANDS> operand_pages{};
    static constexpr uint32_t kNoPage = 0xFFFFFFFFu;
    // KERNEL: the module's custom kernel it runs (host/machine_kernel.cpp); -1 for built-in ops.
    int32_t custom = -1;
    // MATMUL, EMBED, MOEMM: where the repacked matrix (or piece) operand 1 reads lies.
    uint32_t weight_page = kNoPage;
    uint64_t weight_offset = 0, weight_bytes = 0;
    int32_t stream_slot = -1;  // streaming: the slot it reads its matrix from (-1: none)
};

// Streaming plan: groups of consecutive dispatches whose host-page matrices are copied together
// into one slot; group g uses slot g % 2, and its copy is recorded before group g - 1's first
// dispatch (group 0's at the start of the cycle), so it overlaps that group's compute.
struct StreamCopy {
    uint32_t src_page = 0;
    uint64_t src_offset = 0, dst_offset = 0, bytes = 0;
};
struct StreamGroup {
    uint32_t first_dispatch = 0;
    uint32_t slot = 0;
    uint64_t bytes = 0;
    std::vector<StreamCopy> copies;
};
struct StreamPlan {
    std::vector<StreamGroup> groups;
    uint64_t bytesPerCycle() const {
        uint64_t n = 0;
        for (const StreamGroup& g : groups) n += g.bytes;
        return n;
    }
};

// Groups the dispatches that read a matrix in a host page (PagePlan::page_tier 1) and points
// their operand 1 at the slot: offset within the slot in the push words, and operand_pages[1] =
// `slot_view_base + slot` (the slots' texel views follow the pages'). Matrices shared by
// consecutive dispatches (a MATMUL's variants, a tied table) are copied once per group.
StreamPlan planStreams(const PagePlan& pages, std::vector<DispatchDesc>* dispatches,
                       uint32_t slot_view_base);

// Rows of a weight matrix one MATMUL invocation computes, by weight type.
uint32_t matmulRowsPerInvocation(DType type);
// MOEMM's rows per invocation (shaders/matmul.comp with MM_MOE): BLUE_MM_R_MOE for block types.
uint32_t moeRowsPerInvocation(DType type);

// One dispatch per tensor instruction, block by block (MATMUL: a single-item variant, a batched
// one and, for plain weight types, Q4_0 and the IQ4 types with at least BLUE_MATMUL_WG *
// BLUE_MM_R_GEMM rows, the GEMM variant for BLUE_MATMUL_GEMM_TILE items or more; the plan kernel
// enables one per cycle). Fails naming the instruction when no kernel exists for its operand types, its kernel
// cannot run its shape (an odd ROPE head size, an F16 KV cache with odd rows, an ATTN head larger
// than BLUE_ATTN_MAX_HEAD) or its fixed grid exceeds the device: `max_groups_x` along x, and along y (MATMUL's rows) the 65535 workgroups
// every Vulkan device allows.
// Which kernel shapes the plan picks where there is a choice (GpuOptions decides them per device).
struct KernelChoice {
    // GPU shapes (GpuOptions::decode_kernel SPLIT): MATMUL of one item and of 2..15 items split
    // K (`_b1s`, `_s`) instead of lanes over rows (`_b1` and the 4-item tile: CPU drivers), 16+
    // items run the shared-memory tiled `_t` instead of `_g`, and RMSNORM its wide `_w`.
    bool split_matmul = false;
    // ATTN/ATTNX/ATTNP: a workgroup per head whose lanes split the positions (`_split`) instead of one
    // lane per head.
    bool split_attn = false;
    // Loop iterations after which the driver ends every loop of an invocation (lavapipe:
    // LP_MAX_TGSI_LOOP_ITERATIONS, 65535, counted over all loops of the invocation; 0: no limit).
    // ATTN/ATTNX/ATTNP then take the split kernel where one lane's walk could pass it, and a context
    // even that would cut short is refused at load.
    uint32_t loop_limit = 0;
    // Items from which a batched MATMUL runs the GEMM (`_t` or `_g`) rather than the 4-item
    // tiles (GpuMachine: BLUE_GEMM_MIN_ITEMS in the environment, else defaultGemmMinItems), and
    // whether the environment gave it (itemsGemmMinItems).
    uint32_t gemm_min_items = BLUE_MATMUL_GEMM_TILE;
    bool gemm_min_items_given = false;
    // The int8 GEMM (GpuOptions::int8_matmul): with GPU shapes `_tq` for every block type; with
    // CPU-driver shapes `_iq` after a PACKX of its x for the types that have one (Q4_0, Q4_K, Q5_K, Q6_K;
    // where planPackedX made the region), the other types keeping `_i`.
    bool int8_matmul = false;
    // SAMPLE's longest history (GpuOptions::sample_history): its width (sampleWidth).
    uint32_t sample_history = 0;
    // Dispatches the plan makes one (GpuMachine: on unless BLUE_FUSE=0 in the environment):
    // MATMULs over one x (a layer's Q, K and V, host/matmul_groups.h: planPages' fuse_matmuls,
    // which places them for it), and a ROPEQK with the KVSTORE after it (`ropekv_*`, where the KV
    // store's k is ROPEQK's and its v is laid out as k; into F16 caches with neox pairs when the
    // head and rotated dims are multiples of 4).
    bool fuse = false;
};

// The item count from which a batched MATMUL runs the GEMM unless BLUE_GEMM_MIN_ITEMS says
// otherwise: 16 with CPU-driver shapes (`_g`, tuned on lavapipe); 65 with GPU shapes, whose
// split-K tiles (`_s`) beat the 64 x 64 shared-memory tiles (`_t`) for every decode batch up to
// 64 items on an NVIDIA H200 (tinyllama Q4_0, 16/32/64 instances: 1,390/1,730/2,021 against
// 528/968/1,714 tok/s): `_t` has a workgroup per 64 rows, too few to fill the GPU below a prompt.
constexpr uint32_t kGpuGemmMinItems = 65;
inline uint32_t defaultGemmMinItems(bool split_matmul) {
    return split_matmul ? kGpuGemmMinItems : BLUE_MATMUL_GEMM_TILE;
}

// The CPU drivers' lanes-over-items GEMM (`_i`, `_iq`) fills a workgroup with 32 items; below
// that the 4-item tiles stay unless BLUE_GEMM_MIN_ITEMS was given. At 16 instances a half-empty
// `_i` was slower than the tiles: decode of 16 instances 1.16-1.33x faster from 32 on (peer-dim256
// and peer-dim1024 Q4_0, lavapipe, 2026-11-28).
constexpr uint32_t kItemsGemmTile = BLUE_MATMUL_ITEMS_LANES * BLUE_MATMUL_ITEMS_PER_LANE;
inline uint32_t itemsGemmMinItems(const KernelChoice& k) {
    return k.gemm_min_items_given ? k.gemm_min_items : std::max(k.gemm_min_items, kItemsGemmTile);
}

// The loop limit of a device's compiler (KernelChoice::loop_limit): 65535 for CPU drivers
// (lavapipe), 0 (none) for the rest.
constexpr uint32_t deviceLoopLimit(bool cpu_driver) { return cpu_driver ? 65535u : 0u; }

// The longest window of history tokens SAMPLE's repetition penalties can walk within a loop limit
// (0: no limit, UINT32_MAX returned), after the walks over a vocabulary of n_vocab tokens the rest
// of sampling (and a grammar's mask) takes, at sampleWidth's lanes for that history (below).
// shaders/sample.comp applyPenalties has the count.
uint32_t maxPenaltyWindow(uint32_t loop_limit, uint32_t n_vocab, uint32_t history = 0);

// Narrow workgroups for CPU drivers. lavapipe runs a workgroup's lanes eight at a time whether they
// have work or not, so a kernel sized for a GPU's wide rows spends most of a small row's dispatch
// on idle lanes (README, Measured: narrow workgroups). These pick the kernels' widths there
// ("kernel@W", host/pipelines.h); devices without a loop limit (GPUs) keep the built widths.
//
// SAMPLE, SAMPLEG, SAMPLEQ on a CPU driver: without a history length, 64 lanes for vocabularies
// up to kNarrowSampleVocab (every walk then still fits the loop limit with room for penalties),
// else the built 256; with one (`history`: the longest a request can have, a model's context),
// the narrowest of 8, 16, 32 ... up to that width whose penalties still reach min(history, that
// width's window): fewer lanes with longer walks, which lavapipe runs faster (its barriers switch
// between a workgroup's groups of eight lanes), and no window a request could ask for is lost.
constexpr uint32_t kNarrowSampleVocab = 4096;
uint32_t sampleWidth(uint32_t loop_limit, uint32_t n_vocab, uint32_t history = 0);
// The lanes-over-rows MATMUL kernels (`_b1`, the 4-item tile, `_g`) over `rows` rows of `r` rows
// per lane: the widest of 64, 32 and 16 (kNarrowMatmulWg) lanes whose last workgroup leaves at most
// a fifth of the rows it computes clamped (64 x 4 lanes' rows for a 64-row matrix computed one row
// four times).
constexpr uint32_t kNarrowMatmulWg = 16;
uint32_t matmulWidth(uint64_t rows, uint32_t r);

// Why a size past the loop limit is refused, for messages: "its compiler ends every loop of a
// shader invocation after 65535 iterations: lavapipe's LP_MAX_TGSI_LOOP_ITERATIONS".
std::string loopLimitReason(uint32_t loop_limit);

// The most instructions one instance runs in one sequencer cycle on a device with this loop limit
// (0: no limit, UINT32_MAX returned): a module's max_steps is capped there, so that the step loop
// leaves the cycle's walks (INCMP, INCPY, INTCPY) most of the limit. An instance with steps left
// goes on in the next cycle, max_steps' own meaning: the results are the same and only the cycle
// count grows. bluec lowers 4,096.
uint32_t maxCycleSteps(uint32_t loop_limit);

// The most words a grammar automaton may take on a device with this loop limit (0: no limit,
// UINT32_MAX returned). The generation program copies an automaton of more than 4,096 words into
// its instance in a cycle of its own (INTCPY, one word a loop iteration; compiler/lower_model.cpp),
// and instances that copy in the same cycle do it together; 7,168 iterations stay for the cycle's
// other loops: the generation program's 4,096 steps and another instance's prompt comparison (8
// tokens an iteration: about 24,000 tokens).
uint32_t maxGrammarWords(uint32_t loop_limit);

// Worst-case loop iterations of one ATTN/ATTNX/ATTNP invocation (planDispatches, KernelChoice;
// ATTNP: positions = the U_n * PS its page table covers).
struct AttnLoops {
    uint64_t head = 0, positions = 0;
    uint64_t lanes = 0;  // a lane per head
    uint64_t split = 0;  // a workgroup per head
};
Result<std::vector<DispatchDesc>> planDispatches(const Module& m, const PagePlan& pages,
                                                 uint32_t max_groups_x, const KernelChoice& kernels = {});

// The kernel name for a tensor instruction: "<op>_<type of operand 1>" when such a kernel is
// built in, else "<op>".
std::string kernelName(const Module& m, uint32_t op, const std::vector<uint32_t>& args);

}  // namespace blue
