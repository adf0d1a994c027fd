// Fork and join (vm/cascade_abi.h, "fork and join"): a stage with `fork K` runs K branches at
// once as sibling instances. The request's instance writes the prompt and the branch parameters
// into a fork record in the heap and opens it; idle instances, and the request's own, claim
// branches with an atomic add and run them through the same forward block (so the branches of
// every request batch together like any instances); a sibling writes its result into the record
// and tells the request's instance through its mailbox. Once all K are in, the join keeps one
// branch by its rule and writes it to the stage's slot. Nothing of this passes through the host.
#include "compiler/cascade/lowerer.h"
#include "vm/abi.h"

namespace blue::cascade {

namespace {

constexpr uint32_t kClosed = 0x40000000u;  // NEXT of a record not open: no claim succeeds
constexpr uint32_t kBranchSeedStep = 0x85EBCA6Bu;

}  // namespace

uint32_t Lowerer::forkRecordWords() const {
    uint32_t words = 0;
    for (uint32_t s = 0; s < p.stages.size(); ++s) {
        if (p.stages[s].fork > 1) words = std::max(words, forkPromptAt(s) + models[stage_model[s]].ctx);
    }
    return words;
}

// The request's side of a fork stage, after its prompt is in history[0, kPrompt).
void Lowerer::emitFork(uint32_t s, CodeBuilder::Label done) {
    const Stage& st = p.stages[s];
    const uint32_t target = slot_addr[size_t(slotIndex(st.target))];
    const uint32_t target_cap = slot_cap[size_t(slotIndex(st.target))];
    const uint32_t K = st.fork, rec_words = forkRecordWords();
    emitRunStart(s);
    // The stage run's seed (branch 0 draws what the stage would draw unforked).
    cb.op(Op::MULI, {kWord2, kRuns}, 0x9E3779B9u);
    cb.op(Op::ADD, {kWord2, kWord2, kSeed});
    cb.op(Op::ADDI, {kRuns, kRuns}, 1);
    cb.jump(Op::BEQZ, {kPrompt}, done);
    // Each branch's cap: max_tokens, what the slot has room for (appending), and an even share of
    // the budget left, so that the branches together never spend more than the budget.
    cb.li(kCap, st.max_tokens);
    if (st.append) {
        cb.op(Op::LD, {kLen, kZero}, target);
        cb.li(kTmp, target_cap);
        cb.op(Op::SUB, {kTmp, kTmp, kLen});
        cb.op(Op::MINU, {kCap, kCap, kTmp});
    }
    if (p.budget) {
        cb.li(kTmp, p.budget);
        cb.op(Op::SUB, {kTmp, kTmp, kTotal});
        cb.li(kTmp2, K);
        cb.op(Op::DIVU, {kTmp, kTmp, kTmp2});
        cb.op(Op::MINU, {kCap, kCap, kTmp});
    }

    // Take a free record; when every record is taken, try again next cycle (their owners are
    // running their branches themselves, so they free them).
    auto take = cb.newLabel(), scan = cb.newLabel(), taken = cb.newLabel(), full = cb.newLabel();
    cb.bind(take);
    cb.li(kFork, BLUE_CAS_HEAP_FORKS);
    cb.li(kI, 0);
    cb.bind(scan);
    cb.li(kTmp, fork_records);
    cb.jump(Op::BGEU, {kI, kTmp}, full);
    cb.li(kWord, 0);
    cb.li(kTmp, 1);
    cb.op(Op::ATOMCAS, {kWord, kFork, kTmp});
    cb.jump(Op::BEQZ, {kWord, }, taken);
    cb.op(Op::ADDI, {kFork, kFork}, rec_words);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, scan);
    cb.bind(full);
    cb.op(Op::YIELD);
    cb.jump(Op::JMP, {}, take);
    cb.bind(taken);
    // Closed before anything is written: a claim of the record's last use fails against its
    // old K now, and every later one against kClosed.
    cb.op(Op::ADDI, {kTmp2, kFork}, BLUE_CAS_FORK_NEXT);
    cb.li(kTmp, kClosed);
    cb.op(Op::ATOMXCHG, {kWord, kTmp2, kTmp});
    cb.op(Op::YIELD);
    auto put = [&](uint32_t word, uint8_t reg) { cb.op(Op::STG, {reg, kFork}, word); };
    cb.li(kTmp, K);
    put(BLUE_CAS_FORK_K, kTmp);
    cb.li(kTmp, s);
    put(BLUE_CAS_FORK_STAGE, kTmp);
    put(BLUE_CAS_FORK_PARENT, kIid);
    put(BLUE_CAS_FORK_MARK, kCancelMark);
    put(BLUE_CAS_FORK_SEED, kWord2);
    put(BLUE_CAS_FORK_CAP, kCap);
    put(BLUE_CAS_FORK_PLEN, kPrompt);
    {
        auto loop = cb.newLabel(), copied = cb.newLabel();
        cb.li(kI, 0);
        cb.op(Op::ADDI, {kJ, kFork}, forkPromptAt(s));
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kPrompt}, copied);
        cb.op(Op::LD, {kWord, kI}, hist_base);
        cb.op(Op::ADD, {kTmp, kJ, kI});
        cb.op(Op::STG, {kWord, kTmp}, 0);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(copied);
    }
    // Open it a cycle later, when the stores above are visible to every instance.
    cb.op(Op::YIELD);
    cb.op(Op::ADDI, {kTmp2, kFork}, BLUE_CAS_FORK_NEXT);
    cb.op(Op::ATOMXCHG, {kWord, kTmp2, kZero});

    // Run branches here too until none is left to claim, then wait for the siblings' messages.
    auto claim = cb.newLabel(), wait = cb.newLabel(), joined = cb.newLabel();
    cb.li(kOwn, 0);
    cb.bind(claim);
    cb.op(Op::ADDI, {kTmp2, kFork}, BLUE_CAS_FORK_NEXT);
    cb.li(kTmp, 1);
    cb.op(Op::ATOMADD, {kBranch, kTmp2, kTmp});
    cb.li(kTmp, K);
    cb.jump(Op::BGEU, {kBranch, kTmp}, wait);
    cb.jump(Op::CALL, {}, branch_labels[s]);
    cb.op(Op::ADDI, {kOwn, kOwn}, 1);
    cb.jump(Op::JMP, {}, claim);
    cb.bind(wait);
    cb.li(kTmp, K);
    cb.jump(Op::BGEU, {kOwn, kTmp}, joined);
    cb.op(Op::RECV, {kTmp});
    cb.op(Op::ADDI, {kOwn, kOwn}, 1);
    cb.jump(Op::JMP, {}, wait);
    cb.bind(joined);
    emitJoin(s);
    // Free the record (NEXT stays >= K: a late claim takes nothing), then honour a cancel.
    cb.li(kTmp, 0);
    cb.op(Op::ATOMXCHG, {kWord, kFork, kTmp});
    cb.op(Op::INFLAG, {kFlagWord, kIid});
    cb.jump(Op::BEQ, {kFlagWord, kCancelMark}, cancel_label);
}

// All K branches are in the record at kFork: keep one (kE) by the stage's rule, write it to the
// slot and the stage's statistics, and count every branch's tokens against the budget.
void Lowerer::emitJoin(uint32_t s) {
    const Stage& st = p.stages[s];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    const uint32_t target = slot_addr[size_t(slotIndex(st.target))];
    const uint32_t K = st.fork, bw = branchWords(s);
    auto at = [&](uint32_t b, uint32_t word) { return BLUE_CAS_FORK_HEADER + b * bw + word; };
    cb.li(kE, 0);
    if (st.join == "first") {
        // The earliest finishing cycle; the lowest branch of equals.
        cb.op(Op::LDG, {kWord2, kFork}, at(0, BLUE_CAS_BR_FINISH));
        for (uint32_t b = 1; b < K; ++b) {
            auto keep = cb.newLabel();
            cb.op(Op::LDG, {kTmp, kFork}, at(b, BLUE_CAS_BR_FINISH));
            cb.jump(Op::BGEU, {kTmp, kWord2}, keep);
            cb.op(Op::MOV, {kWord2, kTmp});
            cb.li(kE, b);
            cb.bind(keep);
        }
    } else if (st.join == "judge") {
        emitJudge(s);
    } else {
        // The highest mean log-probability; a branch with no token never wins over one with any.
        cb.op(Op::LF, {kF2}, 0xFF800000u);  // -inf
        for (uint32_t b = 0; b < K; ++b) {
            auto keep = cb.newLabel();
            cb.op(Op::LDG, {kTmp, kFork}, at(b, BLUE_CAS_BR_TOKENS));
            cb.jump(Op::BEQZ, {kTmp}, keep);
            cb.op(Op::LDG, {kF1, kFork}, at(b, BLUE_CAS_BR_LP_SUM));
            cb.op(Op::UTOF, {kTmp, kTmp});
            cb.op(Op::FDIV, {kF1, kF1, kTmp});
            cb.op(Op::FLT, {kTmp, kF2, kF1});
            cb.jump(Op::BEQZ, {kTmp}, keep);
            cb.op(Op::MOV, {kF2, kF1});
            cb.li(kE, b);
            cb.bind(keep);
        }
    }
    // Totals over all branches.
    cb.li(kN, 0);
    cb.li(kJ, 0);
    for (uint32_t b = 0; b < K; ++b) {
        cb.op(Op::LDG, {kTmp, kFork}, at(b, BLUE_CAS_BR_TOKENS));
        cb.op(Op::ADD, {kN, kN, kTmp});
        cb.op(Op::LDG, {kTmp, kFork}, at(b, BLUE_CAS_BR_BY_SIBLING));
        cb.op(Op::ADD, {kJ, kJ, kTmp});
    }
    cb.op(Op::ADD, {kTotal, kTotal, kN});
    cb.op(Op::ST, {kN, kZero}, stats + BLUE_CAS_ST_BRANCH_TOKENS);
    cb.op(Op::ST, {kJ, kZero}, stats + BLUE_CAS_ST_SIBLINGS);
    cb.li(kTmp, K);
    cb.op(Op::ST, {kTmp, kZero}, stats + BLUE_CAS_ST_BRANCHES);
    cb.op(Op::ST, {kE, kZero}, stats + BLUE_CAS_ST_CHOICE);
    // The kept branch: its statistics, then its tokens into the slot.
    cb.li(kTmp, bw);
    cb.op(Op::MUL, {kTmp, kE, kTmp});
    cb.op(Op::ADD, {kTmp2, kFork, kTmp});  // the branch's words, from BLUE_CAS_FORK_HEADER
    const std::pair<uint32_t, uint32_t> copied[] = {{BLUE_CAS_BR_TOKENS, BLUE_CAS_ST_TOKENS},
                                                    {BLUE_CAS_BR_ENT_SUM, BLUE_CAS_ST_ENT_SUM},
                                                    {BLUE_CAS_BR_ENT_MAX, BLUE_CAS_ST_ENT_MAX},
                                                    {BLUE_CAS_BR_LP_SUM, BLUE_CAS_ST_LP_SUM}};
    for (auto [from, to] : copied) {
        cb.op(Op::LDG, {kTmp, kTmp2}, BLUE_CAS_FORK_HEADER + from);
        cb.op(Op::ST, {kTmp, kZero}, stats + to);
    }
    if (!st.append) cb.op(Op::ST, {kZero, kZero}, target);
    auto loop = cb.newLabel(), done = cb.newLabel();
    cb.op(Op::LD, {kLen, kZero}, target);
    cb.op(Op::LDG, {kN, kTmp2}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_LEN);
    cb.li(kI, 0);
    cb.bind(loop);
    cb.jump(Op::BGEU, {kI, kN}, done);
    cb.op(Op::ADD, {kTmp, kTmp2, kI});
    cb.op(Op::LDG, {kWord, kTmp}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_LEN + 1);
    cb.op(Op::ST, {kWord, kLen}, target + 1);
    cb.op(Op::ADDI, {kLen, kLen}, 1);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(done);
    cb.op(Op::ST, {kLen, kZero}, target);
}

// `join judge MODEL`: each branch's tokens are scored after the prompt (still in history[0,
// kPrompt): every branch copied the same one there) by MODEL's score block, as a select stage
// scores its options; the highest mean log-likelihood wins, the lowest branch of equals.
void Lowerer::emitJudge(uint32_t s) {
    const Stage& st = p.stages[s];
    const LoadedModel& judge = models[stage_judge[s]];
    const uint32_t K = st.fork, bw = branchWords(s);
    auto skip_prefill = cb.newLabel();
    cb.op(Op::ADDI, {kN, kPrompt}, uint32_t(-1));
    cb.jump(Op::BEQZ, {kN}, skip_prefill);
    emitPrefill(judge.score_block, kN);
    cb.bind(skip_prefill);
    cb.op(Op::LF, {kF2}, 0xFF800000u);  // -inf
    for (uint32_t b = 0; b < K; ++b) {
        const uint32_t len_at = BLUE_CAS_FORK_HEADER + b * bw + BLUE_CAS_BR_LEN;
        auto loop = cb.newLabel(), copied = cb.newLabel(), keep = cb.newLabel();
        cb.op(Op::LDG, {kN, kFork}, len_at);
        cb.jump(Op::BEQZ, {kN}, keep);
        cb.li(kI, 0);
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kN}, copied);
        cb.op(Op::ADD, {kTmp, kFork, kI});
        cb.op(Op::LDG, {kWord, kTmp}, len_at + 1);
        cb.op(Op::ADD, {kTmp, kPrompt, kI});
        cb.op(Op::ST, {kWord, kTmp}, hist_base);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(copied);
        cb.op(Op::ADDI, {kArgRows, kN}, 1);
        cb.op(Op::ADDI, {kArgPos, kPrompt}, uint32_t(-1));
        cb.op(Op::ADDI, {kArgTokens, kArgPos}, hist_base);
        cb.op(Op::RUN, {kArgRows}, judge.score_block);
        cb.op(Op::TLD, {kF1, kZero}, score_sum);
        cb.op(Op::UTOF, {kTmp, kN});
        cb.op(Op::FDIV, {kF1, kF1, kTmp});
        cb.op(Op::FLT, {kTmp, kF2, kF1});
        cb.jump(Op::BEQZ, {kTmp}, keep);
        cb.op(Op::MOV, {kF2, kF1});
        cb.li(kE, b);
        cb.bind(keep);
    }
}

// One branch of fork stage `s` (a subroutine): the record at kFork, the branch in kBranch. It
// generates into the local branch slot and writes its result into the record; run by a sibling,
// it then sends the branch's index to the parent's mailbox.
void Lowerer::emitBranch(uint32_t s) {
    const LoadedModel& lm = models[stage_model[s]];
    const uint32_t stats = stats_base + s * BLUE_CAS_STAGE_WORDS;
    auto generated = cb.newLabel();
    cb.bind(branch_labels[s]);
    cb.op(Op::LDG, {kPrompt, kFork}, BLUE_CAS_FORK_PLEN);
    cb.op(Op::LDG, {kCap, kFork}, BLUE_CAS_FORK_CAP);
    cb.op(Op::LDG, {kParent, kFork}, BLUE_CAS_FORK_PARENT);
    cb.op(Op::LDG, {kMark, kFork}, BLUE_CAS_FORK_MARK);
    {
        auto loop = cb.newLabel(), copied = cb.newLabel();
        cb.li(kI, 0);
        cb.op(Op::ADDI, {kJ, kFork}, forkPromptAt(s));
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kPrompt}, copied);
        cb.op(Op::ADD, {kTmp, kJ, kI});
        cb.op(Op::LDG, {kWord, kTmp}, 0);
        cb.op(Op::ST, {kWord, kI}, hist_base);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(copied);
    }
    emitSampling(s);
    cb.op(Op::LDG, {kTmp, kFork}, BLUE_CAS_FORK_SEED);
    cb.op(Op::MULI, {kTmp2, kBranch}, kBranchSeedStep);
    cb.op(Op::ADD, {kTmp, kTmp, kTmp2});
    cb.op(Op::ST, {kTmp, kZero}, BLUE_LM_SAMPLING + BLUE_SP_SEED);
    cb.op(Op::ST, {kZero, kZero}, branch_slot);
    for (uint32_t w : {BLUE_CAS_ST_TOKENS, BLUE_CAS_ST_ENT_SUM, BLUE_CAS_ST_ENT_MAX, BLUE_CAS_ST_LP_SUM}) {
        cb.op(Op::ST, {kZero, kZero}, stats + w);
    }
    emitPrefill(lm.block);
    emitGenerate(s, GenInto{branch_slot, branch_cap, true}, generated);
    cb.bind(generated);
    // The result: statistics, finishing cycle, who ran it, the tokens.
    cb.li(kTmp, branchWords(s));
    cb.op(Op::MUL, {kTmp, kBranch, kTmp});
    cb.op(Op::ADD, {kJ, kFork, kTmp});
    const std::pair<uint32_t, uint32_t> put[] = {{BLUE_CAS_ST_TOKENS, BLUE_CAS_BR_TOKENS},
                                                 {BLUE_CAS_ST_ENT_SUM, BLUE_CAS_BR_ENT_SUM},
                                                 {BLUE_CAS_ST_ENT_MAX, BLUE_CAS_BR_ENT_MAX},
                                                 {BLUE_CAS_ST_LP_SUM, BLUE_CAS_BR_LP_SUM}};
    for (auto [from, to] : put) {
        cb.op(Op::LD, {kTmp, kZero}, stats + from);
        cb.op(Op::STG, {kTmp, kJ}, BLUE_CAS_FORK_HEADER + to);
    }
    cb.op(Op::CYCLE, {kTmp});
    cb.op(Op::STG, {kTmp, kJ}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_FINISH);
    cb.op(Op::SNE, {kTmp, kIid, kParent});
    cb.op(Op::STG, {kTmp, kJ}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_BY_SIBLING);
    auto loop = cb.newLabel(), copied = cb.newLabel(), mine = cb.newLabel();
    cb.op(Op::LD, {kN, kZero}, branch_slot);
    cb.op(Op::STG, {kN, kJ}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_LEN);
    cb.li(kI, 0);
    cb.bind(loop);
    cb.jump(Op::BGEU, {kI, kN}, copied);
    cb.op(Op::LD, {kWord, kI}, branch_slot + 1);
    cb.op(Op::ADD, {kTmp, kJ, kI});
    cb.op(Op::STG, {kWord, kTmp}, BLUE_CAS_FORK_HEADER + BLUE_CAS_BR_LEN + 1);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(copied);
    // The parent reads the record after the message, which arrives a cycle after these stores.
    cb.jump(Op::BEQ, {kIid, kParent}, mine);
    cb.op(Op::SEND, {kParent, kBranch});
    cb.bind(mine);
    cb.op(Op::RET);
}

// An idle instance's look at the fork records: claims an open record's next branch and runs it,
// then goes to `after`; falls through when there is nothing to claim.
void Lowerer::emitForkScan(CodeBuilder::Label after) {
    const uint32_t rec_words = forkRecordWords();
    auto loop = cb.newLabel(), next = cb.newLabel(), none = cb.newLabel();
    cb.li(kFork, BLUE_CAS_HEAP_FORKS);
    cb.li(kI, 0);
    cb.bind(loop);
    cb.li(kTmp, fork_records);
    cb.jump(Op::BGEU, {kI, kTmp}, none);
    cb.op(Op::LDG, {kWord, kFork}, BLUE_CAS_FORK_STATE);
    cb.jump(Op::BEQZ, {kWord}, next);
    cb.op(Op::LDG, {kWord, kFork}, BLUE_CAS_FORK_NEXT);  // a cheap look before the atomic
    cb.li(kTmp, kMaxBranches);
    cb.jump(Op::BGEU, {kWord, kTmp}, next);
    cb.op(Op::ADDI, {kTmp2, kFork}, BLUE_CAS_FORK_NEXT);
    cb.li(kTmp, 1);
    cb.op(Op::ATOMADD, {kBranch, kTmp2, kTmp});
    // K is read after the claim: a claim on a record being re-taken fails against its old K.
    cb.op(Op::LDG, {kWord, kFork}, BLUE_CAS_FORK_K);
    cb.jump(Op::BGEU, {kBranch, kWord}, next);
    cb.op(Op::LDG, {kWord, kFork}, BLUE_CAS_FORK_STAGE);
    for (uint32_t s = 0; s < p.stages.size(); ++s) {
        if (p.stages[s].fork < 2) continue;
        auto other = cb.newLabel();
        cb.li(kTmp, s);
        cb.jump(Op::BNE, {kWord, kTmp}, other);
        cb.jump(Op::CALL, {}, branch_labels[s]);
        cb.jump(Op::JMP, {}, after);
        cb.bind(other);
    }
    cb.jump(Op::JMP, {}, after);
    cb.bind(next);
    cb.op(Op::ADDI, {kFork, kFork}, rec_words);
    cb.op(Op::ADDI, {kI, kI}, 1);
    cb.jump(Op::JMP, {}, loop);
    cb.bind(none);
}

// The wait for work of a module with fork stages, at `next`: a branch of a request in progress
// first (it finishes sooner), else a new request (to `request`, its slot in kSlot, counted in the
// heap's ACTIVE), else the next cycle. Once the input is closed and drained and no request is in
// progress anywhere, to `halt`.
void Lowerer::emitIdle(CodeBuilder::Label next, CodeBuilder::Label request, CodeBuilder::Label halt) {
    auto polled = cb.newLabel(), got = cb.newLabel();
    cb.bind(next);
    emitForkScan(next);
    cb.op(Op::INPOLL, {kSlot});
    cb.li(kTmp, 0xFFFFFFFEu);
    cb.jump(Op::BNE, {kSlot, kTmp}, polled);
    cb.op(Op::YIELD);
    cb.jump(Op::JMP, {}, next);
    cb.bind(polled);
    cb.jump(Op::BNE, {kSlot, kMinus1}, got);
    cb.li(kTmp, BLUE_CAS_HEAP_ACTIVE);
    cb.op(Op::ATOMADD, {kWord, kTmp, kZero});
    cb.jump(Op::BEQZ, {kWord}, halt);
    cb.op(Op::YIELD);
    cb.jump(Op::JMP, {}, next);
    cb.bind(got);
    cb.li(kTmp, BLUE_CAS_HEAP_ACTIVE);
    cb.li(kTmp2, 1);
    cb.op(Op::ATOMADD, {kWord, kTmp, kTmp2});
    cb.jump(Op::JMP, {}, request);
}

}  // namespace blue::cascade
