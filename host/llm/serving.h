// Serving: many concurrent requests on one engine. One GpuMachine with N instances stays up; a
// driver thread moves requests into the input ring and drains the output ring while chains run.
// Free instances take requests on the GPU (the generation program loops back to INRECV), so
// continuous batching needs no host decision: the host only keeps submitting chains while it
// has requests that have not ended, and stops when it has none.
//
// Cancellation (client gone, stop string seen): the host sets the serving instance's flag word
// to tag + 1; the program checks it after every token and ends the request.
//
// Device loss: when a chain fails (VK_ERROR_DEVICE_LOST, out of device memory, any Vulkan
// failure), every request not yet finished ends with FinishReason::Error and `device_failure`,
// its message naming the call and what was running; the driver then rebuilds the device, the
// pipelines and the machine (uploading the weights again from the open model) and serves again.
// Meanwhile health() says Recovering and submit() refuses with `*unavailable`. A rebuild that
// fails is retried with a doubling delay, for as long as the engine lives.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/llm/engine.h"

namespace blue {

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finishReasonName(FinishReason r);  // "stop", "length", "cancelled", "error"

// What a request's callback receives: new text (possibly empty) and, once, the end.
struct StreamEvent {
    uint64_t id = 0;
    std::string text;             // text produced since the previous event
    std::vector<uint32_t> tokens; // tokens produced since the previous event
    std::vector<TokenLogprobs> logprobs;  // of those tokens, when the request asked
    bool finished = false;
    FinishReason reason = FinishReason::None;
    uint32_t prompt_tokens = 0;
    uint32_t completion_tokens = 0;  // total so far
    uint32_t cached_tokens = 0;      // leading prompt tokens the instance did not recompute
    std::vector<float> embedding;    // with the finish of an embedding request: the pooled vector
                                     // (n_embd elements when it ran to its end; not normalised)
    // With FinishReason::Error: what failed and what was running, and whether it was the device
    // (the engine is rebuilding it: the request may be sent again).
    std::string error;
    bool device_failure = false;
};

// Called on the driver thread; must not block for long. Whatever it refers to must outlive the
// ServingEngine: its destructor cancels running requests and calls back with their finish.
using StreamCallback = std::function<void(const StreamEvent&)>;

struct ServeOptions {
    uint32_t instances = 4;
    uint32_t max_queue = 0;     // requests waiting for an instance (0: 8 per instance)
    uint32_t chain_cycles = 16; // shorter chains stream tokens sooner
    // Device rebuilds: the delay after a failed attempt, doubling up to the maximum.
    uint32_t recovery_delay_ms = 250;
    uint32_t recovery_delay_max_ms = 30000;
    // Where device failures and rebuilds are reported, one line each (default: stderr).
    std::function<void(const std::string&)> log;
};

enum class ServeState { Serving, Recovering, Stopped };

struct ServeHealth {
    ServeState state = ServeState::Serving;
    uint32_t recoveries = 0;       // device rebuilds that succeeded
    uint32_t failed_attempts = 0;  // rebuild attempts that failed since the last failure
    std::string failure;           // the last device failure and what was running ("" if none)
    std::string attempt_error;     // why the last rebuild attempt failed ("" if none)
};

struct ServeMetrics {
    uint64_t requests_total = 0, requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    uint64_t queue_depth = 0;      // accepted, not yet started on an instance
    uint32_t queue_capacity = 0;   // ServeOptions::max_queue
    uint64_t busy_instances = 0;
    uint32_t instances = 0;
    uint64_t submits = 0, round_trips = 0, cycles = 0, resumes = 0;
    uint64_t recoveries = 0;  // device rebuilds after a failure
    uint64_t expert_bytes = 0;  // MoE: expert weight bytes read (GpuStats::expert_bytes)
    // MoE under --vram-budget with an expert cache (GpuStats::expert_hits ...).
    uint64_t expert_hits = 0, expert_misses = 0, expert_inplace = 0, expert_paged_bytes = 0;
    uint64_t prefix_hits = 0, prefix_tokens = 0;  // requests that reused KV rows; tokens not recomputed
    uint64_t sessions = 0;           // conversations kept in session slots now
    uint64_t session_evictions = 0;  // conversations dropped for a new one (least recently used)
    // Paged KV (--kv-page): positions per page and pages in each pool (0: per-instance caches);
    // pages held and reserved now, and the most held at once, as the last chain left them.
    uint32_t kv_page = 0, kv_pages = 0;
    uint64_t kv_pages_in_use = 0, kv_pages_committed = 0, kv_pages_peak = 0, kv_evictions = 0;
};

// The device rebuild that both serving engines (this one and CascadeServingEngine) run on their
// driver thread after a failure: calls `attempt` (a new device and machine) until it succeeds or
// `stopping` is set under `mutex` (then returns false). Each failed attempt is recorded in
// `health` and logged, and the next waits a delay doubling from `delay_ms` to `delay_max_ms`. On
// success, under `mutex`, the machine is installed and `health` says Serving with one more recovery.
struct ServeRebuild {
    std::mutex& mutex;
    std::condition_variable& wake;
    const bool& stopping;
    ServeHealth& health;
    std::unique_ptr<GpuMachine>& machine;
    uint32_t delay_ms, delay_max_ms;
    std::function<void(const std::string&)> log;
};
bool rebuildAfterFailure(const ServeRebuild& r,
                         const std::function<Result<std::unique_ptr<GpuMachine>>()>& attempt);

// The GPU counters of a serving engine's machines: `retired` (those device failures ended) plus
// the current one's.
void addGpuCounters(GpuStats& retired, const GpuStats& current);
void setGpuCounters(ServeMetrics& m, const GpuStats& retired, const GpuStats& current);

class ServingEngine {
public:
    ~ServingEngine();  // cancels what is running and stops the driver
    ServingEngine(const ServingEngine&) = delete;
    ServingEngine& operator=(const ServingEngine&) = delete;

    // `engine` must outlive the serving engine.
    static Result<std::unique_ptr<ServingEngine>> create(Engine& engine, const ServeOptions& options);

    // Queues a request; `stop` strings end it when they appear in the text (the text is cut
    // before them). Fails when the request is invalid (message names the field), the queue is
    // full (`*queue_full` set) or the device is being rebuilt (`*unavailable` set).
    //
    // `session` (not empty): the request is a turn of that conversation, kept in one of the
    // program's session slots (Engine::sessions) between requests, so its next turn, on whatever
    // instance takes it, reuses the KV rows of everything said so far. A new conversation takes a
    // free slot, else the least recently used idle one (whose conversation is forgotten). One
    // turn at a time: a turn sent while the previous one still runs fails with `*session_busy`
    // set, unless that one has already finished for its client (a stop string, a cancel) and
    // only its instance has not yet ended it: then the new turn waits here for that end. A new
    // conversation also fails so when every slot's has a turn running.
    Result<uint64_t> submit(GenerationRequest request, std::vector<std::string> stop,
                            StreamCallback callback, bool* queue_full = nullptr,
                            bool* unavailable = nullptr, const std::string& session = "",
                            bool* session_busy = nullptr);
    // Ends a request early (its callback gets a Cancelled finish). Unknown ids are ignored.
    void cancel(uint64_t id);

    ServeMetrics metrics() const;
    ServeHealth health() const;
    Engine& engine() { return engine_; }

private:
    struct Active;
    ServingEngine(Engine& e, const ServeOptions& o);
    using Deliveries = std::vector<std::pair<StreamCallback, StreamEvent>>;
    void driverLoop();
    bool serveStep();  // one pass of the driver; false: a chain failed
    void handleRecords(std::span<const OutputRecord> records);
    void finishRequest(Active& a, FinishReason reason);
    void takePending(Deliveries* out);
    void failAll(const Status& failure);
    bool recover();  // false: stopping
    void log(const std::string& line) const;

    Engine& engine_;
    ServeOptions options_;
    std::unique_ptr<GpuMachine> machine_;  // the driver thread's; null while recovering
    std::thread driver_;

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    ServeHealth health_;
    GpuStats retired_;  // counters of the machines that device failures ended
    uint64_t next_id_ = 1;
    std::deque<std::pair<uint64_t, std::vector<uint32_t>>> to_push_;  // encoded, not yet queued
    std::vector<uint64_t> to_cancel_;
    std::map<uint32_t, std::unique_ptr<Active>> active_;  // by tag: submitted, not finished
    // Conversations in session slots: name -> slot, when last used, whether a turn runs.
    struct Session {
        uint32_t slot = 0;
        uint64_t used = 0;
        bool busy = false;
        uint32_t tag = 0;                    // of the turn that runs (while busy)
        std::vector<uint32_t> next;          // a turn waiting for that one's end (encoded; empty: none)
        uint64_t next_id = 0;
    };
    std::map<std::string, Session> sessions_;
    uint64_t session_clock_ = 0;
    // Under mutex_: gives the request its slot; `*defer`: it must wait for the running turn's end.
    Status claimSession(const std::string& name, GenerationRequest* r, bool* busy, bool* defer);
    void endSessionTurn(const std::string& name);  // under mutex_, at a turn's end marker
    std::vector<uint32_t> serving_;                        // instance -> tag (or ~0)
    ServeMetrics metrics_;
};

}  // namespace blue
