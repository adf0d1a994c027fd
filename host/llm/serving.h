// Serving: many concurrent requests on one engine. One GpuMachine with N instances stays up; a
// driver thread moves requests into the input ring and drains the output ring while chains run.
// Free instances take requests on the GPU (the generation program loops back to INRECV), so
// continuous batching needs no host decision: the host only keeps submitting chains while it
// has requests that have not ended, and stops when it has none.
//
// Cancellation (client gone, stop string seen): the host sets the serving instance's flag word
// to tag + 1; the program checks it after every token and ends the request.
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
    bool finished = false;
    FinishReason reason = FinishReason::None;
    uint32_t prompt_tokens = 0;
    uint32_t completion_tokens = 0;  // total so far
};

// Called on the driver thread; must not block for long. Whatever it refers to must outlive the
// ServingEngine: its destructor cancels running requests and calls back with their finish.
using StreamCallback = std::function<void(const StreamEvent&)>;

struct ServeOptions {
    uint32_t instances = 4;
    uint32_t max_queue = 0;     // requests waiting for an instance (0: 8 per instance)
    uint32_t chain_cycles = 16; // shorter chains stream tokens sooner
};

struct ServeMetrics {
    uint64_t requests_total = 0, requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
    uint64_t prompt_tokens = 0, completion_tokens = 0;
    uint64_t queue_depth = 0;      // accepted, not yet started on an instance
    uint32_t queue_capacity = 0;   // ServeOptions::max_queue
    uint64_t busy_instances = 0;
    uint32_t instances = 0;
    uint64_t submits = 0, round_trips = 0, cycles = 0, resumes = 0;
};

class ServingEngine {
public:
    ~ServingEngine();  // cancels what is running and stops the driver
    ServingEngine(const ServingEngine&) = delete;
    ServingEngine& operator=(const ServingEngine&) = delete;

    // `engine` must outlive the serving engine.
    static Result<std::unique_ptr<ServingEngine>> create(Engine& engine, const ServeOptions& options);

    // Queues a request; `stop` strings end it when they appear in the text (the text is cut
    // before them). Fails when the request is invalid (message names the field) or the queue is
    // full (`*queue_full` set).
    Result<uint64_t> submit(GenerationRequest request, std::vector<std::string> stop,
                            StreamCallback callback, bool* queue_full = nullptr);
    // Ends a request early (its callback gets a Cancelled finish). Unknown ids are ignored.
    void cancel(uint64_t id);

    ServeMetrics metrics() const;
    Engine& engine() { return engine_; }

private:
    struct Active;
    ServingEngine(Engine& e, const ServeOptions& o);
    void driverLoop();
    void handleRecords(std::span<const OutputRecord> records);
    void finishRequest(Active& a, FinishReason reason);

    Engine& engine_;
    ServeOptions options_;
    std::unique_ptr<GpuMachine> machine_;
    std::thread driver_;

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    Status failure_;  // a Vulkan failure stops serving; later submits get it
    uint64_t next_id_ = 1;
    std::deque<std::pair<uint64_t, std::vector<uint32_t>>> to_push_;  // encoded, not yet queued
    std::vector<uint64_t> to_cancel_;
    std::map<uint32_t, std::unique_ptr<Active>> active_;  // by tag: submitted, not finished
    std::vector<uint32_t> serving_;                        // instance -> tag (or ~0)
    ServeMetrics metrics_;
};

}  // namespace blue
