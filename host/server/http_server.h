// The OpenAI-compatible HTTP server behind `bluevm serve`, built on the public C API
// (host/bluevm.h): one engine, many concurrent clients.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true answers server-sent events)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text)
//   POST /tokenize {"content", "add_special"} -> {"tokens": [...]}   (a model, not a cascade)
//   POST /v1/embeddings {"input", "encoding_format", "dimensions"}   (a model lowered with a pooling)
//
// With api_keys, every endpoint but GET /health needs `Authorization: Bearer KEY` (401 with
// WWW-Authenticate: Bearer otherwise; keys are compared without an early exit). CORS is off
// unless cors_origins names origins (or "*").
//
// A client that disconnects cancels its request, which frees its instance. Bad requests get 400
// with an OpenAI error body naming the field; an unknown model 404; a full queue 429.
//
// Device loss (or exhausted device memory): the requests in flight get 503 (code "device_lost",
// the message naming the Vulkan call and what was running; a stream gets it as its last event)
// while the engine rebuilds the device, the machine and the weights. Meanwhile /health answers
// 503 {"status": "recovering", ...} and new requests 503 with Retry-After (code "recovering");
// then /health is 200 {"status": "ok", "recoveries": N, "last_failure": "..."} again.
// A non-streamed response is held until its request ends, so its status says how it ended.
//
// A compiled cascade is served the same way (create(bluevm_cascade*)): the task is the prompt or
// the last user message, max_tokens and the sampling fields are accepted but the cascade's own
// budgets and per-stage settings decide; a task longer than the input slot is a 400 with code
// context_length_exceeded.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host/bluevm.h"
#include "vm/status.h"

namespace blue::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;           // 0: any free port (see HttpServer::port)
    uint32_t threads = 0;      // HTTP worker threads; 0: instances + queue + 8
    std::vector<std::string> model_names;  // names clients may send as "model" (first: reported)
    bool log = false;          // one line per request on stderr
    size_t max_body_bytes = 8u << 20;
    // Keys a client must send as `Authorization: Bearer KEY` on every endpoint but GET /health
    // (401 otherwise); empty: no authentication.
    std::vector<std::string> api_keys;
    // Origins answered with CORS headers (preflight OPTIONS: 204); "*": any; empty: no CORS.
    std::vector<std::string> cors_origins;
    // Slow clients (conn_front.h): a connection's headers must arrive within header_timeout_ms
    // of its accept and its body within body_timeout_ms of the headers, else it is dropped;
    // over max_connections in all or max_connections_per_address from one address, a new one
    // gets 503. Connections still arriving hold no worker thread.
    int header_timeout_ms = 10000;
    int body_timeout_ms = 30000;
    uint32_t max_connections = 1024;
    uint32_t max_connections_per_address = 256;
    // How tools are described and calls written (host/server/tools.h): "auto" (or ""): the format
    // of the model's chat template family; "json", "hermes", "llama3".
    std::string tool_format = "auto";
};

class HttpServer {
public:
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // `model` and `engine` must outlive the server.
    static Result<std::unique_ptr<HttpServer>> create(bluevm_model* model, bluevm_engine* engine,
                                                      const ServerOptions& options);
    // Serves a cascade (bluevm_cascade_open) as the model named options.model_names[0]: the
    // answer is its answer slot; non-streamed responses add {"cascade": {"slots", "stages"}};
    // a stream sends the final writes of the answer slot as they are made (vm/cascade_abi.h) and
    // the rest of the answer when the cascade ends. `cascade` must outlive it.
    static Result<std::unique_ptr<HttpServer>> create(bluevm_cascade* cascade, const ServerOptions& options);

    // Binds the listening socket; fails naming the address when it cannot.
    Status bind();
    int port() const;
    // Serves until stop() (from another thread or a signal handler's helper thread).
    Status run();
    void stop();

private:
    struct Impl;
    explicit HttpServer(std::unique_ptr<Impl> impl);
    static Result<std::unique_ptr<HttpServer>> finishCreate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace blue::server
