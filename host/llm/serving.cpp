// ServingEngine (see serving.h).
#include "host/llm/serving.h"

#include <algorithm>

#include "vm/abi.h"
#include "vm/llm_abi.h"

namespace blue {

const char* finishReasonName(FinishReason r) {
    switch (r) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        case FinishReason::Error: return "error";
        case FinishReason::None: break;
    }
    return "none";
}

struct ServingEngine::Active {
    uint64_t id = 0;
    uint32_t tag = 0;
    uint32_t max_new = 0;
    uint32_t prompt_tokens = 0;
    StreamCallback callback;
    std::vector<std::string> stop;
    TokenStreamDecoder decoder;
    std::string text;       // all text so far
    size_t emitted = 0;     // bytes of `text` already sent
    uint32_t tokens = 0;
    bool started = false;   // BEGIN seen: an instance serves it
    uint32_t instance = 0;
    bool cancel_requested = false;
    bool finished = false;  // the callback got its finish (the GPU may still be ending it)
    std::vector<StreamEvent> pending;  // events to deliver outside the lock

    Active(const Tokenizer& tok, bool fresh) : decoder(tok, false, fresh) {}
};

ServingEngine::ServingEngine(Engine& e, const ServeOptions& o) : engine_(e), options_(o) {}

ServingEngine::~ServingEngine() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    if (driver_.joinable()) driver_.join();
}

Result<std::unique_ptr<ServingEngine>> ServingEngine::create(Engine& engine, const ServeOptions& options) {
    std::unique_ptr<ServingEngine> s(new ServingEngine(engine, options));
    if (s->options_.max_queue == 0) s->options_.max_queue = 8 * options.instances;
    auto m = engine.createMachine(options.instances, options.chain_cycles, 0xFFFFFFFFull);
    if (!m) return m.status();
    s->machine_ = std::move(m.value());
    s->serving_.assign(options.instances, 0xFFFFFFFFu);
    s->metrics_.instances = options.instances;
    s->metrics_.queue_capacity = s->options_.max_queue;
    s->driver_ = std::thread([p = s.get()] { p->driverLoop(); });
    return s;
}

Result<uint64_t> ServingEngine::submit(GenerationRequest request, std::vector<std::string> stop,
                                       StreamCallback callback, bool* queue_full) {
    if (queue_full) *queue_full = false;
    BLUE_TRY(engine_.validate(request));
    std::unique_lock<std::mutex> lock(mutex_);
    if (!failure_.isOk()) return failure_;
    if (stopping_) return Status::error("the server is shutting down");
    uint64_t waiting = 0;
    for (const auto& [tag, a] : active_) waiting += a->started ? 0 : 1;
    if (waiting >= options_.max_queue) {
        ++metrics_.requests_rejected;
        if (queue_full) *queue_full = true;
        return BLUE_ERROR("the queue is full (%llu requests waiting for %u instances)",
                          (unsigned long long)waiting, options_.instances);
    }
    uint64_t id = next_id_++;
    request.tag = uint32_t(id);
    bool fresh = request.prompt.size() == 1 && int32_t(request.prompt[0]) == engine_.tokenizer().bos();
    auto a = std::make_unique<Active>(engine_.tokenizer(), fresh);
    a->id = id;
    a->tag = request.tag;
    a->max_new = request.max_new;
    a->prompt_tokens = uint32_t(request.prompt.size());
    a->callback = std::move(callback);
    for (std::string& s : stop) {
        if (!s.empty()) a->stop.push_back(std::move(s));
    }
    to_push_.emplace_back(id, encodeRequest(request));
    active_[a->tag] = std::move(a);
    ++metrics_.requests_total;
    metrics_.prompt_tokens += request.prompt.size();
    lock.unlock();
    wake_.notify_all();
    return id;
}

void ServingEngine::cancel(uint64_t id) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        to_cancel_.push_back(id);
    }
    wake_.notify_all();
}

ServeMetrics ServingEngine::metrics() const {
    std::lock_guard<std::mutex> lock(mutex_);
    ServeMetrics m = metrics_;
    m.queue_depth = 0;
    m.busy_instances = 0;
    for (const auto& [tag, a] : active_) {
        if (!a->started) ++m.queue_depth;
    }
    for (uint32_t t : serving_) m.busy_instances += t != 0xFFFFFFFFu;
    return m;
}

// Ends a request for its client (under the lock). The GPU may still be running it: the instance
// is told to stop and its end marker frees the entry later.
void ServingEngine::finishRequest(Active& a, FinishReason reason) {
    if (a.finished) return;
    a.finished = true;
    StreamEvent ev;
    ev.id = a.id;
    ev.finished = true;
    ev.reason = reason;
    ev.prompt_tokens = a.prompt_tokens;
    ev.completion_tokens = a.tokens;
    a.pending.push_back(std::move(ev));
    ++metrics_.requests_finished;
    if (reason == FinishReason::Cancelled) ++metrics_.requests_cancelled;
    if (reason == FinishReason::Cancelled || reason == FinishReason::Stop) {
        a.cancel_requested = true;
        if (a.started) machine_->setFlag(a.instance, a.tag + 1);
    }
}

namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that
// must be held back because the next token may complete a stop string.
size_t heldBackForStops(const std::string& text, const std::vector<std::string>& stops) {
    size_t held = 0;
    for (const std::string& s : stops) {
        for (size_t n = std::min(s.size() - 1, text.size()); n > held; --n) {
            if (text.compare(text.size() - n, n, s, 0, n) == 0) {
                held = n;
                break;
            }
        }
    }
    return held;
}

}  // namespace

void ServingEngine::handleRecords(std::span<const OutputRecord> records) {
    std::vector<std::pair<StreamCallback, StreamEvent>> deliveries;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const OutputRecord& rec : records) {
            if (rec.inst >= serving_.size()) continue;
            if (rec.kind == BLUE_OUT_BEGIN) {
                serving_[rec.inst] = rec.value;
                auto it = active_.find(rec.value);
                if (it == active_.end()) continue;
                it->second->started = true;
                it->second->instance = rec.inst;
                if (it->second->cancel_requested) machine_->setFlag(rec.inst, rec.value + 1);
                continue;
            }
            auto it = active_.find(serving_[rec.inst]);
            if (it == active_.end()) continue;
            Active& a = *it->second;
            if (rec.kind == BLUE_OUT_TOKEN && !a.finished) {
                ++a.tokens;
                ++metrics_.completion_tokens;
                a.text += a.decoder.push(int32_t(rec.value));
                StreamEvent ev;
                ev.id = a.id;
                ev.tokens.push_back(rec.value);
                ev.prompt_tokens = a.prompt_tokens;
                ev.completion_tokens = a.tokens;
                size_t cut = std::string::npos;
                for (const std::string& s : a.stop) {
                    size_t from = a.emitted > s.size() ? a.emitted - s.size() : 0;
                    size_t at = a.text.find(s, from);
                    if (at != std::string::npos && at < cut) cut = at;
                }
                size_t until = cut != std::string::npos ? cut : a.text.size() - heldBackForStops(a.text, a.stop);
                if (until > a.emitted) {
                    ev.text = a.text.substr(a.emitted, until - a.emitted);
                    a.emitted = until;
                }
                a.pending.push_back(std::move(ev));
                if (cut != std::string::npos) {
                    a.text.resize(cut);
                    finishRequest(a, FinishReason::Stop);
                }
            } else if (rec.kind == BLUE_OUT_END) {
                if (!a.finished) {
                    a.text += a.decoder.finish();
                    if (a.text.size() > a.emitted) {
                        StreamEvent ev;
                        ev.id = a.id;
                        ev.text = a.text.substr(a.emitted);
                        ev.prompt_tokens = a.prompt_tokens;
                        ev.completion_tokens = a.tokens;
                        a.emitted = a.text.size();
                        a.pending.push_back(std::move(ev));
                    }
                    // Length: max_new reached, or the context filled (the program stops there).
                    const bool full = a.tokens >= a.max_new ||
                                      a.prompt_tokens + a.tokens + 1 >= engine_.contextLength();
                    finishRequest(a, a.cancel_requested ? FinishReason::Cancelled
                                     : full             ? FinishReason::Length
                                                        : FinishReason::Stop);
                }
                serving_[rec.inst] = 0xFFFFFFFFu;
                for (StreamEvent& ev : a.pending) deliveries.emplace_back(a.callback, std::move(ev));
                active_.erase(it);
                continue;
            }
            for (StreamEvent& ev : a.pending) deliveries.emplace_back(a.callback, std::move(ev));
            a.pending.clear();
        }
    }
    for (auto& [cb, ev] : deliveries) {
        if (cb) cb(ev);
    }
}

void ServingEngine::driverLoop() {
    auto sink = [this](std::span<const OutputRecord> recs) { handleRecords(recs); };
    for (;;) {
        bool keep_going;
        std::vector<std::pair<StreamCallback, StreamEvent>> deliveries;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] {
                return stopping_ || !to_push_.empty() || !to_cancel_.empty() || !active_.empty() ||
                       machine_->inFlight();
            });
            for (auto& [id, msg] : to_push_) {
                Status s = machine_->pushInput(std::move(msg));
                if (!s) failure_ = s;
            }
            to_push_.clear();
            for (uint64_t id : to_cancel_) {
                for (auto& [tag, a] : active_) {
                    if (a->id == id) finishRequest(*a, FinishReason::Cancelled);
                }
            }
            to_cancel_.clear();
            if (stopping_) {
                for (auto& [tag, a] : active_) finishRequest(*a, FinishReason::Cancelled);
                machine_->closeInput();
            }
            for (auto& [tag, a] : active_) {
                for (StreamEvent& ev : a->pending) deliveries.emplace_back(a->callback, std::move(ev));
                a->pending.clear();
            }
            keep_going = stopping_ || !active_.empty();
        }
        for (auto& [cb, ev] : deliveries) {
            if (cb) cb(ev);
        }
        Result<bool> progressed = machine_->pump(sink, keep_going);
        if (!progressed) {
            deliveries.clear();
            {
                std::lock_guard<std::mutex> lock(mutex_);
                failure_ = progressed.status();
                for (auto& [tag, a] : active_) finishRequest(*a, FinishReason::Error);
                for (auto& [tag, a] : active_) {
                    for (StreamEvent& ev : a->pending) deliveries.emplace_back(a->callback, std::move(ev));
                }
                active_.clear();
            }
            for (auto& [cb, ev] : deliveries) {
                if (cb) cb(ev);
            }
            return;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        const GpuStats& st = machine_->stats();  // the driver is the machine's only user
        metrics_.submits = st.submits;
        metrics_.round_trips = st.round_trips;
        metrics_.cycles = st.cycles;
        metrics_.resumes = st.resumes;
        if (!progressed.value() && stopping_) return;  // input closed, every instance halted
    }
}

}  // namespace blue
