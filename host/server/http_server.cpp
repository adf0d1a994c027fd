// HttpServer (see http_server.h): cpp-httplib routes over the C API.
#include "host/server/http_server.h"

#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "host/server/conn_front.h"
#include "host/server/embeddings.h"
#include "host/server/openai.h"
#include "host/server/tools.h"

namespace blue::server {

namespace {

using Clock = std::chrono::steady_clock;

// How long a stream may go without bytes before the server writes a keep-alive (an SSE comment).
// Writing is how a closed client shows.
constexpr auto kKeepAlive = std::chrono::milliseconds(500);
constexpr int kPollMs = 100;

int64_t unixTime() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

const char* finishName(bluevm_finish f) {
    switch (f) {
        case BLUEVM_FINISH_LENGTH: return "length";
        case BLUEVM_FINISH_CANCELLED: return "cancelled";
        case BLUEVM_FINISH_ERROR: return "error";
        case BLUEVM_FINISH_STOP:
        case BLUEVM_FINISH_NONE: break;
    }
    return "stop";
}

void sendError(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(errorBody(e), "application/json");
}

ApiError apiError(int status, std::string message, std::string type = "invalid_request_error",
                  std::string param = "", std::string code = "") {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.param = std::move(param);
    e.code = std::move(code);
    return e;
}

// How long a client should wait before retrying while the device is rebuilt (seconds).
constexpr const char* kRetryAfter = "1";

int portOf(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
    if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
    return -1;
}

// The server's socket of the connection `req` arrived on, found by its local and peer ports (-1:
// not found). httplib 0.11 does not give handlers their socket; a handler that holds its response
// until the end watches it to see the client leave.
int connectionSocket(const httplib::Request& req) {
    if (req.local_port <= 0 || req.remote_port <= 0) return -1;
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1;
    while (dirent* e = readdir(dir)) {
        char* end = nullptr;
        long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
        sockaddr_storage local{}, peer{};
        socklen_t n = sizeof local;
        if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &n) != 0 ||
            portOf(local) != req.local_port) {
            continue;
        }
        n = sizeof peer;
        if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &n) == 0 &&
            portOf(peer) == req.remote_port) {
            found = int(fd);
            break;
        }
    }
    closedir(dir);
    return found;
}

// True when the peer of a connected socket has closed (or the socket failed). Linux reports a
// peer's close as POLLRDHUP; elsewhere only a reset shows (and /proc/self/fd is missing anyway).
bool peerClosed(int fd) {
#ifdef POLLRDHUP
    constexpr short kClosed = POLLRDHUP;
#else
    constexpr short kClosed = 0;
#endif
    pollfd p{fd, kClosed, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (kClosed | POLLHUP | POLLERR | POLLNVAL));
}

// True when `given` equals one of `keys`. Every key is compared over the longer length, with no
// early exit on a differing byte and none on a match, so the time does not say where they differ.
bool keyMatches(const std::vector<std::string>& keys, std::string_view given) {
    unsigned found = 0;
    for (const std::string& key : keys) {
        const size_t n = std::max(key.size(), given.size());
        unsigned diff = key.size() != given.size() ? 1u : 0u;
        for (size_t i = 0; i < n; ++i) {
            const unsigned char a = i < key.size() ? (unsigned char)key[i] : 0;
            const unsigned char b = i < given.size() ? (unsigned char)given[i] : 0;
            diff |= unsigned(a ^ b);
        }
        found |= unsigned(diff == 0);
    }
    return found != 0;
}

// The error of a request that ended with BLUEVM_FINISH_ERROR: 503 when the device failed (the
// engine is rebuilding it; the request may be sent again), else 500.
ApiError finishError(bluevm_status error, const std::string& message) {
    if (error == BLUEVM_ERR_DEVICE_LOST) {
        return apiError(503, message + "; the device is being rebuilt, retry later",
                        "server_error", "", "device_lost");
    }
    return apiError(500, "the engine failed while generating: " + message, "server_error");
}

// The answer to a submit the engine or cascade refused.
// invalid_param: the field an invalid-argument failure is about ("" when unknown).
// The response to a refused submit, whose message is `message`.
void refuseSubmitAs(httplib::Response& res, bluevm_status st, const std::string& message, const char* prompt_param,
                    const char* invalid_param) {
    switch (st) {
        case BLUEVM_ERR_QUEUE_FULL:
            res.set_header("Retry-After", "1");
            return sendError(res, apiError(429, message, "rate_limit_error", "", "queue_full"));
        case BLUEVM_ERR_TOO_LONG:
            return sendError(res, apiError(400, message, "invalid_request_error", prompt_param, "context_length_exceeded"));
        case BLUEVM_ERR_INVALID_ARGUMENT:
            return sendError(res, apiError(400, message, "invalid_request_error", invalid_param));
        case BLUEVM_ERR_GRAMMAR_TOO_LARGE:
            return sendError(res, apiError(400, message, "invalid_request_error", invalid_param, "grammar_too_large"));
        case BLUEVM_ERR_SHUTDOWN:
            return sendError(res, apiError(503, message, "server_error"));
        case BLUEVM_ERR_BUSY:
            return sendError(res, apiError(409, message, "invalid_request_error", "session_id", "session_busy"));
        case BLUEVM_ERR_DEVICE_LOST:
            res.set_header("Retry-After", kRetryAfter);
            return sendError(res, apiError(503, message, "server_error", "", "recovering"));
        default:
            return sendError(res, apiError(500, message, "server_error"));
    }
}

void refuseSubmit(httplib::Response& res, bluevm_status st, const char* prompt_param, const char* invalid_param = "") {
    refuseSubmitAs(res, st, bluevm_last_error(), prompt_param, invalid_param);
}

// What one poll of a generation brought: new text and, once, the end.
struct Polled {
    std::string text;
    bool finished = false;
    bluevm_finish reason = BLUEVM_FINISH_NONE;
    bluevm_status error = BLUEVM_OK;  // with BLUEVM_FINISH_ERROR
    std::string error_message;
    Usage usage;
    nlohmann::json extra;  // cascades: {"cascade": {"slots": ..., "stages": ...}}
    std::vector<TokenLogprob> logprobs;  // of the new tokens, when the request asked
};

// One accepted generation: its id in the engine (or cascade) and what its response has sent so far.
struct Generation {
    bluevm_engine* engine = nullptr;
    bluevm_cascade* cascade = nullptr;
    const bluevm_cascade_info* cascade_info = nullptr;  // its slots, for the response
    uint64_t id = 0;
    Endpoint endpoint = Endpoint::Completions;
    std::string response_id, model;
    int64_t created = 0;
    bool stream = false, include_usage = false;
    std::string text;  // non-streamed: everything so far (with the echoed prompt)
    std::string streamed;  // cascades: the answer text streamed so far
    const bluevm_model* model_handle = nullptr;  // token texts of log-probabilities
    bool logprobs = false;
    std::vector<ApiRequest::Tool> tools;   // chat: the tools offered (streamed: text held until
                                           // the end, when a call is known)
    ToolFormat tool_format = ToolFormat::Json;  // how the model writes calls
    bool tool_text = false;  // streamed with tools: the answer is known to be text, sent as it comes
    size_t text_offset = 0;                // completions: bytes before the next token
    std::vector<TokenLogprob> all_logprobs;  // non-streamed: every token's
    bool started = false, finished = false;
    Clock::time_point last_write = Clock::now();

    ~Generation() {
        if (cascade && !finished) bluevm_cascade_release(cascade, id);  // a finished one is forgotten
        if (!engine) return;
        if (!finished) bluevm_cancel(engine, id);
        bluevm_release(engine, id);
    }

    // Waits up to timeout_ms for new text or the end. A cascade streams the final writes of its
    // answer slot; the rest of its answer comes with its end.
    bluevm_status poll(int timeout_ms, Polled* out) {
        *out = Polled{};
        if (cascade) return pollCascade(timeout_ms, out);
        bluevm_event ev;
        bluevm_status st = bluevm_poll(engine, id, timeout_ms, &ev);
        if (st != BLUEVM_OK) return st;
        out->text.assign(ev.text, ev.text_len);
        out->finished = ev.finished != 0;
        out->reason = ev.reason;
        out->error = ev.error;
        if (ev.reason == BLUEVM_FINISH_ERROR) out->error_message = bluevm_last_error();
        out->usage = Usage{ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens};
        if (logprobs && ev.logprobs) {
            for (size_t i = 0; i < ev.n_tokens; ++i) {
                TokenLogprob t{piece(ev.tokens[i]), ev.logprobs[i], {}};
                for (uint32_t k = 0; k < ev.n_top; ++k) {
                    t.top.emplace_back(piece(ev.top_ids[i * ev.n_top + k]), ev.top_logprobs[i * ev.n_top + k]);
                }
                out->logprobs.push_back(std::move(t));
            }
        }
        return st;
    }

    std::string piece(uint32_t token) const {
        const char* p = nullptr;
        size_t len = 0;
        if (bluevm_token_piece(model_handle, token, &p, &len) != BLUEVM_OK || !p) return "";
        return std::string(p, len);
    }

    // The id of the tool call this response answers with: from the response's id.
    std::string toolCallId() const { return "call_" + response_id.substr(response_id.rfind('-') + 1); }

    // The choice's "logprobs" for these tokens (null when not asked); moves the text offset on.
    nlohmann::json logprobsFor(const std::vector<TokenLogprob>& tokens) {
        if (!logprobs) return nullptr;
        nlohmann::json j = logprobsJson(endpoint, tokens, text_offset);
        for (const TokenLogprob& t : tokens) text_offset += t.token.size();
        return j;
    }

    bluevm_status pollCascade(int timeout_ms, Polled* out) {
        const char* piece = nullptr;
        size_t len = 0;
        int ended = 0;
        bluevm_status st = bluevm_cascade_stream(cascade, id, timeout_ms, &piece, &len, &ended);
        if (st != BLUEVM_OK) return st;
        out->text.assign(piece, len);
        streamed += out->text;
        if (!ended) return BLUEVM_OK;
        bluevm_cascade_result* r = nullptr;
        st = bluevm_cascade_wait(cascade, id, 0, &r);
        if (st != BLUEVM_OK) return st;
        finished = true;  // the id is forgotten
        out->finished = true;
        out->reason = bluevm_cascade_result_finish(r);
        out->error_message = bluevm_cascade_result_error(r, &out->error);
        const char* answer = bluevm_cascade_result_answer(r, &len);
        // The answer begins with what was streamed (bluevm_cascade_stream); sent text is never
        // taken back, so only the rest follows.
        std::string_view whole(answer, len);
        if (whole.substr(0, streamed.size()) == streamed) out->text += whole.substr(streamed.size());
        bluevm_cascade_result_usage(r, &out->usage.prompt_tokens, &out->usage.completion_tokens);
        nlohmann::json slots = nlohmann::json::object();
        for (uint32_t k = 0; k < cascade_info->n_slots; ++k) {
            const char* name = cascade_info->slots[k];
            const char* slot = bluevm_cascade_result_slot(r, name, &len);
            slots[name] = std::string(slot ? slot : "", len);
        }
        nlohmann::json stats = nlohmann::json::parse(bluevm_cascade_result_stats_json(r), nullptr, false);
        nlohmann::json stages = stats.is_object() && stats.contains("stages") ? stats["stages"] : nlohmann::json::array();
        out->extra = {{"cascade", {{"slots", slots}, {"stages", stages}}}};
        bluevm_cascade_result_free(r);
        return BLUEVM_OK;
    }
};

// httplib::Server with the listening socket set from outside: the front (conn_front.h) accepts,
// and workers call processSocket on connections whose request is whole.
struct FrontedHttp : httplib::Server {
    void setListenSocket(int fd) { svr_sock_ = fd; }
};

// httplib 0.11 keeps Server::process_and_close_socket private; an explicit instantiation may
// name a private member, which is how the front's workers reach it.
struct ProcessTag {
    using type = bool (httplib::Server::*)(int);
    friend type processMember(ProcessTag);
};
template <typename Tag, typename Tag::type M>
struct ExposeMember {
    friend typename Tag::type processMember(Tag) { return M; }
};
template struct ExposeMember<ProcessTag, &httplib::Server::process_and_close_socket>;

void processSocket(httplib::Server& http, int fd) {
    (http.*processMember(ProcessTag{}))(fd);
}

}  // namespace

struct HttpServer::Impl {
    bluevm_model* model = nullptr;
    bluevm_engine* engine = nullptr;
    bluevm_cascade* cascade = nullptr;  // serving a cascade instead of a model's engine
    ServerOptions options;
    bluevm_model_info info{};
    ToolFormat tool_format = ToolFormat::Json;  // options.tool_format, or the chat template's
    bluevm_cascade_info cascade_info{};
    FrontedHttp http;
    std::unique_ptr<ConnFront> front;
    std::unique_ptr<httplib::ThreadPool> pool;
    bool pool_down = false;  // shut down (joined) once: by run(), else by the destructor
    int port = 0;
    std::atomic<bool> stopping{false};
    std::mutex counts_mutex;
    std::map<std::pair<std::string, int>, uint64_t> http_counts;  // (path, status) -> requests

    bool knownModel(const std::string& name) const {
        for (const std::string& n : options.model_names) {
            if (n == name) return true;
        }
        return false;
    }
    // A 404 for a "model" the server does not serve ("" names none).
    std::optional<ApiError> unknownModel(const std::string& name) const {
        if (name.empty() || knownModel(name)) return std::nullopt;
        return apiError(404, "the model '" + name + "' does not exist; this server serves '" + options.model_names.front() + "'",
                        "invalid_request_error", "model", "model_not_found");
    }
    void embeddings(const httplib::Request& req, httplib::Response& res);
    void routes();
    nlohmann::json modelMeta() const;
    void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
    bool submitModel(const ApiRequest& ar, Generation& g, httplib::Response& res);
    bool submitCascade(const ApiRequest& ar, Generation& g, httplib::Response& res);
    bluevm_status engineHealth(bluevm_health* h) const {
        return cascade ? bluevm_cascade_health(cascade, h) : bluevm_engine_health(engine, h);
    }
    bluevm_status engineMetrics(bluevm_metrics* m) const {
        return cascade ? bluevm_cascade_metrics(cascade, m) : bluevm_engine_metrics(engine, m);
    }
    bool pump(Generation& g, httplib::DataSink& sink);
    void answerWhole(Generation& g, const httplib::Request& req, httplib::Response& res);
    void health(httplib::Response& res);
    void tokenize(const httplib::Request& req, httplib::Response& res);
    void detokenize(const httplib::Request& req, httplib::Response& res);
    bool authorized(const httplib::Request& req) const;
    std::string allowedOrigin(const httplib::Request& req) const;
    std::string metricsText();
};

bool HttpServer::Impl::authorized(const httplib::Request& req) const {
    if (options.api_keys.empty()) return true;
    if (req.method == "GET" && req.path == "/health") return true;
    const std::string header = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (header.size() < kBearer.size() || header.compare(0, kBearer.size(), kBearer) != 0) return false;
    return keyMatches(options.api_keys, std::string_view(header).substr(kBearer.size()));
}

// The Access-Control-Allow-Origin value for the request's Origin ("": none, CORS off or not allowed).
std::string HttpServer::Impl::allowedOrigin(const httplib::Request& req) const {
    if (options.cors_origins.empty() || !req.has_header("Origin")) return "";
    const std::string origin = req.get_header_value("Origin");
    for (const std::string& o : options.cors_origins) {
        if (o == "*") return "*";
        if (o == origin) return origin;
    }
    return "";
}

void HttpServer::Impl::routes() {
    // CORS preflights are answered before authentication (browsers send them without the key).
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (req.method == "OPTIONS" && !options.cors_origins.empty()) {
            res.status = 204;
            return httplib::Server::HandlerResponse::Handled;
        }
        if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
        res.set_header("WWW-Authenticate", "Bearer");
        sendError(res, apiError(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                                "invalid_request_error", "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
    });
    http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        const std::string origin = allowedOrigin(req);
        if (origin.empty()) return;
        res.set_header("Access-Control-Allow-Origin", origin);
        if (origin != "*") res.set_header("Vary", "Origin");
        if (req.method == "OPTIONS") {
            res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
            res.set_header("Access-Control-Max-Age", "600");
        }
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        nlohmann::json data = nlohmann::json::array();
        data.push_back({{"id", options.model_names.front()},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "bluevm"},
                        {"meta", modelMeta()}});
        res.set_content(nlohmann::json{{"object", "list"}, {"data", data}}.dump(), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metricsText(), "text/plain; version=0.0.4");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        generate(Endpoint::Completions, req, res);
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
        generate(Endpoint::Chat, req, res);
    });
    http.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) { embeddings(req, res); });
    // Errors httplib answers itself (unknown path, body too large) get an OpenAI error body too.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string message = res.status == 404 ? "no route for " + req.method + " " + req.path
                              : res.status == 413 ? "the request body is too large"
                                                  : "the request could not be served";
        sendError(res, apiError(res.status, message));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
        {
            std::lock_guard<std::mutex> lock(counts_mutex);
            ++http_counts[{req.path, res.status}];
        }
        if (options.log) std::fprintf(stderr, "%s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
    });
}

nlohmann::json HttpServer::Impl::modelMeta() const {
    if (!cascade) {
        return {{"architecture", info.architecture},
                {"n_ctx", info.n_ctx},
                {"n_vocab", info.n_vocab},
                {"device", info.device},
                {"chat_template", info.chat_template},
                {"n_embd", info.n_embd},
                {"pooling", info.pooling},
                {"sessions", info.sessions},
                {"tool_format", std::string(toolFormatName(tool_format))}};
    }
    const bluevm_cascade_info& c = cascade_info;
    return {{"kind", "cascade"},
            {"stages", std::vector<std::string>(c.stages, c.stages + c.n_stages)},
            {"slots", std::vector<std::string>(c.slots, c.slots + c.n_slots)},
            {"answer_slot", c.answer_slot},
            {"input_capacity", c.input_capacity},
            {"device", c.device}};
}

// A cascade's own budgets decide how much it generates: max_tokens is only checked to be >= 1.
constexpr uint32_t kCascadeMaxTokens = 1u << 30;

void HttpServer::Impl::generate(Endpoint endpoint, const httplib::Request& req,
                                httplib::Response& res) {
    ApiRequest ar;
    if (auto e = parseRequest(endpoint, req.body, cascade ? kCascadeMaxTokens : info.n_ctx, &ar)) {
        return sendError(res, *e);
    }
    if (auto e = unknownModel(ar.model)) return sendError(res, *e);
    auto g = std::make_shared<Generation>();
    if (!(cascade ? submitCascade(ar, *g, res) : submitModel(ar, *g, res))) return;
    g->endpoint = endpoint;
    g->response_id = strFormat("%s-bluevm-%llu", endpoint == Endpoint::Chat ? "chatcmpl" : "cmpl",
                               (unsigned long long)g->id);
    g->model = options.model_names.front();
    g->created = unixTime();
    g->stream = ar.stream;
    g->include_usage = ar.include_usage;
    if (ar.echo && !ar.has_prompt_ids && !cascade) g->text = ar.prompt;
    g->text_offset = g->text.size();
    if (!g->stream) return answerWhole(*g, req, res);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        // The provider owns the Generation: when httplib drops it (done, or the client gone),
        // the destructor cancels the request if it still runs and releases it.
        [this, g](size_t, httplib::DataSink& sink) { return pump(*g, sink); });
}

// Queues a request on the model's engine; false: refused (the response says why).
bool HttpServer::Impl::submitModel(const ApiRequest& ar, Generation& g, httplib::Response& res) {
    bluevm_request r;
    bluevm_request_init(&r);
    std::string prompt;
    std::string constraint_kind, constraint;  // tools: what a call must be
    if (auto e = toolConstraint(ar, tool_format, &constraint_kind, &constraint)) {
        sendError(res, *e);
        return false;
    }
    if (ar.endpoint == Endpoint::Chat) {
        std::vector<std::pair<std::string, std::string>> messages = withTools(ar, tool_format);
        char* text = nullptr;
        auto format = [&] {
            std::vector<const char*> roles, contents;
            for (const auto& [role, content] : messages) {
                roles.push_back(role.c_str());
                contents.push_back(content.c_str());
            }
            return bluevm_format_chat(model, roles.data(), contents.data(), roles.size(), &text);
        };
        bluevm_status fs = format();
        if (fs != BLUEVM_OK) {
            // A template without a tool role: tool results as user turns that say what they are.
            for (auto& [role, content] : messages) {
                if (role == "tool") role = "user", content = "Tool result: " + content;
            }
            fs = format();
        }
        if (fs != BLUEVM_OK) {
            sendError(res, apiError(400, bluevm_last_error(), "invalid_request_error", "messages"));
            return false;
        }
        prompt = text;
        bluevm_free(text);
        r.prompt = prompt.c_str();
        r.parse_special = 1;
    } else if (ar.has_prompt_ids) {
        for (uint32_t t : ar.prompt_ids) {
            if (t >= info.n_vocab) {
                sendError(res, apiError(400, strFormat("prompt token %u is outside the vocabulary (%u)", t, info.n_vocab),
                                        "invalid_request_error", "prompt"));
                return false;
            }
        }
        r.prompt_ids = ar.prompt_ids.data();
        r.n_prompt_ids = ar.prompt_ids.size();
    } else {
        r.prompt = ar.prompt.c_str();
    }
    r.max_tokens = ar.max_tokens ? ar.max_tokens : info.n_ctx;
    r.temperature = ar.temperature;
    r.top_k = ar.top_k;
    r.top_p = ar.top_p;
    r.min_p = ar.min_p;
    r.repeat_penalty = ar.repeat_penalty;
    r.presence_penalty = ar.presence_penalty;
    r.frequency_penalty = ar.frequency_penalty;
    r.seed = ar.seed_given ? ar.seed : std::random_device{}();
    r.ignore_eos = ar.ignore_eos;
    r.no_prefix_reuse = ar.cache_prompt ? 0 : 1;
    r.session = ar.session_id.empty() ? nullptr : ar.session_id.c_str();
    r.logprobs = ar.logprobs;
    r.top_logprobs = ar.top_logprobs;
    r.grammar = ar.grammar.empty() ? nullptr : ar.grammar.c_str();
    r.json_schema = ar.json_schema.empty() ? nullptr : ar.json_schema.c_str();
    r.json_object = ar.json_object ? 1 : 0;
    if (constraint_kind == "grammar") r.grammar = constraint.c_str();
    if (constraint_kind == "json_schema") r.json_schema = constraint.c_str();
    if (toolsOffered(ar)) g.tools = ar.tools;  // the answer is read back as tool_calls
    g.tool_format = tool_format;
    g.logprobs = ar.logprobs;
    g.model_handle = model;
    std::vector<const char*> stops;
    for (const std::string& s : ar.stop) stops.push_back(s.c_str());
    r.stop = stops.data();
    r.n_stop = stops.size();

    bluevm_status st = bluevm_submit(engine, &r, &g.id);
    if (st == BLUEVM_ERR_GRAMMAR_TOO_LARGE && toolsOffered(ar) && ar.parallel_tool_calls) {
        // Several calls do not fit an instance's grammar memory: the request again with one call
        // per answer, its tools text saying so too.
        ApiRequest single = ar;
        single.parallel_tool_calls = false;
        return submitModel(single, g, res);
    }
    if (st != BLUEVM_OK) {
        refuseSubmit(res, st, ar.endpoint == Endpoint::Chat ? "messages" : "prompt",
                     constraint_kind.empty() ? ar.format_param.c_str() : "tools");
        return false;
    }
    g.engine = engine;
    return true;
}


// Queues a cascade task: the prompt's text, or the content of the chat's last user message. The
// sampling fields are the cascade's own (per stage): they are accepted and not used.
bool HttpServer::Impl::submitCascade(const ApiRequest& ar, Generation& g, httplib::Response& res) {
    std::string task;
    const char* param = ar.endpoint == Endpoint::Chat ? "messages" : "prompt";
    if (ar.json_object || !ar.json_schema.empty() || !ar.grammar.empty()) {
        sendError(res, apiError(400, "'" + ar.format_param + "': structured output is not supported by a cascade "
                                "(its stages decide their own text)", "invalid_request_error", ar.format_param));
        return false;
    }
    if (ar.endpoint == Endpoint::Chat) {
        bool found = false;
        for (const ApiRequest::Message& m : ar.messages) {
            if (m.role != "user") continue;
            task = m.content;
            found = true;
        }
        if (!found) {
            sendError(res, apiError(400, "'messages' has no user message: a cascade takes its task from the last one",
                                    "invalid_request_error", "messages"));
            return false;
        }
    } else if (ar.has_prompt_ids) {
        sendError(res, apiError(400, "a cascade takes its task as text, not token ids", "invalid_request_error", "prompt"));
        return false;
    } else {
        task = ar.prompt;
    }
    if (ar.logprobs) {
        sendError(res, apiError(400, "'logprobs' is not supported by a cascade", "invalid_request_error", "logprobs"));
        return false;
    }
    if (ar.echo) {
        sendError(res, apiError(400, "'echo' is not supported by a cascade", "invalid_request_error", "echo"));
        return false;
    }
    if (!ar.session_id.empty()) {
        sendError(res, apiError(400, "'session_id' is not supported by a cascade", "invalid_request_error", "session_id"));
        return false;
    }
    const uint32_t seed = ar.seed_given ? ar.seed : std::random_device{}();
    bluevm_status st = bluevm_cascade_submit(cascade, task.c_str(), seed, &g.id);
    if (st != BLUEVM_OK) {
        refuseSubmit(res, st, param);
        return false;
    }
    g.cascade = cascade;
    g.cascade_info = &cascade_info;
    return true;
}

// POST /v1/embeddings: every input is a request with the embed flag on the model's engine (so the
// instances pool them on the GPU, batched with whatever else runs); the pooled vectors come back
// on the finished events and are cut to `dimensions` and normalised here. When the queue is full,
// the handler waits for its own oldest request before it queues the next.
void HttpServer::Impl::embeddings(const httplib::Request& req, httplib::Response& res) {
    if (cascade) {
        return sendError(res, apiError(400, "/v1/embeddings is not served for a cascade: serve one model (with --pooling)"));
    }
    EmbeddingRequest er;
    if (auto e = parseEmbeddingRequest(req.body, info.n_embd, info.n_vocab, &er)) return sendError(res, *e);
    if (auto e = unknownModel(er.model)) return sendError(res, *e);
    std::vector<std::vector<float>> vectors(er.inputs.size());
    std::deque<std::pair<size_t, uint64_t>> running;  // (input, request id), oldest first
    uint64_t prompt_tokens = 0;
    std::optional<ApiError> failure;
    // Waits for the oldest running request and takes its vector.
    auto collect = [&] {
        auto [index, id] = running.front();
        running.pop_front();
        bluevm_event ev{};
        bluevm_status st = bluevm_poll(engine, id, -1, &ev);
        while (st == BLUEVM_OK && !ev.finished) st = bluevm_poll(engine, id, -1, &ev);
        if (!failure && ev.reason == BLUEVM_FINISH_ERROR) {
            failure = apiError(ev.error == BLUEVM_ERR_DEVICE_LOST ? 503 : 500, bluevm_last_error(), "server_error");
        } else if (!failure && (st != BLUEVM_OK || ev.n_embedding != info.n_embd)) {
            failure = apiError(500, strFormat("input %zu: the embedding ended early (%u of %u elements)", index,
                                              ev.n_embedding, info.n_embd), "server_error");
        } else if (!failure) {
            vectors[index] = finishEmbedding(std::vector<float>(ev.embedding, ev.embedding + ev.n_embedding), er.dimensions);
            prompt_tokens += ev.prompt_tokens;
        }
        bluevm_release(engine, id);
    };
    for (size_t i = 0; i < er.inputs.size() && !failure; ++i) {
        const EmbeddingRequest::Input& in = er.inputs[i];
        bluevm_request r;
        bluevm_request_init(&r);
        r.embed = 1;
        if (in.is_ids) {
            r.prompt_ids = in.ids.data();
            r.n_prompt_ids = in.ids.size();
        } else {
            r.prompt = in.text.c_str();
        }
        uint64_t id = 0;
        bluevm_status st = bluevm_submit(engine, &r, &id);
        while (st == BLUEVM_ERR_QUEUE_FULL && !running.empty() && !failure) {
            collect();
            st = bluevm_submit(engine, &r, &id);
        }
        if (st != BLUEVM_OK) {
            std::string where = er.inputs.size() > 1 ? strFormat("input[%zu]", i) : std::string("input");
            std::string message = bluevm_last_error();
            while (!running.empty()) collect();
            return refuseSubmitAs(res, st, where + ": " + message, "input", "input");
        }
        running.emplace_back(i, id);
    }
    while (!running.empty()) collect();
    if (failure) return sendError(res, *failure);
    res.set_content(embeddingResponse(vectors, er.base64, options.model_names.front(), prompt_tokens).dump(),
                    "application/json");
}

// POST /tokenize {"content": string, "add_special": bool, "parse_special": bool, "with_pieces":
// bool} -> {"tokens": [ids]}, or with pieces [{"id", "piece"}] (llama.cpp server's shapes: a
// piece that is not whole UTF-8, a byte token's say, is its list of byte values).
void HttpServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
    if (cascade) {
        return sendError(res, apiError(400, "/tokenize is not served for a cascade: its stages may use different tokenizers"));
    }
    nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
    if (!j.is_object()) return sendError(res, apiError(400, "the body is not a JSON object"));
    if (!j.contains("content") || !j["content"].is_string()) {
        return sendError(res, apiError(400, "'content' must be a string", "invalid_request_error", "content"));
    }
    bool flags[3] = {false, false, false};  // add_special, parse_special, with_pieces
    const char* names[3] = {"add_special", "parse_special", "with_pieces"};
    for (int f = 0; f < 3; ++f) {
        if (!j.contains(names[f])) continue;
        if (!j[names[f]].is_boolean()) {
            return sendError(res, apiError(400, std::string("'") + names[f] + "' must be a boolean", "invalid_request_error", names[f]));
        }
        flags[f] = j[names[f]].get<bool>();
    }
    const std::string text = j["content"].get<std::string>();
    std::vector<uint32_t> ids(text.size() + 8);
    size_t count = 0;
    auto run = [&] {
        return bluevm_tokenize_special(model, text.data(), text.size(), flags[0], flags[1], ids.data(), ids.size(), &count);
    };
    bluevm_status st = run();
    if (st == BLUEVM_OK && count > ids.size()) {
        ids.resize(count);
        st = run();
    }
    if (st != BLUEVM_OK) return sendError(res, apiError(400, bluevm_last_error(), "invalid_request_error", "content"));
    ids.resize(count);
    if (!flags[2]) return res.set_content(nlohmann::json{{"tokens", ids}}.dump(), "application/json");
    nlohmann::json tokens = nlohmann::json::array();
    for (uint32_t id : ids) {
        // The piece as the model's tokenizer shows it, control tokens included (their text).
        const char* piece = nullptr;
        size_t len = 0;
        std::string p;
        if (bluevm_token_piece_special(model, id, 1, &piece, &len) == BLUEVM_OK && piece) p.assign(piece, len);
        nlohmann::json entry = {{"id", id}, {"piece", p}};
        try {
            (void)entry.dump();  // json's own UTF-8 check
        } catch (const nlohmann::json::type_error&) {
            entry["piece"] = bytesJson(p);
        }
        tokens.push_back(std::move(entry));
    }
    res.set_content(nlohmann::json{{"tokens", tokens}}.dump(), "application/json");
}

// POST /detokenize {"tokens": [ids]} -> {"content": text} (llama.cpp server's shape).
void HttpServer::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
    if (cascade) {
        return sendError(res, apiError(400, "/detokenize is not served for a cascade: its stages may use different tokenizers"));
    }
    nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
    if (!j.is_object()) return sendError(res, apiError(400, "the body is not a JSON object"));
    if (!j.contains("tokens") || !j["tokens"].is_array()) {
        return sendError(res, apiError(400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens"));
    }
    std::vector<uint32_t> ids;
    for (size_t k = 0; k < j["tokens"].size(); ++k) {
        const nlohmann::json& t = j["tokens"][k];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= int64_t(info.n_vocab)) {
            return sendError(res, apiError(400, strFormat("'tokens[%zu]' (%s) is not a token id of this model's vocabulary (%u)",
                                                          k, t.dump().c_str(), info.n_vocab),
                                           "invalid_request_error", "tokens"));
        }
        ids.push_back(uint32_t(t.get<int64_t>()));
    }
    std::string text(ids.size() * 8 + 16, '\0');
    size_t len = 0;
    bluevm_status st = bluevm_detokenize(model, ids.data(), ids.size(), text.data(), text.size(), &len);
    if (st == BLUEVM_OK && len > text.size()) {
        text.resize(len);
        st = bluevm_detokenize(model, ids.data(), ids.size(), text.data(), text.size(), &len);
    }
    if (st != BLUEVM_OK) return sendError(res, apiError(400, bluevm_last_error(), "invalid_request_error", "tokens"));
    text.resize(len);
    res.set_content(nlohmann::json{{"content", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
}

void HttpServer::Impl::health(httplib::Response& res) {
    bluevm_health h;
    if (engineHealth(&h) != BLUEVM_OK) {
        return sendError(res, apiError(500, bluevm_last_error(), "server_error"));
    }
    nlohmann::json j = {{"status", h.state == BLUEVM_ENGINE_SERVING      ? "ok"
                                   : h.state == BLUEVM_ENGINE_RECOVERING ? "recovering"
                                                                         : "stopped"},
                        {"recoveries", h.recoveries}};
    if (h.failure[0]) j["last_failure"] = h.failure;
    if (h.state == BLUEVM_ENGINE_RECOVERING) {
        j["failed_attempts"] = h.failed_attempts;
        if (h.attempt_error[0]) j["attempt_error"] = h.attempt_error;
        res.status = 503;
        res.set_header("Retry-After", kRetryAfter);
    } else if (h.state == BLUEVM_ENGINE_STOPPED) {
        res.status = 503;
    }
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
}

// A non-streamed response: held until the request ends, so that its status can still say how it
// ended (503 when the device failed). The client leaving cancels the request.
void HttpServer::Impl::answerWhole(Generation& g, const httplib::Request& req,
                                   httplib::Response& res) {
    const int socket = connectionSocket(req);
    for (;;) {
        if (stopping) {
            return sendError(res, apiError(503, "the server is stopping", "server_error"));
        }
        if (socket >= 0 && peerClosed(socket)) return;  // ~Generation cancels the request
        Polled ev;
        bluevm_status st = g.poll(kPollMs, &ev);
        if (st == BLUEVM_ERR_TIMEOUT) continue;
        if (st != BLUEVM_OK) {
            return sendError(res, apiError(500, bluevm_last_error(), "server_error"));
        }
        g.text += ev.text;
        for (TokenLogprob& t : ev.logprobs) g.all_logprobs.push_back(std::move(t));
        if (!ev.finished) continue;
        g.finished = true;
        if (ev.reason == BLUEVM_FINISH_ERROR) {
            ApiError e = finishError(ev.error, ev.error_message);
            if (e.status == 503) res.set_header("Retry-After", kRetryAfter);
            return sendError(res, e);
        }
        nlohmann::json calls = toolCallsOf(g.tools, g.tool_format, g.text, g.toolCallId());
        res.set_content(responseBody(g.endpoint, g.response_id, g.created, g.model, g.text,
                                     calls.is_array() ? "tool_calls" : finishName(ev.reason), ev.usage, ev.extra,
                                     g.logprobsFor(g.all_logprobs), calls),
                        "application/json");
        return;
    }
}

// One step of a streamed response: waits briefly for new text and writes it. Returns false when
// the client is gone (the request is then cancelled) or the server is stopping.
bool HttpServer::Impl::pump(Generation& g, httplib::DataSink& sink) {
    if (stopping) return false;
    auto write = [&](const std::string& s) {
        g.last_write = Clock::now();
        return sink.write(s.data(), s.size());
    };
    if (g.stream && !g.started) {
        g.started = true;
        if (g.endpoint == Endpoint::Chat &&
            !write(streamChunk(g.endpoint, g.response_id, g.created, g.model, "", "", true))) {
            return false;
        }
        if (!g.text.empty() &&
            !write(streamChunk(g.endpoint, g.response_id, g.created, g.model, g.text, ""))) {
            return false;
        }
    }
    Polled ev;
    bluevm_status st = g.poll(kPollMs, &ev);
    if (st == BLUEVM_ERR_TIMEOUT) {
        if (Clock::now() - g.last_write < kKeepAlive) return true;
        return write(": keep-alive\n\n");
    }
    if (st != BLUEVM_OK) return false;
    if (!g.tools.empty() && !g.tool_text) {
        // The text may be calls, known at the end: held until then, or until its first byte
        // says it is text.
        g.text += ev.text;
        for (TokenLogprob& t : ev.logprobs) g.all_logprobs.push_back(std::move(t));
        if (answerIsText(g.tool_format, g.text)) {
            g.tool_text = true;
            if (!write(streamChunk(g.endpoint, g.response_id, g.created, g.model, g.text, "", false,
                                   g.logprobsFor(g.all_logprobs)))) {
                return false;
            }
        }
    } else if ((!ev.text.empty() || !ev.logprobs.empty()) &&
               !write(streamChunk(g.endpoint, g.response_id, g.created, g.model, ev.text, "", false,
                                  g.logprobsFor(ev.logprobs)))) {
        return false;
    }
    if (!ev.finished) return true;
    g.finished = true;
    std::string finish = finishName(ev.reason);
    if (!g.tools.empty() && !g.tool_text && ev.reason != BLUEVM_FINISH_ERROR) {
        nlohmann::json calls = toolCallsOf(g.tools, g.tool_format, g.text, g.toolCallId());
        if (calls.is_array()) finish = "tool_calls";
        if ((calls.is_array() || !g.text.empty() || !g.all_logprobs.empty()) &&
            !write(streamChunk(g.endpoint, g.response_id, g.created, g.model, g.text, "", false,
                               g.logprobsFor(g.all_logprobs), calls))) {
            return false;
        }
    }
    const Usage& usage = ev.usage;
    if (ev.reason == BLUEVM_FINISH_ERROR) {
        // The status line went out with the first byte: the error is the stream's last event.
        bool ok = write("data: " + errorBody(finishError(ev.error, ev.error_message)) + "\n\n");
        sink.done();
        return ok;
    }
    bool ok = write(streamChunk(g.endpoint, g.response_id, g.created, g.model, "", finish));
    if (ok && g.include_usage) {
        ok = write(usageChunk(g.endpoint, g.response_id, g.created, g.model, usage));
    }
    if (ok) ok = write(kStreamDone);
    if (ok) sink.done();
    return ok;
}

std::string HttpServer::Impl::metricsText() {
    bluevm_metrics m{};
    engineMetrics(&m);
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, double value) {
        out += strFormat("# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
    };
    metric("bluevm_requests_total", "counter", "Generation requests accepted.", double(m.requests_total));
    metric("bluevm_requests_finished_total", "counter", "Generation requests that ended.", double(m.requests_finished));
    metric("bluevm_requests_cancelled_total", "counter", "Requests cancelled (client gone or stopped).", double(m.requests_cancelled));
    metric("bluevm_requests_rejected_total", "counter", "Requests refused because the queue was full.", double(m.requests_rejected));
    metric("bluevm_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", double(m.prompt_tokens));
    metric("bluevm_completion_tokens_total", "counter", "Tokens generated.", double(m.completion_tokens));
    metric("bluevm_prefix_hits_total", "counter",
           "Requests whose instance reused the KV rows of their prompt's leading tokens.", double(m.prefix_hits));
    metric("bluevm_prefix_tokens_total", "counter", "Prompt tokens those requests did not recompute.",
           double(m.prefix_tokens));
    metric("bluevm_sessions", "gauge", "Conversations kept in session slots.", double(m.sessions));
    metric("bluevm_session_evictions_total", "counter",
           "Conversations forgotten to give their session slot to a new one.", double(m.session_evictions));
    metric("bluevm_queue_depth", "gauge", "Accepted requests waiting for an instance.", double(m.queue_depth));
    metric("bluevm_queue_capacity", "gauge", "Requests that may wait before 429.", double(m.queue_capacity));
    metric("bluevm_instances", "gauge", "Instances of the generation program.", double(m.instances));
    metric("bluevm_instances_busy", "gauge", "Instances serving a request.", double(m.busy_instances));
    metric("bluevm_instance_occupancy", "gauge", "Busy instances as a fraction of all.",
           m.instances ? double(m.busy_instances) / double(m.instances) : 0.0);
    metric("bluevm_gpu_submits_total", "counter", "GPU chain submits.", double(m.submits));
    metric("bluevm_host_round_trips_total", "counter", "Host waits that decided what the GPU runs next (0 by design).", double(m.round_trips));
    metric("bluevm_vm_cycles_total", "counter", "VM cycles run.", double(m.cycles));
    metric("bluevm_expert_bytes_total", "counter",
           "MoE models: expert weight bytes read by the chosen experts' matmuls (0 for dense models).",
           double(m.expert_bytes));
    metric("bluevm_expert_cache_hits_total", "counter",
           "MoE under --vram-budget: experts the routing chose that were in the device-local cache.",
           double(m.expert_hits));
    metric("bluevm_expert_cache_misses_total", "counter",
           "MoE under --vram-budget: experts copied into the cache from host memory.", double(m.expert_misses));
    metric("bluevm_expert_cache_inplace_total", "counter",
           "MoE under --vram-budget: experts read in host memory (every slot held an expert of the same run).",
           double(m.expert_inplace));
    metric("bluevm_expert_paged_bytes_total", "counter",
           "MoE under --vram-budget: expert bytes copied into the cache.", double(m.expert_paged_bytes));
    metric("bluevm_gpu_resumes_total", "counter", "Submits that restarted the GPU after it idled with no request.", double(m.resumes));
    metric("bluevm_device_recoveries_total", "counter",
           "Device rebuilds after a lost device or exhausted device memory.", double(m.recoveries));
    metric("bluevm_kv_pages", "gauge", "Pages in each layer's KV pool (--kv-page; 0: per-instance caches).",
           double(m.kv_pages));
    metric("bluevm_kv_page_positions", "gauge", "Positions per KV page (0: per-instance caches).", double(m.kv_page));
    metric("bluevm_kv_pages_in_use", "gauge", "KV pages held by requests, as the last GPU chain left them.",
           double(m.kv_pages_in_use));
    metric("bluevm_kv_pages_committed", "gauge",
           "KV pages admitted requests reserved (held and still to take); new requests wait past the pool.",
           double(m.kv_pages_committed));
    metric("bluevm_kv_pages_peak", "gauge", "Most KV pages held at once since the server started.",
           double(m.kv_pages_peak));
    metric("bluevm_kv_evictions_total", "counter",
           "Cached KV pages of the prefix index taken for other rows (their prefix is computed again).",
           double(m.kv_evictions));
    bluevm_health h;
    const bool recovering =
        engineHealth(&h) == BLUEVM_OK && h.state == BLUEVM_ENGINE_RECOVERING;
    metric("bluevm_device_recovering", "gauge",
           "1 while the device is being rebuilt (requests get 503).", recovering ? 1.0 : 0.0);
    const FrontCounts& fc = front->counts();
    metric("bluevm_http_connections_accepted_total", "counter", "TCP connections accepted.", double(fc.accepted));
    metric("bluevm_http_connections_waiting", "gauge", "Connections whose request has not fully arrived.", double(fc.waiting));
    out += "# HELP bluevm_http_connections_dropped_total Connections closed before their request was served, by reason.\n"
           "# TYPE bluevm_http_connections_dropped_total counter\n";
    out += strFormat("bluevm_http_connections_dropped_total{reason=\"timeout\"} %llu\n", (unsigned long long)fc.dropped_timeout);
    out += strFormat("bluevm_http_connections_dropped_total{reason=\"limit\"} %llu\n", (unsigned long long)fc.dropped_limit);
    out += strFormat("bluevm_http_connections_dropped_total{reason=\"header_size\"} %llu\n", (unsigned long long)fc.dropped_header_size);
    out += strFormat("bluevm_http_connections_dropped_total{reason=\"client_closed\"} %llu\n", (unsigned long long)fc.closed_early);
    out += "# HELP bluevm_http_requests_total HTTP requests answered, by path and status.\n"
           "# TYPE bluevm_http_requests_total counter\n";
    std::lock_guard<std::mutex> lock(counts_mutex);
    for (const auto& [key, n] : http_counts) {
        std::string path;
        for (char c : key.first) {
            if (c == '"' || c == '\\') path += '\\';
            if (c == '\n') { path += "\\n"; continue; }
            path += c;
        }
        out += strFormat("bluevm_http_requests_total{path=\"%s\",code=\"%d\"} %llu\n", path.c_str(),
                         key.second, (unsigned long long)n);
    }
    return out;
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
    stop();
    // A server that never ran (bind failed) still has its idle workers to join.
    if (impl_->pool && !impl_->pool_down) impl_->pool->shutdown();
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(bluevm_cascade* cascade,
                                                       const ServerOptions& options) {
    if (!cascade) return Status::error("the server needs a cascade");
    auto impl = std::make_unique<Impl>();
    impl->cascade = cascade;
    impl->options = options;
    if (bluevm_cascade_get_info(cascade, &impl->cascade_info) != BLUEVM_OK) return Status::error(bluevm_last_error());
    if (impl->options.model_names.empty()) impl->options.model_names.push_back("cascade");
    return finishCreate(std::move(impl));
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(bluevm_model* model, bluevm_engine* engine,
                                                       const ServerOptions& options) {
    if (!model || !engine) return Status::error("the server needs a model and an engine");
    auto impl = std::make_unique<Impl>();
    impl->model = model;
    impl->engine = engine;
    impl->options = options;
    if (bluevm_model_get_info(model, &impl->info) != BLUEVM_OK) return Status::error(bluevm_last_error());
    if (impl->options.model_names.empty()) impl->options.model_names.push_back(impl->info.name);
    if (options.tool_format.empty() || options.tool_format == "auto") {
        impl->tool_format = toolFormatForTemplate(impl->info.chat_template);
    } else if (std::optional<ToolFormat> f = toolFormatFromName(options.tool_format)) {
        if (!toolFormatFits(*f, impl->info.chat_template)) {
            return BLUE_ERROR("tool format '%s' needs a Mistral chat template (mistral-v3, mistral-v3-tekken or "
                              "mistral-v7: its turns have the tool markers); this model's is '%s'",
                              options.tool_format.c_str(), impl->info.chat_template);
        }
        impl->tool_format = *f;
    } else {
        return BLUE_ERROR("tool format '%s' is not one of auto, json, hermes, llama3, mistral", options.tool_format.c_str());
    }
    return finishCreate(std::move(impl));
}

Result<std::unique_ptr<HttpServer>> HttpServer::finishCreate(std::unique_ptr<Impl> impl) {
    const ServerOptions& options = impl->options;
    bluevm_metrics m{};
    impl->engineMetrics(&m);
    // Every running and waiting request holds a worker thread for its response, plus a few for
    // quick requests (health, metrics, refusals): fewer would leave requests waiting unseen in
    // the HTTP layer instead of being queued or refused with 429.
    uint32_t threads = options.threads ? options.threads : m.instances + m.queue_capacity + 8;
    threads = std::min<uint32_t>(threads, 1024);
    impl->pool = std::make_unique<httplib::ThreadPool>(threads);
    impl->http.set_payload_max_length(options.max_body_bytes);
    // One request per connection: a kept-alive connection would hold its worker while idle.
    impl->http.set_keep_alive_max_count(1);
    impl->http.set_read_timeout(std::max(1, options.body_timeout_ms / 1000), 0);
    FrontOptions fo;
    fo.host = options.host;
    fo.port = options.port;
    fo.header_timeout_ms = options.header_timeout_ms;
    fo.body_timeout_ms = options.body_timeout_ms;
    fo.max_connections = options.max_connections;
    fo.max_per_address = options.max_connections_per_address;
    Impl* raw = impl.get();
    impl->front = std::make_unique<ConnFront>(fo, [raw](int fd, std::function<void()> done) {
        raw->pool->enqueue([raw, fd, done] {
            processSocket(raw->http, fd);
            done();
        });
    });
    impl->routes();
    return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

Status HttpServer::bind() {
    Impl& im = *impl_;
    if (Status st = im.front->bind(); !st) return st;
    im.port = im.front->port();
    im.http.setListenSocket(im.front->listenSocket());
    return Status::ok();
}

int HttpServer::port() const {
    return impl_->port;
}

Status HttpServer::run() {
    impl_->front->run();
    impl_->pool->shutdown();  // the requests handed over are answered (503 once stopping)
    impl_->pool_down = true;
    return Status::ok();
}

void HttpServer::stop() {
    impl_->stopping = true;
    impl_->http.setListenSocket(-1);  // ends workers' keep-alive loops
    impl_->front->stop();
}

}  // namespace blue::server
