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
//   - the prefix index (sharePrefix): a request's full prompt pages are looked up by key
//     (parent page, its generation, PS tokens) in an open-addressed table in the heap, and the
//     pages found are mapped into its table instead of computed; the pages it computes are
//     published there as pending, and marked ready once their rows are written. A released page
//     that is indexed stays cached with its rows until the sweep takes it for other rows
//     (eviction, with a second chance for pages taken since the sweep last passed).
// Ordering rests on two rules: a page's key and rows are written at least one cycle before it is
// marked ready (plain stores show from the next cycle), and a page is held (its refcount raised
// by a compare-and-swap) before its key is checked, so the key cannot change under the check.
// Relaxed atomics can at worst make two requests compute the same page, never share wrong rows.
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

namespace {

constexpr uint32_t kCached = BLUE_KVP_INDEXED | BLUE_KVP_READY;  // an indexed page nobody holds
constexpr uint32_t kGolden = 0x9E3779B1u;  // spreads a key hash over the buckets (Fibonacci hashing)

uint32_t log2u(uint32_t v) { return uint32_t(std::countr_zero(v)); }

}  // namespace

// After the prompt's checks (kTmp = start + prompt length): the request's reservation, kLeft
// pages, admitted once the pool holds them. A restored conversation (start > 0: the host wrote
// its rows into pages 0..n-1 and mapped them in the page table, n = ceil(start / PS)) then
// takes those pages (free -> held; any other state rejects it, so only a fresh machine's first
// request restores), out of its reservation.
void Lowering::admitPages(CodeBuilder& cb, uint32_t ctx, const GenLabels& g) {
    auto admit = cb.newLabel("kv_admit"), admitted = cb.newLabel("kv_admitted");
    auto wait = cb.newLabel("kv_admit_wait"), adopted = cb.newLabel("kv_adopted");
    cb.op(Op::MINU, {kLeft, kMaxNew, kCtx});  // positions it may write: min(ctx, prompt + max_new)
    cb.op(Op::ADD, {kLeft, kLeft, kTmp});
    cb.op(Op::MINU, {kLeft, kLeft, kCtx});
    cb.op(Op::ADDI, {kLeft, kLeft}, kv_page - 1);
    cb.op(Op::SHRLI, {kLeft, kLeft}, log2u(kv_page));
    cb.bind(admit);
    cb.li(kAddr, kvArray(BLUE_KVP_COMMITTED));
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
    cb.bind(admitted);  // and on for each restored page
    cb.op(Op::SHLI, {kOld, kHeld}, log2u(kv_page));
    cb.jump(Op::BGEU, {kOld, kStart}, adopted);
    cb.op(Op::LD, {kPage, kHeld}, pageTableAddr(ctx));
    cb.li(kOld, kv_pages);
    cb.jump(Op::BGEU, {kPage, kOld}, g.reject);
    cb.op(Op::ADDI, {kAddr, kPage}, kvArray(BLUE_KVP_STATE(kv_pages)));
    cb.li(kWord, 0);
    cb.op(Op::ATOMCAS, {kWord, kAddr, kOne});
    cb.jump(Op::BNEZ, {kWord}, g.reject);  // not free: released at reject with those before it
    pageTaken(cb, ctx, false);
    cb.jump(Op::JMP, {}, admitted);
    cb.bind(adopted);
}

namespace {

// HASHL, HCMPL or HCPYL over one page of tokens, 8 words a step: `local` (a register, advanced)
// holds the tokens' local address; for HASHL `acc` is the hash, for HCPYL the heap address
// (advanced too); HCMPL jumps to `differ` at the first step that finds a difference.
void pageWalk(CodeBuilder& cb, Op op, uint32_t page, uint8_t acc, uint8_t local, uint8_t scratch,
              CodeBuilder::Label differ) {
    for (uint32_t w = 0; w < page; w += BLUE_MAX_WALK) {
        if (op == Op::HCMPL) {
            cb.op(Op::MOV, {scratch, acc});
            cb.op(Op::HCMPL, {scratch, local, kEight});
            cb.jump(Op::BNE, {scratch, kEight}, differ);
        } else {
            cb.op(op, {acc, local, kEight});
        }
        if (w + BLUE_MAX_WALK < page) {
            cb.op(Op::ADDI, {local, local}, BLUE_MAX_WALK);
            if (op != Op::HASHL) cb.op(Op::ADDI, {acc, acc}, BLUE_MAX_WALK);
        }
    }
}

// dst = the local address of page `index`'s tokens in the history.
void pageTokens(CodeBuilder& cb, uint8_t dst, uint8_t index, uint32_t page) {
    cb.op(Op::SHLI, {dst, index}, log2u(page));
    cb.op(Op::ADDI, {dst, dst}, BLUE_LM_HISTORY);
}

// The probe sequence of the prefix index, one for lookups and inserts (an insert must walk the
// entries a lookup of its key walks): from the first bucket of the key hash in `hash`, at most
// BLUE_KVP_TABLE_PROBES entries, one after another (kB the bucket, kProbe the entries left).
void firstEntry(CodeBuilder& cb, uint8_t hash, uint32_t buckets) {
    cb.op(Op::MULI, {kB, hash}, kGolden);
    cb.op(Op::SHRLI, {kB, kB}, 32 - log2u(buckets));
    cb.li(kProbe, BLUE_KVP_TABLE_PROBES);
}
// Entry kB into kWord (an atomic read: entries change within a cycle), its address in kAddr; at
// `exhausted` once every entry of the sequence was read.
void readEntry(CodeBuilder& cb, uint32_t table, CodeBuilder::Label exhausted) {
    cb.jump(Op::BEQZ, {kProbe}, exhausted);
    cb.op(Op::ADDI, {kProbe, kProbe}, uint32_t(-1));
    cb.op(Op::ADDI, {kAddr, kB}, table);
    cb.op(Op::ATOMADD, {kWord, kAddr, 0});
}
void nextEntry(CodeBuilder& cb, uint32_t buckets) {
    cb.op(Op::ADDI, {kB, kB}, 1);
    cb.op(Op::ANDI, {kB, kB}, buckets - 1);
}

}  // namespace

// The paged program's prefix reuse, after admission. The prompt goes into the history first
// (its tokens are the keys). Then, page by page over the prompt's full pages before its last
// token (that one is always computed: its logits give the first sample):
//   - lookup: the key's hash picks a bucket; the entries from there with the same hash are
//     candidates. A ready candidate is held (compare-and-swap on its state) and its key checked:
//     the same tokens after the same parent page of the same generation. It then goes into the
//     page table; a page nobody held takes one page of the reservation, one others hold gives it
//     back. A pending candidate (another request is computing it) makes the request wait a
//     cycle and look again. An empty entry, or none of the probed, ends the lookup.
//   - publish: the request's remaining full prompt pages are taken from the pool now and
//     indexed as pending, key first. If the first of them finds its key indexed meanwhile by
//     another request, it gives its page back, waits a cycle and looks up again (once per page,
//     so hash collisions cannot loop); an index crowded around a key leaves that page and the
//     rest private.
// kReuse = the positions reused (OUTU when some); kReady..kPubEnd are the pages to mark ready as
// prefill writes them. No sharing for a request that opts out of prefix reuse or an embedding.
void Lowering::sharePrefix(CodeBuilder& cb, uint32_t ctx) {
    const uint32_t ps = kv_page, shift = log2u(kv_page), np = kv_pages;
    const uint32_t buckets = uint32_t(blueKvpBuckets(np)), tab = pageTableAddr(ctx);
    const uint32_t state = kvArray(BLUE_KVP_STATE(np)), gen = kvArray(BLUE_KVP_GEN(np));
    const uint32_t parent = kvArray(BLUE_KVP_PARENT(np)), pgen = kvArray(BLUE_KVP_PGEN(np));
    const uint32_t hash = kvArray(BLUE_KVP_HASH(np));
    const uint32_t tokens = kvArray(BLUE_KVP_TOKENS(np)), table = kvArray(BLUE_KVP_TABLE(np, ps));
    auto lookup = cb.newLabel("kv_lookup"), probe_start = cb.newLabel("kv_lookup_probe_start");
    auto probe = cb.newLabel("kv_lookup_probe"), probe_next = cb.newLabel("kv_lookup_next");
    auto acquire = cb.newLabel("kv_acquire"), ready = cb.newLabel("kv_acquire_ready");
    auto held = cb.newLabel("kv_acquired"), mismatch = cb.newLabel("kv_key_differs");
    auto shared = cb.newLabel("kv_hit_shared"), hit = cb.newLabel("kv_hit");
    auto missed = cb.newLabel("kv_missed"), publish = cb.newLabel("kv_publish");
    auto give_way = cb.newLabel("kv_give_way");
    auto ins_fail = cb.newLabel("kv_insert_failed"), done = cb.newLabel("kv_shared");
    auto reported = cb.newLabel("kv_reuse_reported");

    cb.li(kHist, BLUE_LM_HISTORY);
    cb.li(kReuse, 0);
    cb.li(kJ, 0);
    cb.li(kPubEnd, 0);
    cb.li(kReady, 0);
    cb.li(kParent, BLUE_KVP_ROOT);
    cb.li(kPgen, 0);
    cb.li(kH, BLUE_KVP_HASH_SEED);
    cb.li(kChain, 0);
    if (sessions) storedSession(cb, ctx, done);
    cb.op(Op::ADD, {kPrompt, kHist, kStart});
    cb.op(Op::INCPY, {kPrompt, kSlot, kTmp2});  // kPrompt = prompt length
    cb.op(Op::INFREE, {kSlot});
    cb.jump(Op::BNEZ, {kStart}, done);  // a restored conversation: its own rows, not shared
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_NO_PREFIX);
    cb.jump(Op::BNEZ, {kWord}, done);
    if (embed_block != kNone) cb.jump(Op::BNEZ, {kEmbed}, done);
    cb.op(Op::SHRLI, {kPubEnd, kPrompt}, shift);  // the pages full of prompt tokens
    cb.li(kMayYield, 1);
    cb.li(kChain, 1);

    cb.bind(lookup);
    cb.op(Op::ADDI, {kN, kPrompt}, uint32_t(-1));
    cb.op(Op::SHRLI, {kN, kN}, shift);  // pages before the last prompt token
    cb.jump(Op::BGEU, {kJ, kN}, missed);
    cb.op(Op::MOV, {kHNext, kH});
    pageTokens(cb, kWord, kJ, ps);
    pageWalk(cb, Op::HASHL, ps, kHNext, kWord, kTmp, missed);
    cb.bind(probe_start);
    firstEntry(cb, kHNext, buckets);
    cb.bind(probe);
    readEntry(cb, table, missed);
    cb.jump(Op::BEQZ, {kWord}, missed);
    cb.jump(Op::BEQ, {kWord, kMinus1}, probe_next);
    cb.op(Op::ADDI, {kPage, kWord}, uint32_t(-1));
    cb.op(Op::ADDI, {kAddr, kPage}, hash);
    cb.op(Op::ATOMADD, {kWord, kAddr, 0});
    cb.jump(Op::BNE, {kWord, kHNext}, probe_next);
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.op(Op::ATOMADD, {kS, kAddr, 0});
    cb.bind(acquire);
    cb.op(Op::ANDI, {kWord, kS}, kCached);
    cb.li(kOld, kCached);
    cb.jump(Op::BEQ, {kWord, kOld}, ready);
    cb.op(Op::ANDI, {kWord, kS}, BLUE_KVP_INDEXED);
    cb.jump(Op::BEQZ, {kWord}, probe_next);  // taken for other rows since the entry was read
    cb.op(Op::YIELD, {});                    // pending: its owner writes its rows; look again
    cb.jump(Op::JMP, {}, probe_start);
    cb.bind(ready);
    cb.op(Op::ADDI, {kOld, kS}, 1);
    cb.op(Op::ORI, {kOld, kOld}, BLUE_KVP_RECENT);
    cb.op(Op::MOV, {kWord, kS});
    cb.op(Op::ATOMCAS, {kWord, kAddr, kOld});
    cb.jump(Op::BEQ, {kWord, kS}, held);
    cb.op(Op::MOV, {kS, kWord});  // changed meanwhile: decide again on what it is now
    cb.jump(Op::JMP, {}, acquire);
    cb.bind(held);  // held: its key cannot change now; check it
    cb.op(Op::SHLI, {kOld, kPage}, shift);
    cb.op(Op::ADDI, {kOld, kOld}, tokens);
    pageTokens(cb, kWord, kJ, ps);
    pageWalk(cb, Op::HCMPL, ps, kOld, kWord, kTmp, mismatch);
    cb.op(Op::LDG, {kWord, kPage}, parent);
    cb.jump(Op::BNE, {kWord, kParent}, mismatch);
    cb.op(Op::LDG, {kWord, kPage}, pgen);
    cb.jump(Op::BNE, {kWord, kPgen}, mismatch);
    cb.op(Op::ANDI, {kWord, kS}, BLUE_KVP_REFS);
    cb.jump(Op::BNEZ, {kWord}, shared);
    cb.li(kAddr, kvArray(BLUE_KVP_IN_USE));  // a cached page: held again, from the reservation
    cb.op(Op::ATOMADD, {kOld, kAddr, kOne});
    cb.op(Op::ADDI, {kOld, kOld}, 1);
    cb.li(kAddr, kvArray(BLUE_KVP_PEAK));
    cb.op(Op::ATOMMAXS, {kWord, kAddr, kOld});
    cb.jump(Op::JMP, {}, hit);
    cb.bind(shared);  // others hold it: the reservation's page goes back
    cb.li(kAddr, kvArray(BLUE_KVP_COMMITTED));
    cb.op(Op::ATOMADD, {kWord, kAddr, kMinus1});
    cb.bind(hit);
    cb.op(Op::ADDI, {kLeft, kLeft}, uint32_t(-1));
    cb.op(Op::ST, {kPage, kJ}, tab);
    cb.op(Op::ADDI, {kHeld, kJ}, 1);
    cb.op(Op::MOV, {kParent, kPage});
    cb.op(Op::LDG, {kPgen, kPage}, gen);
    cb.op(Op::MOV, {kH, kHNext});
    cb.op(Op::ADDI, {kJ, kJ}, 1);
    cb.li(kMayYield, 1);
    cb.jump(Op::JMP, {}, lookup);
    cb.bind(mismatch);  // another key of the same hash: give it back, look further
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.op(Op::ATOMADD, {kWord, kAddr, kMinus1});
    cb.bind(probe_next);
    nextEntry(cb, buckets);
    cb.jump(Op::JMP, {}, probe);

    cb.bind(missed);
    cb.op(Op::SHLI, {kReuse, kJ}, shift);
    cb.op(Op::MOV, {kReady, kJ});
    cb.bind(publish);
    cb.jump(Op::BGEU, {kHeld, kPubEnd}, done);
    takePage(cb, ctx);  // kPage, at table entry kHeld - 1
    cb.op(Op::ADDI, {kTmp, kHeld}, uint32_t(-1));
    indexPage(cb, publish, ins_fail, give_way);
    cb.bind(give_way);  // the page back to the pool, unmapped; the reservation has it again
    cb.op(Op::ADDI, {kHeld, kHeld}, uint32_t(-1));
    cb.op(Op::ST, {kMinus1, kHeld}, tab);
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.op(Op::ATOMXCHG, {kWord, kAddr, 0});
    cb.li(kAddr, kvArray(BLUE_KVP_IN_USE));
    cb.op(Op::ATOMADD, {kWord, kAddr, kMinus1});
    cb.op(Op::ADDI, {kLeft, kLeft}, 1);
    cb.li(kMayYield, 0);
    cb.op(Op::YIELD, {});
    cb.jump(Op::JMP, {}, lookup);
    cb.bind(ins_fail);  // the index is crowded there: this page and the rest stay private
    cb.op(Op::ADDI, {kPubEnd, kHeld}, uint32_t(-1));
    cb.li(kChain, 0);
    cb.bind(done);
    cb.jump(Op::BEQZ, {kReuse}, reported);
    cb.op(Op::OUTU, {kReuse});
    cb.bind(reported);
}

// A paged request that continues a stored conversation (a session, not new) reuses its slot, not
// the index: the slot's tokens become the history, kReuse = the leading prompt tokens they share
// (at most all but the last), the prompt is copied over them, pages for those positions are
// taken and the slot's rows copied into them (session_load through the page table); then on at
// `done`. Its pages are not published (sessionFrom = kReuse: the save writes the rest). Any
// other request goes on after this code.
void Lowering::storedSession(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label done) {
    auto other = cb.newLabel("kv_not_stored"), take = cb.newLabel("kv_session_pages");
    auto taken = cb.newLabel("kv_session_pages_taken");
    unlessStored(cb, other);
    cb.jump(Op::BNEZ, {kStart}, other);
    cb.op(Op::ANDI, {kWord, kFlags}, BLUE_REQ_FLAG_NO_PREFIX);
    cb.jump(Op::BNEZ, {kWord}, other);
    if (pooling == Pooling::Mean || pooling == Pooling::Cls) cb.jump(Op::BNEZ, {kEmbed}, other);
    loadSession(cb, ctx);
    cb.li(kReuse, BLUE_LM_HISTORY);
    cb.op(Op::INCMP, {kReuse, kSlot, kTmp2});
    cb.op(Op::LD, {kWord, 0}, kvValidAddr(ctx));
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.op(Op::ADDI, {kWord, kTmp}, uint32_t(-1));  // kTmp: prompt length (start is 0)
    cb.op(Op::MINU, {kReuse, kReuse, kWord});
    cb.op(Op::MOV, {kPrompt, kHist});
    cb.op(Op::INCPY, {kPrompt, kSlot, kTmp2});
    cb.op(Op::INFREE, {kSlot});
    cb.jump(Op::BEQZ, {kReuse}, done);
    cb.bind(take);
    cb.op(Op::SHLI, {kOld, kHeld}, log2u(kv_page));
    cb.jump(Op::BGEU, {kOld, kReuse}, taken);
    takePage(cb, ctx);
    cb.jump(Op::JMP, {}, take);
    cb.bind(taken);
    loadSessionRows(cb, ctx);
    cb.jump(Op::JMP, {}, done);
    cb.bind(other);
}

// Page kPage, entry kTmp of the page table (its rows those of the history's tokens there), into
// the prefix index as pending, after the chain kH / kParent / kPgen: its key (the tokens, the
// parent and its generation, the hash), INDEXED, then an entry in the table. Indexed: the chain
// moves on to it and the code goes on at `indexed`. The index crowded around its key (no free
// entry among those probed): not indexed, at `failed`. While kMayYield is set, an entry of the
// same hash found on the way means another instance indexed the key meanwhile: at `give_way`,
// the page still marked INDEXED and in no entry.
void Lowering::indexPage(CodeBuilder& cb, CodeBuilder::Label indexed, CodeBuilder::Label failed,
                         CodeBuilder::Label give_way) {
    const uint32_t ps = kv_page, shift = log2u(kv_page), np = kv_pages;
    const uint32_t buckets = uint32_t(blueKvpBuckets(np)), hash = kvArray(BLUE_KVP_HASH(np));
    const uint32_t state = kvArray(BLUE_KVP_STATE(np)), table = kvArray(BLUE_KVP_TABLE(np, ps));
    auto probe = cb.newLabel("kv_insert_probe"), next = cb.newLabel("kv_insert_next");
    auto again = cb.newLabel("kv_insert_try"), crowded = cb.newLabel("kv_insert_crowded");
    pageTokens(cb, kWord, kTmp, ps);
    cb.op(Op::MOV, {kHNext, kH});
    pageWalk(cb, Op::HASHL, ps, kHNext, kWord, kTmp2, failed);
    pageTokens(cb, kWord, kTmp, ps);
    cb.op(Op::SHLI, {kOld, kPage}, shift);
    cb.op(Op::ADDI, {kOld, kOld}, kvArray(BLUE_KVP_TOKENS(np)));
    pageWalk(cb, Op::HCPYL, ps, kOld, kWord, kTmp2, failed);
    cb.op(Op::STG, {kParent, kPage}, kvArray(BLUE_KVP_PARENT(np)));
    cb.op(Op::STG, {kPgen, kPage}, kvArray(BLUE_KVP_PGEN(np)));
    cb.op(Op::ADDI, {kAddr, kPage}, hash);
    cb.op(Op::ATOMXCHG, {kWord, kAddr, kHNext});
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.li(kOld, BLUE_KVP_INDEXED);
    cb.op(Op::ATOMADD, {kWord, kAddr, kOld});
    firstEntry(cb, kHNext, buckets);
    cb.bind(probe);
    readEntry(cb, table, crowded);
    cb.jump(Op::BEQZ, {kWord}, again);
    cb.jump(Op::BEQ, {kWord, kMinus1}, again);
    cb.jump(Op::BEQZ, {kMayYield}, next);
    cb.op(Op::ADDI, {kOld, kWord}, hash - 1);
    cb.op(Op::ATOMADD, {kS, kOld, 0});
    cb.jump(Op::BEQ, {kS, kHNext}, give_way);
    cb.bind(next);
    nextEntry(cb, buckets);
    cb.jump(Op::JMP, {}, probe);
    cb.bind(again);
    cb.op(Op::ADDI, {kOld, kPage}, 1);
    cb.op(Op::MOV, {kS, kWord});
    cb.op(Op::ATOMCAS, {kS, kAddr, kOld});
    cb.jump(Op::BNE, {kS, kWord}, probe);  // another went in first: look at it
    cb.op(Op::STG, {kB, kPage}, kvArray(BLUE_KVP_BUCKET(np)));
    cb.op(Op::MOV, {kH, kHNext});
    cb.op(Op::MOV, {kParent, kPage});
    cb.op(Op::LDG, {kPgen, kPage}, kvArray(BLUE_KVP_GEN(np)));
    cb.li(kMayYield, 0);
    cb.jump(Op::JMP, {}, indexed);
    cb.bind(crowded);
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.li(kOld, uint32_t(0) - BLUE_KVP_INDEXED);
    cb.op(Op::ATOMADD, {kWord, kAddr, kOld});
    cb.jump(Op::JMP, {}, failed);
}

// At a request's end, before its response ends: the full pages it wrote after its prompt's (its
// answer) go into the index too, continuing the chain of its prompt's pages, so a conversation's
// next turn, on any instance, finds its earlier answer as well. They are marked ready a cycle
// later (finishRequest). Not when the chain was cut (an opt-out, an embedding, a crowded index).
void Lowering::publishAnswer(CodeBuilder& cb, uint32_t ctx) {
    auto next = cb.newLabel("kv_publish_answer"), indexed = cb.newLabel("kv_answer_indexed");
    auto done = cb.newLabel("kv_answer_published");
    cb.jump(Op::BEQZ, {kChain}, done);
    cb.li(kMayYield, 0);
    cb.bind(next);
    cb.jump(Op::BGEU, {kPubEnd, kHeld}, done);
    cb.op(Op::ADDI, {kWord, kPubEnd}, 1);
    cb.op(Op::SHLI, {kWord, kWord}, log2u(kv_page));
    cb.jump(Op::BLTU, {kPos, kWord}, done);  // not full
    cb.op(Op::LD, {kPage, kPubEnd}, pageTableAddr(ctx));
    cb.op(Op::MOV, {kTmp, kPubEnd});
    indexPage(cb, indexed, done, done);
    cb.bind(indexed);
    cb.op(Op::ADDI, {kPubEnd, kPubEnd}, 1);
    cb.jump(Op::JMP, {}, next);
    cb.bind(done);
}

// One page from the pool into page table entry kHeld (kPage = its id): the clock sweep takes a
// free page, or evicts a cached one (out of the index), giving a page taken from the index since
// the sweep last passed a second chance; at most BLUE_KVP_PROBES probes a cycle. Since committed
// <= NP counts every page held plus every page still to take, a free or cached page exists
// whenever an instance needs one.
void Lowering::takePage(CodeBuilder& cb, uint32_t ctx) {
    const uint32_t np = kv_pages, state = kvArray(BLUE_KVP_STATE(np));
    auto probe = cb.newLabel("kv_probe"), sweep = cb.newLabel("kv_sweep");
    auto evict = cb.newLabel("kv_evict"), take_free = cb.newLabel("kv_take_free");
    auto take = cb.newLabel("kv_take");
    cb.li(kProbe, BLUE_KVP_PROBES);
    cb.bind(probe);
    cb.jump(Op::BNEZ, {kProbe}, sweep);
    cb.op(Op::YIELD, {});  // the sweep goes on next cycle
    cb.li(kProbe, BLUE_KVP_PROBES);
    cb.bind(sweep);
    cb.op(Op::ADDI, {kProbe, kProbe}, uint32_t(-1));
    cb.li(kAddr, kvArray(BLUE_KVP_CLOCK));
    cb.op(Op::ATOMADD, {kPage, kAddr, kOne});
    cb.li(kOld, np);
    cb.op(Op::REMU, {kPage, kPage, kOld});
    cb.op(Op::ADDI, {kAddr, kPage}, state);
    cb.op(Op::ATOMADD, {kS, kAddr, 0});
    cb.jump(Op::BEQZ, {kS}, take_free);
    cb.li(kOld, kCached);
    cb.jump(Op::BEQ, {kS, kOld}, evict);
    cb.op(Op::ORI, {kOld, kOld}, BLUE_KVP_RECENT);
    cb.jump(Op::BNE, {kS, kOld}, probe);  // held, pending or private
    cb.li(kOld, kCached);                 // a second chance: the sweep takes it next time round
    cb.op(Op::MOV, {kWord, kS});
    cb.op(Op::ATOMCAS, {kWord, kAddr, kOld});
    cb.jump(Op::JMP, {}, probe);
    cb.bind(evict);
    cb.op(Op::MOV, {kWord, kS});
    cb.op(Op::ATOMCAS, {kWord, kAddr, kOne});
    cb.jump(Op::BNE, {kWord, kS}, probe);
    cb.op(Op::LDG, {kB, kPage}, kvArray(BLUE_KVP_BUCKET(np)));  // out of the index
    cb.op(Op::ADDI, {kB, kB}, kvArray(BLUE_KVP_TABLE(np, kv_page)));
    cb.op(Op::ADDI, {kOld, kPage}, 1);
    cb.op(Op::ATOMCAS, {kOld, kB, kMinus1});
    cb.li(kAddr, kvArray(BLUE_KVP_EVICTIONS));
    cb.op(Op::ATOMADD, {kWord, kAddr, kOne});
    cb.jump(Op::JMP, {}, take);
    cb.bind(take_free);
    cb.li(kWord, 0);
    cb.op(Op::ATOMCAS, {kWord, kAddr, kOne});  // free -> held
    cb.jump(Op::BNEZ, {kWord}, probe);
    cb.bind(take);
    pageTaken(cb, ctx, true);
}

// Page kPage, just taken (held now, by this request alone): a new generation of it (so no key
// naming its old rows as parent matches again), page table entry kHeld (written when `map`; a
// restored snapshot's is there already), one page of the reservation, in_use and the peak.
void Lowering::pageTaken(CodeBuilder& cb, uint32_t ctx, bool map) {
    cb.op(Op::LDG, {kWord, kPage}, kvArray(BLUE_KVP_GEN(kv_pages)));
    cb.op(Op::ADDI, {kWord, kWord}, 1);
    cb.op(Op::STG, {kWord, kPage}, kvArray(BLUE_KVP_GEN(kv_pages)));
    if (map) cb.op(Op::ST, {kPage, kHeld}, pageTableAddr(ctx));
    cb.op(Op::ADDI, {kHeld, kHeld}, 1);
    cb.op(Op::ADDI, {kLeft, kLeft}, uint32_t(-1));
    cb.li(kAddr, kvArray(BLUE_KVP_IN_USE));
    cb.op(Op::ATOMADD, {kOld, kAddr, kOne});
    cb.op(Op::ADDI, {kOld, kOld}, 1);
    cb.li(kAddr, kvArray(BLUE_KVP_PEAK));
    cb.op(Op::ATOMMAXS, {kWord, kAddr, kOld});
}

// Before a RUN that advanced kPos: pages for every position below kPos.
void Lowering::ensurePages(CodeBuilder& cb, uint32_t ctx, const GenLabels& g) {
    auto more = cb.newLabel("kv_ensure"), done = cb.newLabel("kv_ensured");
    cb.bind(more);
    cb.op(Op::SHLI, {kOld, kHeld}, log2u(kv_page));
    cb.jump(Op::BGEU, {kOld, kPos}, done);
    cb.jump(Op::BEQZ, {kLeft}, g.finish);  // never: admission reserved every page the request writes
    takePage(cb, ctx);
    cb.jump(Op::JMP, {}, more);
    cb.bind(done);
}

// After a prefill RUN (the next cycle, so its rows are written): the published pages it filled
// are ready for other requests.
void Lowering::markReady(CodeBuilder& cb, uint32_t ctx) {
    auto mark = cb.newLabel("kv_mark_ready"), marked = cb.newLabel("kv_marked");
    cb.bind(mark);
    cb.jump(Op::BGEU, {kReady, kPubEnd}, marked);
    cb.op(Op::ADDI, {kWord, kReady}, 1);
    cb.op(Op::SHLI, {kWord, kWord}, log2u(kv_page));
    cb.jump(Op::BLTU, {kPos, kWord}, marked);
    cb.op(Op::LD, {kPage, kReady}, pageTableAddr(ctx));
    cb.op(Op::ADDI, {kAddr, kPage}, kvArray(BLUE_KVP_STATE(kv_pages)));
    cb.li(kOld, BLUE_KVP_READY);
    cb.op(Op::ATOMADD, {kWord, kAddr, kOld});
    cb.op(Op::ADDI, {kReady, kReady}, 1);
    cb.jump(Op::JMP, {}, mark);
    cb.bind(marked);
}

// At a request's end (finish, reject, cancel): every page held is let go. Its table entry stays
// (entries past kHeld are stale: nothing reads a position the request has not mapped), so the
// host can read a finished run's rows through it (a KV snapshot). A page no request holds any more stays cached when it is indexed and ready, is out of
// the index and free when it was pending (a cancel before its rows were all written), and free
// when private. Then in_use and committed drop by the pages no longer held, and committed by the
// reservation not taken too (last, so admission never counts a page free before it is).
void Lowering::releasePages(CodeBuilder& cb, uint32_t ctx) {
    const uint32_t np = kv_pages;
    auto next = cb.newLabel("kv_release"), released = cb.newLabel("kv_released");
    cb.li(kProbe, 0);  // pages no request holds now
    cb.bind(next);
    cb.jump(Op::BEQZ, {kHeld}, released);
    cb.op(Op::ADDI, {kHeld, kHeld}, uint32_t(-1));
    cb.op(Op::LD, {kPage, kHeld}, pageTableAddr(ctx));
    cb.op(Op::ADDI, {kAddr, kPage}, kvArray(BLUE_KVP_STATE(np)));
    cb.op(Op::ATOMADD, {kS, kAddr, kMinus1});
    cb.op(Op::ANDI, {kWord, kS}, BLUE_KVP_REFS);
    cb.jump(Op::BNE, {kWord, kOne}, next);  // others hold it too
    cb.op(Op::ADDI, {kProbe, kProbe}, 1);
    cb.op(Op::ANDI, {kWord, kS}, kCached);
    cb.li(kOld, kCached);
    cb.jump(Op::BEQ, {kWord, kOld}, next);  // cached for later requests
    cb.op(Op::ANDI, {kWord, kS}, BLUE_KVP_INDEXED);
    cb.jump(Op::BEQZ, {kWord}, next);  // private: free now
    cb.op(Op::LDG, {kB, kPage}, kvArray(BLUE_KVP_BUCKET(np)));  // pending: out of the index
    cb.op(Op::ADDI, {kB, kB}, kvArray(BLUE_KVP_TABLE(np, kv_page)));
    cb.op(Op::ADDI, {kOld, kPage}, 1);
    cb.op(Op::ATOMCAS, {kOld, kB, kMinus1});
    cb.op(Op::ATOMXCHG, {kWord, kAddr, 0});
    cb.jump(Op::JMP, {}, next);
    cb.bind(released);
    cb.op(Op::SUB, {kOld, 0, kProbe});
    cb.li(kAddr, kvArray(BLUE_KVP_IN_USE));
    cb.op(Op::ATOMADD, {kWord, kAddr, kOld});
    cb.op(Op::SUB, {kOld, kOld, kLeft});
    cb.li(kAddr, kvArray(BLUE_KVP_COMMITTED));
    cb.op(Op::ATOMADD, {kWord, kAddr, kOld});
    cb.li(kLeft, 0);
    cb.li(kPubEnd, 0);
    cb.li(kReady, 0);
    cb.li(kChain, 0);  // a request rejected before its lookup publishes nothing at its end
}

}  // namespace blue::lower_model
