// Checkpoints of a running cascade (vm/cascade_abi.h): the program writes one to the output ring
// after every stage statement it runs or skips; the host decodes them (CheckpointDecoder), folds
// them into the state a resume request carries (CascadeResume), and encodes that state into the
// request's resume block. The host never reads GPU memory for this: only the records the program
// chose to write.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "compiler/cascade/cascade.h"
#include "vm/cascade_abi.h"
#include "vm/interp.h"
#include "vm/module.h"
#include "vm/status.h"

namespace blue {

using StageWords = std::array<uint32_t, BLUE_CAS_STAGE_WORDS>;  // BLUE_CAS_ST_* order

struct CascadeCheckpoint {
    uint32_t step = 0;   // 1..CascadeInfo::steps
    uint32_t stage = 0;  // index into CascadeInfo::stages
    uint32_t runs = 0;   // stage runs of the request so far (seeds the next run)
    uint32_t total = 0;  // tokens the request generated so far (the budget's counter)
    std::vector<uint32_t> loops;  // CascadeInfo::loops counters, outermost first
    StageWords stats{};           // the stage's statistics after the step
    uint32_t slot = 0;            // the slot the stage writes (index into CascadeInfo::slots)
    std::vector<uint32_t> tokens; // that slot's whole contents
    bool operator==(const CascadeCheckpoint&) const = default;
};

// Checks a checkpoint against the module's shape (step, stage, slot, lengths); the message
// names what is out of range.
Status checkCheckpoint(const CascadeCheckpoint& c, const CascadeInfo& info);

// Recognizes and decodes the checkpoint records of one instance's output.
class CheckpointDecoder {
public:
    enum class Feed { NOT_MINE, MORE, DONE };
    // `m` and `info` must outlive the decoder.
    CheckpointDecoder(const Module& m, const CascadeInfo& info) : m_(&m), info_(&info) {}
    // NOT_MINE: the record is not part of a checkpoint; MORE: it is, and more follow; DONE: it
    // completed checkpoint(). Fails on a malformed checkpoint (wrong record kind or a value out
    // of the module's range).
    Result<Feed> feed(const OutputRecord& rec);
    const CascadeCheckpoint& checkpoint() const { return cur_; }
    bool inside() const { return field_ > 0; }

private:
    const Module* m_;
    const CascadeInfo* info_;
    CascadeCheckpoint cur_;
    size_t field_ = 0;  // records of the current checkpoint so far (0: none begun)
    uint32_t left_ = 0; // slot tokens still to come
};

// Follows the output of every instance as it arrives and calls `sink(request tag, checkpoint)`
// for each completed checkpoint. The first failure (malformed output, or the sink's) is kept
// and returned by status(); later records are ignored.
class CheckpointStream {
public:
    using Sink = std::function<Status(uint32_t tag, const CascadeCheckpoint&)>;
    CheckpointStream(const Module& m, const CascadeInfo& info, Sink sink)
        : m_(m), info_(info), sink_(std::move(sink)) {}
    void feed(std::span<const OutputRecord> records);
    const Status& status() const { return status_; }

private:
    struct Inst {
        int64_t tag = -1;
        CheckpointDecoder dec;
    };
    const Module& m_;
    const CascadeInfo& info_;
    Sink sink_;
    std::map<uint32_t, Inst> insts_;
    Status status_;
};

// The state a resume request restores: everything the checkpoints so far reported.
struct CascadeResume {
    uint32_t step = 0, runs = 0, total = 0;
    std::vector<uint32_t> loops;
    std::vector<StageWords> stats;              // per stage
    std::vector<std::vector<uint32_t>> slots;   // per slot (without `input`)

    // The state of a request before its first stage.
    static CascadeResume initial(const CascadeInfo& info);
    // Folds in the next checkpoint (already checked with checkCheckpoint).
    void apply(const CascadeCheckpoint& c);
    // The request's resume block (vm/cascade_abi.h).
    std::vector<uint32_t> block(const CascadeInfo& info) const;
};

}  // namespace blue
