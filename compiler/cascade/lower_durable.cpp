// Durable slots (vm/cascade_abi.h): the checkpoint after every stage statement, and the code that
// restores a request's state from a resume block and continues after its last checkpoint.
#include "compiler/cascade/lowerer.h"

namespace blue::cascade {

// ---- durable slots: checkpoints and resume (vm/cascade_abi.h) ------------------------------

void Lowerer::countSteps(const std::vector<Stmt>& body, uint32_t depth) {
    loop_depth = std::max(loop_depth, depth);
    for (const Stmt& s : body) {
        if (s.kind == Stmt::STAGE || s.kind == Stmt::RUN) ++steps;
        countSteps(s.body, depth + (s.kind == Stmt::REPEAT ? 1 : 0));
        countSteps(s.else_body, depth);
    }
}

// Words of a request's resume block.
uint32_t Lowerer::resumeWords() const {
    return BLUE_CAS_RESUME_LOOPS + loop_depth + uint32_t(p.stages.size()) * BLUE_CAS_STAGE_WORDS +
           (hist_base - slot_addr[1]);
}

// Reads the request's tag, seed and flags and copies the task into the input slot (refusing one
// longer than the slot). Leaves the flags in kGen and the message in kSlot (not yet freed).
void Lowerer::emitRequest(CodeBuilder::Label reject) {
    auto fresh = cb.newLabel();
    cb.li(kTmp, BLUE_CAS_REQ_SEED);
    cb.op(Op::INLD, {kSeed, kSlot, kTmp});
    cb.li(kTmp, BLUE_CAS_REQ_FLAGS);
    cb.op(Op::INLD, {kGen, kSlot, kTmp});
    cb.li(kPrompt, BLUE_CAS_REQ_HEADER);  // where the task's tokens start
    cb.jump(Op::BEQZ, {kGen}, fresh);
    cb.li(kPrompt, BLUE_CAS_REQ_HEADER + resumeWords());
    cb.bind(fresh);
    cb.op(Op::INLEN, {kTmp, kSlot});
    cb.op(Op::SUB, {kTmp, kTmp, kPrompt});  // a message shorter than its header wraps: refused
    cb.li(kTmp2, p.input_capacity + 1);
    cb.jump(Op::BGEU, {kTmp, kTmp2}, reject);
    cb.li(kWord, slot_addr[0] + 1);
    cb.op(Op::INCPY, {kWord, kSlot, kPrompt});
    cb.op(Op::ST, {kWord, kZero}, slot_addr[0]);
}

// With BLUE_CAS_REQ_RESUME: loads the registers, statistics and slots of the resume block, frees
// the message and jumps to the code after the checkpointed step (an unknown step ends the
// request with OUTEND alone, which the host reports as incomplete). Without: frees the message.
void Lowerer::emitRestore() {
    auto start = cb.newLabel();
    auto copy = [&](uint32_t from, uint32_t local, uint32_t words) {
        auto loop = cb.newLabel(), done = cb.newLabel();
        cb.li(kI, 0);
        cb.li(kN, words);
        cb.li(kJ, from);
        cb.bind(loop);
        cb.jump(Op::BGEU, {kI, kN}, done);
        cb.op(Op::INLD, {kWord, kSlot, kJ});
        cb.op(Op::ST, {kWord, kI}, local);
        cb.op(Op::ADDI, {kI, kI}, 1);
        cb.op(Op::ADDI, {kJ, kJ}, 1);
        cb.jump(Op::JMP, {}, loop);
        cb.bind(done);
    };
    auto load = [&](uint8_t reg, uint32_t word) {
        cb.li(kTmp, BLUE_CAS_REQ_HEADER + word);
        cb.op(Op::INLD, {reg, kSlot, kTmp});
    };
    auto resume = cb.newLabel();
    cb.jump(Op::BNEZ, {kGen}, resume);
    cb.op(Op::INFREE, {kSlot});
    cb.jump(Op::JMP, {}, start);
    cb.bind(resume);
    load(kWord2, BLUE_CAS_RESUME_STEP);
    load(kRuns, BLUE_CAS_RESUME_RUNS);
    load(kTotal, BLUE_CAS_RESUME_TOTAL);
    for (uint32_t d = 0; d < loop_depth; ++d) load(uint8_t(kLoop0 + d), BLUE_CAS_RESUME_LOOPS + d);
    uint32_t stats_at = BLUE_CAS_REQ_HEADER + BLUE_CAS_RESUME_LOOPS + loop_depth;
    uint32_t stats_words = uint32_t(p.stages.size()) * BLUE_CAS_STAGE_WORDS;
    copy(stats_at, stats_base, stats_words);
    copy(stats_at + stats_words, slot_addr[1], hist_base - slot_addr[1]);
    cb.op(Op::INFREE, {kSlot});
    for (uint32_t k = 1; k <= steps; ++k) {
        cb.li(kTmp, k);
        cb.jump(Op::BEQ, {kWord2, kTmp}, step_labels[k]);
    }
    cb.jump(Op::JMP, {}, cancel_label);
    cb.bind(start);
}

// The checkpoint after step `step` (a run of stage `stage`, or its skip).
void Lowerer::emitCheckpoint(uint32_t step, uint32_t stage) {
    const int slot = slotIndex(p.stages[stage].target);
    cb.op(Op::OUTS, {}, ckpt_marker);
    for (uint32_t v : {step, stage}) {
        cb.li(kTmp, v);
        cb.op(Op::OUTU, {kTmp});
    }
    cb.op(Op::OUTU, {kRuns});
    cb.op(Op::OUTU, {kTotal});
    for (uint32_t d = 0; d < loop_depth; ++d) cb.op(Op::OUTU, {uint8_t(kLoop0 + d)});
    emitStageRecords(stage);
    cb.li(kTmp, uint32_t(slot - 1));
    cb.op(Op::OUTU, {kTmp});
    emitSlotRecords(size_t(slot));
}

}  // namespace blue::cascade
