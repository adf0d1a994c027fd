// ServingEngine (see serving.h).
#include "host/llm/serving.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>

#include "vm/abi.h"
#include "vm/kv_pages_abi.h"
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
    uint32_t cached_tokens = 0;  // prefix reuse: the program's OUTU after BEGIN
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
    LogprobRecords logprobs;           // of the token on its way (when asked)
    std::string session;               // the conversation it is a turn of ("" none)
    bool embed = false;                // an embedding request: the program's float records
    std::vector<float> embedding;      // ... collected here, delivered with the finish

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
    if (engine.deviceLost()) BLUE_TRY(engine.resetDevice());  // an engine made again after a loss
    auto m = engine.createMachine(options.instances, options.chain_cycles, 0xFFFFFFFFull);
    if (!m) return m.status();
    s->machine_ = std::move(m.value());
    s->serving_.assign(options.instances, 0xFFFFFFFFu);
    s->metrics_.instances = options.instances;
    s->metrics_.kv_page = engine.kvPage();
    s->metrics_.kv_pages = engine.kvPages();
    s->metrics_.queue_capacity = s->options_.max_queue;
    s->driver_ = std::thread([p = s.get()] { p->driverLoop(); });
    return s;
}

Result<uint64_t> ServingEngine::submit(GenerationRequest request, std::vector<std::string> stop,
                                       StreamCallback callback, bool* queue_full,
                                       bool* unavailable, const std::string& session, bool* session_busy) {
    if (queue_full) *queue_full = false;
    if (unavailable) *unavailable = false;
    BLUE_TRY(engine_.validate(request));
    request.top_logprobs = std::min(request.top_logprobs, engine_.config().n_vocab);
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return Status::error("the server is shutting down");
    if (health_.state == ServeState::Recovering) {
        if (unavailable) *unavailable = true;
        return Status::error("the device is being rebuilt after a failure (" + health_.failure +
                             "); retry later");
    }
    if (session_busy) *session_busy = false;
    uint64_t waiting = 0;
    for (const auto& [tag, a] : active_) waiting += a->started ? 0 : 1;
    if (waiting >= options_.max_queue) {
        ++metrics_.requests_rejected;
        if (queue_full) *queue_full = true;
        return BLUE_ERROR("the queue is full (%llu requests waiting for %u instances)",
                          (unsigned long long)waiting, options_.instances);
    }
    bool defer = false;
    if (!session.empty()) BLUE_TRY(claimSession(session, &request, session_busy, &defer));
    uint64_t id = next_id_++;
    request.tag = uint32_t(id);
    bool fresh = request.prompt.size() == 1 && int32_t(request.prompt[0]) == engine_.tokenizer().bos();
    auto a = std::make_unique<Active>(engine_.tokenizer(), fresh);
    a->id = id;
    a->tag = request.tag;
    a->max_new = request.max_new;
    a->prompt_tokens = uint32_t(request.prompt.size());
    a->embed = request.embed;
    a->session = session;
    a->callback = std::move(callback);
    for (std::string& s : stop) {
        if (!s.empty()) a->stop.push_back(std::move(s));
    }
    if (defer) {  // queued behind the turn its instance is still ending (endSessionTurn)
        sessions_[session].next = encodeRequest(request);
        sessions_[session].next_id = id;
    } else {
        if (!session.empty()) sessions_[session].tag = request.tag;
        to_push_.emplace_back(id, encodeRequest(request));
    }
    active_[a->tag] = std::move(a);
    ++metrics_.requests_total;
    metrics_.prompt_tokens += request.prompt.size();
    lock.unlock();
    wake_.notify_all();
    return id;
}

void ServingEngine::endSessionTurn(const std::string& name) {
    auto s = sessions_.find(name);
    if (s == sessions_.end()) return;
    if (s->second.next.empty()) {
        s->second.busy = false;
        return;
    }
    // The waiting turn goes into the input ring now; the driver pushes it on its next pass.
    s->second.tag = uint32_t(s->second.next_id);
    to_push_.emplace_back(s->second.next_id, std::move(s->second.next));
    s->second.next.clear();
}

Status ServingEngine::claimSession(const std::string& name, GenerationRequest* r, bool* busy, bool* defer) {
    const uint32_t slots = engine_.sessions();
    if (slots == 0) return Status::error("this server keeps no sessions (start it with --sessions N)");
    if (name.size() > 256) return Status::error("a session id is at most 256 bytes");
    if (r->embed) return Status::error("an embedding is not a turn of a session");
    auto it = sessions_.find(name);
    bool fresh = it == sessions_.end();
    if (!fresh && it->second.busy) {
        auto running = active_.find(it->second.tag);
        const bool ending = running != active_.end() && running->second->finished;
        if (!ending || !it->second.next.empty()) {
            if (busy) *busy = true;
            return BLUE_ERROR("session '%s' has a turn running: send the next one after it ends", name.c_str());
        }
        *defer = true;  // its client has the answer; the instance is only ending it
    }
    if (fresh) {
        std::vector<bool> used(slots, false);
        for (const auto& [n, s] : sessions_) used[s.slot] = true;
        uint32_t slot = uint32_t(std::find(used.begin(), used.end(), false) - used.begin());
        if (slot == slots) {  // all taken: forget the least recently used idle conversation
            auto lru = sessions_.end();
            for (auto s = sessions_.begin(); s != sessions_.end(); ++s) {
                if (!s->second.busy && (lru == sessions_.end() || s->second.used < lru->second.used)) lru = s;
            }
            if (lru == sessions_.end()) {
                if (busy) *busy = true;
                return BLUE_ERROR("all %u session slots have a turn running", slots);
            }
            slot = lru->second.slot;
            sessions_.erase(lru);
            ++metrics_.session_evictions;
        }
        it = sessions_.emplace(name, Session{slot, 0, false}).first;
    }
    it->second.busy = true;
    it->second.used = ++session_clock_;
    r->session = it->second.slot + 1;
    r->session_new = fresh;
    metrics_.sessions = sessions_.size();
    return Status::ok();
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
    m.recoveries = health_.recoveries;
    return m;
}

ServeHealth ServingEngine::health() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return health_;
}

void ServingEngine::log(const std::string& line) const {
    if (options_.log) {
        options_.log(line);
    } else {
        std::fprintf(stderr, "bluevm: %s\n", line.c_str());
    }
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
    ev.cached_tokens = a.cached_tokens;
    ev.completion_tokens = a.tokens;
    ev.embedding = std::move(a.embedding);
    a.pending.push_back(std::move(ev));
    ++metrics_.requests_finished;
    if (reason == FinishReason::Cancelled) ++metrics_.requests_cancelled;
    if (reason == FinishReason::Cancelled || reason == FinishReason::Stop) {
        a.cancel_requested = true;
        if (a.started && machine_) machine_->setFlag(a.instance, a.tag + 1);
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
            if (rec.kind == BLUE_OUT_UINT) {  // prefix reuse (vm/llm_abi.h), right after BEGIN
                a.cached_tokens = rec.value;
                ++metrics_.prefix_hits;
                metrics_.prefix_tokens += rec.value;
                continue;
            }
            if (a.embed && rec.kind == BLUE_OUT_FLOAT) {
                a.embedding.push_back(std::bit_cast<float>(rec.value));
                continue;
            }
            if (a.logprobs.take(rec)) continue;
            if (rec.kind == BLUE_OUT_TOKEN && !a.finished) {
                ++a.tokens;
                ++metrics_.completion_tokens;
                a.text += a.decoder.push(int32_t(rec.value));
                StreamEvent ev;
                ev.id = a.id;
                ev.tokens.push_back(rec.value);
                if (auto lp = a.logprobs.pop()) ev.logprobs.push_back(std::move(*lp));
                ev.prompt_tokens = a.prompt_tokens;
                ev.cached_tokens = a.cached_tokens;
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
                        ev.cached_tokens = a.cached_tokens;
                        ev.completion_tokens = a.tokens;
                        a.emitted = a.text.size();
                        a.pending.push_back(std::move(ev));
                    }
                    // Length: max_new reached, or the context filled (the program stops there).
                    const bool full = !a.embed && (a.tokens >= a.max_new ||
                                                   a.prompt_tokens + a.tokens + 1 >= engine_.contextLength());
                    finishRequest(a, a.cancel_requested ? FinishReason::Cancelled
                                     : full             ? FinishReason::Length
                                                        : FinishReason::Stop);
                }
                serving_[rec.inst] = 0xFFFFFFFFu;
                for (StreamEvent& ev : a.pending) deliveries.emplace_back(a.callback, std::move(ev));
                // The program saved the turn into its slot before this end marker.
                if (!a.session.empty()) endSessionTurn(a.session);
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

void ServingEngine::takePending(Deliveries* out) {
    for (auto& [tag, a] : active_) {
        for (StreamEvent& ev : a->pending) out->emplace_back(a->callback, std::move(ev));
        a->pending.clear();
    }
}

bool ServingEngine::serveStep() {
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
            finishRequest(*it->second, FinishReason::Error);
            it->second->pending.back().error = s.message();
            refused.push_back(it->first);
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
        takePending(&deliveries);
        for (uint32_t tag : refused) active_.erase(tag);
        keep_going = stopping_ || !active_.empty();
    }
    for (auto& [cb, ev] : deliveries) {
        if (cb) cb(ev);
    }
    clearVkFailure();
    Result<bool> progressed = machine_->pump(
        [this](std::span<const OutputRecord> recs) { handleRecords(recs); }, keep_going);
    if (!progressed) {
        failAll(progressed.status());
        return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // Counters go on across device rebuilds: the machines before this one are in retired_.
    setGpuCounters(metrics_, retired_, machine_->stats());  // the driver is the machine's only user
    if (!progressed.value() && stopping_) health_.state = ServeState::Stopped;
    return true;
}

void ServingEngine::driverLoop() {
    for (;;) {
        if (!machine_ && !recover()) break;
        if (!serveStep()) continue;
        std::lock_guard<std::mutex> lock(mutex_);
        if (health_.state == ServeState::Stopped) break;  // input closed, every instance halted
    }
    std::lock_guard<std::mutex> lock(mutex_);
    health_.state = ServeState::Stopped;
}

// A chain failed: the machine is gone. Every request not finished ends with the failure, which
// names the call and what was running; the machine is destroyed (after the GPU drains).
void ServingEngine::failAll(const Status& failure) {
    engine_.noteDeviceFailure();  // marks the device lost when it was
    const GpuStats& st = machine_->stats();
    Deliveries deliveries;
    std::string message;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        std::string running;
        size_t n_running = 0, n_waiting = 0;
        for (auto& [tag, a] : active_) {
            if (a->finished) continue;
            if (a->started) {
                running += strFormat("%s%llu (instance %u)", n_running++ ? ", " : "",
                                     (unsigned long long)a->id, a->instance);
            } else {
                ++n_waiting;
            }
        }
        message = failure.message() + " while serving ";
        message += n_running ? strFormat("request%s %s", n_running > 1 ? "s" : "", running.c_str())
                             : std::string("no running request");
        if (n_waiting) message += strFormat(", %zu waiting", n_waiting);
        message += strFormat(" (after %llu chain submits, at VM cycle %llu)",
                             (unsigned long long)st.submits, (unsigned long long)st.cycles);
        for (auto& [tag, a] : active_) {
            if (a->finished) continue;
            finishRequest(*a, FinishReason::Error);
            a->pending.back().error = message;
            a->pending.back().device_failure = true;
        }
        takePending(&deliveries);
        active_.clear();
        sessions_.clear();  // the new machine's session store starts empty
        metrics_.sessions = 0;
        to_push_.clear();
        to_cancel_.clear();
        serving_.assign(options_.instances, 0xFFFFFFFFu);
        addGpuCounters(retired_, st);
        health_.state = ServeState::Recovering;
        health_.failure = message;
        health_.failed_attempts = 0;
        health_.attempt_error.clear();
    }
    for (auto& [cb, ev] : deliveries) {
        if (cb) cb(ev);
    }
    log(message + "; rebuilding the device");
    machine_.reset();
}

// Rebuilds the device, the pipelines and the machine until it works or the engine stops.
bool ServingEngine::recover() {
    ServeRebuild r{mutex_, wake_, stopping_, health_, machine_, options_.recovery_delay_ms,
                   options_.recovery_delay_max_ms, [this](const std::string& line) { log(line); }};
    return rebuildAfterFailure(r, [this]() -> Result<std::unique_ptr<GpuMachine>> {
        BLUE_TRY(engine_.resetDevice());
        return engine_.createMachine(options_.instances, options_.chain_cycles, 0xFFFFFFFFull);
    });
}

bool rebuildAfterFailure(const ServeRebuild& r,
                         const std::function<Result<std::unique_ptr<GpuMachine>>()>& attempt) {
    uint32_t delay_ms = r.delay_ms;
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(r.mutex);
            if (r.stopping) return false;
        }
        auto m = attempt();
        if (m) {
            std::unique_lock<std::mutex> lock(r.mutex);
            r.machine = std::move(m.value());
            r.health.state = ServeState::Serving;
            const uint32_t n = ++r.health.recoveries;
            lock.unlock();
            r.log(strFormat("the device is rebuilt (recovery %u); serving again", n));
            return true;
        }
        std::unique_lock<std::mutex> lock(r.mutex);
        const uint32_t failed = ++r.health.failed_attempts;
        r.health.attempt_error = m.message();
        lock.unlock();
        r.log(strFormat("rebuilding the device failed (attempt %u): %s; retrying in %u ms", failed,
                        m.message().c_str(), delay_ms));
        lock.lock();
        if (r.wake.wait_for(lock, std::chrono::milliseconds(delay_ms), [&] { return r.stopping; })) {
            return false;
        }
        delay_ms = std::min(delay_ms * 2, std::max(r.delay_max_ms, r.delay_ms));
    }
}

void addGpuCounters(GpuStats& retired, const GpuStats& current) {
    retired.submits += current.submits;
    retired.round_trips += current.round_trips;
    retired.cycles += current.cycles;
    retired.resumes += current.resumes;
    retired.expert_bytes += current.expert_bytes;
    retired.expert_hits += current.expert_hits;
    retired.expert_misses += current.expert_misses;
    retired.expert_inplace += current.expert_inplace;
    retired.expert_paged_bytes += current.expert_paged_bytes;
    // A rebuilt machine starts its pool empty; the peak before it stays the run's.
    retired.heap_watch[BLUE_KVP_PEAK] = std::max(retired.heap_watch[BLUE_KVP_PEAK], current.heap_watch[BLUE_KVP_PEAK]);
    retired.heap_watch[BLUE_KVP_EVICTIONS] += current.heap_watch[BLUE_KVP_EVICTIONS];
}

void setGpuCounters(ServeMetrics& m, const GpuStats& retired, const GpuStats& current) {
    m.submits = retired.submits + current.submits;
    m.round_trips = retired.round_trips + current.round_trips;
    m.cycles = retired.cycles + current.cycles;
    m.resumes = retired.resumes + current.resumes;
    m.expert_bytes = retired.expert_bytes + current.expert_bytes;
    m.expert_hits = retired.expert_hits + current.expert_hits;
    m.expert_misses = retired.expert_misses + current.expert_misses;
    m.expert_inplace = retired.expert_inplace + current.expert_inplace;
    m.expert_paged_bytes = retired.expert_paged_bytes + current.expert_paged_bytes;
    m.kv_pages_in_use = current.heap_watch[BLUE_KVP_IN_USE];
    m.kv_pages_committed = current.heap_watch[BLUE_KVP_COMMITTED];
    m.kv_pages_peak = std::max(retired.heap_watch[BLUE_KVP_PEAK], current.heap_watch[BLUE_KVP_PEAK]);
    m.kv_evictions = uint64_t(retired.heap_watch[BLUE_KVP_EVICTIONS]) + current.heap_watch[BLUE_KVP_EVICTIONS];
}

}  // namespace blue
