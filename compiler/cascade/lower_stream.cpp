// Streaming the answer slot as it is written, and stage-time records (vm/cascade_abi.h): which
// stage statements' writes are final, and the code that writes their tokens to the output ring.
#include "compiler/cascade/lowerer.h"

namespace blue::cascade {

// ---- streaming the answer slot and stage times (vm/cascade_abi.h) --------------------------

// Step ids in source order, as emitStmts assigns them.
void Lowerer::numberSteps(const std::vector<Stmt>& body, uint32_t* n) {
    for (const Stmt& s : body) {
        if (s.kind == Stmt::STAGE || s.kind == Stmt::RUN) step_of[&s] = ++*n;
        numberSteps(s.body, n);
        numberSteps(s.else_body, n);
    }
}

// Whether a statement in `body` (nested ones included) replaces the stream slot's contents.
bool Lowerer::replacesStream(const std::vector<Stmt>& body) const {
    for (const Stmt& s : body) {
        if (s.kind == Stmt::STAGE || s.kind == Stmt::RUN) {
            const Stage& st = p.stages[s.stage];
            if (!st.append && uint32_t(slotIndex(st.target)) == stream_slot) return true;
        }
        if (s.kind == Stmt::SCORE && !s.score_into.empty() && uint32_t(slotIndex(s.score_into)) == stream_slot) return true;
        if (replacesStream(s.body) || replacesStream(s.else_body)) return true;
    }
    return false;
}

// Marks the stage statements of `body` whose write of the stream slot is final: no replacing
// write can follow on any path (`after`: one can follow the end of `body`). Streamed text is
// never retracted, so only those stream. Returns whether one can follow the start of `body`.
// Conservative: a skip rule or a condition that would keep a later write from running is not
// evaluated, and a `write` inside a loop of more than one round can reach itself.
bool Lowerer::planStream(const std::vector<Stmt>& body, bool after) {
    bool r = after;
    for (auto it = body.rbegin(); it != body.rend(); ++it) {
        const Stmt& s = *it;
        switch (s.kind) {
            case Stmt::STAGE:
            case Stmt::RUN: {
                const Stage& st = p.stages[s.stage];
                const bool writes = uint32_t(slotIndex(st.target)) == stream_slot;
                if (writes && !r) stream_steps[step_of[&s]] = true;
                r = r || (writes && !st.append);
                break;
            }
            case Stmt::IF: {
                const bool yes = planStream(s.body, r), no = planStream(s.else_body, r);
                r = yes || no;
                break;
            }
            case Stmt::REPEAT: {
                // From inside the body, the next round's whole body can follow.
                const bool cont = r || (s.count > 1 && replacesStream(s.body));
                r = planStream(s.body, cont) || r;
                break;
            }
            case Stmt::SCORE:  // a `filter` into the stream slot replaces it (and streams nothing)
                r = r || (!s.score_into.empty() && uint32_t(slotIndex(s.score_into)) == stream_slot);
                break;
            case Stmt::BREAK: break;  // leads to the loop's end, whose future `r` already covers
        }
    }
    return r;
}

// Tokens of a run a stop string may still remove after the next token: the longest stop's, less one.
uint32_t Lowerer::streamHold(uint32_t stage) const {
    size_t hold = 0;
    for (const std::string& stop : p.stages[stage].stops) hold = std::max(hold, tokensOf(stop, true).size() - 1);
    return uint32_t(hold);
}

// In a stage statement whose write is final: streams the stream slot's tokens from kStreamed up
// to its length less min(hold, kGen) (the run's tokens a stop string may still remove). Uses
// kTmp, kN and kWord only (kTok and the RUN arguments stay live).
void Lowerer::emitStreamFlush(uint32_t hold) {
    if (!stream_slot || !stream_steps[next_step]) return;
    const uint32_t slot = slot_addr[stream_slot];
    auto loop = cb.newLabel(), done = cb.newLabel();
    cb.op(Op::LD, {kN, kZero}, slot);
    if (hold) {
        cb.li(kTmp, hold);
        cb.op(Op::MINU, {kTmp, kTmp, kGen});
        cb.jump(Op::BLTU, {kN, kTmp}, done);
        cb.op(Op::SUB, {kN, kN, kTmp});
    }
    cb.jump(Op::BGEU, {kStreamed, kN}, done);
    cb.op(Op::OUTS, {}, stream_marker);
    cb.op(Op::SUB, {kTmp, kN, kStreamed});
    cb.op(Op::OUTU, {kTmp});
    cb.bind(loop);
    cb.op(Op::LD, {kWord, kStreamed}, slot + 1);
    cb.op(Op::OUTT, {kWord});
    cb.op(Op::ADDI, {kStreamed, kStreamed}, 1);
    cb.jump(Op::BLTU, {kStreamed, kN}, loop);
    cb.bind(done);
}

// After a stage run: its time record (kTmp2: the start cycle, kTmp: the cycles), then the rest of
// a final write's tokens.
void Lowerer::emitStageEnd(uint32_t stage) {
    cb.op(Op::OUTS, {}, time_marker);
    cb.li(kWord, stage);
    cb.op(Op::OUTU, {kWord});
    cb.op(Op::OUTU, {kTmp2});
    cb.op(Op::OUTU, {kTmp});
    emitStreamFlush(0);
}

}  // namespace blue::cascade
