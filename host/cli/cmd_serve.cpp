// `bluevm serve`: an OpenAI-compatible HTTP server (host/server/) over the C API, for a model
// (--model) or a compiled cascade (--cascade, with --model NAME=PATH overrides). SIGINT and
// SIGTERM stop it cleanly: running requests are cancelled, the engine and device are released.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "compiler/cascade/cascade.h"
#include "compiler/lower_model.h"
#include "host/bluevm.h"
#include "host/cli/commands.h"
#include "host/cli/progress.h"
#include "host/server/http_server.h"

namespace blue::cli {

namespace {

struct ServeArgs {
    std::vector<std::string> models;  // one GGUF/.bir, or NAME=PATH overrides with --cascade
    std::string cascade, host = "127.0.0.1", device, alias, trace;
    int port = 8080;
    uint32_t instances = 4, ctx = 0, queue = 0, chain_cycles = 16, threads = 0;
    uint64_t vram_budget = 0;
    bool expert_cache = true;
    GpuOptions::HostWeights host_weights = GpuOptions::HostWeights::AUTO;
    bool log = false;
    bool chain_cycles_given = false;
    std::vector<std::string> api_keys, cors_origins;
    std::string api_key_file;
    double header_timeout = 10, body_timeout = 30;
    uint32_t max_connections = 1024, max_per_address = 256;
    uint32_t grammar_words = kGrammarWordsAuto;
    std::string tool_format = "auto";
    std::string pooling;  // "": the file's
    uint32_t sessions = 0;
    uint32_t kv_page = 0, kv_pool = 0;  // paged KV (bluevm_model_options)
};

// Adds the keys of BLUEVM_API_KEY and of --api-key-file (one a line; blank lines and lines
// starting with '#' skipped) to a.api_keys; false: the file cannot be read (*error says).
bool loadApiKeys(ServeArgs& a, std::string* error) {
    if (const char* env = std::getenv("BLUEVM_API_KEY"); env && *env) a.api_keys.push_back(env);
    if (a.api_key_file.empty()) return true;
    std::ifstream in(a.api_key_file);
    if (!in) {
        *error = "cannot read --api-key-file '" + a.api_key_file + "'";
        return false;
    }
    for (std::string line; std::getline(in, line);) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
        if (!line.empty() && line[0] != '#') a.api_keys.push_back(line);
    }
    return true;
}

// Signals go to one waiting thread, never interrupting the engine's or the HTTP threads.
sigset_t blockStopSignals() {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    return signals;
}

// Binds and serves until SIGINT or SIGTERM; `banner` (given the port) is printed once listening.
int runServer(Result<std::unique_ptr<server::HttpServer>> srv, const sigset_t& signals,
              const std::function<std::string(int)>& banner) {
    if (!srv) return fail(srv.message());
    if (Status s = srv.value()->bind(); !s) return fail(s.message());
    server::HttpServer& http = *srv.value();
    std::fprintf(stderr, "%s\n", banner(http.port()).c_str());
    std::thread waiter([&] {
        int sig = 0;
        sigwait(&signals, &sig);
        if (sig == SIGINT || sig == SIGTERM) http.stop();
    });
    Status ran = http.run();
    // Wake the waiter if the server ended on its own.
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    int code = ran ? 0 : fail(ran.message());
    std::fprintf(stderr, "bluevm: server stopped\n");
    return code;
}

server::ServerOptions serverOptions(const ServeArgs& a) {
    server::ServerOptions so;
    so.host = a.host;
    so.port = a.port;
    so.threads = a.threads;
    so.log = a.log;
    so.api_keys = a.api_keys;
    so.cors_origins = a.cors_origins;
    so.header_timeout_ms = int(a.header_timeout * 1000);
    so.body_timeout_ms = int(a.body_timeout * 1000);
    so.max_connections = a.max_connections;
    so.max_connections_per_address = a.max_per_address;
    so.tool_format = a.tool_format;
    return so;
}

int serveCascade(const ServeArgs& a) {
    if (a.ctx) return fail("--ctx does not apply to a cascade: its `context` is compiled in (bluec cascade)");
    const sigset_t signals = blockStopSignals();
    std::map<std::string, std::string> overrides;
    for (const std::string& mp : a.models) {
        if (!parseModelOverride(mp, &overrides)) return fail("--model needs NAME=PATH with --cascade, got '" + mp + "'");
    }
    std::vector<std::string> names, paths;
    for (const auto& [name, path] : overrides) {
        names.push_back(name);
        paths.push_back(path);
    }
    std::vector<const char*> name_ptrs, path_ptrs;
    for (size_t i = 0; i < names.size(); ++i) {
        name_ptrs.push_back(names[i].c_str());
        path_ptrs.push_back(paths[i].c_str());
    }
    bluevm_cascade_options co;
    bluevm_cascade_options_init(&co);
    co.device = a.device.empty() ? nullptr : a.device.c_str();
    co.instances = a.instances;
    co.trace_path = a.trace.empty() ? nullptr : a.trace.c_str();
    co.max_queue = a.queue;
    if (a.chain_cycles_given) co.chain_cycles = a.chain_cycles;
    co.model_names = name_ptrs.data();
    co.model_paths = path_ptrs.data();
    co.n_models = names.size();
    bluevm_cascade* cascade = nullptr;
    if (bluevm_cascade_open(a.cascade.c_str(), &co, &cascade) != BLUEVM_OK) return fail(bluevm_last_error());
    server::ServerOptions so = serverOptions(a);
    const std::filesystem::path file(a.cascade);
    if (!a.alias.empty()) so.model_names.push_back(a.alias);
    so.model_names.push_back(file.stem().string());
    so.model_names.push_back(file.filename().string());
    bluevm_cascade_info info;
    bluevm_cascade_get_info(cascade, &info);
    int code = runServer(server::HttpServer::create(cascade, so), signals, [&](int port) {
        return strFormat("bluevm: serving cascade '%s' on http://%s:%d (%u instances, %u stages, answer slot '%s', "
                         "%s); Ctrl-C stops",
                         so.model_names.front().c_str(), a.host.c_str(), port, a.instances, info.n_stages,
                         info.answer_slot, info.device);
    });
    bluevm_cascade_close(cascade);
    return code;
}

int serve(const ServeArgs& a) {
    if (!a.cascade.empty()) return serveCascade(a);
    if (a.models.size() != 1) {
        return fail(a.models.empty() ? "--model (or --cascade) is required"
                                     : "give one --model (several are NAME=PATH overrides of a --cascade)");
    }
    if (!a.trace.empty()) return fail("--trace records cascades' stages: it applies with --cascade");
    const std::string& model_path = a.models[0];
    const sigset_t signals = blockStopSignals();
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.device = a.device.empty() ? nullptr : a.device.c_str();
    mo.ctx = a.ctx;
    mo.vram_budget = a.vram_budget;
    mo.expert_cache = a.expert_cache ? 1 : 0;
    mo.host_weights = int(a.host_weights);
    mo.grammar_words = a.grammar_words;
    mo.pooling = a.pooling.empty() ? nullptr : a.pooling.c_str();
    mo.sessions = a.sessions;
    mo.kv_page = a.kv_page;
    mo.kv_pool = a.kv_pool;
    bluevm_model* model = nullptr;
    if (bluevm_model_open(model_path.c_str(), &mo, &model) != BLUEVM_OK) return fail(bluevm_last_error());
    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = a.instances;
    eo.max_queue = a.queue;
    eo.chain_cycles = a.chain_cycles;
    ProgressBar bar("loading weights");
    std::function<void(uint64_t, uint64_t)> progress = loadProgress(bar);
    eo.on_load = [](uint64_t done, uint64_t total, void* user) {
        (*static_cast<std::function<void(uint64_t, uint64_t)>*>(user))(done, total);
    };
    eo.on_load_user = &progress;
    bluevm_engine* engine = nullptr;
    if (bluevm_engine_create(model, &eo, &engine) != BLUEVM_OK) {
        std::string message = bluevm_last_error();
        bluevm_model_close(model);
        return fail(message);
    }
    server::ServerOptions so = serverOptions(a);
    bluevm_model_info info;
    bluevm_model_get_info(model, &info);
    // Names clients may send; the first is reported. A file without general.name reports its
    // file name rather than the bare architecture.
    const std::string stem = std::filesystem::path(model_path).stem().string();
    if (!a.alias.empty()) so.model_names.push_back(a.alias);
    if (std::string(info.name) == info.architecture) so.model_names.push_back(stem);
    so.model_names.push_back(info.name);
    so.model_names.push_back(stem);
    so.model_names.push_back(std::filesystem::path(model_path).filename().string());
    int code = runServer(server::HttpServer::create(model, engine, so), signals, [&](int port) {
        const std::string embeddings =
            std::string(info.pooling) == "none" ? "" : strFormat(", embeddings: %s pooling", info.pooling);
        return strFormat("bluevm: serving '%s' on http://%s:%d (%u instances, context %u%s, %s); Ctrl-C stops",
                         so.model_names.front().c_str(), a.host.c_str(), port, a.instances, info.n_ctx,
                         embeddings.c_str(), info.device);
    });
    bluevm_engine_destroy(engine);
    bluevm_model_close(model);
    return code;
}

}  // namespace

Command addServeCommand(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    CLI::App* sub = app.add_subcommand("serve", "Serve a model, or a compiled cascade, over an OpenAI-compatible HTTP API");
    sub->add_option("--model,-m", a->models,
                    "GGUF model, or a .bir lowered by `bluec lower`; with --cascade: NAME=PATH replaces a "
                    "cascade model's file (same tensors), repeatable");
    sub->add_option("--cascade", a->cascade, "serve a cascade compiled by `bluec cascade` (a .bir) instead of a model");
    sub->add_option("--instances", a->instances, "concurrent requests on the GPU (sharing the weights)")->check(CLI::Range(1u, 4096u));
    sub->add_option("--host", a->host, "address to listen on");
    sub->add_option("--port", a->port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
    sub->add_option("--ctx", a->ctx, "context length per instance (default: the model's, at most 2048)");
    sub->add_option("--grammar-words", a->grammar_words,
                    "structured output: grammar automaton words per instance (default: 58368, or "
                    "what 16 instances fit in one device page; 0: no grammars)");
    sub->add_option("--pooling", a->pooling,
                    "/v1/embeddings: pool a prompt's output-normed hidden states by mean, cls (the first "
                    "token's), last, or none (no embeddings); default: the file's <arch>.pooling_type, else none")
        ->check(CLI::IsMember({"none", "mean", "cls", "last"}));
    sub->add_option("--sessions", a->sessions,
                    "session slots: conversations (a request's \"session_id\") whose tokens and KV rows the GPU "
                    "keeps between turns, each a whole context of KV rows (default 0: none)")
        ->check(CLI::Range(0u, 4096u));
    addKvPageOptions(sub, &a->kv_page, &a->kv_pool, "8 x ctx");
    sub->add_option("--queue", a->queue, "requests that may wait for an instance before 429 (default 8 per instance)");
    sub->add_option("--chain-cycles", a->chain_cycles, "cycles per submitted chain (fewer: tokens stream sooner)")->check(CLI::Range(2u, 4096u));
    sub->add_option("--threads", a->threads, "HTTP worker threads (default: enough for every instance and queued request)");
    sub->add_option("--device", a->device, "Vulkan device: index or part of its name");
    addDeviceLimitsOption(sub);
    addVramBudgetOption(sub, &a->vram_budget, &a->host_weights, &a->expert_cache);
    sub->add_option("--alias", a->alias, "the model name reported by /v1/models");
    sub->add_option("--trace", a->trace,
                    "cascades: append one JSON line per finished request (stages, slots, preference pair) to FILE");
    sub->add_flag("--log", a->log, "log one line per HTTP request on stderr");
    sub->add_option("--api-key", a->api_keys,
                    "require `Authorization: Bearer KEY` on every endpoint but GET /health (repeatable; "
                    "also BLUEVM_API_KEY)");
    sub->add_option("--api-key-file", a->api_key_file, "file of accepted API keys, one a line");
    sub->add_option("--tool-format", a->tool_format,
                    "how tools are described to the model and its calls read: auto (its chat template's "
                    "family: hermes for ChatML, llama3 for Llama 3, mistral for Mistral v3/tekken/v7, json "
                    "otherwise), json, hermes, llama3, mistral (Mistral templates only)")
        ->check(CLI::IsMember({"auto", "json", "hermes", "llama3", "mistral"}));
    sub->add_option("--cors-origin", a->cors_origins,
                    "answer CORS preflights and allow this browser origin, or * for any (repeatable; default: no CORS)");
    sub->add_option("--header-timeout", a->header_timeout,
                    "seconds a connection may take to send its request headers before it is dropped (default 10)")
        ->check(CLI::Range(0.1, 3600.0));
    sub->add_option("--body-timeout", a->body_timeout,
                    "seconds a request may take to send its body after the headers (default 30)")
        ->check(CLI::Range(0.1, 3600.0));
    sub->add_option("--max-connections", a->max_connections,
                    "open connections in all; more get 503 (default 1024)")->check(CLI::Range(1u, 1u << 20));
    sub->add_option("--max-connections-per-ip", a->max_per_address,
                    "open connections from one client address; more get 503 (default 256)")->check(CLI::Range(1u, 1u << 20));
    return [a, sub] {
        a->chain_cycles_given = sub->count("--chain-cycles") > 0;
        std::string error;
        if (!loadApiKeys(*a, &error)) return fail(error);
        return serve(*a);
    };
}

}  // namespace blue::cli
