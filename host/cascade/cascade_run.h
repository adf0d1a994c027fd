// Running a compiled cascade (compiler/cascade/cascade.h): opens its models once, uploads their
// weights (shared by every instance and stage), feeds tasks into the input ring and decodes the
// results the program writes at each request's end (vm/cascade_abi.h). Every decision between
// the task and the result runs in the module's control code on the GPU (or on the reference
// interpreter); the host only encodes the task and decodes the output records.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "compiler/cascade/cascade.h"
#include "host/cascade/cascade_checkpoint.h"
#include "compiler/tokenizer.h"
#include "host/device.h"
#include "host/machine.h"
#include "host/pipelines.h"
#include "vm/module.h"
#include "vm/weights.h"

namespace blue {

struct CascadeRunOptions {
    std::string device;        // see DeviceOptions::select
    bool reference = false;    // the CPU reference interpreter instead of the GPU
    uint32_t instances = 1;    // tasks run at once
    // Instances beside them that run fork branches (cascades with `fork K`); -1: K - 1 per task
    // run at once, so every branch of a fork runs at the same time.
    int32_t siblings = -1;
    uint32_t chain_cycles = 64;
    double max_submit_ms = -1;  // GpuOptions::max_submit_ms
    uint64_t max_cycles = 0;    // watchdog (0: 10 million cycles)
    bool profile = false;       // time every kernel with GPU timestamps (GpuOptions::profile)
    // Model files by name, replacing the module's (same tensors, types and shapes).
    std::map<std::string, std::string> models;
};

struct StageStats {
    std::string name;
    uint32_t state = 0;  // BLUE_CAS_STATE_*
    uint32_t tokens = 0, cycles = 0, runs = 0;
    uint32_t drafted = 0, accepted = 0, passes = 0;  // speculative stages (passes: target verifications)
    uint32_t choice = 0;                             // select stages: the option written; fork: the branch kept
    uint32_t branches = 0, siblings = 0;             // fork stages: branches, of which siblings ran
    uint32_t branch_tokens = 0;                      // fork stages: tokens of all branches
    bool select = false;                             // (set by the runner from the module)
    float entropy_sum = 0, entropy_max = 0, logprob_sum = 0;
    // Time (ms) of the last run and of all runs: their cycles mapped onto the chain times the host
    // measured (CascadeRunner::run); < 0 when not measured (served requests, old modules).
    double ms = -1, ms_total = -1;
    float entropyMean() const { return tokens ? entropy_sum / float(tokens) : 0.0f; }
    float logprobMean() const { return tokens ? logprob_sum / float(tokens) : 0.0f; }
    const char* stateName() const;  // "ran", "skipped", "no budget", "not reached"
};

struct CascadeTask {
    std::string text;
    uint32_t seed = 0;
    // Continue from this state (durable slots) instead of from the start; must outlive run().
    const CascadeResume* resume = nullptr;
};

struct CascadeResult {
    bool complete = false;  // the program reported every stage and slot
    std::vector<StageStats> stages;
    std::vector<std::vector<int32_t>> slots;  // CascadeInfo::slots order
    std::vector<std::string> slot_text;
    uint32_t generated = 0;  // tokens over all stages' last runs
    std::vector<CascadeCheckpoint> checkpoints;  // those the program reported, in order
    // The stream slot's tokens the program streamed (final text, a prefix of the slot's tokens).
    std::vector<int32_t> streamed;
    struct StageRun {
        uint32_t stage = 0, start = 0, cycles = 0;  // from the stage-time records
    };
    std::vector<StageRun> runs;  // in the order they ran
};

// Decodes a cascade module's output records (vm/cascade_abi.h) incrementally: records of many
// instances interleave; each instance reports one request at a time between OUTBEGIN and OUTEND.
// Used by CascadeRunner (all records at the end) and CascadeServingEngine (as chains drain).
class CascadeDecoder {
public:
    // `info`, `tokenizer` and `module` must outlive the decoder. With the module, checkpoint
    // records (durable slots) are decoded into CascadeResult::checkpoints; without, a module that
    // writes them cannot be decoded.
    CascadeDecoder(const CascadeInfo& info, const Tokenizer& tokenizer, const Module* module = nullptr)
        : info_(info), tokenizer_(tokenizer), module_(module) {}
    // Takes one record. When it ends a request (OUTEND), returns true and moves the request's
    // tag and result (complete only when every stage and slot was reported) into the outputs.
    // A record that breaks the protocol fails, naming the instance and the record.
    Result<bool> push(const OutputRecord& rec, uint32_t* tag, CascadeResult* result);
    // Requests begun and not ended (the instance's tag and what arrived so far), then forgets them.
    std::vector<std::pair<uint32_t, CascadeResult>> takeUnfinished();
    // The stream-slot tokens instance `inst`'s current request streamed so far (empty: none).
    std::span<const int32_t> streamed(uint32_t inst) const;

private:
    struct Cursor {
        int64_t tag = -1;   // the request the instance reports (-1: none)
        size_t field = 0;   // records of the current request so far
        size_t slot = 0;    // slot being read
        uint32_t left = 0;  // its tokens still to come
        bool in_slot_tokens = false;
        // A stream or stage-time record group (vm/cascade_abi.h) being read.
        enum class Side { None, StreamCount, StreamTokens, Time } side = Side::None;
        uint32_t side_left = 0;
        CascadeResult result;
    };
    // Takes a record of a stream or stage-time group; false: the record is not one.
    Result<bool> pushSide(Cursor& c, const OutputRecord& rec);
    void finish(CascadeResult& r) const;  // slot texts and the generated count

    const CascadeInfo& info_;
    const Tokenizer& tokenizer_;
    const Module* module_;
    std::map<uint32_t, Cursor> cursors_;  // by instance
    std::map<uint32_t, CheckpointDecoder> checkpoints_;  // by instance
};

class CascadeRunner {
public:
    ~CascadeRunner();
    // `path`: a .bir written by `bluec cascade`. Fails with a message naming the file, the
    // model or the override that is wrong, or the device problem.
    static Result<std::unique_ptr<CascadeRunner>> open(const std::string& path, const CascadeRunOptions& options);

    const CascadeInfo& info() const { return info_; }
    const Tokenizer& tokenizer() const { return tokenizer_; }
    const Module& module() const { return module_; }
    const CascadeRunOptions& options() const { return options_; }
    std::string deviceName() const;  // "reference interpreter" without a device

    // A machine with `instances` instances of the cascade on the runner's device, for callers
    // that feed it themselves (CascadeServingEngine). Fails on the reference interpreter.
    Result<std::unique_ptr<GpuMachine>> createMachine(uint32_t instances, uint32_t chain_cycles,
                                                      uint64_t max_cycles);
    // Builds the device and pipelines again (after a lost device); machines made before must
    // be gone.
    Status resetDevice();

    // Runs the tasks to completion, `options.instances` at a time. A task longer than the input
    // slot is refused before anything runs. `on_checkpoint(task index, checkpoint)` is called
    // as each checkpoint arrives (while the run goes on); its first failure ends the run's
    // result with that failure (the run itself is not interrupted).
    Result<std::vector<CascadeResult>> run(const std::vector<CascadeTask>& tasks,
                                           const CheckpointStream::Sink& on_checkpoint = {});

    // The last run's counters as one JSON object (GPU: GpuStats; reference: cycles and steps).
    const std::string& statsJson() const { return stats_json_; }
    const GpuStats& gpuStats() const { return gpu_stats_; }
    // Validation-layer findings on the runner's device (0 on the reference interpreter).
    // Safe while another thread serves (resetDevice may replace the device meanwhile).
    uint32_t validationErrors() const;

private:
    CascadeRunner() = default;
    Result<std::vector<CascadeResult>> decode(std::span<const OutputRecord> records, size_t tasks) const;
    // The longest history a stage's penalties can walk: the program's context (its largest
    // stage's; 0 if it names none), which sets sampling's width on CPU drivers (sampleWidth).
    uint32_t historyLength() const;

    CascadeRunOptions options_;
    Module module_;
    CascadeInfo info_;
    Tokenizer tokenizer_;
    std::unique_ptr<WeightSource> weights_;
    std::unique_ptr<Device> device_;
    std::unique_ptr<Pipelines> pipelines_;
    std::string stats_json_;
    GpuStats gpu_stats_;
    uint32_t retired_validation_errors_ = 0;  // of devices resetDevice() replaced
    mutable std::mutex device_mutex_;         // guards device_ against validationErrors()
};

// The input-ring message of a task (vm/cascade_abi.h): tag, seed, flags, then the resume block
// when `resume` is not empty, then the task's tokens.
std::vector<uint32_t> cascadeRequest(uint32_t tag, uint32_t seed, std::span<const int32_t> tokens,
                                     std::span<const uint32_t> resume = {});

// `{"stages":[...],"generated":N}`: one result's statistics as JSON (for --stats and traces);
// stages whose time was measured add "ms" (last run) and "ms_total" (all runs).
std::string cascadeStatsJson(const CascadeResult& r);

// Sets every stage's ms and ms_total from the result's stage runs and the run's clock (points of
// cycles done and ms, increasing): a run of cycles [start, start + cycles) takes
// t(start + cycles) - t(start), t interpolated linearly between points (from (0, 0)). A stage
// that did not run gets 0.
void cascadeStageTimes(CascadeResult& r, std::span<const CycleTime> clock);

}  // namespace blue
