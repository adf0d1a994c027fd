// CascadeServingEngine (see cascade_serving.h).
#include "host/cascade/cascade_serving.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "host/vk_check.h"
#include "vm/abi.h"
#include "vm/cascade_abi.h"

namespace blue {

namespace {

constexpr uint32_t kNoTag = 0xFFFFFFFFu;

void deliver(std::vector<std::pair<CascadeCallback, CascadeOutcome>>& deliveries) {
    for (auto& [cb, outcome] : deliveries) {
        if (cb) cb(outcome);
    }
}

}  // namespace

struct CascadeServingEngine::Active {
    uint64_t id = 0;
    uint32_t tag = 0;
    uint32_t prompt_tokens = 0;
    CascadeCallback callback;
    bool started = false;  // OUTBEGIN seen: an instance serves it
    uint32_t instance = 0;
    bool cancel_requested = false;
    bool finished = false;  // the callback got its outcome (the GPU may still be ending it)
    CascadeTextCallback on_text;
    std::optional<TokenStreamDecoder> text;  // the streamed tokens' text, whole characters
    size_t streamed_taken = 0;               // streamed tokens decoded so far
};

CascadeServingEngine::CascadeServingEngine(CascadeRunner& r, const CascadeServeOptions& o)
    : runner_(r), options_(o), decoder_(r.info(), r.tokenizer(), &r.module()) {}

CascadeServingEngine::~CascadeServingEngine() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    if (driver_.joinable()) driver_.join();
}

Result<std::unique_ptr<CascadeServingEngine>> CascadeServingEngine::create(
    CascadeRunner& runner, const CascadeServeOptions& options) {
    if (options.instances < 1)
        return Status::error("a cascade serving engine needs at least one instance");
    std::unique_ptr<CascadeServingEngine> s(new CascadeServingEngine(runner, options));
    if (s->options_.max_queue == 0) s->options_.max_queue = 8 * options.instances;
    auto m = runner.createMachine(options.instances, options.chain_cycles, 0xFFFFFFFFull);
    if (!m) return m.status();
    s->machine_ = std::move(m.value());
    s->serving_.assign(options.instances, kNoTag);
    s->metrics_.instances = options.instances;
    s->metrics_.queue_capacity = s->options_.max_queue;
    s->driver_ = std::thread([p = s.get()] { p->driverLoop(); });
    return s;
}

Result<uint64_t> CascadeServingEngine::submit(const std::string& task, uint32_t seed,
                                              CascadeCallback callback, CascadeRefusal* refusal,
                                              CascadeTextCallback on_text) {
    CascadeRefusal dummy;
    CascadeRefusal& why = refusal ? *refusal : dummy;
    why = CascadeRefusal::None;
    std::vector<int32_t> ids = runner_.tokenizer().encode(task, false, true);
    const uint32_t capacity = runner_.info().input_capacity;
    if (ids.size() > capacity) {
        why = CascadeRefusal::TooLong;
        return BLUE_ERROR("the task has %zu tokens, more than the cascade's input slot holds (%u)",
                          ids.size(), capacity);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) {
        why = CascadeRefusal::ShuttingDown;
        return Status::error("the server is shutting down");
    }
    if (health_.state == ServeState::Recovering) {
        why = CascadeRefusal::Unavailable;
        return Status::error("the device is being rebuilt after a failure (" + health_.failure +
                             "); retry later");
    }
    uint64_t waiting = 0;
    for (const auto& [tag, a] : active_) waiting += a->started || a->finished ? 0 : 1;
    if (waiting >= options_.max_queue) {
        ++metrics_.requests_rejected;
        why = CascadeRefusal::QueueFull;
        return BLUE_ERROR("the queue is full (%llu requests waiting for %u instances)",
                          (unsigned long long)waiting, options_.instances);
    }
    uint64_t id = next_id_++;
    auto a = std::make_unique<Active>();
    a->id = id;
    a->tag = uint32_t(id);
    a->prompt_tokens = uint32_t(ids.size());
    a->callback = std::move(callback);
    a->on_text = std::move(on_text);
    to_push_.emplace_back(id, cascadeRequest(a->tag, seed, ids));
    active_[a->tag] = std::move(a);
    ++metrics_.requests_total;
    metrics_.prompt_tokens += ids.size();
    lock.unlock();
    wake_.notify_all();
    return id;
}

void CascadeServingEngine::cancel(uint64_t id) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        to_cancel_.push_back(id);
    }
    wake_.notify_all();
}

ServeMetrics CascadeServingEngine::metrics() const {
    std::lock_guard<std::mutex> lock(mutex_);
    ServeMetrics m = metrics_;
    m.queue_depth = 0;
    m.busy_instances = 0;
    for (const auto& [tag, a] : active_) m.queue_depth += a->started || a->finished ? 0 : 1;
    for (uint32_t t : serving_) m.busy_instances += t != kNoTag;
    m.recoveries = health_.recoveries;
    return m;
}

ServeHealth CascadeServingEngine::health() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return health_;
}

void CascadeServingEngine::log(const std::string& line) const {
    if (options_.log) {
        options_.log(line);
    } else {
        std::fprintf(stderr, "bluevm: %s\n", line.c_str());
    }
}

// Ends a request for its client (under the lock). When the GPU still runs it, its instance is told
// to stop; its end marker frees the entry later.
void CascadeServingEngine::finishRequest(Active& a, FinishReason reason, Deliveries* out,
                                         CascadeResult result, const std::string& error) {
    if (a.finished) return;
    a.finished = true;
    CascadeOutcome o;
    o.id = a.id;
    o.reason = reason;
    o.result = std::move(result);
    o.prompt_tokens = a.prompt_tokens;
    o.error = error;
    ++metrics_.requests_finished;
    metrics_.completion_tokens += o.result.generated;
    if (reason == FinishReason::Cancelled) {
        ++metrics_.requests_cancelled;
        a.cancel_requested = true;
        if (a.started && machine_) machine_->setFlag(a.instance, a.tag + 1);
    }
    out->emplace_back(a.callback, std::move(o));
}

// Decodes the tokens instance `inst` streamed for `a` since the last call into text for its
// text callback. A character split across tokens waits for its last byte; the answer's final
// text (Tokenizer::decode of the whole slot) begins with everything delivered.
void CascadeServingEngine::takeStreamed(Active& a, uint32_t inst, TextDeliveries* out) {
    std::span<const int32_t> tokens = decoder_.streamed(inst);
    if (a.finished || !a.on_text || a.streamed_taken >= tokens.size()) return;
    if (!a.text) a.text.emplace(runner_.tokenizer());
    std::string text;
    for (; a.streamed_taken < tokens.size(); ++a.streamed_taken) text += a.text->push(tokens[a.streamed_taken]);
    if (!text.empty()) out->push_back({a.on_text, {a.id, std::move(text)}});
}

void CascadeServingEngine::handleRecords(std::span<const OutputRecord> records) {
    Deliveries deliveries;
    TextDeliveries texts;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const OutputRecord& rec : records) {
            if (rec.inst >= serving_.size()) continue;
            if (rec.kind == BLUE_OUT_BEGIN) {
                serving_[rec.inst] = rec.value;
                if (auto it = active_.find(rec.value); it != active_.end()) {
                    it->second->started = true;
                    it->second->instance = rec.inst;
                    if (it->second->cancel_requested) machine_->setFlag(rec.inst, rec.value + 1);
                }
            }
            uint32_t tag = 0;
            CascadeResult result;
            auto ended = decoder_.push(rec, &tag, &result);
            auto it = active_.find(serving_[rec.inst]);
            if (!ended) {
                // The program broke the output protocol (a compiler bug): the request fails.
                if (it != active_.end()) {
                    finishRequest(*it->second, FinishReason::Error, &deliveries, {},
                                  ended.message());
                }
                continue;
            }
            if (!ended.value()) {
                if (rec.kind == BLUE_OUT_TOKEN && it != active_.end()) takeStreamed(*it->second, rec.inst, &texts);
                continue;
            }
            serving_[rec.inst] = kNoTag;
            if (it == active_.end()) continue;
            Active& a = *it->second;
            if (a.cancel_requested || a.finished) {
                finishRequest(a, FinishReason::Cancelled, &deliveries);
            } else if (!result.complete) {
                finishRequest(
                    a, FinishReason::Error, &deliveries, std::move(result),
                    "the cascade program ended the request without reporting every stage and slot");
            } else {
                bool budget = false;
                for (const StageStats& st : result.stages)
                    budget |= st.state == BLUE_CAS_STATE_NO_BUDGET;
                finishRequest(a, budget ? FinishReason::Length : FinishReason::Stop, &deliveries,
                              std::move(result));
            }
            active_.erase(it);
        }
    }
    for (auto& [cb, text] : texts) cb(text.first, text.second);  // before the outcomes they precede
    deliver(deliveries);
}

bool CascadeServingEngine::serveStep() {
    bool keep_going;
    Deliveries deliveries;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] {
            return stopping_ || !to_push_.empty() || !to_cancel_.empty() || !active_.empty() ||
                   machine_->inFlight();
        });
        std::vector<uint32_t> refused;  // requests the machine would not queue: they end here
        for (auto& [id, msg] : to_push_) {
            Status s = machine_->pushInput(std::move(msg));
            auto it = active_.find(uint32_t(id));
            if (s || it == active_.end()) continue;
            finishRequest(*it->second, FinishReason::Error, &deliveries, {}, s.message());
            refused.push_back(it->first);
        }
        to_push_.clear();
        for (uint64_t id : to_cancel_) {
            if (auto it = active_.find(uint32_t(id)); it != active_.end()) {
                finishRequest(*it->second, FinishReason::Cancelled, &deliveries);
            }
        }
        to_cancel_.clear();
        if (stopping_) {
            for (auto& [tag, a] : active_) finishRequest(*a, FinishReason::Cancelled, &deliveries);
            machine_->closeInput();
        }
        for (uint32_t tag : refused) active_.erase(tag);
        keep_going = stopping_ || !active_.empty();
    }
    deliver(deliveries);
    clearVkFailure();
    Result<bool> progressed = machine_->pump(
        [this](std::span<const OutputRecord> recs) { handleRecords(recs); }, keep_going);
    if (!progressed) {
        failAll(progressed.status());
        return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    setGpuCounters(metrics_, retired_, machine_->stats());
    if (!progressed.value() && stopping_) health_.state = ServeState::Stopped;
    return true;
}

void CascadeServingEngine::driverLoop() {
    for (;;) {
        if (!machine_ && !recover()) break;
        if (!serveStep()) continue;
        std::lock_guard<std::mutex> lock(mutex_);
        if (health_.state == ServeState::Stopped) break;  // input closed, every instance halted
    }
    std::lock_guard<std::mutex> lock(mutex_);
    health_.state = ServeState::Stopped;
}

// A chain failed: every request not finished ends with the failure; the machine is dropped.
void CascadeServingEngine::failAll(const Status& failure) {
    const GpuStats& st = machine_->stats();
    Deliveries deliveries;
    std::string message;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        size_t running = 0, waiting = 0;
        for (auto& [tag, a] : active_) {
            if (!a->finished) ++(a->started ? running : waiting);
        }
        message =
            failure.message() + strFormat(
                                    " while serving %zu cascade request%s (%zu waiting; after %llu "
                                    "chain submits, at VM cycle %llu)",
                                    running, running == 1 ? "" : "s", waiting,
                                    (unsigned long long)st.submits, (unsigned long long)st.cycles);
        for (auto& [tag, a] : active_) {
            if (a->finished) continue;
            finishRequest(*a, FinishReason::Error, &deliveries, {}, message);
            deliveries.back().second.device_failure = true;
        }
        active_.clear();
        to_push_.clear();
        to_cancel_.clear();
        serving_.assign(options_.instances, kNoTag);
        addGpuCounters(retired_, st);
        health_.state = ServeState::Recovering;
        health_.failure = message;
        health_.failed_attempts = 0;
        health_.attempt_error.clear();
    }
    deliver(deliveries);
    log(message + "; rebuilding the device");
    machine_.reset();
    decoder_.takeUnfinished();
}

// Rebuilds the device, the pipelines and the machine until it works or the engine stops.
bool CascadeServingEngine::recover() {
    ServeRebuild r{mutex_,
                   wake_,
                   stopping_,
                   health_,
                   machine_,
                   options_.recovery_delay_ms,
                   options_.recovery_delay_max_ms,
                   [this](const std::string& line) { log(line); }};
    return rebuildAfterFailure(r, [this]() -> Result<std::unique_ptr<GpuMachine>> {
        BLUE_TRY(runner_.resetDevice());
        return runner_.createMachine(options_.instances, options_.chain_cycles, 0xFFFFFFFFull);
    });
}

}  // namespace blue
