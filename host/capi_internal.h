// What the C API's source files (capi.cpp, capi_cascade.cpp) share: the calling thread's error
// message, status helpers and the guard that keeps C++ exceptions from crossing into C.
#pragma once

#include <cstdio>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "host/bluevm.h"
#include "host/llm/engine.h"
#include "host/llm/serving.h"
#include "host/llm/structured_output.h"
#include "host/vk_check.h"

struct bluevm_model {
    std::unique_ptr<blue::Engine> engine;
    std::string name, architecture, device, chat_template, pooling;
};

namespace blue::capi {

// A request's generation parameters (all but the prompt and stop strings).
inline void setRequestParams(const bluevm_request& in, GenerationRequest* r) {
    r->max_new = in.max_tokens;
    r->sampling.temperature = in.temperature;
    r->sampling.top_k = in.top_k;
    r->sampling.top_p = in.top_p;
    r->sampling.min_p = in.min_p;
    r->sampling.repeat_penalty = in.repeat_penalty;
    r->sampling.presence_penalty = in.presence_penalty;
    r->sampling.frequency_penalty = in.frequency_penalty;
    r->sampling.seed = in.seed;
    r->ignore_eog = in.ignore_eos != 0;
    r->logprobs = in.logprobs != 0;
    r->top_logprobs = in.top_logprobs;
    r->prefix_reuse = in.no_prefix_reuse == 0;
    r->embed = in.embed != 0;
}

// The request's structured-output constraint (API 8), compiled into r->grammar; the message
// names the field and what is wrong. *too_large (when given): the failure is an automaton larger
// than an instance's grammar memory (BLUEVM_ERR_GRAMMAR_TOO_LARGE).
inline Status setRequestConstraint(const bluevm_request& in, const Engine& e, GenerationRequest* r,
                                   bool* too_large = nullptr) {
    OutputConstraint c;
    int given = (in.grammar ? 1 : 0) + (in.json_schema ? 1 : 0) + (in.json_object ? 1 : 0);
    if (given > 1) return Status::error("at most one of grammar, json_schema and json_object");
    const char* field = "grammar";
    if (in.grammar) {
        c = {ConstraintKind::Grammar, in.grammar};
    } else if (in.json_schema) {
        c = {ConstraintKind::JsonSchema, in.json_schema};
        field = "json_schema";
    } else if (in.json_object) {
        c.kind = ConstraintKind::JsonObject;
        field = "json_object";
    }
    if (c.kind == ConstraintKind::None) return Status::ok();
    Result<PackedGrammar> g = compileConstraint(c, e.grammarWords(), too_large);
    if (!g) return Status::error(std::string(field) + ": " + g.status().message());
    r->grammar = g.value();
    return Status::ok();
}

inline thread_local std::string t_last_error;

inline bluevm_status failWith(bluevm_status s, const std::string& message) {
    t_last_error = message;
    return s;
}

inline bluevm_status ok() {
    t_last_error.clear();
    return BLUEVM_OK;
}

inline bluevm_finish finishOf(FinishReason r) {
    switch (r) {
        case FinishReason::Stop: return BLUEVM_FINISH_STOP;
        case FinishReason::Length: return BLUEVM_FINISH_LENGTH;
        case FinishReason::Cancelled: return BLUEVM_FINISH_CANCELLED;
        case FinishReason::Error: return BLUEVM_FINISH_ERROR;
        case FinishReason::None: break;
    }
    return BLUEVM_FINISH_NONE;
}

// The status of a failed device operation on this thread: device loss or out-of-device-memory
// (which a later attempt may overcome) or another device failure.
inline bluevm_status deviceStatus() {
    return vkFatal(lastVkFailure().result) ? BLUEVM_ERR_DEVICE_LOST : BLUEVM_ERR_DEVICE;
}

inline void healthOut(const ServeHealth& h, bluevm_health* out) {
    *out = bluevm_health{};
    out->state = h.state == ServeState::Recovering ? BLUEVM_ENGINE_RECOVERING
                 : h.state == ServeState::Stopped  ? BLUEVM_ENGINE_STOPPED
                                                   : BLUEVM_ENGINE_SERVING;
    out->recoveries = h.recoveries;
    out->failed_attempts = h.failed_attempts;
    std::snprintf(out->failure, sizeof out->failure, "%s", h.failure.c_str());
    std::snprintf(out->attempt_error, sizeof out->attempt_error, "%s", h.attempt_error.c_str());
}

inline void metricsOut(const ServeMetrics& m, bluevm_metrics* out) {
    out->requests_total = m.requests_total;
    out->requests_finished = m.requests_finished;
    out->requests_cancelled = m.requests_cancelled;
    out->requests_rejected = m.requests_rejected;
    out->prompt_tokens = m.prompt_tokens;
    out->completion_tokens = m.completion_tokens;
    out->queue_depth = m.queue_depth;
    out->queue_capacity = m.queue_capacity;
    out->busy_instances = m.busy_instances;
    out->instances = m.instances;
    out->submits = m.submits;
    out->round_trips = m.round_trips;
    out->cycles = m.cycles;
    out->resumes = m.resumes;
    out->recoveries = m.recoveries;
    out->expert_bytes = m.expert_bytes;
    out->prefix_hits = m.prefix_hits;
    out->prefix_tokens = m.prefix_tokens;
    out->expert_hits = m.expert_hits;
    out->expert_misses = m.expert_misses;
    out->expert_inplace = m.expert_inplace;
    out->expert_paged_bytes = m.expert_paged_bytes;
    out->sessions = m.sessions;
    out->session_evictions = m.session_evictions;
    out->kv_page = m.kv_page;
    out->kv_pages = m.kv_pages;
    out->kv_pages_in_use = m.kv_pages_in_use;
    out->kv_pages_committed = m.kv_pages_committed;
    out->kv_pages_peak = m.kv_pages_peak;
    out->kv_evictions = m.kv_evictions;
}

template <class F>
bluevm_status guarded(F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return failWith(BLUEVM_ERR_INTERNAL, "out of host memory");
    } catch (const std::exception& e) {
        return failWith(BLUEVM_ERR_INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
        return failWith(BLUEVM_ERR_INTERNAL, "internal error");
    }
}

}  // namespace blue::capi
