// A `bluevm serve` in the test process: stories260K (or another GGUF) on a bluevm engine behind
// the HTTP server on a free port, and a client for it. The destructor checks that the validation
// layer reported nothing.
#pragma once

#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <thread>

#include "host/bluevm.h"
#include "host/server/http_server.h"
#include "tests/test_paths.h"

namespace blue::test {

// The model a TestServer serves, and its bluevm_model_options.
struct TestModel {
    std::string path;              // a GGUF; empty: stories260K
    uint64_t vram_budget = 0;
    int host_weights = 0;          // with vram_budget: 1 read in place, 2 stream, 0 the device's default
    uint32_t grammar_words = 0;    // 0: the default
    const char* pooling = nullptr;
    uint32_t sessions = 0;
    uint32_t chain_cycles = 0;     // the engine's (0: its default)
    uint32_t kv_page = 0, kv_pool = 0;  // paged KV (0: per-instance caches)
};

struct TestServer {
    bluevm_model* model = nullptr;
    bluevm_engine* engine = nullptr;
    std::unique_ptr<server::HttpServer> http;
    std::thread thread;

    // `extra`: api_keys, cors_origins, timeouts, connection limits and the tool format for the
    // server; `tm`: the model and its options.
    TestServer(uint32_t instances, uint32_t ctx, uint32_t max_queue, const server::ServerOptions& extra = {},
               const TestModel& tm = {}) {
        bluevm_model_options mo;
        bluevm_model_options_init(&mo);
        mo.ctx = ctx;
        mo.vram_budget = tm.vram_budget;
        mo.host_weights = tm.host_weights;
        mo.pooling = tm.pooling;
        mo.sessions = tm.sessions;
        mo.kv_page = tm.kv_page;
        mo.kv_pool = tm.kv_pool;
        if (tm.grammar_words) mo.grammar_words = tm.grammar_words;
        const std::string path =
            tm.path.empty() ? sharedDir() + "/models/stories260K/stories260K.gguf" : tm.path;
        REQUIRE_MESSAGE(bluevm_model_open(path.c_str(), &mo, &model) == BLUEVM_OK, bluevm_last_error());
        bluevm_engine_options eo;
        bluevm_engine_options_init(&eo);
        eo.instances = instances;
        eo.max_queue = max_queue;
        if (tm.chain_cycles) eo.chain_cycles = tm.chain_cycles;
        REQUIRE_MESSAGE(bluevm_engine_create(model, &eo, &engine) == BLUEVM_OK, bluevm_last_error());
        server::ServerOptions so;
        so.port = 0;
        so.model_names = {"stories260K"};
        so.max_body_bytes = 1 << 20;
        so.api_keys = extra.api_keys;
        so.cors_origins = extra.cors_origins;
        so.header_timeout_ms = extra.header_timeout_ms;
        so.body_timeout_ms = extra.body_timeout_ms;
        so.max_connections = extra.max_connections;
        so.max_connections_per_address = extra.max_connections_per_address;
        so.tool_format = extra.tool_format;
        auto s = server::HttpServer::create(model, engine, so);
        REQUIRE_MESSAGE(s.isOk(), s.message());
        http = std::move(s.value());
        REQUIRE(http->bind().isOk());
        thread = std::thread([this] { (void)http->run(); });
    }
    ~TestServer() {
        http->stop();
        thread.join();
        http.reset();
        bluevm_model_info info;
        bluevm_model_get_info(model, &info);
        CHECK(info.validation_errors == 0u);
        bluevm_engine_destroy(engine);
        bluevm_model_close(model);
    }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", http->port());
        c.set_read_timeout(120, 0);
        return c;
    }
    // The value of a metric line "name value" in /metrics.
    double metric(const std::string& name) const {
        auto res = client().Get("/metrics");
        REQUIRE(res);
        const std::string& body = res->body;
        size_t at = body.find("\n" + name + " ");
        REQUIRE_MESSAGE(at != std::string::npos, name);
        return std::stod(body.substr(at + name.size() + 2));
    }
};

// A JSON POST to send with a content receiver (streamed answers read as they come).
inline httplib::Request jsonPost(const std::string& path, const nlohmann::json& body) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    return req;
}

inline httplib::Result post(const TestServer& s, const std::string& path, const nlohmann::json& body) {
    return s.client().Post(path.c_str(), body.dump(), "application/json");
}

// A POST that must answer 200: its JSON body (the test stops, showing the body, otherwise).
inline nlohmann::json postOk(const TestServer& s, const std::string& path, const nlohmann::json& body) {
    auto res = post(s, path, body);
    REQUIRE(res);
    INFO(res->body);
    REQUIRE(res->status == 200);
    return nlohmann::json::parse(res->body);
}

}  // namespace blue::test
