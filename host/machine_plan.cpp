// Load-time planning for GpuMachine (see machine_plan.h).
#include "host/machine_plan.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <map>
#include <optional>

#include "host/machine.h"
#include "host/pipelines.h"
#include "host/matmul_groups.h"
#include "host/weight_layout.h"
#include "vm/abi.h"
#include "vm/isa.h"
#include "vm/tensor_ops.h"
#include "vm/verify.h"

namespace blue {

namespace {

constexpr uint64_t kTensorAlign = 256;
// maxComputeWorkGroupCount[1] every Vulkan device allows (the specification's minimum).
constexpr uint32_t kMinGroupsY = 65535;

std::string lower(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

bool isMatmul(Op op) {
    return op == Op::MATMUL || op == Op::MATMULADD || op == Op::MATMULGLU;
}

// Why an op's kernel cannot run an instruction that the op's rules (and the reference machine)
// accept; empty when it can. MATMUL reads its matrix repacked (host/weight_layout.h); ROPE
// rotates pairs of dims; F16 caches pack two halves per word, so
// their slices must be whole words; ATTN holds one head's query in fixed shared memory.
std::string kernelLimit(const Module& m, const TensorInstr& ti) {
    const auto& a = ti.args;
    switch (ti.op) {
        case Op::ROPE:
            if (a[4] % 2) {
                return strFormat("head size %u is odd; the kernel rotates pairs of dims", a[4]);
            }
            break;
        case Op::MATMUL:
        case Op::MATMULADD:
        case Op::MATMULGLU:
            if (m.tensors[a[1]].cls != BLUE_TC_WEIGHT) {
                return strFormat(
                    "the matrix '%s' is not a WEIGHT tensor; the kernels read "
                    "matrices in the GPU weight layout, which only weights have",
                    m.tensors[a[1]].name.c_str());
            }
            break;
        case Op::MOEMM: {
            const TensorDecl& w = m.tensors[a[1]];
            if (m.tensors[a[2]].elements() != w.ne[0] && w.ne[0] % 4) {
                return strFormat("a row length of %llu per slot is not a whole number of texels (4 floats)",
                                 (unsigned long long)w.ne[0]);
            }
            WeightLayout wl;
            if (!weightLayout(w.dtype, w.ne[0], w.ne[1], &wl)) {
                return strFormat("type %s has no GPU weight layout", std::string(dtypeName(w.dtype)).c_str());
            }
            break;
        }
        case Op::KVSTORE:
        case Op::KVSTOREP:
        case Op::ATTN:
        case Op::ATTNX:
        case Op::ATTNP: {
            const TensorDecl& kc = m.tensors[a[1]];
            if (kc.dtype == DType::F16 && kc.ne[0] % 2) {
                return strFormat("an F16 KV cache needs an even row length, not %llu",
                                 (unsigned long long)kc.ne[0]);
            }
            const bool store = ti.op == Op::KVSTORE || ti.op == Op::KVSTOREP;
            uint64_t head = !store ? m.tensors[a[0]].elements() / a[4] : 0;
            if (head > BLUE_ATTN_MAX_HEAD) {
                return strFormat("head size %llu is more than the kernel's %u",
                                 (unsigned long long)head, BLUE_ATTN_MAX_HEAD);
            }
            break;
        }
        default:
            break;
    }
    return {};
}

// The KV pool [D, PS, NP] a paged-KV instruction reads through page tables (operand 1 of
// KVSTOREP and ATTNP, 0 of PGCOPY and KVCOPYP); null for other ops.
const TensorDecl* kvPool(const Module& m, const TensorInstr& ti) {
    switch (ti.op) {
        case Op::KVSTOREP:
        case Op::ATTNP: return &m.tensors[ti.args[1]];
        case Op::PGCOPY:
        case Op::KVCOPYP: return &m.tensors[ti.args[0]];
        default: return nullptr;
    }
}

// A MATMUL dispatch over `rows` weight rows made split-K (GPUs): the kernel named with
// `suffix` added, one workgroup per BLUE_MATMUL_SPLIT_ROWS rows; unchanged when that kernel
// does not exist or the grid would pass the 65535 workgroups along y.
void splitMatmul(DispatchDesc* d, uint64_t rows, const char* suffix) {
    const uint64_t groups = (rows + BLUE_MATMUL_SPLIT_ROWS - 1) / BLUE_MATMUL_SPLIT_ROWS;
    if (groups > kMinGroupsY || !Pipelines::exists(d->pipeline + suffix)) return;
    d->pipeline += suffix;
    d->fixed = uint32_t(groups);
}

// A lanes-over-rows MATMUL dispatch over `rows` rows (r per lane) at matmulWidth's lanes.
void narrowMatmul(DispatchDesc* d, uint64_t rows, uint32_t r) {
    const uint32_t w = matmulWidth(rows, r);
    if (w == BLUE_MATMUL_WG) return;
    d->pipeline += "@" + std::to_string(w);
    d->fixed = uint32_t((rows + uint64_t(w) * r - 1) / (uint64_t(w) * r));
}

// The single-item (`_b1`) variant of a MATMUL or MOEMM dispatch: runs when one item asks.
DispatchDesc singleItemDispatch(const DispatchDesc& d, const char* suffix = "_b1") {
    DispatchDesc single = d;
    single.pipeline += suffix;
    single.max_items = 1;
    single.push[BLUE_PC_TILE] = 1;
    return single;
}

// The GEMM variant of a batched MATMUL dispatch over `rows` weight rows, when its type has one
// and the matrix fills at least one of its narrowest workgroups (fewer rows would leave most lanes
// computing clamped duplicates), at matmulWidth's lanes.
std::optional<DispatchDesc> gemmDispatch(const DispatchDesc& batched, uint64_t rows, uint32_t min_items) {
    DispatchDesc g = batched;
    g.pipeline += "_g";
    if (rows < kNarrowMatmulWg * BLUE_MM_R_GEMM || !Pipelines::exists(g.pipeline)) return std::nullopt;
    g.fixed = uint32_t((rows + BLUE_MATMUL_WG * BLUE_MM_R_GEMM - 1) / (BLUE_MATMUL_WG * BLUE_MM_R_GEMM));
    narrowMatmul(&g, rows, BLUE_MM_R_GEMM);
    g.min_items = min_items;
    g.tile = BLUE_MATMUL_GEMM_TILE;
    return g;
}

// The worst case of loop iterations one invocation of the ATTN/ATTNX/ATTNP kernels runs (each
// loop counted once more than its iterations, as lavapipe counts them): the lane-per-head kernel
// walks every position of the context with two loops over the head's quads (four at a time, then
// the rest: shaders/attn.comp); the split kernel's lanes take every BLUE_ATTN_SPLIT_WG-th
// position, then merge. ATTNX's window is not counted: the bound holds for any window. ATTNP's
// context is the positions its page table covers, U_n * PS (unmapped ones still take an
// iteration). `heads`: the query heads, as the dispatch grid reads them from the instruction's
// format.
AttnLoops attnLoops(const Module& m, const TensorInstr& ti, uint32_t heads) {
    const TensorDecl& dst = m.tensors[ti.args[0]];
    const TensorDecl& kc = m.tensors[ti.args[1]];
    AttnLoops a;
    a.head = dst.ne[0] / std::max<uint64_t>(1, heads);
    a.positions = ti.op == Op::ATTNP ? uint64_t(ti.args[11]) * kc.ne[1] : kc.ne[1];
    const uint64_t quads = a.head / 4, per = 2 * ((quads / 4 + 1) + (quads % 4 + 1));
    a.lanes = 2 * (quads + 1) + (a.positions + 1) + a.positions * per;
    const uint64_t mine = (a.positions + BLUE_ATTN_SPLIT_WG - 1) / BLUE_ATTN_SPLIT_WG;
    const uint64_t merge = 2 * (BLUE_ATTN_SPLIT_WG + 1) + (quads / 16 + 2) * (17 + BLUE_ATTN_SPLIT_WG + 1);
    a.split = (quads + 1) + (mine + 1) + mine * per + merge;
    return a;
}

// A batched MATMUL dispatch over `rows` weight rows made a GEMM: the kernel named with `suffix`
// added, in workgroups of `group_rows` rows by `tile` items, from `min_items` items on
// (KernelChoice::gemm_min_items); none when the type has no such kernel or the grid would pass the
// 65535 workgroups along y. The GPUs' `_t` (shaders/matmul_tiled.comp: 64 x 64 tiles, every type)
// and the CPU drivers' lanes-over-items `_i` (shaders/matmul_items.comp: the block types).
std::optional<DispatchDesc> rowGroupsGemm(const DispatchDesc& batched, uint64_t rows, uint32_t min_items,
                                          const char* suffix, uint32_t group_rows, uint32_t tile) {
    DispatchDesc t = batched;
    t.pipeline += suffix;
    const uint64_t groups = (rows + group_rows - 1) / group_rows;
    if (groups > kMinGroupsY || !Pipelines::exists(t.pipeline)) return std::nullopt;
    t.fixed = uint32_t(groups);
    t.min_items = min_items;
    t.tile = tile;
    return t;
}

// PACKX before the int8 kernels of a MATMUL (`d`: its dispatch, with the packed x's reference):
// the same block and mode, every cycle its block runs, a workgroup per item (shaders/packx.comp);
// no matrix.
DispatchDesc packxDispatch(const DispatchDesc& d) {
    DispatchDesc p = d;
    p.pipeline = "packx";
    p.axis = 1;
    p.tile = 1;
    p.fixed = 1;
    p.min_items = 0;
    p.max_items = 0;
    p.push[BLUE_PC_TILE] = 1;
    p.operand_pages.fill(DispatchDesc::kNoPage);
    p.operand_pages[2] = d.operand_pages[2];
    p.weight_page = DispatchDesc::kNoPage;
    p.weight_offset = p.weight_bytes = 0;
    return p;
}

// After a MOEROUTE with an expert cache: MOECOPY dispatches (one per BLUE_COPY_MAX_MATRICES of
// its matrices: one for a layer's gate, up and down) that copy the experts MOEROUTE listed from
// host memory into their slots (x: the list, which MOEROUTE sizes through a patch word; y: the
// chunks of every matrix, one after another).
Status addExpertCopies(const Module& m, const PagePlan& pages, const ExpertCache& xc, uint32_t block,
                       size_t route, std::vector<DispatchDesc>* out) {
    for (size_t first = 0; first < xc.tensors.size(); first += BLUE_COPY_MAX_MATRICES) {
        const size_t count = std::min<size_t>(BLUE_COPY_MAX_MATRICES, xc.tensors.size() - first);
        DispatchDesc d;
        d.block = block;
        d.pipeline = "moecopy";
        d.mode = 0;
        d.axis = 1;
        d.tile = BLUE_MAX_ROWS;
        d.fixed = 0;
        d.operand_pages.fill(DispatchDesc::kNoPage);
        d.push[BLUE_PC_BLOCK] = block;
        d.push[BLUE_PC_MODE] = 0;
        d.push[BLUE_PC_TILE] = d.tile;
        d.push[BLUE_PC_COPY_STATE] = xc.state + 1;
        d.push[BLUE_PC_COPY_CHUNK] = BLUE_COPY_CHUNK_TEXELS;
        d.push[BLUE_PC_COPY_COUNT] = uint32_t(count);
        for (size_t i = 0; i < count; ++i) {
            const TensorPlace& src = pages.places[xc.tensors[first + i]];
            const TensorPlace& dst = xc.caches[first + i];
            const uint32_t at = BLUE_PC_COPY_PAIRS + 8 * uint32_t(i);
            d.push[at] = src.page | BLUE_TC_WEIGHT << 16;
            d.push[at + 1] = uint32_t(src.offset);
            d.push[at + 2] = uint32_t(src.slice);
            d.push[at + 3] = xc.experts;
            d.push[at + 4] = dst.page | BLUE_TC_WEIGHT << 16;
            d.push[at + 5] = uint32_t(dst.offset);
            d.push[at + 6] = uint32_t(dst.slice);
            d.push[at + 7] = xc.slots;
            d.fixed += uint32_t((dst.slice / 16 + BLUE_COPY_CHUNK_TEXELS - 1) / BLUE_COPY_CHUNK_TEXELS);
        }
        if (d.fixed > kMinGroupsY) {
            return BLUE_ERROR("tensor '%s': one expert's matrices need %u copy workgroups, more than %u",
                              m.tensors[xc.tensors[first]].name.c_str(), d.fixed, kMinGroupsY);
        }
        auto& rp = (*out)[route].push;
        if (rp[BLUE_PC_MOE_PATCH] == BLUE_MOE_MAX_PATCH) {
            return BLUE_ERROR("tensor '%s': too many dispatches read one expert map",
                              m.tensors[xc.tensors[first]].name.c_str());
        }
        rp[BLUE_PC_MOE_PATCH + 1 + rp[BLUE_PC_MOE_PATCH]++] = uint32_t(out->size()) | BLUE_MOE_PATCH_COPY;
        out->push_back(d);
    }
    return Status::ok();
}

}  // namespace

std::string loopLimitReason(uint32_t loop_limit) {
    return strFormat("its compiler ends every loop of a shader invocation after %u iterations: lavapipe's "
                     "LP_MAX_TGSI_LOOP_ITERATIONS",
                     loop_limit);
}

uint32_t maxCycleSteps(uint32_t loop_limit) {
    return loop_limit == 0 ? UINT32_MAX : loop_limit / 8;  // 8,191 for lavapipe
}

uint32_t maxGrammarWords(uint32_t loop_limit) {
    if (loop_limit == 0) return UINT32_MAX;
    return loop_limit >= 7168 ? (loop_limit + 1 - 7168) & ~3u : 0;  // 58,368 for lavapipe
}

namespace {

// maxPenaltyWindow at a given width.
uint32_t penaltyWindowAt(uint32_t loop_limit, uint32_t n_vocab, uint64_t lanes) {
    if (loop_limit == 0) return UINT32_MAX;
    // SAMPLE's other walks: at most 60 over the row, 8 logits per lane an iteration (row
    // statistics, the prefilter's sample and count, top-k/top-p passes, top log-probabilities, the
    // draw: 56 on the longest path of shaders/common/sampling.glsl keepThreshold, each pass over its
    // list of at most 1,024 logits, also 8 per lane an iteration, counted as one over the row), a
    // grammar's mask, up to 17 iterations per 4 tokens per lane, and the radix selects'
    // histograms, 256 bins cleared by the lanes in each of 8 passes; then 64 of margin, as
    // attnLoops keeps.
    const uint64_t n = n_vocab;
    const uint64_t rest = 60 * ((n + 8 * lanes - 1) / (8 * lanes)) + 70 * ((n + 4 * lanes - 1) / (4 * lanes)) +
                          8 * ((256 + lanes - 1) / lanes) + 64;
    if (rest >= loop_limit) return 0;
    const uint64_t budget = loop_limit - rest;
    // applyPenalties: ceil(W / lanes) window positions per invocation, each walking the window 16
    // tokens an iteration, plus the outer loop.
    auto loops = [lanes](uint64_t w) {
        return (w + lanes - 1) / lanes * ((w + 15) / 16 + 1) + (w + lanes - 1) / lanes + 1;
    };
    uint64_t lo = 0, hi = 1u << 20;
    while (lo < hi) {
        const uint64_t mid = (lo + hi + 1) / 2;
        if (loops(mid) <= budget) lo = mid; else hi = mid - 1;
    }
    return uint32_t(lo);
}

}  // namespace

uint32_t maxPenaltyWindow(uint32_t loop_limit, uint32_t n_vocab, uint32_t history) {
    return penaltyWindowAt(loop_limit, n_vocab, sampleWidth(loop_limit, n_vocab, history));
}

uint32_t sampleWidth(uint32_t loop_limit, uint32_t n_vocab, uint32_t history) {
    if (loop_limit == 0) return 256;
    const uint32_t widest = n_vocab <= kNarrowSampleVocab ? 64 : 256;
    if (history == 0) return widest;
    const uint32_t need = std::min(history, penaltyWindowAt(loop_limit, n_vocab, widest));
    for (uint32_t w = 8; w < widest; w *= 2) {
        const uint32_t window = penaltyWindowAt(loop_limit, n_vocab, w);
        if (window > 0 && window >= need) return w;  // (0: the walks alone pass the limit)
    }
    return widest;
}

uint32_t matmulWidth(uint64_t rows, uint32_t r) {
    for (uint32_t w : {uint32_t(BLUE_MATMUL_WG), 32u}) {
        const uint64_t per = uint64_t(w) * r, computed = (rows + per - 1) / per * per;
        if (computed * 4 <= rows * 5) return w;
    }
    return kNarrowMatmulWg;
}

Result<ControlLayout> planControl(const Module& m, const GpuOptions& options, uint32_t ndispatch,
                                  uint64_t max_binding_bytes, uint64_t expert_state_words) {
    const Layout& l = m.layout;
    const uint64_t n = options.instances;
    ControlLayout c;
    auto& h = c.header;
    h[BLUE_H_NINST] = options.instances;
    h[BLUE_H_NREGS] = l.regs;
    h[BLUE_H_LOCAL_WORDS] = l.local_words;
    h[BLUE_H_STACK_DEPTH] = l.stack_depth;
    h[BLUE_H_MAILBOX_CAP] = l.mailbox_cap;
    h[BLUE_H_HEAP_WORDS] = l.heap_words;
    h[BLUE_H_MAX_STEPS] = l.max_steps;
    h[BLUE_H_NBLOCKS] = uint32_t(m.blocks.size());
    h[BLUE_H_MAX_ROWS] = l.max_rows;
    h[BLUE_H_CODE_WORDS] = uint32_t(m.code.size());
    h[BLUE_H_CONST_WORDS] = uint32_t(m.consts.size());
    h[BLUE_H_IN_SLOTS] = l.in_slots;
    h[BLUE_H_IN_SLOT_WORDS] = l.in_slot_words;
    h[BLUE_H_NDISPATCH] = ndispatch;
    h[BLUE_H_OUT_CAP] = options.out_records;
    h[BLUE_H_MAX_CYCLES] = uint32_t(std::min<uint64_t>(options.max_cycles, 0xFFFFFFFFu));
    h[BLUE_H_NTENSORS] = uint32_t(m.tensors.size());

    // Control regions, in order; sizes in words.
    const std::pair<uint32_t, uint64_t> regions[] = {
        {BLUE_O_STATE, n * BLUE_STATE_WORDS},
        {BLUE_O_REGS, n * l.regs},
        {BLUE_O_STACK, n * l.stack_depth},
        {BLUE_O_LOCAL, n * l.local_words},
        {BLUE_O_MAILBOX, n * (2 + 2 * uint64_t(l.mailbox_cap))},
        {BLUE_O_HEAP, l.heap_words},
        {BLUE_O_BARGS, n * BLUE_MAX_BLOCK_ARGS},
        {BLUE_O_CODE, m.code.size()},
        {BLUE_O_CONST, m.consts.size()},
        {BLUE_O_BLOCKS, uint64_t(m.blocks.size()) * BLUE_BLOCK_WORDS},
        {BLUE_O_LISTS, uint64_t(m.blocks.size()) * 3 * n},
        {BLUE_O_ROWMAP, uint64_t(m.blocks.size()) * l.max_rows * 2},
        {BLUE_O_DISPATCH, uint64_t(ndispatch) * BLUE_DISPATCH_WORDS},
        {BLUE_O_INDIRECT, uint64_t(ndispatch + 1) * 3},
        {BLUE_O_TENSORS, uint64_t(m.tensors.size()) * BLUE_TREF_WORDS},
        {BLUE_O_EXPERT_CACHE, expert_state_words},
    };
    uint64_t at = BLUE_HEADER_WORDS;
    for (const auto& [index, words] : regions) {
        h[index] = uint32_t(at);
        at += words;
        if (at * 4 > max_binding_bytes || at > 0xFFFFFFFFull) {
            return BLUE_ERROR(
                "the control buffer for %u instances needs more than the device's "
                "largest storage binding (%llu MiB); use fewer instances or smaller "
                "per-instance memory",
                options.instances, (unsigned long long)(max_binding_bytes >> 20));
        }
    }
    c.control_words = at;

    // I/O regions.
    const uint64_t slots = l.in_slots;
    const std::pair<uint32_t, uint64_t> io_regions[] = {
        {BLUE_H_IO_ORDER, slots},
        {BLUE_H_IO_SLOTSTATE, slots},
        {BLUE_H_IO_SLOTS, slots * l.in_slot_words},
        {BLUE_H_IO_OUT, uint64_t(options.out_records) * 2},
        {BLUE_H_IO_FLAGS, n},
    };
    at = BLUE_IO_DYNAMIC;
    for (const auto& [index, words] : io_regions) {
        h[index] = uint32_t(at);
        at += words;
    }
    if (at * 4 > max_binding_bytes) {
        return BLUE_ERROR(
            "the I/O rings (%u input slots of %u words, %u output records) exceed "
            "the device's largest storage binding",
            l.in_slots, l.in_slot_words, options.out_records);
    }
    c.io_words = at;
    return c;
}

namespace {

// A slice of a tensor other than a repacked matrix, padded so kernels read it in whole texels.
uint64_t paddedSlice(const TensorDecl& t) { return (tensorSliceBytes(t) + 15) / 16 * 16; }

}  // namespace

Result<PagePlan> planPages(const Module& m, uint32_t instances, uint64_t page_limit,
                           uint64_t vram_budget, bool stream, bool expert_cache, bool fuse_matmuls) {
    PagePlan plan;
    plan.places.resize(m.tensors.size());
    int last[2] = {-1, -1};  // the page each tier fills now
    // Places `bytes` in the tier's current page, or a new one when it does not fit there.
    auto place = [&](uint64_t bytes, uint8_t tier, uint32_t* page, uint64_t* offset) -> Status {
        int& at = last[tier];
        if (at < 0 || ((plan.page_bytes[at] + kTensorAlign - 1) & ~(kTensorAlign - 1)) + bytes >
                          page_limit) {
            if (plan.page_bytes.size() == BLUE_MAX_PAGES) {
                return BLUE_ERROR("the module's tensors need more than %u pages of %.1f MiB",
                                  BLUE_MAX_PAGES, double(page_limit) / (1 << 20));
            }
            plan.page_bytes.push_back(0);
            plan.page_tier.push_back(tier);
            at = int(plan.page_bytes.size() - 1);
        }
        uint64_t& used = plan.page_bytes[at];
        used = (used + kTensorAlign - 1) & ~(kTensorAlign - 1);
        *page = uint32_t(at);
        *offset = used;
        used += bytes;
        return Status::ok();
    };
    // Sizes first: slices, totals, and the pieces of matrices larger than a page.
    std::vector<uint64_t> group_bytes(m.tensors.size(), 0);
    for (uint32_t i = 0; i < m.tensors.size(); ++i) {
        const TensorDecl& t = m.tensors[i];
        TensorPlace& p = plan.places[i];
        WeightLayout wl;
        uint64_t count = t.cls == BLUE_TC_ROWS       ? m.layout.max_rows
                         : t.cls == BLUE_TC_INSTANCE ? instances
                                                     : 1;
        if (t.cls == BLUE_TC_WEIGHT && (t.ndim == 2 || t.ndim == 3) &&
            weightLayout(t.dtype, t.ne[0], t.ne[1], &wl)) {
            // A 3-D weight holds experts' matrices: each repacked, one slice per expert.
            p.repacked = true;
            p.slice = wl.bytes;
            if (t.ndim == 3) count = t.ne[2];
        } else {
            p.slice = paddedSlice(t);
        }
        p.bytes = p.slice * count;
        if (p.bytes > page_limit && p.repacked && t.ndim == 2) {
            // Split by rows: groups of 8 rows are contiguous in the weight layout.
            const uint64_t group = wl.bytes / (wl.rows_padded / 8);
            const uint64_t groups_per_piece = page_limit / group;
            if (groups_per_piece == 0) {
                return BLUE_ERROR(
                    "tensor '%s': 8 of its rows need %.1f KiB, more than the device's largest "
                    "storage binding (%.1f KiB)",
                    t.name.c_str(), double(group) / 1024, double(page_limit) / 1024);
            }
            const uint64_t groups = wl.rows_padded / 8;
            const uint64_t npieces = (groups + groups_per_piece - 1) / groups_per_piece;
            const uint64_t per = (groups + npieces - 1) / npieces;  // balanced pieces
            for (uint64_t g = 0; g < groups; g += per) {
                TensorPiece piece;
                piece.row_begin = uint32_t(g * 8);
                piece.rows = uint32_t(std::min<uint64_t>(t.ne[1] - g * 8, per * 8));
                piece.bytes = std::min(per, groups - g) * group;
                p.pieces.push_back(piece);
            }
        } else if (p.bytes > page_limit) {
            return BLUE_ERROR(
                "tensor '%s' needs %.1f MiB, more than the device's largest "
                "storage binding (%.1f MiB)",
                t.name.c_str(), double(p.bytes) / (1 << 20), double(page_limit) / (1 << 20));
        }
    }
    // MATMULs over one x stacked into one dispatch (host/matmul_groups.h): each group's matrices
    // go back to back into one page, its destinations interleaved row by row into another region.
    // A group must fit a page unsplit; streaming copies matrix by matrix, so it stacks none.
    std::vector<int32_t> group_of(m.tensors.size(), -1);
    if (fuse_matmuls && !stream) {
        for (MatmulGroup& g : findMatmulGroups(m)) {
            uint64_t stack = 0, row = 0;
            bool whole = true;
            for (uint32_t t : g.weights) {
                whole = whole && plan.places[t].pieces.empty();
                stack += plan.places[t].bytes;
            }
            // (Groups may share a row, laid out alike: every layer writes q, k and v.)
            for (uint32_t t : g.row) row += paddedSlice(m.tensors[t]);
            const uint64_t count = plan.places[g.row[0]].bytes / plan.places[g.row[0]].slice;
            // The rows and one row more: the last member's view ends a row past the first's.
            if (!whole || stack > page_limit || (count + 1) * row > page_limit) continue;
            for (uint32_t t : g.weights) group_of[t] = int32_t(plan.matmul_groups.size());
            for (uint32_t t : g.row) {
                group_of[t] = int32_t(plan.matmul_groups.size());
                plan.places[t].slice = row;
                plan.places[t].bytes = count * row;
            }
            plan.matmul_groups.push_back(std::move(g));
        }
    }
    std::vector<uint8_t> placed(m.tensors.size(), 0);
    // The members of tensor i's stack (its group's matrices or destinations' row), when it has one.
    auto stackOf = [&](uint32_t i) -> const std::vector<uint32_t>* {
        if (group_of[i] < 0) return nullptr;
        const MatmulGroup& g = plan.matmul_groups[size_t(group_of[i])];
        return std::find(g.weights.begin(), g.weights.end(), i) != g.weights.end() ? &g.weights : &g.row;
    };
    auto placeTensor = [&](uint32_t i, uint8_t tier) -> Status {
        TensorPlace& p = plan.places[i];
        if (placed[i]) return Status::ok();
        placed[i] = 1;
        p.tier = tier;
        if (const std::vector<uint32_t>* stack = stackOf(i)) {
            const bool matrices = m.tensors[i].cls == BLUE_TC_WEIGHT;
            // Matrices end to end; destinations: their rows and one more (the last view ends a
            // row past the first's).
            uint64_t bytes = plan.places[i].bytes + plan.places[i].slice;
            if (matrices) {
                bytes = 0;
                for (uint32_t t : *stack) bytes += plan.places[t].bytes;
            }
            uint32_t page = 0;
            uint64_t at = 0;
            BLUE_TRY(place(bytes, tier, &page, &at));
            for (uint32_t t : *stack) {
                TensorPlace& q = plan.places[t];
                placed[t] = 1;
                q.tier = tier;
                q.page = page;
                q.offset = at;
                at += matrices ? q.bytes : paddedSlice(m.tensors[t]);
            }
            return Status::ok();
        }
        if (p.pieces.empty()) return place(p.bytes, tier, &p.page, &p.offset);
        for (TensorPiece& piece : p.pieces) BLUE_TRY(place(piece.bytes, tier, &piece.page, &piece.offset));
        p.page = p.pieces[0].page;
        p.offset = p.pieces[0].offset;
        return Status::ok();
    };
    // Upper bound of the bytes a tensor adds to its tier: itself and its alignment.
    auto footprint = [&](uint32_t i) {
        const TensorPlace& p = plan.places[i];
        if (placed[i]) return uint64_t(0);
        if (const std::vector<uint32_t>* stack = stackOf(i)) {  // placed as one (matrices only here)
            uint64_t n = kTensorAlign;
            for (uint32_t t : *stack) n += placed[t] ? 0 : plan.places[t].bytes;
            return n;
        }
        if (p.pieces.empty()) return p.bytes + kTensorAlign;
        uint64_t n = 0;
        for (const TensorPiece& piece : p.pieces) n += piece.bytes + kTensorAlign;
        return n;
    };
    // Activations first when a budget is set (they must be device-local); otherwise after the
    // weights, so weights share pages with each other.
    std::vector<uint32_t> weights, others;
    for (uint32_t i = 0; i < m.tensors.size(); ++i) {
        (m.tensors[i].cls == BLUE_TC_WEIGHT ? weights : others).push_back(i);
    }
    if (vram_budget == 0) {
        for (uint32_t i : weights) BLUE_TRY(placeTensor(i, 0));
        for (uint32_t i : others) BLUE_TRY(placeTensor(i, 0));
        return plan;
    }
    for (uint32_t i : others) BLUE_TRY(placeTensor(i, 0));
    if (plan.tierBytes(0) > vram_budget) {
        return BLUE_ERROR(
            "the activations, KV caches and logits need %.1f MiB of device memory, more than the "
            "VRAM budget of %.1f MiB (weights could go to host memory; these cannot)",
            double(plan.tierBytes(0)) / (1 << 20), double(vram_budget) / (1 << 20));
    }
    // Weights read in full per token first, tables read a row at a time (EMBED only) last.
    // Streaming copies only matrices that MATMUL, EMBED and MOEMM read as their operand 1.
    std::vector<uint8_t> dense(m.tensors.size(), 0), streamable(m.tensors.size(), 1);
    // MoE experts: 3-D matrices that only MOEMM reads (as its operand 1), by layer. Layers are told apart by their MOEROUTE (one expert map may serve every layer): key = the
    // MOEROUTE's ordinal in block and instruction order, as planDispatches counts them.
    std::vector<uint8_t> expert_ok(m.tensors.size(), 1), expert_layers(m.tensors.size(), 0);
    std::map<uint32_t, std::vector<uint32_t>> layer_experts;
    uint32_t route_ordinal = 0;
    for (const BlockDecl& blk : m.blocks) {
        std::vector<TensorInstr> instrs;
        if (!decodeBlock(m, blk, &instrs)) continue;
        std::map<uint32_t, uint32_t> route_of;  // expert map -> the MOEROUTE filling it now
        for (const TensorInstr& ti : instrs) {
            const OpInfo& info = opInfo(ti.op);
            if (ti.op == Op::MOEROUTE && ti.args.size() > 2) route_of[ti.args[2]] = route_ordinal++;
            for (size_t k = 0; k < ti.args.size() && k < info.format.size(); ++k) {
                const char letter = info.format[k];
                if ((letter != 't' && letter != 'o') || ti.args[k] >= m.tensors.size()) continue;
                if (!(ti.op == Op::EMBED && k == 1)) dense[ti.args[k]] = 1;
                if (!((isMatmul(ti.op) || ti.op == Op::EMBED || ti.op == Op::MOEMM) && k == 1)) {
                    streamable[ti.args[k]] = 0;
                }
                if (!(ti.op == Op::MOEMM && k == 1)) expert_ok[ti.args[k]] = 0;
            }
            if (ti.op == Op::MOEMM && ti.args.size() > 3 && ti.args[1] < m.tensors.size() &&
                route_of.count(ti.args[3])) {
                std::vector<uint32_t>& list = layer_experts[route_of[ti.args[3]]];
                if (std::find(list.begin(), list.end(), ti.args[1]) == list.end()) {
                    list.push_back(ti.args[1]);
                    expert_layers[ti.args[1]] += 1;
                }
            }
        }
    }
    for (uint32_t i : weights) streamable[i] &= plan.places[i].repacked ? 1 : 0;
    uint64_t device = plan.tierBytes(0);
    // Expert caching: only when the weights do not all fit, and every expert tensor of a layer
    // can be cached (a repacked 3-D matrix no other op reads, in one page).
    std::vector<uint8_t> cached(m.tensors.size(), 0);
    uint64_t all_weights = device;
    for (uint32_t i : weights) all_weights += stackOf(i) && stackOf(i)->front() != i ? 0 : footprint(i);
    if (expert_cache && all_weights > vram_budget) {
        for (const auto& [route, list] : layer_experts) {
            bool ok = true;
            for (uint32_t t : list) {
                ok = ok && expert_ok[t] && expert_layers[t] == 1 && plan.places[t].repacked && m.tensors[t].ndim == 3 &&
                     m.tensors[t].cls == BLUE_TC_WEIGHT && m.tensors[t].ne[2] == m.tensors[list[0]].ne[2];
            }
            if (!ok) continue;
            for (uint32_t t : list) {
                cached[t] = 1;
                streamable[t] = 0;
                plan.places[t].expert = true;
                BLUE_TRY(placeTensor(t, 1));
                plan.page_experts.resize(plan.page_bytes.size(), 0);
                plan.page_experts[plan.places[t].page] = 1;
            }
        }
        // Other host-memory weights start a page of their own: pages that hold experts are bound
        // to the kernels (set 0), pages that stream are read by copies only.
        last[1] = -1;
    }
    if (stream) {
        // The slots first, then the weights that cannot stream.
        for (uint32_t i : weights) {
            if (!streamable[i]) continue;
            const TensorPlace& p = plan.places[i];
            if (p.pieces.empty()) plan.slot_bytes = std::max(plan.slot_bytes, p.bytes);
            for (const TensorPiece& piece : p.pieces) plan.slot_bytes = std::max(plan.slot_bytes, piece.bytes);
        }
        device += 2 * plan.slot_bytes;
        for (uint32_t i : weights) {
            if (streamable[i] || cached[i]) continue;
            device += footprint(i);
            BLUE_TRY(placeTensor(i, 0));
        }
        if (device > vram_budget) {
            return BLUE_ERROR(
                "streaming weights needs %.1f MiB of device memory (activations, KV caches, "
                "logits, the weights only device memory can hold, and two slots of %.1f MiB for "
                "the largest matrix), more than the VRAM budget of %.1f MiB",
                double(device) / (1 << 20), double(plan.slot_bytes) / (1 << 20),
                double(vram_budget) / (1 << 20));
        }
    }
    std::stable_partition(weights.begin(), weights.end(), [&](uint32_t i) { return dense[i] != 0; });
    for (uint32_t i : weights) {
        if ((stream && !streamable[i]) || cached[i]) continue;  // placed above
        const uint8_t tier = device + footprint(i) <= vram_budget ? 0 : 1;
        if (tier == 0) device += footprint(i);
        BLUE_TRY(placeTensor(i, tier));
    }
    // The expert caches take what the budget has left: the same number of slots in every layer.
    uint64_t per_slot = 0, aligns = 0, largest = 0;
    uint32_t slots = BLUE_MOE_MAX_EXPERTS;
    for (const auto& [route, list] : layer_experts) {
        if (list.empty() || !cached[list[0]]) continue;
        slots = std::min(slots, uint32_t(m.tensors[list[0]].ne[2]));
        for (uint32_t t : list) {
            per_slot += plan.places[t].slice;
            aligns += kTensorAlign;
            largest = std::max(largest, plan.places[t].slice);
        }
    }
    if (per_slot == 0) return plan;
    const uint64_t left = vram_budget > device + aligns ? vram_budget - device - aligns : 0;
    slots = uint32_t(std::min<uint64_t>({slots, left / per_slot, page_limit / largest}));
    if (slots == 0) return plan;  // the experts are read in place
    uint32_t state = 0;
    for (const auto& [route, list] : layer_experts) {
        if (list.empty() || !cached[list[0]]) continue;
        ExpertCache c;
        c.route = route;
        c.experts = uint32_t(m.tensors[list[0]].ne[2]);
        c.slots = slots;
        c.state = state;
        state += BLUE_XC_WORDS(c.experts, c.slots);
        c.tensors = list;
        for (uint32_t t : list) {
            TensorPlace p;
            p.repacked = true;
            p.slice = plan.places[t].slice;
            p.bytes = p.slice * slots;
            BLUE_TRY(place(p.bytes, 0, &p.page, &p.offset));
            c.caches.push_back(p);
        }
        plan.expert_caches.push_back(std::move(c));
    }
    return plan;
}

Status planPackedX(const Module& m, uint32_t instances, uint64_t page_limit, PagePlan* plan) {
    uint64_t k = 0;
    for (const auto& block : m.blocks) {
        std::vector<TensorInstr> instrs;
        BLUE_TRY(decodeBlock(m, block, &instrs));
        for (const TensorInstr& ti : instrs) {
            if (isMatmul(ti.op) && Pipelines::exists(kernelName(m, uint32_t(ti.op), ti.args) + "_iq")) {
                k = std::max<uint64_t>(k, m.tensors[ti.args[1]].ne[0]);
            }
        }
    }
    plan->packed_x = PackedX{};
    if (k == 0) return Status::ok();
    PackedX& x = plan->packed_x;
    x.k = k;
    x.items = std::max<uint64_t>(m.layout.max_rows, instances);
    x.item_bytes = (k + 255) / 256 * BLUE_XQ_GBLOCK_TEXELS * 16;
    const uint64_t bytes = x.bytes();
    int last = -1;
    for (size_t p = 0; p < plan->page_bytes.size(); ++p) {
        if (plan->page_tier[p] == 0) last = int(p);
    }
    if (last >= 0 && ((plan->page_bytes[last] + kTensorAlign - 1) & ~(kTensorAlign - 1)) + bytes <= page_limit) {
        x.page = uint32_t(last);
    } else {
        if (plan->page_bytes.size() == BLUE_MAX_PAGES || bytes > page_limit) {
            return BLUE_ERROR("the int8 GEMM's packed activations (%.1f MiB for %llu items of K = %llu) need a "
                              "page of their own and none is left or they pass one; turn it off (BLUE_MATMUL_INT8=0)",
                              double(bytes) / (1 << 20), (unsigned long long)x.items, (unsigned long long)k);
        }
        x.page = uint32_t(plan->page_bytes.size());
        plan->page_bytes.push_back(0);
        plan->page_tier.push_back(0);
    }
    uint64_t& used = plan->page_bytes[x.page];
    x.offset = (used + kTensorAlign - 1) & ~(kTensorAlign - 1);
    used = x.offset + bytes;
    return Status::ok();
}

StreamPlan planStreams(const PagePlan& pages, std::vector<DispatchDesc>* dispatches,
                       uint32_t slot_view_base) {
    StreamPlan plan;
    // Matrices (page, offset) of the open group, and where each sits in its slot.
    std::map<std::pair<uint32_t, uint64_t>, uint64_t> open;
    for (size_t d = 0; d < dispatches->size(); ++d) {
        DispatchDesc& disp = (*dispatches)[d];
        if (disp.weight_page == DispatchDesc::kNoPage || pages.page_tier[disp.weight_page] != 1) continue;
        const auto key = std::make_pair(disp.weight_page, disp.weight_offset);
        auto at = open.find(key);
        if (at == open.end()) {
            if (plan.groups.empty() || plan.groups.back().bytes + disp.weight_bytes > pages.slot_bytes) {
                StreamGroup g;
                g.first_dispatch = uint32_t(d);
                g.slot = uint32_t(plan.groups.size() % 2);
                plan.groups.push_back(g);
                open.clear();
            }
            StreamGroup& g = plan.groups.back();
            at = open.emplace(key, g.bytes).first;
            g.copies.push_back({disp.weight_page, disp.weight_offset, g.bytes, disp.weight_bytes});
            g.bytes += (disp.weight_bytes + kTensorAlign - 1) & ~(kTensorAlign - 1);
        }
        const StreamGroup& g = plan.groups.back();
        disp.stream_slot = int32_t(g.slot);
        disp.operand_pages[1] = slot_view_base + g.slot;
        const uint32_t wat = BLUE_PC_OPERANDS + BLUE_TREF_WORDS;
        disp.push[wat] = (slot_view_base + g.slot) | (disp.push[wat] & 0xFFFF0000u);
        disp.push[wat + 1] = uint32_t(at->second);
    }
    return plan;
}

Status checkDeviceFit(const PagePlan& pages, const ControlLayout& layout, uint32_t instances,
                      uint64_t device_local_bytes, uint32_t max_groups_x) {
    // Host pages take no VRAM; streaming's two slots do.
    const uint64_t total = layout.control_words * 4 + pages.tierBytes(0) + 2 * pages.slot_bytes;
    if (total > device_local_bytes) {
        return BLUE_ERROR(
            "the module needs %.1f MiB of device memory (%zu tensor pages and the "
            "control buffer for %u instances), the device has %.1f MiB; --vram-budget keeps "
            "weights in host memory",
            double(total) / (1 << 20), pages.page_bytes.size() - size_t(std::count(pages.page_tier.begin(), pages.page_tier.end(), 1)), instances,
            double(device_local_bytes) / (1 << 20));
    }
    uint64_t groups = (uint64_t(instances) + BLUE_SEQ_WG - 1) / BLUE_SEQ_WG;
    if (groups > max_groups_x) {
        return BLUE_ERROR(
            "%u instances need %llu sequencer workgroups of %u, the device allows "
            "%u (maxComputeWorkGroupCount[0]); use at most %llu instances",
            instances, (unsigned long long)groups, BLUE_SEQ_WG, max_groups_x,
            (unsigned long long)max_groups_x * BLUE_SEQ_WG);
    }
    return Status::ok();
}

uint32_t moeRowsPerInvocation(DType type) {
    const bool plain = type == DType::F32 || type == DType::F16 || type == DType::BF16;
    return plain ? BLUE_MM_R_PLAIN : BLUE_MM_R_MOE;
}

uint32_t matmulRowsPerInvocation(DType type) {
    switch (type) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
            return BLUE_MM_R_PLAIN;
        case DType::Q8_0:
            return BLUE_MM_R_Q8;
        case DType::Q4_0:
        case DType::Q4_1:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::IQ4_NL:
        case DType::MXFP4:
            return BLUE_MM_R_SMALLQ;
        default:
            return BLUE_MM_R_KQ;
    }
}

std::string kernelName(const Module& m, uint32_t op, const std::vector<uint32_t>& args) {
    const OpInfo& info = *opInfo(op);
    // MATMULADD and MATMULGLU run MATMUL's kernels, told by a push constant what to do with dst.
    std::string base = isMatmul(Op(op)) ? std::string("matmul") : lower(info.name);
    if (info.format.size() > 1 && info.format[1] == 't' && args[1] < m.tensors.size()) {
        std::string typed = base + "_" + lower(dtypeName(m.tensors[args[1]].dtype));
        if (Pipelines::exists(typed)) return typed;
    }
    return base;
}

namespace {

// The `ropekv_*` kernel for a ROPEQK and the KVSTORE after it (KernelChoice::fuse), or "" when
// they stay two dispatches: the store must take ROPEQK's k at ROPEQK's position, and its v must
// be laid out as k (same class, elements and stride, as the kernel reads it with k's), distinct
// from q and k. Into F16 caches with neox pairs an invocation takes two frequencies, so that it
// writes whole cache words: the head and the rotated dims must be multiples of 4.
std::string ropeKvKernel(const Module& m, const PagePlan& pages, const TensorInstr& rope, const TensorInstr& store) {
    if (rope.op != Op::ROPEQK || store.op != Op::KVSTORE) return "";
    const uint32_t q = rope.args[0], k = rope.args[1], v = store.args[2], kc = store.args[1], vc = store.args[3];
    if (store.args[0] != k || store.args[4] != rope.args[3] || v == q || v == k) return "";
    const TensorDecl &kd = m.tensors[k], &vd = m.tensors[v];
    if (vd.cls != kd.cls || vd.elements() != kd.elements() || pages.places[v].slice != pages.places[k].slice) return "";
    const DType cache = m.tensors[kc].dtype;
    const bool paired = cache == DType::F16 && rope.args[6] != 0;
    if (m.tensors[vc].dtype != cache || (paired && (rope.args[4] % 4 != 0 || rope.args[5] % 4 != 0))) return "";
    const std::string kernel = "ropekv_" + lower(dtypeName(cache));
    return Pipelines::exists(kernel) ? kernel : "";
}

}  // namespace

Result<std::vector<DispatchDesc>> planDispatches(const Module& m, const PagePlan& pages,
                                                 uint32_t max_groups_x, const KernelChoice& kernels) {
    std::vector<DispatchDesc> out;
    uint32_t route_ordinal = 0;  // MOEROUTEs so far (ExpertCache::route)
    for (uint32_t b = 0; b < m.blocks.size(); ++b) {
        std::map<uint32_t, size_t> routes;  // expert map -> the dispatch of the MOEROUTE filling it
        std::map<uint32_t, const ExpertCache*> route_caches;  // expert map -> its MOEROUTE's cache
        // The tensor (and mode) whose packed x the PackedX region holds: MATMULs in a row that
        // read the same x (a layer's Q, K and V; up and gate) share one PACKX, as long as only
        // MATMULs run between them and none writes that x.
        uint32_t packed_tensor = UINT32_MAX, packed_mode = 0, prev_dst = UINT32_MAX;
        std::vector<TensorInstr> instrs;
        BLUE_TRY(decodeBlock(m, m.blocks[b], &instrs));
        // Stacked MATMULs (PagePlan::matmul_groups): the first runs for its group, the rest fold.
        std::map<size_t, const MatmulGroup*> stacked;
        std::vector<uint8_t> folded(instrs.size(), 0);
        for (const MatmulGroup& g : pages.matmul_groups) {
            for (const auto& [rb, first] : g.runs) {
                if (rb != b) continue;
                stacked[first] = &g;
                for (size_t k = 1; k < g.weights.size(); ++k) folded[first + k] = 1;
            }
        }
        for (size_t at = 0; at < instrs.size(); ++at) {
            const TensorInstr& ti = instrs[at];
            const OpInfo& info = opInfo(ti.op);
            if (!isMatmul(ti.op) || prev_dst == packed_tensor) packed_tensor = UINT32_MAX;
            prev_dst = ti.args[0];
            if (folded[at]) continue;
            DispatchDesc base;
            base.block = b;
            base.pipeline = kernelName(m, uint32_t(ti.op), ti.args);
            if (ti.op == Op::KERNEL) {  // the module's own SPIR-V, not a built-in kernel
                base.custom = int32_t(ti.args[2]);
                base.pipeline = "kernel/" + m.kernels[ti.args[2]].name;
            } else if (!Pipelines::exists(base.pipeline)) {
                return BLUE_ERROR("block '%s': no GPU kernel for %s with these operand types",
                                  m.blocks[b].name.c_str(), std::string(info.name).c_str());
            } else if (kernels.split_matmul && Pipelines::exists(base.pipeline + "_w")) {
                base.pipeline += "_w";  // GPU shapes: the wide variant of a per-item kernel
            }
            if (std::string limit = kernelLimit(m, ti); !limit.empty()) {
                return BLUE_ERROR("block '%s': %s: %s", m.blocks[b].name.c_str(),
                                  std::string(info.name).c_str(), limit.c_str());
            }
            const TensorDecl& dst = m.tensors[ti.args[0]];
            // Narrow workgroups where the device pays for idle lanes (sampleWidth); RMSNORM a lane per item.
            uint32_t width = 0;
            if (ti.op == Op::SAMPLE || ti.op == Op::SAMPLEG || ti.op == Op::SAMPLEQ) {
                const uint32_t w = sampleWidth(kernels.loop_limit, uint32_t(dst.ne[0]), kernels.sample_history);
                if (w != 256) width = w;
            } else if (ti.op == Op::RMSNORM && base.pipeline == "rmsnorm") {
                base.tile = BLUE_RMS_ITEMS;  // a lane per item (shaders/rmsnorm.comp)
            }
            if (width != 0) base.pipeline += "@" + std::to_string(width);
            base.mode = dst.cls == BLUE_TC_ROWS ? 0 : 1;
            base.push[BLUE_PC_BLOCK] = b;
            base.push[BLUE_PC_MODE] = base.mode;
            uint32_t word = BLUE_PC_OPERANDS;
            base.operand_pages.fill(DispatchDesc::kNoPage);
            for (size_t i = 0; i < ti.args.size(); ++i) {
                char letter = info.format[i];
                bool tensor = (letter == 't' || letter == 'o') && ti.args[i] != 0xFFFFFFFFu;
                if (tensor && i < BLUE_MAX_TEX_OPERANDS)
                    base.operand_pages[i] = pages.places[ti.args[i]].page;
                if (letter == 'o' && ti.args[i] == 0xFFFFFFFFu) {
                    base.push[word++] = 0xFFFFFFFFu;  // no tensor: page 0xFFFF
                    word += BLUE_TREF_WORDS - 1;
                    continue;
                }
                if (letter != 't' && letter != 'o') {
                    base.push[word++] = ti.args[i];
                    continue;
                }
                const TensorDecl& t = m.tensors[ti.args[i]];
                const TensorPlace& p = pages.places[ti.args[i]];
                if (i == 1 && p.repacked && !p.expert &&
                    (isMatmul(ti.op) || ti.op == Op::EMBED || ti.op == Op::MOEMM)) {
                    base.weight_page = p.page;
                    base.weight_offset = p.offset;
                    base.weight_bytes = p.bytes;
                }
                base.push[word++] = p.page | t.cls << 16;
                base.push[word++] = uint32_t(p.offset);
                base.push[word++] = uint32_t(p.slice);
                base.push[word++] = uint32_t(t.elements());
            }
            if (ti.op == Op::EMBED) {
                base.push[BLUE_PC_EMBED_BASE] = 0;
                base.push[BLUE_PC_EMBED_LAST] = 1;
            }
            if (ti.op == Op::MATMULADD) base.push[BLUE_PC_MM_EPILOGUE] = BLUE_MM_ADD;
            if (ti.op == Op::MATMULGLU) base.push[BLUE_PC_MM_EPILOGUE] = ti.args[3] == BLUE_GLU_GELU ? BLUE_MM_GELU : BLUE_MM_SILU;
            if (ti.op == Op::KVCOPY) {
                base.push[BLUE_PC_KV_ROW_WORDS] = uint32_t(*dtypeRowBytes(dst.dtype, dst.ne[0]) / 4);
                base.push[BLUE_PC_KV_CTX] = uint32_t(dst.ne[1]);
            }
            // ELEM grids size x by the destination's elements; the paged copies' destination is a
            // whole pool, so they take one page (PGCOPY) or a store slot (KVCOPYP) of words.
            uint64_t elem_count = dst.elements();
            if (ti.op == Op::KVSTORE || ti.op == Op::KVSTOREP) {
                // kvstore.comp: BLUE_KV_WORDS cache words per invocation (F16: two halves a word).
                const uint64_t words = m.tensors[ti.args[1]].dtype == DType::F16 ? dst.elements() / 2 : dst.elements();
                elem_count = (words + BLUE_KV_WORDS - 1) / BLUE_KV_WORDS;
            }
            if (ti.op == Op::ROPE || ti.op == Op::ROPEQK) {
                // rope.comp: an invocation per frequency (head / 2) per chunk of BLUE_ROPE_HEADS
                // heads (ROPEQK: q's, then k's), so the angle is computed once per chunk.
                const uint64_t head = ti.args[4];
                uint64_t heads = dst.elements() / head;
                if (ti.op == Op::ROPEQK) heads += m.tensors[ti.args[1]].elements() / head;
                elem_count = head / 2 * ((heads + BLUE_ROPE_HEADS - 1) / BLUE_ROPE_HEADS);
            }
            if (const TensorDecl* pool = kvPool(m, ti)) {
                const uint32_t row_words = uint32_t(*dtypeRowBytes(pool->dtype, pool->ne[0]) / 4);
                base.push[BLUE_PC_KVP_PAGE] = uint32_t(pool->ne[1]);
                base.push[BLUE_PC_KVP_PAGES] = uint32_t(pool->ne[2]);
                if (ti.op == Op::PGCOPY) {
                    base.push[BLUE_PC_KV_ROW_WORDS] = row_words;
                    elem_count = uint64_t(row_words) * pool->ne[1];
                } else if (ti.op == Op::KVCOPYP) {
                    const uint64_t ctx = m.tensors[ti.args[1]].ne[1];
                    base.push[BLUE_PC_KV_ROW_WORDS] = row_words;
                    base.push[BLUE_PC_KV_CTX] = uint32_t(ctx);
                    elem_count = uint64_t(row_words) * ctx;
                }
            }
            // ROPEQK with the KVSTORE after it: one dispatch (rope.comp ROPE_KV), its words after
            // ROPEQK's the caches' references and v's page and offset; the store folds.
            const std::string rope_kv =
                kernels.fuse && at + 1 < instrs.size() ? ropeKvKernel(m, pages, ti, instrs[at + 1]) : "";
            if (!rope_kv.empty()) {
                const TensorInstr& store = instrs[at + 1];
                folded[at + 1] = 1;
                base.pipeline = rope_kv;
                for (const auto& [at_word, operand] : {std::pair{BLUE_PC_ROPEKV_KC, 1}, std::pair{BLUE_PC_ROPEKV_VC, 3}}) {
                    const uint32_t t = store.args[size_t(operand)];
                    base.push[at_word] = pages.places[t].page | m.tensors[t].cls << 16;
                    base.push[at_word + 1] = uint32_t(pages.places[t].offset);
                    base.push[at_word + 2] = uint32_t(pages.places[t].slice);
                    base.push[at_word + 3] = uint32_t(m.tensors[t].elements());
                }
                const uint32_t v = store.args[2];
                base.push[BLUE_PC_ROPEKV_V] = pages.places[v].page | m.tensors[v].cls << 16;
                base.push[BLUE_PC_ROPEKV_V + 1] = uint32_t(pages.places[v].offset);
                // After the rotations' invocations (elem_count, above; half as many with neox pairs
                // into F16 caches: two frequencies each), one per BLUE_KV_WORDS of v.
                const bool f16 = m.tensors[store.args[1]].dtype == DType::F16;
                if (f16 && ti.args[6] != 0) elem_count /= 2;
                const uint64_t words = f16 ? m.tensors[v].elements() / 2 : m.tensors[v].elements();
                elem_count += (words + BLUE_KV_WORDS - 1) / BLUE_KV_WORDS;
            }
            if (auto it = stacked.find(at); it != stacked.end()) {
                // The stack: its matrices as one [K, rows] matrix, its destinations as one row
                // (the first member's view starts it; planPages gave every member its stride).
                const MatmulGroup& g = *it->second;
                uint64_t rows = 0, bytes = 0;
                for (uint32_t t : g.weights) {
                    rows += m.tensors[t].ne[1];
                    bytes += pages.places[t].bytes;
                }
                const uint32_t wat = BLUE_PC_OPERANDS + BLUE_TREF_WORDS;
                base.push[wat + 2] = uint32_t(bytes);
                base.push[wat + 3] = uint32_t(m.tensors[ti.args[1]].ne[0] * rows);
                base.weight_bytes = bytes;
                base.push[BLUE_PC_OPERANDS + 3] = uint32_t(rows);
                elem_count = rows;
            }
            // The rest of the plan for one dispatch over `n` destination elements.
            auto emit = [&](DispatchDesc d, uint64_t n) -> Status {
                switch (info.grid) {
                    case Grid::ELEM:
                        d.fixed = uint32_t((n + BLUE_ELEM_WG - 1) / BLUE_ELEM_WG);
                        // A small model's ROPE or KV store needs a few lanes an item (stories260K:
                        // 8 and 2): several items share a workgroup, each on a power of two of its
                        // lanes (common/tensor.glsl elemItem), where one each left most lanes
                        // idle and lavapipe pays per workgroup.
                        if ((ti.op == Op::ROPE || ti.op == Op::ROPEQK || ti.op == Op::KVSTORE ||
                             ti.op == Op::KVSTOREP) && n <= BLUE_ELEM_WG / 2) {
                            uint32_t lanes = 1;
                            while (lanes < n) lanes <<= 1;
                            d.tile = BLUE_ELEM_WG / lanes;
                            d.push[BLUE_PC_TILE] = d.tile;
                        }
                        break;
                    case Grid::MATMUL: {
                        uint32_t rows =
                            BLUE_MATMUL_WG * matmulRowsPerInvocation(m.tensors[ti.args[1]].dtype);
                        d.fixed = uint32_t((n + rows - 1) / rows);
                        d.axis = 1;
                        break;
                    }
                    case Grid::HEADS: {
                        size_t first_u = info.format.find('u');
                        uint32_t heads = first_u == std::string_view::npos ? 1 : ti.args[first_u];
                        d.fixed = (heads + BLUE_ATTN_WG - 1) / BLUE_ATTN_WG;
                        bool split = kernels.split_attn;
                        if (kernels.loop_limit != 0) {
                            // A driver that ends an invocation's loops after a number of
                            // iterations (lavapipe): the lane-per-head kernel only while one
                            // lane's walk over the whole context stays under it.
                            // A margin of 64: measured counts ran up to 4 above attnLoops'.
                            const AttnLoops loops = attnLoops(m, ti, heads);
                            const uint64_t budget = kernels.loop_limit - 64;
                            if (loops.lanes > budget) split = true;
                            if (split && loops.split > budget) {
                                return BLUE_ERROR(
                                    "block '%s': %s over %llu positions of head size %llu needs %llu loop "
                                    "iterations in one invocation, which this device would cut short (%s): "
                                    "use a shorter context",
                                    m.blocks[b].name.c_str(), std::string(info.name).c_str(),
                                    (unsigned long long)loops.positions, (unsigned long long)loops.head,
                                    (unsigned long long)loops.split, loopLimitReason(kernels.loop_limit).c_str());
                            }
                        }
                        if (split && Pipelines::exists(d.pipeline + "_split")) {
                            d.pipeline += "_split";
                            d.fixed = heads;  // a workgroup per head
                        }
                        // On a CPU driver, specialized for the head's size (shaders/attn.comp
                        // HEAD_QUADS). GPUs keep the general kernel: not measured there, where a
                        // lane's o[] would take up to 256 registers.
                        const uint64_t head = dst.elements() / std::max<uint32_t>(heads, 1);
                        if (kernels.loop_limit != 0 && head % 4 == 0 && head != 0 && head <= BLUE_ATTN_MAX_HEAD) {
                            d.pipeline += "#" + std::to_string(head / 4);
                        }
                        break;
                    }
                    case Grid::ONE:  // one workgroup for the whole run
                        d.fixed = 1;
                        d.tile = BLUE_MAX_ROWS;
                        break;
                    case Grid::MOE: {
                        const TensorDecl& w = m.tensors[ti.args[1]];
                        uint32_t rows = BLUE_MATMUL_WG * moeRowsPerInvocation(w.dtype);
                        d.fixed = uint32_t((w.ne[1] + rows - 1) / rows);
                        d.axis = 1;
                        d.push[BLUE_PC_MOE_SHAPE] = uint32_t(w.ne[0]);
                        d.push[BLUE_PC_MOE_SHAPE + 1] = uint32_t(w.ne[1]);
                        d.push[BLUE_PC_MOE_SHAPE + 2] = uint32_t(w.ne[2]);
                        d.push[BLUE_PC_MOE_SHAPE + 3] = uint32_t(dst.elements() / w.ne[1]);
                        break;
                    }
                    default:
                        d.fixed = 1;
                        break;
                }
                // The fixed axis is x, except for MATMUL (rows along y, items along x).
                const uint32_t max_fixed = d.axis == 0 ? max_groups_x : kMinGroupsY;
                if (d.fixed > max_fixed) {
                    return BLUE_ERROR(
                        "block '%s': %s on tensor '%s' needs %u workgroups%s, the device "
                        "allows %u",
                        m.blocks[b].name.c_str(), std::string(info.name).c_str(), dst.name.c_str(),
                        d.fixed, d.axis == 0 ? "" : " along y", max_fixed);
                }
                if (info.grid == Grid::MATMUL) {
                    // One item (decode of one instance): the single-item kernel; more: tiles of 4;
                    // many (a prompt, a large batch): a GEMM. On a GPU (split_matmul) the single
                    // item and the 4-item tile split K and the GEMM is the shared-memory tiled
                    // `_t`; on a CPU driver it is the lanes-over-items `_i` (block types) or the
                    // register-tiled `_g` (F32, F16, BF16). With int8_matmul, block types take
                    // the int8 tiled `_tq` on a GPU; on a CPU driver Q4_0, Q4_K, Q5_K and Q6_K the int8 lanes
                    // over items `_iq` after PACKX (integer SWAR: lavapipe has no fast dot
                    // product), the other types `_i`.
                    const uint32_t r = matmulRowsPerInvocation(m.tensors[ti.args[1]].dtype);
                    const uint32_t g = kernels.gemm_min_items, gi = itemsGemmMinItems(kernels);
                    const uint64_t k = m.tensors[ti.args[1]].ne[0];
                    const PackedX& px = pages.packed_x;
                    const std::string kernel = d.pipeline;
                    // The int8 kernels of CPU drivers (`_b1q`, `_q` and `_iq`, built together
                    // for their types: shaders/CMakeLists.txt) read x packed by a PACKX before
                    // them, one per x while MATMULs share it, in every cycle.
                    const bool packed = kernels.int8_matmul && !kernels.split_matmul && px.item_bytes != 0 &&
                                        k <= px.k && Pipelines::exists(kernel + "_iq");
                    if (packed) {
                        d.push[BLUE_PC_MM_XQ] = px.page | BLUE_TC_GLOBAL << 16;
                        d.push[BLUE_PC_MM_XQ + 1] = uint32_t(px.offset);
                        d.push[BLUE_PC_MM_XQ + 2] = uint32_t(px.item_bytes);
                        d.push[BLUE_PC_MM_XQ + 3] = uint32_t(k);
                        d.operand_pages[BLUE_MM_XQ_OPERAND] = px.page;
                        if (packed_tensor != ti.args[2] || packed_mode != d.mode) {
                            out.push_back(packxDispatch(d));
                            packed_tensor = ti.args[2];
                            packed_mode = d.mode;
                        }
                    }
                    DispatchDesc single = singleItemDispatch(d, packed ? "_b1q" : "_b1");
                    if (kernels.split_matmul) splitMatmul(&single, n, "s"); else narrowMatmul(&single, n, r);
                    out.push_back(single);
                    d.min_items = 2;
                    d.tile = BLUE_MATMUL_TILE;
                    std::optional<DispatchDesc> gemm;
                    if (packed) {
                        gemm = rowGroupsGemm(d, n, gi, "_iq", BLUE_MATMUL_ITEMS_ROWS, kItemsGemmTile);
                    }
                    // On a GPU the int8 tiles for every block type; a CPU driver keeps the
                    // float `_i` for the types without a SWAR kernel (`_tq` ran at 0.37x of it).
                    if (kernels.int8_matmul && kernels.split_matmul && !gemm) {
                        gemm = rowGroupsGemm(d, n, g, "_tq", BLUE_MATMUL_TILED_ROWS, BLUE_MATMUL_TILED_ITEMS);
                    }
                    if (!gemm) gemm =
                        kernels.split_matmul
                            ? rowGroupsGemm(d, n, g, "_t", BLUE_MATMUL_TILED_ROWS, BLUE_MATMUL_TILED_ITEMS)
                            : rowGroupsGemm(d, n, gi, "_i", BLUE_MATMUL_ITEMS_ROWS, kItemsGemmTile);
                    if (!gemm && !kernels.split_matmul) gemm = gemmDispatch(d, n, g);
                    if (packed) d.pipeline += "_q";
                    if (kernels.split_matmul) splitMatmul(&d, n, "_s"); else narrowMatmul(&d, n, r);
                    if (gemm) {
                        d.max_items = gemm->min_items - 1;
                        d.push[BLUE_PC_TILE] = d.tile;
                        out.push_back(d);
                        d = *gemm;
                    }
                }
                if (info.grid == Grid::MOE) {
                    // A single-row run gets tiles of one pair, more rows tiles of BLUE_MOE_TILE_ROWS
                    // (MOEROUTE makes the tiles by the same rule). The MOEROUTE that fills the map
                    // writes both variants' items axis, and counts the bytes their experts read.
                    auto route = routes.find(ti.args[3]);
                    if (route == routes.end()) {
                        return BLUE_ERROR("block '%s': MOEMM reads the expert map '%s', which no MOEROUTE "
                                          "before it in the block fills",
                                          m.blocks[b].name.c_str(), m.tensors[ti.args[3]].name.c_str());
                    }
                    const auto cache_of = route_caches.find(ti.args[3]);
                    if (const ExpertCache* xc = cache_of == route_caches.end() ? nullptr : cache_of->second) {
                        // Cached experts: the `moemmc` kernels read a tile's matrix from the
                        // cache when MOEROUTE put its expert there this run, else in place.
                        const auto it = std::find(xc->tensors.begin(), xc->tensors.end(), ti.args[1]);
                        if (it != xc->tensors.end()) {
                            const TensorPlace& cp = xc->caches[size_t(it - xc->tensors.begin())];
                            d.pipeline = "moemmc" + d.pipeline.substr(std::string("moemm").size());
                            d.push[BLUE_PC_MOE_CACHE_REF] = cp.page | BLUE_TC_WEIGHT << 16;
                            d.push[BLUE_PC_MOE_CACHE_REF + 1] = uint32_t(cp.offset);
                            d.push[BLUE_PC_MOE_CACHE_REF + 2] = uint32_t(cp.slice);
                            d.push[BLUE_PC_MOE_CACHE_REF + 3] = xc->slots;
                            d.operand_pages[BLUE_MOE_CACHE_OPERAND] = cp.page;
                        }
                    }
                    const DispatchDesc single = singleItemDispatch(d);
                    d.min_items = 2;
                    d.tile = BLUE_MOE_TILE_ROWS;
                    std::array<uint32_t, BLUE_PUSH_WORDS>& rp = out[route->second].push;
                    for (uint32_t index : {uint32_t(out.size()), uint32_t(out.size() + 1)}) {
                        if (rp[BLUE_PC_MOE_PATCH] == BLUE_MOE_MAX_PATCH) {
                            return BLUE_ERROR("block '%s': more than %u MOEMM dispatches read the expert map '%s'",
                                              m.blocks[b].name.c_str(), BLUE_MOE_MAX_PATCH / 2,
                                              m.tensors[ti.args[3]].name.c_str());
                        }
                        rp[BLUE_PC_MOE_PATCH + 1 + rp[BLUE_PC_MOE_PATCH]++] = index;
                    }
                    rp[BLUE_PC_MOE_TEXELS] += uint32_t(pages.places[ti.args[1]].slice / 16);
                    out.push_back(single);
                }
                const ExpertCache* xc = nullptr;
                if (ti.op == Op::MOEROUTE) {
                    xc = pages.expertCacheOf(route_ordinal++);
                    route_caches[ti.args[2]] = xc;
                    routes[ti.args[2]] = out.size();
                    if (xc) d.push[BLUE_PC_MOE_CACHE] = xc->state + 1;
                }
                d.push[BLUE_PC_TILE] = d.tile;
                out.push_back(d);
                if (xc) BLUE_TRY(addExpertCopies(m, pages, *xc, b, out.size() - 1, &out));
                return Status::ok();
            };
            // A matrix split by rows (planPages): one dispatch per piece, each reading its own
            // page and writing its rows of the destination (MATMUL) or the tokens in its rows
            // (EMBED). No other op reads a split tensor.
            for (size_t i = 0; i < ti.args.size(); ++i) {
                char letter = info.format[i];
                if ((letter != 't' && letter != 'o') || ti.args[i] == 0xFFFFFFFFu) continue;
                const TensorPlace& p = pages.places[ti.args[i]];
                if (p.pieces.empty() || ((isMatmul(ti.op) || ti.op == Op::EMBED) && i == 1))
                    continue;
                return BLUE_ERROR(
                    "block '%s': %s reads tensor '%s', which is split by rows over %zu pages (it "
                    "is larger than the device's largest storage binding); only MATMUL and EMBED "
                    "read split matrices",
                    m.blocks[b].name.c_str(), std::string(info.name).c_str(),
                    m.tensors[ti.args[i]].name.c_str(), p.pieces.size());
            }
            const TensorPlace& wp = pages.places[ti.args.size() > 1 ? ti.args[1] : 0];
            if ((isMatmul(ti.op) || ti.op == Op::EMBED) && !wp.pieces.empty()) {
                const TensorDecl& w = m.tensors[ti.args[1]];
                for (size_t k = 0; k < wp.pieces.size(); ++k) {
                    const TensorPiece& piece = wp.pieces[k];
                    DispatchDesc part = base;
                    const uint32_t wat = BLUE_PC_OPERANDS + BLUE_TREF_WORDS;
                    part.push[wat] = piece.page | w.cls << 16;
                    part.push[wat + 1] = uint32_t(piece.offset);
                    part.push[wat + 2] = uint32_t(piece.bytes);
                    part.push[wat + 3] = uint32_t(w.ne[0] * piece.rows);
                    part.operand_pages[1] = piece.page;
                    part.weight_page = piece.page;
                    part.weight_offset = piece.offset;
                    part.weight_bytes = piece.bytes;
                    uint64_t n = dst.elements();
                    if (isMatmul(ti.op)) {  // rows [row_begin, +rows) of every item's output
                        part.push[BLUE_PC_OPERANDS + 1] += piece.row_begin * 4;
                        part.push[BLUE_PC_OPERANDS + 3] = piece.rows;
                        n = piece.rows;
                    } else {
                        part.push[BLUE_PC_EMBED_BASE] = piece.row_begin;
                        part.push[BLUE_PC_EMBED_LAST] = k + 1 == wp.pieces.size();
                    }
                    BLUE_TRY(emit(part, n));
                }
                continue;
            }
            BLUE_TRY(emit(base, elem_count));
        }
    }
    return out;
}

}  // namespace blue
