// Paged KV caches in the generation program (LowerOptions::kv_page; /work/paged_kv_plan.md,
// commit 4: pages without prefix sharing). Each layer's K and V rows live in GLOBAL pools
// kpool.L / vpool.L [kv_dim, PS, NP] that all instances share; an instance reads and writes them
// through its page table (ceil(ctx / PS) page ids in its local memory, pageTableAddr). The page
// state is in the heap (vm/kv_pages_abi.h). All of it is decided on the GPU, by the program:
//   - admission: a request reserves the pages its worst case needs, ceil(min(ctx, prompt +
//     max_new) / PS), with one ATOMADD on `committed`; when the pool cannot hold them now it
//     gives them back, yields and tries again next cycle (or ends, when cancelled meanwhile).
//     An admitted request never runs out of pages, so its ids never depend on the pool's size:
//     a small pool only makes requests wait.
//   - allocation, before each RUN that writes positions past the pages held: a clock sweep over
//     the page states (ATOMADD on the hand, ATOMCAS 0 -> 1), at most BLUE_KVP_PROBES probes a
//     cycle. Since committed <= NP counts every page held plus every page still to take, a free
//     page exists whenever an instance needs one.
//   - release, at finish, reject or cancel: every page held goes back (its table entry unmapped)
//     and the unused reservation is refunded.
// No prefix reuse yet: an instance's rows are released with its request.
#include <bit>

#include "compiler/lower_model_internal.h"

namespace blue::lower_model {

// The paged part of a layer's attention: K and V rows into the pools (KVSTOREP) and attention
// over them (ATTNP: ATTNX's semantics, so plain ATTN is window 0, softcap 0), both through the
// instance's page table.
void Lowering::pagedCaches(CodeBuilder& cb, uint32_t l, uint32_t ctx,
                           const std::map<std::string, uint32_t>& a, uint32_t qscale,
                           uint32_t window, uint32_t softcap) {
    const uint32_t kv_dim = cfg.n_head_kv * cfg.head_dim;
    const std::string ln = std::to_string(l);
    const uint32_t kp =
        activation("kpool." + ln, BLUE_TC_GLOBAL, kv_type, {kv_dim, kv_page, kv_pages});
    const uint32_t vp =
        activation("vpool." + ln, BLUE_TC_GLOBAL, kv_type, {kv_dim, kv_page, kv_pages});
    const uint32_t tab = pageTableAddr(ctx), n = (ctx + kv_page - 1) / kv_page;
    cb.tensor(Op::KVSTOREP, {a.at("k"), kp, a.at("v"), vp, BLUE_FA_POS, tab, n});
    cb.tensor(Op::ATTNP, {a.at("att"), kp, vp, a.at("q"), cfg.n_head, cfg.n_head_kv, BLUE_FA_POS,
                          qscale, window, softcap, tab, n});
}

// After the prompt's checks (kTmp = prompt length): the request's reservation, kLeft pages,
// admitted once the pool holds them. A restored conversation (start > 0: rows the host wrote
// into per-instance caches) is rejected: paged snapshots come later (plan commit 8).
void Lowering::admitPages(CodeBuilder& cb, const GenLabels& g) {
    auto admit = cb.newLabel("kv_admit"), admitted = cb.newLabel("kv_admitted");
    auto wait = cb.newLabel("kv_admit_wait");
    cb.jump(Op::BNEZ, {kStart}, g.reject);
    cb.op(Op::MINU, {kLeft, kMaxNew, kCtx});  // positions it may write: min(ctx, prompt + max_new)
    cb.op(Op::ADD, {kLeft, kLeft, kTmp});
    cb.op(Op::MINU, {kLeft, kLeft, kCtx});
    cb.op(Op::ADDI, {kLeft, kLeft}, kv_page - 1);
    cb.op(Op::SHRLI, {kLeft, kLeft}, uint32_t(std::countr_zero(kv_page)));
    cb.bind(admit);
    cb.li(kAddr, kv_heap + BLUE_KVP_COMMITTED);
    cb.op(Op::ATOMADD, {kOld, kAddr, kLeft});
    cb.op(Op::ADD, {kOld, kOld, kLeft});
    cb.li(kProbe, kv_pages);
    cb.jump(Op::BGEU, {kProbe, kOld}, admitted);
    cb.op(Op::SUB, {kOld, 0, kLeft});  // the pool is short now: give them back and try next cycle
    cb.op(Op::ATOMADD, {kPage, kAddr, kOld});
    cb.op(Op::INFLAG, {kFlagWord, kIid});  // cancelled while waiting: it ends, holding nothing
    cb.jump(Op::BNE, {kFlagWord, kCancelMark}, wait);
    cb.li(kLeft, 0);
    cb.jump(Op::JMP, {}, g.reject);
    cb.bind(wait);
    cb.op(Op::YIELD, {});
    cb.jump(Op::JMP, {}, admit);
    cb.bind(admitted);
}

// Before a RUN that advanced kPos: pages for every position below kPos, taken from the pool by
// the clock sweep into the page table.
void Lowering::ensurePages(CodeBuilder& cb, uint32_t ctx, const GenLabels& g) {
    auto more = cb.newLabel("kv_ensure"), probe = cb.newLabel("kv_probe"),
         sweep = cb.newLabel("kv_sweep");
    auto done = cb.newLabel("kv_ensured");
    cb.bind(more);
    cb.op(Op::SHLI, {kOld, kHeld}, uint32_t(std::countr_zero(kv_page)));
    cb.jump(Op::BGEU, {kOld, kPos}, done);
    cb.jump(Op::BEQZ, {kLeft},
            g.finish);  // never: admission reserved every page the request writes
    cb.li(kProbe, BLUE_KVP_PROBES);
    cb.bind(probe);
    cb.jump(Op::BNEZ, {kProbe}, sweep);
    cb.op(Op::YIELD, {});  // the sweep goes on next cycle
    cb.li(kProbe, BLUE_KVP_PROBES);
    cb.bind(sweep);
    cb.op(Op::ADDI, {kProbe, kProbe}, uint32_t(-1));
    cb.li(kAddr, kv_heap + BLUE_KVP_CLOCK);
    cb.op(Op::ATOMADD, {kPage, kAddr, kOne});
    cb.li(kOld, kv_pages);
    cb.op(Op::REMU, {kPage, kPage, kOld});
    cb.op(Op::ADDI, {kAddr, kPage}, kv_heap + BLUE_KVP_STATE);
    cb.li(kOld, 0);
    cb.op(Op::ATOMCAS, {kOld, kAddr, kOne});  // free -> held
    cb.jump(Op::BNEZ, {kOld}, probe);
    cb.op(Op::ST, {kPage, kHeld}, pageTableAddr(ctx));
    cb.op(Op::ADDI, {kHeld, kHeld}, 1);
    cb.op(Op::ADDI, {kLeft, kLeft}, uint32_t(-1));
    cb.li(kAddr, kv_heap + BLUE_KVP_IN_USE);
    cb.op(Op::ATOMADD, {kOld, kAddr, kOne});
    cb.op(Op::ADDI, {kOld, kOld}, 1);
    cb.li(kAddr, kv_heap + BLUE_KVP_PEAK);
    cb.op(Op::ATOMMAXS, {kPage, kAddr, kOld});
    cb.jump(Op::JMP, {}, more);
    cb.bind(done);
}

// At a request's end (finish, reject, cancel): in_use drops by the pages held (first, so it is
// never above what instances hold), every page goes back to the pool with its table entry
// unmapped, then committed drops by those pages and the reservation not taken (last, so
// admission never counts a page free before it is).
void Lowering::releasePages(CodeBuilder& cb, uint32_t ctx) {
    auto next = cb.newLabel("kv_release"), released = cb.newLabel("kv_released");
    cb.op(Op::MOV, {kProbe, kHeld});
    cb.op(Op::SUB, {kOld, 0, kProbe});
    cb.li(kAddr, kv_heap + BLUE_KVP_IN_USE);
    cb.op(Op::ATOMADD, {kPage, kAddr, kOld});
    cb.bind(next);
    cb.jump(Op::BEQZ, {kHeld}, released);
    cb.op(Op::ADDI, {kHeld, kHeld}, uint32_t(-1));
    cb.op(Op::LD, {kPage, kHeld}, pageTableAddr(ctx));
    cb.op(Op::ST, {kMinus1, kHeld}, pageTableAddr(ctx));
    cb.op(Op::ADDI, {kAddr, kPage}, kv_heap + BLUE_KVP_STATE);
    cb.op(Op::ATOMXCHG, {kOld, kAddr, 0});  // held -> free
    cb.jump(Op::JMP, {}, next);
    cb.bind(released);
    cb.op(Op::SUB, {kOld, 0, kProbe});
    cb.op(Op::SUB, {kOld, kOld, kLeft});
    cb.li(kAddr, kv_heap + BLUE_KVP_COMMITTED);
    cb.op(Op::ATOMADD, {kPage, kAddr, kOld});
    cb.li(kLeft, 0);
}

}  // namespace blue::lower_model
