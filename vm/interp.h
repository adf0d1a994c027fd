// The reference machine: a plain CPU interpreter of Blue-IR that defines its semantics. The GPU
// runtime (host/) must produce the same per-instance output for every program; tests compare them.
//
// Execution is in cycles, exactly as on the GPU:
//   1. sequencer: each instance in id order that is RUNNING (a PARKED one becomes RUNNING first)
//      runs control code until it parks on a block (RUN), yields, halts, faults, or has run
//      layout.max_steps instructions;
//   2. blocks: each block that at least one instance asked for runs its tensor instructions over
//      the rows and instances that asked, in the order they asked.
// The run ends when no instance is RUNNING or PARKED, or fails when max_cycles pass first.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "vm/module.h"
#include "vm/tensor_ops.h"
#include "vm/weights.h"

namespace blue {

struct OutputRecord {
    uint32_t inst = 0;
    uint32_t kind = 0;  // BLUE_OUT_*
    uint32_t value = 0;
    bool operator==(const OutputRecord&) const = default;
};

struct MachineOptions {
    uint32_t instances = 1;
    uint64_t max_cycles = 1000000;
    // Steps an instance runs in one cycle at most, below the module's max_steps (0: max_steps).
    // The GPU machine caps them on devices whose compiler limits loops (host: maxCycleSteps);
    // the same cap here gives the same cycle and step counts.
    uint32_t cycle_steps = 0;
};

struct InstanceReport {
    uint32_t pc = 0;
    uint32_t status = 0;  // BLUE_ST_*
    uint32_t fault = 0;   // BLUE_FAULT_* when status is BLUE_ST_FAULT
};

struct RunReport {
    Status status;           // ok, or why the run did not finish (watchdog)
    uint64_t cycles = 0;     // cycles in which at least one instance was live
    uint64_t steps = 0;      // control instructions executed
    uint64_t block_runs = 0; // (cycle, block) pairs that ran
    std::vector<OutputRecord> output;
    std::vector<InstanceReport> instances;
};

// Name of a fault code, e.g. "division by zero".
const char* faultName(uint32_t fault);
// One line per faulted instance ("instance 3: division by zero at instruction 12 (DIVS)"),
// at most `limit` lines; empty when none faulted.
std::string describeFaults(const Module& m, const std::vector<InstanceReport>& insts,
                           size_t limit = 8);
// The watchdog message naming the instances still live.
std::string describeUnfinished(const std::vector<InstanceReport>& insts, uint64_t cycles);

// Whether the reference interpreter can run `m`: it cannot run custom kernels' SPIR-V (KERNEL), so
// a module that carries any is refused with a message naming them.
Status refCanRun(const Module& m);

class RefMachine {
public:
    // `m` must have passed verifyModule and, with `weights`, outlive the machine.
    RefMachine(const Module& m, const WeightSource& weights, MachineOptions options);

    // Queues an input message (at most layout.in_slot_words - 1 words).
    void pushInput(std::vector<uint32_t> message);
    // After this, INRECV returns -1 once every queued message has been claimed.
    void closeInput();
    // Sets host flag word `index` (read by INFLAG); out-of-range indices are ignored.
    void setFlag(uint32_t index, uint32_t value) {
        if (index < flags_.size()) flags_[index] = value;
    }

    RunReport run();

    // Called after every cycle's blocks have run, with the cycle number (tools that inspect
    // tensors step by step, e.g. logits).
    void setAfterCycle(std::function<void(uint64_t cycle)> hook) { after_cycle_ = std::move(hook); }
    // Called after every cycle that wrote output, with that cycle's records (hosts that act on
    // output as it arrives, as they do with the GPU's; run()'s report still holds them all).
    void setOnOutput(std::function<void(std::span<const OutputRecord>)> hook) { on_output_ = std::move(hook); }

    // Reference tensor storage, for tests that inspect results.
    const RefTensors& tensors() const { return tensors_; }
    // The heap shared by all instances (counters a program keeps there, e.g. vm/kv_pages_abi.h).
    std::span<const uint32_t> heap() const { return heap_; }

private:
    struct Inst {
        uint32_t pc = 0, status = 0, fault = 0, sp = 0;
        std::vector<uint32_t> regs, stack;
        std::span<uint32_t> local;  // this instance's part of locals_
        std::deque<std::pair<uint32_t, uint64_t>> mailbox;  // value, cycle it was sent in
    };
    enum class Next { CONTINUE, STOP };

    void feedInput();
    void runSequencer(RunReport* report, BlockRun* runs);
    Next step(uint32_t id, Inst& in, BlockRun* runs, RunReport* report);
    Next fault(Inst& in, uint32_t code);
    Next execRun(uint32_t id, Inst& in, uint32_t block, uint32_t arg_reg, BlockRun* runs);
    Next execInput(uint32_t id, Inst& in, uint8_t op, uint32_t a, uint32_t b, uint32_t c);
    Next execWalk(Inst& in, uint8_t op, uint32_t a, uint32_t b, uint32_t c);
    void runBlocks(BlockRun* runs, RunReport* report);

    const Module& m_;
    MachineOptions opt_;
    std::vector<Inst> insts_;
    std::vector<uint32_t> heap_;
    std::vector<uint32_t> flags_;  // [instances] host flag words
    uint32_t bump_ = 0;
    std::vector<uint32_t> block_args_;  // [instances * BLUE_MAX_BLOCK_ARGS]
    std::vector<uint32_t> locals_;      // [instances * local_words], shared with tensor ops
    RefTensors tensors_;
    uint64_t cycle_ = 0;
    std::function<void(std::span<const OutputRecord>)> on_output_;
    std::function<void(uint64_t)> after_cycle_;

    // Input ring: messages wait in `pending_` until their slot (index % in_slots) is free.
    std::deque<std::vector<uint32_t>> pending_;
    std::vector<std::vector<uint32_t>> slots_;
    std::vector<bool> slot_busy_;
    uint64_t published_ = 0, claimed_ = 0;
    bool input_closed_ = false;
};

}  // namespace blue
