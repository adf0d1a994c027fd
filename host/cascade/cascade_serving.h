// Serving a compiled cascade to many concurrent requests, like ServingEngine serves one model
// (host/llm/serving.h): one GpuMachine with N instances of the cascade module stays up; a driver
// thread pushes each request (its tag, seed and task tokens) into the input ring and drains the
// output ring while chains run. Free instances take the next request on the GPU (the cascade
// program loops back to INRECV), so the host decides nothing between a request's input and its
// output: it keeps submitting chains while it has requests that have not ended (round_trips 0).
//
// A cascade reports a request's slots and stage statistics at the request's end (vm/cascade_abi.h),
// so a request's callback is called once, with the whole result, decoded by CascadeDecoder as its
// instance's records arrive. Before that, the text the program streams (the final writes of the
// answer slot, vm/cascade_abi.h) goes to the request's text callback as it arrives, in whole
// UTF-8 characters (TokenStreamDecoder); the answer slot's final text begins with all of it.
//
// Cancellation: the host sets the serving instance's flag word to tag + 1; the program checks it
// after every token and ends the request with OUTEND alone. Device failures end every request not
// yet finished with FinishReason::Error (`device_failure`); the driver then rebuilds the device and
// the machine (CascadeRunner::resetDevice) and serves again, retrying with a doubling delay.
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

#include "host/cascade/cascade_run.h"
#include "host/llm/serving.h"

namespace blue {

struct CascadeServeOptions {
    uint32_t instances = 4;
    uint32_t max_queue = 0;      // requests waiting for an instance (0: 8 per instance)
    uint32_t chain_cycles = 32;  // cycles per chain: fewer notice cancellations sooner
    uint32_t recovery_delay_ms = 250;
    uint32_t recovery_delay_max_ms = 30000;
    std::function<void(const std::string&)> log;  // device failures and rebuilds (default: stderr)
};

// How a request ended, given once to its callback.
struct CascadeOutcome {
    uint64_t id = 0;
    // Stop: the program ran to its end; Length: a stage found the token budget spent;
    // Cancelled; Error (with `error`, and `device_failure` when the device failed).
    FinishReason reason = FinishReason::None;
    CascadeResult result;  // complete unless cancelled or failed
    uint32_t prompt_tokens = 0;  // the task's tokens
    std::string error;
    bool device_failure = false;
};

// Called on the driver thread (or in the destructor); must not block for long.
using CascadeCallback = std::function<void(const CascadeOutcome&)>;
// Streamed answer text of request `id` (never empty), before its outcome; same thread rules.
using CascadeTextCallback = std::function<void(uint64_t id, const std::string& text)>;

// Why submit() refused a request.
enum class CascadeRefusal { None, Invalid, TooLong, QueueFull, Unavailable, ShuttingDown };

class CascadeServingEngine {
public:
    ~CascadeServingEngine();  // cancels what is running and stops the driver
    CascadeServingEngine(const CascadeServingEngine&) = delete;
    CascadeServingEngine& operator=(const CascadeServingEngine&) = delete;

    // `runner` (opened for the GPU) must outlive the serving engine.
    static Result<std::unique_ptr<CascadeServingEngine>> create(CascadeRunner& runner,
                                                                const CascadeServeOptions& options);

    // Queues a task. Fails naming the reason: a task longer than the input slot (TooLong), a full
    // queue (QueueFull), a device being rebuilt (Unavailable), a stopping engine (ShuttingDown).
    // `on_text` (may be empty) receives the streamed answer text.
    Result<uint64_t> submit(const std::string& task, uint32_t seed, CascadeCallback callback,
                            CascadeRefusal* refusal = nullptr, CascadeTextCallback on_text = {});
    // Ends a request early (its callback gets a Cancelled outcome). Unknown ids are ignored.
    void cancel(uint64_t id);

    ServeMetrics metrics() const;
    ServeHealth health() const;
    CascadeRunner& runner() { return runner_; }

private:
    struct Active;
    using Deliveries = std::vector<std::pair<CascadeCallback, CascadeOutcome>>;
    using TextDeliveries = std::vector<std::pair<CascadeTextCallback, std::pair<uint64_t, std::string>>>;
    void takeStreamed(Active& a, uint32_t inst, TextDeliveries* out);
    CascadeServingEngine(CascadeRunner& r, const CascadeServeOptions& o);
    void driverLoop();
    bool serveStep();  // false: a chain failed
    void handleRecords(std::span<const OutputRecord> records);
    void finishRequest(Active& a, FinishReason reason, Deliveries* out, CascadeResult result = {},
                       const std::string& error = "");
    void failAll(const Status& failure);
    bool recover();  // false: stopping
    void log(const std::string& line) const;

    CascadeRunner& runner_;
    CascadeServeOptions options_;
    std::unique_ptr<GpuMachine> machine_;  // the driver thread's; null while recovering
    CascadeDecoder decoder_;               // the driver thread's
    std::thread driver_;

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    ServeHealth health_;
    GpuStats retired_;  // counters of machines that device failures ended
    uint64_t next_id_ = 1;
    std::deque<std::pair<uint64_t, std::vector<uint32_t>>> to_push_;
    std::vector<uint64_t> to_cancel_;
    std::map<uint32_t, std::unique_ptr<Active>> active_;  // by tag: submitted, GPU not done
    std::vector<uint32_t> serving_;                        // instance -> tag (or ~0)
    ServeMetrics metrics_;
};

}  // namespace blue
