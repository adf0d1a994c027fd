// The C API (host/bluevm.h) over Engine and ServingEngine; cascades are in capi_cascade.cpp.
// Every entry point catches what C++ could throw and turns it into a status; messages go to a
// thread-local string (capi_internal.h).
#include "host/bluevm.h"
#include "host/capi_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "host/llm/engine.h"
#include "host/llm/serving.h"
#include "host/vk_check.h"


using namespace blue::capi;

namespace {

// One request's stream as the C side sees it: what arrived since the last poll, and what the last
// poll handed out (kept alive for the event's pointers).
struct RequestState {
    std::string pending_text;
    std::vector<uint32_t> pending_tokens;
    std::string taken_text;
    std::vector<uint32_t> taken_tokens;
    bool logprobs = false;  // the request asked: the vectors below are parallel to the tokens
    uint32_t n_top = 0;
    std::vector<float> pending_lp, taken_lp;
    std::vector<uint32_t> pending_top_ids, taken_top_ids;
    std::vector<float> pending_top_lp, taken_top_lp;
    bool finished = false;
    bool finish_taken = false;
    bluevm_finish reason = BLUEVM_FINISH_NONE;
    bluevm_status error = BLUEVM_OK;  // with BLUEVM_FINISH_ERROR
    std::string error_message;
    uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    std::vector<float> embedding;  // an embedding request's, with the finish
};

}  // namespace

struct bluevm_engine {
    bluevm_model* model = nullptr;
    std::unique_ptr<blue::ServingEngine> serving;
    std::mutex mutex;
    std::condition_variable arrived;
    std::map<uint64_t, std::shared_ptr<RequestState>> requests;

    ~bluevm_engine() {
        serving.reset();  // cancels what runs; its callbacks only touch shared request states
    }
};

extern "C" {

const char* bluevm_status_name(bluevm_status s) {
    switch (s) {
        case BLUEVM_OK: return "ok";
        case BLUEVM_ERR_INVALID_ARGUMENT: return "invalid argument";
        case BLUEVM_ERR_IO: return "i/o error";
        case BLUEVM_ERR_MODEL: return "bad model";
        case BLUEVM_ERR_DEVICE: return "device error";
        case BLUEVM_ERR_TOO_LONG: return "prompt too long";
        case BLUEVM_ERR_QUEUE_FULL: return "queue full";
        case BLUEVM_ERR_NOT_FOUND: return "not found";
        case BLUEVM_ERR_TIMEOUT: return "timeout";
        case BLUEVM_ERR_SHUTDOWN: return "shut down";
        case BLUEVM_ERR_INTERNAL: return "internal error";
        case BLUEVM_ERR_DEVICE_LOST: return "device lost";
        case BLUEVM_ERR_SNAPSHOT: return "bad KV snapshot";
        case BLUEVM_ERR_BUSY: return "busy";
        case BLUEVM_ERR_GRAMMAR_TOO_LARGE: return "grammar too large";
    }
    return "unknown status";
}

const char* bluevm_last_error(void) {
    return t_last_error.c_str();
}

int bluevm_api_version(void) {
    return BLUEVM_API_VERSION;
}

void bluevm_model_options_init(bluevm_model_options* o) {
    if (o) *o = bluevm_model_options{nullptr, 0, 0, 0, 0, BLUEVM_GRAMMAR_WORDS_AUTO, 1, nullptr, 0, 0, 0};
}

bluevm_status bluevm_model_open(const char* path, const bluevm_model_options* options,
                                bluevm_model** out) {
    return guarded([&] {
        if (!path || !out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "path and out must not be NULL");
        *out = nullptr;
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec)) {
            return failWith(BLUEVM_ERR_IO, std::string(path) + ": no such file");
        }
        blue::EngineOptions eo;
        if (options) {
            if (options->device) eo.device = options->device;
            eo.ctx = options->ctx;
            eo.validation = options->validation != 0;
            eo.vram_budget = options->vram_budget;
            eo.expert_cache = options->expert_cache != 0;
            eo.grammar_words = options->grammar_words;
            if (options->host_weights < 0 || options->host_weights > 2) {
                return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "host_weights must be 0 (auto), 1 (read) or 2 (stream)");
            }
            eo.host_weights = blue::GpuOptions::HostWeights(options->host_weights);
            eo.sessions = options->sessions;
            eo.kv_page = options->kv_page;
            eo.kv_pool = options->kv_pool;
            eo.kv_pool_contexts = blue::kDefaultKvPoolContexts;
            if (options->pooling) {
                eo.pooling = blue::parsePooling(options->pooling);
                if (!eo.pooling) {
                    return failWith(BLUEVM_ERR_INVALID_ARGUMENT, std::string("pooling '") + options->pooling +
                                                                     "' is not one of mean, cls, last, none");
                }
            }
        }
        bool device_failed = false;
        blue::clearVkFailure();
        auto e = blue::Engine::open(path, eo, &device_failed);
        if (!e) return failWith(device_failed ? deviceStatus() : BLUEVM_ERR_MODEL, e.message());
        auto m = std::make_unique<bluevm_model>();
        m->engine = std::move(e.value());
        m->name = m->engine->modelName();
        m->architecture = m->engine->config().arch_name;
        m->device = m->engine->device().props().deviceName;
        m->chat_template = m->engine->chatTemplateName();
        m->pooling = blue::poolingName(m->engine->pooling());
        *out = m.release();
        return ok();
    });
}

void bluevm_model_close(bluevm_model* model) {
    delete model;
}

bluevm_status bluevm_model_get_info(const bluevm_model* model, bluevm_model_info* out) {
    if (!model || !out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model and out must not be NULL");
    const blue::ModelConfig& c = model->engine->config();
    out->name = model->name.c_str();
    out->architecture = model->architecture.c_str();
    out->device = model->device.c_str();
    out->chat_template = model->chat_template.c_str();
    out->pooling = model->pooling.c_str();
    out->sessions = model->engine->sessions();
    out->n_vocab = c.n_vocab;
    out->n_ctx = model->engine->contextLength();
    out->n_layer = c.n_layer;
    out->n_embd = c.n_embd;
    out->validation_errors = model->engine->validationErrors();
    return ok();
}

bluevm_status bluevm_tokenize(const bluevm_model* model, const char* text, size_t text_len,
                              int add_bos, uint32_t* ids, size_t capacity, size_t* count) {
    return bluevm_tokenize_special(model, text, text_len, add_bos, 0, ids, capacity, count);
}

bluevm_status bluevm_tokenize_special(const bluevm_model* model, const char* text, size_t text_len, int add_bos,
                                      int parse_special, uint32_t* ids, size_t capacity, size_t* count) {
    return guarded([&] {
        if (!model || (!text && text_len) || !count || (!ids && capacity)) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model, text, ids and count must not be NULL");
        }
        std::vector<int32_t> tok = model->engine->tokenizer().encode(std::string_view(text ? text : "", text_len),
                                                                     add_bos != 0, parse_special != 0);
        *count = tok.size();
        for (size_t i = 0; i < tok.size() && i < capacity; ++i) ids[i] = uint32_t(tok[i]);
        return ok();
    });
}

bluevm_status bluevm_detokenize(const bluevm_model* model, const uint32_t* ids, size_t n_ids,
                                char* text, size_t capacity, size_t* len) {
    return guarded([&] {
        if (!model || (!ids && n_ids) || !len || (!text && capacity)) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model, ids, text and len must not be NULL");
        }
        const blue::Tokenizer& tok = model->engine->tokenizer();
        std::vector<int32_t> v(n_ids);
        for (size_t i = 0; i < n_ids; ++i) {
            if (!tok.isValid(int32_t(ids[i])) || ids[i] > INT32_MAX) {
                return failWith(BLUEVM_ERR_INVALID_ARGUMENT,
                                blue::strFormat("token %u (at %zu) is outside the vocabulary (%d)", ids[i], i,
                                                tok.vocabSize()));
            }
            v[i] = int32_t(ids[i]);
        }
        std::string s = tok.decode(v);
        *len = s.size();
        if (capacity) std::memcpy(text, s.data(), std::min(capacity, s.size()));
        return ok();
    });
}

bluevm_status bluevm_token_piece(const bluevm_model* model, uint32_t id, const char** text, size_t* len) {
    return bluevm_token_piece_special(model, id, 0, text, len);
}

bluevm_status bluevm_token_piece_special(const bluevm_model* model, uint32_t id, int render_special, const char** text,
                                         size_t* len) {
    return guarded([&] {
        if (!model || !text || !len) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model, text and len must not be NULL");
        std::string_view p =
            id > INT32_MAX ? std::string_view() : model->engine->tokenizer().piece(int32_t(id), render_special != 0);
        *text = p.data();
        *len = p.size();
        return ok();
    });
}

bluevm_status bluevm_format_chat(const bluevm_model* model, const char* const* roles,
                                 const char* const* contents, size_t n_messages, char** out) {
    return guarded([&] {
        if (!model || !out || (n_messages && (!roles || !contents))) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model, roles, contents and out must not be NULL");
        }
        *out = nullptr;
        std::vector<blue::ChatMessage> messages;
        for (size_t i = 0; i < n_messages; ++i) {
            if (!roles[i] || !contents[i]) {
                return failWith(BLUEVM_ERR_INVALID_ARGUMENT, blue::strFormat("message %zu: NULL role or content", i));
            }
            messages.push_back({roles[i], contents[i]});
        }
        auto text = model->engine->formatChat(messages);
        if (!text) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, text.message());
        char* p = static_cast<char*>(std::malloc(text.value().size() + 1));
        if (!p) return failWith(BLUEVM_ERR_INTERNAL, "out of host memory");
        std::memcpy(p, text.value().c_str(), text.value().size() + 1);
        *out = p;
        return ok();
    });
}

void bluevm_free(void* p) {
    std::free(p);
}

void bluevm_engine_options_init(bluevm_engine_options* o) {
    if (o) *o = bluevm_engine_options{4, 0, 16, nullptr, nullptr};
}

bluevm_status bluevm_engine_create(bluevm_model* model, const bluevm_engine_options* options,
                                   bluevm_engine** out) {
    return guarded([&] {
        if (!model || !out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model and out must not be NULL");
        *out = nullptr;
        bluevm_engine_options o;
        bluevm_engine_options_init(&o);
        if (options) o = *options;
        if (o.instances < 1 || o.instances > 4096) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, blue::strFormat("instances must be 1..4096, not %u", o.instances));
        }
        if (o.chain_cycles < 2 || o.chain_cycles > 4096) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, blue::strFormat("chain_cycles must be 2..4096, not %u", o.chain_cycles));
        }
        blue::ServeOptions so;
        so.instances = o.instances;
        so.max_queue = o.max_queue;
        so.chain_cycles = o.chain_cycles;
        if (o.on_load) {
            model->engine->setLoadCallback([f = o.on_load, user = o.on_load_user](uint64_t done, uint64_t total) {
                f(done, total, user);
            });
        }
        blue::clearVkFailure();
        auto s = blue::ServingEngine::create(*model->engine, so);
        model->engine->setLoadCallback({});
        if (!s) return failWith(deviceStatus(), s.message());
        auto e = std::make_unique<bluevm_engine>();
        e->model = model;
        e->serving = std::move(s.value());
        *out = e.release();
        return ok();
    });
}

void bluevm_engine_destroy(bluevm_engine* engine) {
    delete engine;
}

void bluevm_request_init(bluevm_request* r) {
    if (!r) return;
    *r = bluevm_request{};
    blue::SamplingParams d;
    r->max_tokens = 256;
    r->temperature = d.temperature;
    r->top_k = d.top_k;
    r->top_p = d.top_p;
    r->min_p = d.min_p;
    r->repeat_penalty = d.repeat_penalty;
    r->presence_penalty = d.presence_penalty;
    r->frequency_penalty = d.frequency_penalty;
    r->seed = d.seed;
}

bluevm_status bluevm_submit(bluevm_engine* engine, const bluevm_request* request, uint64_t* id) {
    return guarded([&] {
        if (!engine || !request || !id) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine, request and id must not be NULL");
        }
        blue::Engine& e = engine->serving->engine();
        blue::GenerationRequest r;
        if (request->prompt_ids) {
            r.prompt.assign(request->prompt_ids, request->prompt_ids + request->n_prompt_ids);
        } else {
            std::string text = request->prompt ? request->prompt : "";
            r.prompt = request->parse_special ? e.specialTokens(text) : e.promptTokens(text);
        }
        setRequestParams(*request, &r);
        bool too_large = false;
        if (blue::Status c = setRequestConstraint(*request, e, &r, &too_large); !c) {
            return failWith(too_large ? BLUEVM_ERR_GRAMMAR_TOO_LARGE : BLUEVM_ERR_INVALID_ARGUMENT, c.message());
        }
        if (r.prompt.size() >= e.contextLength()) {
            return failWith(BLUEVM_ERR_TOO_LONG,
                            blue::strFormat("the prompt has %zu tokens; the context holds %u",
                                            r.prompt.size(), e.contextLength()));
        }
        std::vector<std::string> stop;
        if (request->n_stop && !request->stop) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "stop is NULL but n_stop is not 0");
        }
        for (size_t i = 0; i < request->n_stop; ++i) {
            if (!request->stop[i]) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, blue::strFormat("stop[%zu] is NULL", i));
            stop.emplace_back(request->stop[i]);
        }
        auto state = std::make_shared<RequestState>();
        state->prompt_tokens = uint32_t(r.prompt.size());
        state->logprobs = r.logprobs || r.top_logprobs;
        state->n_top = std::min(r.top_logprobs, e.config().n_vocab);
        bluevm_engine* eng = engine;
        auto callback = [eng, state](const blue::StreamEvent& ev) {
            {
                std::lock_guard<std::mutex> lock(eng->mutex);
                state->pending_text += ev.text;
                state->pending_tokens.insert(state->pending_tokens.end(), ev.tokens.begin(), ev.tokens.end());
                for (const blue::TokenLogprobs& lp : ev.logprobs) {
                    state->pending_lp.push_back(lp.logprob);
                    for (uint32_t i = 0; i < state->n_top; ++i) {
                        bool has = i < lp.top.size();
                        state->pending_top_ids.push_back(has ? lp.top[i].first : 0);
                        state->pending_top_lp.push_back(has ? lp.top[i].second : -INFINITY);
                    }
                }
                state->completion_tokens = ev.completion_tokens;
                state->cached_tokens = std::max(state->cached_tokens, ev.cached_tokens);
                if (ev.finished) {
                    state->finished = true;
                    state->embedding = ev.embedding;
                    state->reason = finishOf(ev.reason);
                    if (ev.reason == blue::FinishReason::Error) {
                        state->error =
                            ev.device_failure ? BLUEVM_ERR_DEVICE_LOST : BLUEVM_ERR_INTERNAL;
                        state->error_message =
                            ev.error.empty() ? "the engine failed; the request ended" : ev.error;
                    }
                }
            }
            eng->arrived.notify_all();
        };
        bool queue_full = false, unavailable = false, session_busy = false;
        const std::string session = request->session ? request->session : "";
        // The lock is held across submit so that a poll cannot look for the id before it is
        // registered; the callback takes the same lock only on the driver thread, later.
        std::lock_guard<std::mutex> lock(engine->mutex);
        auto submitted = engine->serving->submit(std::move(r), std::move(stop), callback,
                                                 &queue_full, &unavailable, session, &session_busy);
        if (!submitted) {
            return failWith(queue_full      ? BLUEVM_ERR_QUEUE_FULL
                            : session_busy  ? BLUEVM_ERR_BUSY
                            : unavailable ? BLUEVM_ERR_DEVICE_LOST
                            : submitted.message().find("shutting down") != std::string::npos
                                ? BLUEVM_ERR_SHUTDOWN
                                : BLUEVM_ERR_INVALID_ARGUMENT,
                            submitted.message());
        }
        engine->requests[submitted.value()] = state;
        *id = submitted.value();
        return ok();
    });
}

bluevm_status bluevm_poll(bluevm_engine* engine, uint64_t id, int timeout_ms, bluevm_event* out) {
    return guarded([&] {
        if (!engine || !out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine and out must not be NULL");
        std::unique_lock<std::mutex> lock(engine->mutex);
        auto it = engine->requests.find(id);
        if (it == engine->requests.end()) {
            return failWith(BLUEVM_ERR_NOT_FOUND, blue::strFormat("no request %llu", (unsigned long long)id));
        }
        std::shared_ptr<RequestState> st = it->second;
        auto ready = [&] {
            return !st->pending_text.empty() || !st->pending_tokens.empty() ||
                   (st->finished && !st->finish_taken);
        };
        if (!ready() && !st->finished) {
            if (timeout_ms < 0) {
                engine->arrived.wait(lock, ready);
            } else if (timeout_ms > 0) {
                engine->arrived.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
            }
        }
        st->taken_text = std::move(st->pending_text);
        st->taken_tokens = std::move(st->pending_tokens);
        st->pending_text.clear();
        st->pending_tokens.clear();
        st->taken_lp = std::move(st->pending_lp);
        st->taken_top_ids = std::move(st->pending_top_ids);
        st->taken_top_lp = std::move(st->pending_top_lp);
        st->pending_lp.clear();
        st->pending_top_ids.clear();
        st->pending_top_lp.clear();
        *out = bluevm_event{};
        out->text = st->taken_text.data();
        out->text_len = st->taken_text.size();
        out->tokens = st->taken_tokens.data();
        out->n_tokens = st->taken_tokens.size();
        out->finished = st->finished;
        out->reason = st->reason;
        out->prompt_tokens = st->prompt_tokens;
        out->completion_tokens = st->completion_tokens;
        out->cached_tokens = st->cached_tokens;
        if (st->finished && !st->embedding.empty()) {
            out->embedding = st->embedding.data();
            out->n_embedding = uint32_t(st->embedding.size());
        }
        if (st->logprobs && st->taken_lp.size() == st->taken_tokens.size()) {
            out->logprobs = st->taken_lp.data();
            out->n_top = st->n_top;
            out->top_ids = st->n_top ? st->taken_top_ids.data() : nullptr;
            out->top_logprobs = st->n_top ? st->taken_top_lp.data() : nullptr;
        }
        if (!st->finished && out->text_len == 0 && out->n_tokens == 0) {
            return failWith(BLUEVM_ERR_TIMEOUT, "no new text within the timeout");
        }
        out->error = st->error;
        st->finish_taken = st->finished;
        if (st->reason == BLUEVM_FINISH_ERROR) return failWith(BLUEVM_OK, st->error_message);
        return ok();
    });
}

bluevm_status bluevm_cancel(bluevm_engine* engine, uint64_t id) {
    return guarded([&] {
        if (!engine) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine must not be NULL");
        {
            std::lock_guard<std::mutex> lock(engine->mutex);
            if (!engine->requests.count(id)) {
                return failWith(BLUEVM_ERR_NOT_FOUND, blue::strFormat("no request %llu", (unsigned long long)id));
            }
        }
        engine->serving->cancel(id);
        return ok();
    });
}

bluevm_status bluevm_release(bluevm_engine* engine, uint64_t id) {
    return guarded([&] {
        if (!engine) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine must not be NULL");
        bool running;
        {
            std::lock_guard<std::mutex> lock(engine->mutex);
            auto it = engine->requests.find(id);
            if (it == engine->requests.end()) {
                return failWith(BLUEVM_ERR_NOT_FOUND, blue::strFormat("no request %llu", (unsigned long long)id));
            }
            running = !it->second->finished;
            engine->requests.erase(it);
        }
        if (running) engine->serving->cancel(id);
        return ok();
    });
}

bluevm_status bluevm_engine_metrics(const bluevm_engine* engine, bluevm_metrics* out) {
    if (!engine || !out) return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine and out must not be NULL");
    metricsOut(engine->serving->metrics(), out);
    return ok();
}

bluevm_status bluevm_engine_health(const bluevm_engine* engine, bluevm_health* out) {
    return guarded([&] {
        if (!engine || !out) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "engine and out must not be NULL");
        }
        healthOut(engine->serving->health(), out);
        return ok();
    });
}

}  // extern "C"
