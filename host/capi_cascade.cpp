// The C API's cascades (host/bluevm.h, "cascades") over CascadeRunner and CascadeServingEngine:
// open, submit/wait/cancel/release, and result accessors. Each request's outcome is kept until
// bluevm_cascade_wait hands it out as a bluevm_cascade_result the caller frees.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/bluevm.h"
#include "host/capi_internal.h"
#include "host/cascade/cascade_serving.h"
#include "host/cascade/cascade_trace.h"

using namespace blue::capi;

struct bluevm_cascade_result {
    bluevm_finish finish = BLUEVM_FINISH_NONE;
    bluevm_status error_status = BLUEVM_OK;
    std::string error;
    std::vector<std::string> slot_names, slot_text;  // CascadeInfo::slots order
    size_t answer = 0;                               // index of the answer slot
    std::string stats_json;
    uint32_t prompt_tokens = 0, completion_tokens = 0;
};

struct bluevm_cascade {
    std::unique_ptr<blue::CascadeRunner> runner;
    std::unique_ptr<blue::CascadeServingEngine> serving;
    std::string device;
    std::vector<const char*> stage_ptrs, slot_ptrs;
    uint32_t instances = 0;
    std::mutex mutex;
    std::condition_variable arrived;
    // Submitted and not yet handed out; null while the request runs.
    std::map<uint64_t, std::unique_ptr<bluevm_cascade_result>> requests;
    std::string trace_path;  // empty: no traces
    std::mutex trace_mutex;  // one line at a time
    // Streamed answer text per request: arrived and not yet taken, and the last text handed out
    // by bluevm_cascade_stream (kept until the next call).
    struct Streamed {
        std::string fresh, handed;
    };
    std::map<uint64_t, Streamed> streamed;

    ~bluevm_cascade() {
        serving.reset();  // cancels what runs; its callbacks only touch `requests`
        runner.reset();
    }
};

namespace {

// The answer slot: the last of the `output` line.
size_t answerSlot(const blue::CascadeInfo& info) {
    if (!info.outputs.empty()) return info.outputs.back();
    return info.slots.empty() ? 0 : info.slots.size() - 1;
}

std::unique_ptr<bluevm_cascade_result> resultOf(const blue::CascadeInfo& info,
                                                const blue::CascadeOutcome& o) {
    auto r = std::make_unique<bluevm_cascade_result>();
    r->finish = finishOf(o.reason);
    if (o.reason == blue::FinishReason::Error) {
        r->error_status = o.device_failure ? BLUEVM_ERR_DEVICE_LOST : BLUEVM_ERR_INTERNAL;
        r->error = o.error.empty() ? "the cascade failed; the request ended" : o.error;
    }
    r->slot_names = info.slots;
    r->slot_text = o.result.slot_text;
    r->slot_text.resize(info.slots.size());
    // The answer: the last output slot that holds text (a skipped stage leaves its slot empty,
    // e.g. entropy_skip's rewrite, and the draft before it stands), else the last output slot.
    r->answer = answerSlot(info);
    for (auto it = info.outputs.rbegin(); it != info.outputs.rend(); ++it) {
        if (*it < r->slot_text.size() && !r->slot_text[*it].empty()) {
            r->answer = *it;
            break;
        }
    }
    r->stats_json = o.result.stages.empty() ? std::string("{\"stages\":[],\"generated\":0}")
                                            : blue::cascadeStatsJson(o.result);
    r->prompt_tokens = o.prompt_tokens;
    r->completion_tokens = o.result.generated;
    return r;
}

bluevm_status statusOfRefusal(blue::CascadeRefusal why) {
    switch (why) {
        case blue::CascadeRefusal::TooLong:
            return BLUEVM_ERR_TOO_LONG;
        case blue::CascadeRefusal::QueueFull:
            return BLUEVM_ERR_QUEUE_FULL;
        case blue::CascadeRefusal::Unavailable:
            return BLUEVM_ERR_DEVICE_LOST;
        case blue::CascadeRefusal::ShuttingDown:
            return BLUEVM_ERR_SHUTDOWN;
        case blue::CascadeRefusal::Invalid:
        case blue::CascadeRefusal::None:
            break;
    }
    return BLUEVM_ERR_INVALID_ARGUMENT;
}

}  // namespace

extern "C" {

void bluevm_cascade_options_init(bluevm_cascade_options* o) {
    if (o) *o = bluevm_cascade_options{nullptr, 4, 0, 32, nullptr, nullptr, 0, nullptr};
}

bluevm_status bluevm_cascade_open(const char* path, const bluevm_cascade_options* options,
                                  bluevm_cascade** out) {
    return guarded([&] {
        if (!path || !out)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
        *out = nullptr;
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec)) {
            return failWith(BLUEVM_ERR_IO, std::string(path) + ": no such file");
        }
        bluevm_cascade_options o;
        bluevm_cascade_options_init(&o);
        if (options) o = *options;
        if (o.instances < 1 || o.instances > 4096) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT,
                            blue::strFormat("instances must be 1..4096, not %u", o.instances));
        }
        if (o.chain_cycles < 2 || o.chain_cycles > 4096) {
            return failWith(
                BLUEVM_ERR_INVALID_ARGUMENT,
                blue::strFormat("chain_cycles must be 2..4096, not %u", o.chain_cycles));
        }
        if (o.trace_path) {  // refused now rather than at the first request's end
            std::FILE* f = std::fopen(o.trace_path, "a");
            if (!f) return failWith(BLUEVM_ERR_IO, std::string(o.trace_path) + ": cannot open the trace file for appending");
            std::fclose(f);
        }
        if (o.n_models && (!o.model_names || !o.model_paths)) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT,
                            "model_names and model_paths must not be NULL when n_models is not 0");
        }
        blue::CascadeRunOptions ro;
        if (o.device) ro.device = o.device;
        ro.instances = o.instances;
        ro.chain_cycles = o.chain_cycles;
        for (size_t i = 0; i < o.n_models; ++i) {
            if (!o.model_names[i] || !o.model_paths[i]) {
                return failWith(BLUEVM_ERR_INVALID_ARGUMENT,
                                blue::strFormat("model %zu: NULL name or path", i));
            }
            ro.models[o.model_names[i]] = o.model_paths[i];
        }
        blue::clearVkFailure();
        auto runner = blue::CascadeRunner::open(path, ro);
        if (!runner) {
            const bool device = blue::lastVkFailure().result != VK_SUCCESS;
            return failWith(device ? deviceStatus() : BLUEVM_ERR_MODEL, runner.message());
        }
        auto c = std::make_unique<bluevm_cascade>();
        c->runner = std::move(runner.value());
        blue::CascadeServeOptions so;
        so.instances = o.instances;
        so.max_queue = o.max_queue;
        so.chain_cycles = o.chain_cycles;
        auto serving = blue::CascadeServingEngine::create(*c->runner, so);
        if (!serving) return failWith(deviceStatus(), serving.message());
        c->serving = std::move(serving.value());
        c->device = c->runner->deviceName();
        for (const std::string& s : c->runner->info().stages) c->stage_ptrs.push_back(s.c_str());
        for (const std::string& s : c->runner->info().slots) c->slot_ptrs.push_back(s.c_str());
        c->instances = o.instances;
        if (o.trace_path) c->trace_path = o.trace_path;
        *out = c.release();
        return ok();
    });
}

void bluevm_cascade_close(bluevm_cascade* cascade) {
    delete cascade;
}

bluevm_status bluevm_cascade_get_info(const bluevm_cascade* cascade, bluevm_cascade_info* out) {
    if (!cascade || !out)
        return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade and out must not be NULL");
    const blue::CascadeInfo& info = cascade->runner->info();
    *out = bluevm_cascade_info{};
    out->device = cascade->device.c_str();
    out->stages = cascade->stage_ptrs.data();
    out->n_stages = uint32_t(cascade->stage_ptrs.size());
    out->slots = cascade->slot_ptrs.data();
    out->n_slots = uint32_t(cascade->slot_ptrs.size());
    const size_t answer = answerSlot(info);
    out->answer_slot = answer < cascade->slot_ptrs.size() ? cascade->slot_ptrs[answer] : "";
    out->input_capacity = info.input_capacity;
    out->instances = cascade->instances;
    out->validation_errors = cascade->runner->validationErrors();
    return ok();
}

bluevm_status bluevm_cascade_submit(bluevm_cascade* cascade, const char* task, uint32_t seed,
                                    uint64_t* id) {
    return guarded([&] {
        if (!cascade || !task || !id)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade, task and id must not be NULL");
        bluevm_cascade* c = cascade;
        auto callback = [c, task = std::string(task), seed](const blue::CascadeOutcome& o) {
            auto r = resultOf(c->runner->info(), o);
            if (!c->trace_path.empty() &&
                (o.reason == blue::FinishReason::Stop || o.reason == blue::FinishReason::Length)) {
                std::lock_guard<std::mutex> lock(c->trace_mutex);
                blue::Status s = blue::appendTraceLine(
                    c->trace_path, blue::cascadeTraceLine(c->runner->info(), blue::CascadeTask{task, seed}, o.result));
                if (!s) std::fprintf(stderr, "bluevm: trace: %s\n", s.message().c_str());
            }
            {
                std::lock_guard<std::mutex> lock(c->mutex);
                auto it = c->requests.find(o.id);
                if (it != c->requests.end()) it->second = std::move(r);  // else: released
            }
            c->arrived.notify_all();
        };
        blue::CascadeRefusal why = blue::CascadeRefusal::None;
        auto on_text = [c](uint64_t rid, const std::string& text) {
            {
                std::lock_guard<std::mutex> lock(c->mutex);
                if (c->requests.count(rid)) c->streamed[rid].fresh += text;  // else: released
            }
            c->arrived.notify_all();
        };
        // Held across submit so that a wait cannot look for the id before it is registered; the
        // callbacks take the same lock on the driver thread, later.
        std::lock_guard<std::mutex> lock(c->mutex);
        auto submitted = c->serving->submit(task, seed, callback, &why, on_text);
        if (!submitted) return failWith(statusOfRefusal(why), submitted.message());
        c->requests[submitted.value()] = nullptr;
        *id = submitted.value();
        return ok();
    });
}

bluevm_status bluevm_cascade_wait(bluevm_cascade* cascade, uint64_t id, int timeout_ms,
                                  bluevm_cascade_result** out) {
    return guarded([&] {
        if (!cascade || !out)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade and out must not be NULL");
        *out = nullptr;
        std::unique_lock<std::mutex> lock(cascade->mutex);
        auto it = cascade->requests.find(id);
        if (it == cascade->requests.end()) {
            return failWith(BLUEVM_ERR_NOT_FOUND,
                            blue::strFormat("no cascade request %llu", (unsigned long long)id));
        }
        // Another thread may release the request meanwhile.
        auto ready = [&] {
            auto at = cascade->requests.find(id);
            return at == cascade->requests.end() || at->second != nullptr;
        };
        if (timeout_ms < 0) {
            cascade->arrived.wait(lock, ready);
        } else if (timeout_ms > 0) {
            cascade->arrived.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
        }
        it = cascade->requests.find(id);
        if (it == cascade->requests.end()) {
            return failWith(BLUEVM_ERR_NOT_FOUND,
                            blue::strFormat("cascade request %llu was released while waiting",
                                            (unsigned long long)id));
        }
        if (!it->second)
            return failWith(BLUEVM_ERR_TIMEOUT, "the request has not ended within the timeout");
        *out = it->second.release();
        cascade->requests.erase(it);
        cascade->streamed.erase(id);
        return ok();
    });
}

bluevm_status bluevm_cascade_stream(bluevm_cascade* cascade, uint64_t id, int timeout_ms,
                                    const char** text, size_t* len, int* ended) {
    return guarded([&] {
        if (!cascade || !text || !len)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade, text and len must not be NULL");
        *text = "";
        *len = 0;
        if (ended) *ended = 0;
        std::unique_lock<std::mutex> lock(cascade->mutex);
        auto news = [&] {
            auto at = cascade->requests.find(id);
            if (at == cascade->requests.end() || at->second != nullptr) return true;
            auto s = cascade->streamed.find(id);
            return s != cascade->streamed.end() && !s->second.fresh.empty();
        };
        if (cascade->requests.find(id) == cascade->requests.end()) {
            return failWith(BLUEVM_ERR_NOT_FOUND,
                            blue::strFormat("no cascade request %llu", (unsigned long long)id));
        }
        if (timeout_ms < 0) {
            cascade->arrived.wait(lock, news);
        } else if (timeout_ms > 0) {
            cascade->arrived.wait_for(lock, std::chrono::milliseconds(timeout_ms), news);
        }
        auto it = cascade->requests.find(id);
        if (it == cascade->requests.end()) {
            return failWith(BLUEVM_ERR_NOT_FOUND,
                            blue::strFormat("cascade request %llu was released while waiting",
                                            (unsigned long long)id));
        }
        auto& s = cascade->streamed[id];
        s.handed = std::move(s.fresh);
        s.fresh.clear();
        const bool done = it->second != nullptr;
        if (s.handed.empty() && !done)
            return failWith(BLUEVM_ERR_TIMEOUT, "nothing streamed within the timeout");
        *text = s.handed.c_str();
        *len = s.handed.size();
        if (ended) *ended = done ? 1 : 0;
        return ok();
    });
}

bluevm_status bluevm_cascade_cancel(bluevm_cascade* cascade, uint64_t id) {
    return guarded([&] {
        if (!cascade) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade must not be NULL");
        {
            std::lock_guard<std::mutex> lock(cascade->mutex);
            if (!cascade->requests.count(id)) {
                return failWith(BLUEVM_ERR_NOT_FOUND,
                                blue::strFormat("no cascade request %llu", (unsigned long long)id));
            }
        }
        cascade->serving->cancel(id);
        return ok();
    });
}

bluevm_status bluevm_cascade_release(bluevm_cascade* cascade, uint64_t id) {
    return guarded([&] {
        if (!cascade) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade must not be NULL");
        bool running;
        {
            std::lock_guard<std::mutex> lock(cascade->mutex);
            auto it = cascade->requests.find(id);
            if (it == cascade->requests.end()) {
                return failWith(BLUEVM_ERR_NOT_FOUND,
                                blue::strFormat("no cascade request %llu", (unsigned long long)id));
            }
            running = it->second == nullptr;
            cascade->requests.erase(it);
            cascade->streamed.erase(id);
        }
        cascade->arrived.notify_all();  // a wait on it ends with NOT_FOUND
        if (running) cascade->serving->cancel(id);
        return ok();
    });
}

bluevm_status bluevm_cascade_run(bluevm_cascade* cascade, const char* task, uint32_t seed,
                                 bluevm_cascade_result** out) {
    if (!out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "out must not be NULL");
    *out = nullptr;
    uint64_t id = 0;
    if (bluevm_status s = bluevm_cascade_submit(cascade, task, seed, &id); s != BLUEVM_OK) return s;
    return bluevm_cascade_wait(cascade, id, -1, out);
}

bluevm_finish bluevm_cascade_result_finish(const bluevm_cascade_result* r) {
    return r ? r->finish : BLUEVM_FINISH_NONE;
}

const char* bluevm_cascade_result_error(const bluevm_cascade_result* r, bluevm_status* status) {
    if (status) *status = r ? r->error_status : BLUEVM_ERR_INVALID_ARGUMENT;
    return r ? r->error.c_str() : "";
}

const char* bluevm_cascade_result_answer(const bluevm_cascade_result* r, size_t* len) {
    if (!r || r->answer >= r->slot_text.size()) {
        if (len) *len = 0;
        return "";
    }
    if (len) *len = r->slot_text[r->answer].size();
    return r->slot_text[r->answer].c_str();
}

const char* bluevm_cascade_result_slot(const bluevm_cascade_result* r, const char* name,
                                       size_t* len) {
    if (len) *len = 0;
    if (!r || !name) return nullptr;
    for (size_t i = 0; i < r->slot_names.size(); ++i) {
        if (r->slot_names[i] != name) continue;
        if (len) *len = r->slot_text[i].size();
        return r->slot_text[i].c_str();
    }
    return nullptr;
}

const char* bluevm_cascade_result_stats_json(const bluevm_cascade_result* r) {
    return r ? r->stats_json.c_str() : "";
}

void bluevm_cascade_result_usage(const bluevm_cascade_result* r, uint32_t* prompt_tokens,
                                 uint32_t* completion_tokens) {
    if (prompt_tokens) *prompt_tokens = r ? r->prompt_tokens : 0;
    if (completion_tokens) *completion_tokens = r ? r->completion_tokens : 0;
}

void bluevm_cascade_result_free(bluevm_cascade_result* r) {
    delete r;
}

bluevm_status bluevm_cascade_metrics(const bluevm_cascade* cascade, bluevm_metrics* out) {
    if (!cascade || !out)
        return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade and out must not be NULL");
    metricsOut(cascade->serving->metrics(), out);
    return ok();
}

bluevm_status bluevm_cascade_health(const bluevm_cascade* cascade, bluevm_health* out) {
    if (!cascade || !out)
        return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "cascade and out must not be NULL");
    healthOut(cascade->serving->health(), out);
    return ok();
}

}  // extern "C"
