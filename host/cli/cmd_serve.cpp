// `bluevm serve`: an OpenAI-compatible HTTP server (host/server/) over the C API. SIGINT and
// SIGTERM stop it cleanly: running requests are cancelled, the engine and device are released.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include "host/bluevm.h"
#include "host/cli/commands.h"
#include "host/cli/progress.h"
#include "host/server/http_server.h"

namespace blue::cli {

namespace {

struct ServeArgs {
    std::string model, host = "127.0.0.1", device, alias;
    int port = 8080;
    uint32_t instances = 4, ctx = 0, queue = 0, chain_cycles = 16, threads = 0;
    bool log = false;
};

int serve(const ServeArgs& a) {
    // Signals go to one waiting thread, never interrupting the engine's or the HTTP threads.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.device = a.device.empty() ? nullptr : a.device.c_str();
    mo.ctx = a.ctx;
    bluevm_model* model = nullptr;
    if (bluevm_model_open(a.model.c_str(), &mo, &model) != BLUEVM_OK) return fail(bluevm_last_error());
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
    server::ServerOptions so;
    so.host = a.host;
    so.port = a.port;
    so.threads = a.threads;
    so.log = a.log;
    bluevm_model_info info;
    bluevm_model_get_info(model, &info);
    // Names clients may send; the first is reported. A file without general.name reports its
    // file name rather than the bare architecture.
    const std::string stem = std::filesystem::path(a.model).stem().string();
    if (!a.alias.empty()) so.model_names.push_back(a.alias);
    if (std::string(info.name) == info.architecture) so.model_names.push_back(stem);
    so.model_names.push_back(info.name);
    so.model_names.push_back(stem);
    so.model_names.push_back(std::filesystem::path(a.model).filename().string());
    int code = 0;
    {
        auto srv = server::HttpServer::create(model, engine, so);
        if (!srv) {
            code = fail(srv.message());
        } else if (Status s = srv.value()->bind(); !s) {
            code = fail(s.message());
        } else {
            server::HttpServer& http = *srv.value();
            std::fprintf(stderr,
                         "bluevm: serving '%s' on http://%s:%d (%u instances, context %u, %s); "
                         "Ctrl-C stops\n",
                         so.model_names.front().c_str(), a.host.c_str(), http.port(), a.instances,
                         info.n_ctx, info.device);
            std::thread waiter([&] {
                int sig = 0;
                sigwait(&signals, &sig);
                if (sig == SIGINT || sig == SIGTERM) http.stop();
            });
            Status ran = http.run();
            // Wake the waiter if the server ended on its own.
            pthread_kill(waiter.native_handle(), SIGTERM);
            waiter.join();
            if (!ran) code = fail(ran.message());
            std::fprintf(stderr, "bluevm: server stopped\n");
        }
    }
    bluevm_engine_destroy(engine);
    bluevm_model_close(model);
    return code;
}

}  // namespace

Command addServeCommand(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    CLI::App* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
    sub->add_option("--model,-m", a->model, "GGUF model, or a .bir lowered by `bluec lower`")->required();
    sub->add_option("--instances", a->instances, "concurrent requests on the GPU (sharing the weights)")->check(CLI::Range(1u, 4096u));
    sub->add_option("--host", a->host, "address to listen on");
    sub->add_option("--port", a->port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
    sub->add_option("--ctx", a->ctx, "context length per instance (default: the model's, at most 2048)");
    sub->add_option("--queue", a->queue, "requests that may wait for an instance before 429 (default 8 per instance)");
    sub->add_option("--chain-cycles", a->chain_cycles, "cycles per submitted chain (fewer: tokens stream sooner)")->check(CLI::Range(2u, 4096u));
    sub->add_option("--threads", a->threads, "HTTP worker threads (default: enough for every instance and queued request)");
    sub->add_option("--device", a->device, "Vulkan device: index or part of its name");
    addDeviceLimitsOption(sub);
    sub->add_option("--alias", a->alias, "the model name reported by /v1/models");
    sub->add_flag("--log", a->log, "log one line per HTTP request on stderr");
    return [a] { return serve(*a); };
}

}  // namespace blue::cli
