// Checkpoint records, resume state and resume blocks (see cascade_checkpoint.h).
#include "host/cascade/cascade_checkpoint.h"

#include "vm/abi.h"

namespace blue {

Status checkCheckpoint(const CascadeCheckpoint& c, const CascadeInfo& info) {
    if (c.step == 0 || c.step > info.steps) return BLUE_ERROR("step %u is not one of the cascade's (1..%u)", c.step, info.steps);
    if (c.stage >= info.stages.size()) return BLUE_ERROR("stage %u is not one of the cascade's %zu", c.stage, info.stages.size());
    if (c.slot >= info.slots.size()) return BLUE_ERROR("slot %u is not one of the cascade's %zu", c.slot, info.slots.size());
    if (c.loops.size() != info.loops) return BLUE_ERROR("%zu loop counters, the cascade nests %u loops", c.loops.size(), info.loops);
    if (c.tokens.size() > info.slot_capacity[c.slot]) {
        return BLUE_ERROR("slot '%s' holds %zu tokens, more than its capacity %u", info.slots[c.slot].c_str(),
                          c.tokens.size(), info.slot_capacity[c.slot]);
    }
    if (c.stats[BLUE_CAS_ST_STATE] > BLUE_CAS_STATE_NO_BUDGET) return BLUE_ERROR("stage state %u is unknown", c.stats[BLUE_CAS_ST_STATE]);
    return Status::ok();
}

Result<CheckpointDecoder::Feed> CheckpointDecoder::feed(const OutputRecord& rec) {
    const size_t loops = info_->loops;
    const size_t stats_at = BLUE_CAS_CKPT_FIXED + loops, slot_at = stats_at + BLUE_CAS_STAGE_WORDS;
    if (field_ == 0) {
        std::string s;
        if (rec.kind != BLUE_OUT_STR || !m_->constString(rec.value, &s) || s != BLUE_CAS_CHECKPOINT_MARKER) return Feed::NOT_MINE;
        cur_ = CascadeCheckpoint{};
        field_ = 1;
        return Feed::MORE;
    }
    auto bad = [&](const char* what) {
        return BLUE_ERROR("checkpoint record %zu: %s (record kind %u)", field_, what, rec.kind);
    };
    const size_t f = field_;
    bool float_stat = f >= stats_at && f < slot_at &&
                      (f - stats_at == BLUE_CAS_ST_ENT_SUM || f - stats_at == BLUE_CAS_ST_ENT_MAX || f - stats_at == BLUE_CAS_ST_LP_SUM);
    uint32_t want = f < slot_at + 2 ? (float_stat ? BLUE_OUT_FLOAT : BLUE_OUT_UINT) : BLUE_OUT_TOKEN;
    if (rec.kind != want) return bad(want == BLUE_OUT_TOKEN ? "expected a slot token" : "expected a number");
    ++field_;
    if (f == 1) cur_.step = rec.value;
    else if (f == 2) cur_.stage = rec.value;
    else if (f == 3) cur_.runs = rec.value;
    else if (f == 4) cur_.total = rec.value;
    else if (f < stats_at) cur_.loops.push_back(rec.value);
    else if (f < slot_at) cur_.stats[f - stats_at] = rec.value;
    else if (f == slot_at) cur_.slot = rec.value;
    if (f <= slot_at) return Feed::MORE;
    if (f == slot_at + 1) {
        if (cur_.slot >= info_->slots.size() || rec.value > info_->slot_capacity[cur_.slot]) return bad("slot or length out of range");
        left_ = rec.value;
        cur_.tokens.reserve(left_);
    } else {
        cur_.tokens.push_back(rec.value);
        --left_;
    }
    if (left_ > 0) return Feed::MORE;
    field_ = 0;
    if (Status s = checkCheckpoint(cur_, *info_); !s) return s.prefix("checkpoint");
    return Feed::DONE;
}

void CheckpointStream::feed(std::span<const OutputRecord> records) {
    for (const OutputRecord& rec : records) {
        if (!status_) return;
        Inst& in = insts_.try_emplace(rec.inst, Inst{-1, CheckpointDecoder(m_, info_)}).first->second;
        if (rec.kind == BLUE_OUT_BEGIN) {
            in.tag = rec.value;
            continue;
        }
        if (rec.kind == BLUE_OUT_END) {
            in.tag = -1;
            continue;
        }
        if (in.tag < 0) continue;
        auto fed = in.dec.feed(rec);
        if (!fed) {
            status_ = Status(fed.status()).prefix(strFormat("cascade output of instance %u", rec.inst));
        } else if (fed.value() == CheckpointDecoder::Feed::DONE) {
            status_ = sink_(uint32_t(in.tag), in.dec.checkpoint());
        }
    }
}

CascadeResume CascadeResume::initial(const CascadeInfo& info) {
    CascadeResume r;
    r.loops.assign(info.loops, 0);
    r.stats.assign(info.stages.size(), StageWords{});
    r.slots.assign(info.slots.size(), {});
    return r;
}

void CascadeResume::apply(const CascadeCheckpoint& c) {
    step = c.step;
    runs = c.runs;
    total = c.total;
    loops = c.loops;
    stats[c.stage] = c.stats;
    slots[c.slot] = c.tokens;
}

std::vector<uint32_t> CascadeResume::block(const CascadeInfo& info) const {
    std::vector<uint32_t> b = {step, runs, total};
    b.insert(b.end(), loops.begin(), loops.end());
    for (const StageWords& s : stats) b.insert(b.end(), s.begin(), s.end());
    for (size_t k = 0; k < slots.size(); ++k) {
        b.push_back(uint32_t(slots[k].size()));
        b.insert(b.end(), slots[k].begin(), slots[k].end());
        b.resize(b.size() + info.slot_capacity[k] - slots[k].size(), 0);
    }
    return b;
}

}  // namespace blue
