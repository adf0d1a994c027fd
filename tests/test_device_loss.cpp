// Device loss survived: VK_ERROR_DEVICE_LOST (and out-of-device-memory) injected at checked Vulkan
// calls (host/vk_check.h) spread over loading (device, pipelines, machine, weights), generating and
// serving over HTTP. Every failure must come back as an error that names the call and what was
// running, never a crash or a hang; a lost device fails fast afterwards; then the engine or the
// server rebuilds the device and answers with exactly the greedy text of an undisturbed run, and
// no validation message was raised on any device. These tests make their own devices: a lost
// device must not harm the shared one of the other GPU tests.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "host/bluevm.h"
#include "host/llm/engine.h"
#include "host/server/http_server.h"
#include "host/vk_check.h"
#include "tests/server_fixture.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string stories() {
    return sharedDir() + "/models/stories260K/stories260K.gguf";
}

// For the length of a test: disarms any fault at the end, however it ends, and collects the
// process's stderr, where devices print validation messages, also those raised while a device is
// destroyed (objects it still holds), which no counter outlives. checkClean() fails on any.
struct FaultScope {
    FILE* file = std::tmpfile();
    int saved = -1;

    FaultScope() {
        std::fflush(stderr);
        saved = dup(2);
        if (file) dup2(fileno(file), 2);
    }
    ~FaultScope() {
        faultClear();
        std::fflush(stderr);
        if (saved >= 0) dup2(saved, 2);
        if (saved >= 0) close(saved);
        if (file) std::fclose(file);
    }
    std::string text() const {
        std::fflush(stderr);
        std::string out;
        if (!file) return out;
        std::rewind(file);
        char buf[4096];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) out.append(buf, n);
        return out;
    }
    void checkClean() const {
        const std::string t = text();
        INFO(t);
        CHECK(t.find("[validation") == std::string::npos);
    }
};

// `n` distinct call numbers spread evenly over 1..total (all of them when total <= n).
std::vector<uint64_t> spread(uint64_t total, size_t n) {
    std::vector<uint64_t> out;
    for (size_t i = 0; i < n && i < total; ++i)
        out.push_back(1 + i * total / std::min<uint64_t>(n, total));
    return out;
}

// What a failure message must say: the injected call, where it is, and what was running.
void checkNamesHit(const std::string& message, const FaultHit& hit, const char* kind) {
    INFO(message);
    CHECK(message.find(std::string(kind) + " (" + vkResultName(hit.result) + " from " + hit.call +
                       " at " + hit.where + ")") != std::string::npos);
    CHECK(message.find(" while ") != std::string::npos);
}

GenerationRequest greedy(const Engine& e, const std::string& prompt, uint32_t n) {
    GenerationRequest r;
    r.prompt = e.promptTokens(prompt);
    r.max_new = n;
    r.sampling.temperature = 0;
    return r;
}

// One load and generation on `e`: a new device, a machine, one greedy request.
Result<std::string> loadAndGenerate(Engine& e, const GenerationRequest& r) {
    BLUE_TRY(e.resetDevice());
    auto out = e.run({r});
    if (!out) return out.status();
    return out.value()[0].text;
}

// stories260K on an engine of its own (context 64, `chain_cycles` cycles a chain), the greedy
// request these cases repeat, and its undisturbed text.
struct Undisturbed {
    Result<std::unique_ptr<Engine>> engine = Status::error("not opened");
    GenerationRequest req;
    std::string text;
    Engine& e() { return *engine.value(); }
};

Undisturbed openUndisturbed(uint32_t chain_cycles) {
    Undisturbed u;
    EngineOptions eo;
    eo.ctx = 64;
    eo.chain_cycles = chain_cycles;
    u.engine = Engine::open(stories(), eo);
    REQUIRE_MESSAGE(u.engine.isOk(), u.engine.message());
    u.req = greedy(u.e(), "Once upon a time", 8);
    auto first = u.e().run({u.req});
    REQUIRE_MESSAGE(first.isOk(), first.message());
    u.text = first.value()[0].text;
    REQUIRE(u.text.rfind(", there was a little girl", 0) == 0);
    return u;
}

// A server rebuilds its device after each loss: one process makes and destroys many devices.
TEST_CASE("device loss: one process makes its device 40 times over and generates on each") {
    Undisturbed u = openUndisturbed(EngineOptions{}.chain_cycles);
    for (int i = 0; i < 40; ++i) {
        CAPTURE(i);
        auto again = loadAndGenerate(u.e(), u.req);
        REQUIRE_MESSAGE(again.isOk(), again.message());
        CHECK(again.value() == u.text);
    }
    CHECK(u.e().validationErrors() == 0u);
}

TEST_CASE(
    "device loss: injected at the checked calls of loading and generating, reported, recovered") {
    FaultScope scope;
    Undisturbed u = openUndisturbed(2);  // many chains per request: more calls to fail while generating
    Engine& e = u.e();
    const GenerationRequest& req = u.req;
    const std::string& expected = u.text;

    // The checked calls of one load + generation, undisturbed.
    const uint64_t base = faultCallCount();
    auto clean = loadAndGenerate(e, req);
    REQUIRE_MESSAGE(clean.isOk(), clean.message());
    const uint64_t total = faultCallCount() - base;
    REQUIRE(total > 30);

    std::set<std::string> sites;
    size_t in_load = 0, in_generate = 0;
    const std::vector<uint64_t> points = spread(total, 32);
    for (size_t i = 0; i < points.size(); ++i) {
        const uint64_t k = points[i];
        CAPTURE(k);
        const uint64_t hits = faultHits();
        faultInject({VK_ERROR_DEVICE_LOST, k});
        auto failed = loadAndGenerate(e, req);
        faultClear();
        REQUIRE(faultHits() == hits + 1);
        const FaultHit hit = faultLastHit();
        CAPTURE(hit.call);
        REQUIRE_FALSE(failed.isOk());
        checkNamesHit(failed.message(), hit, "device lost");
        (failed.message().find("while generating") != std::string::npos ? in_generate : in_load) +=
            1;
        sites.insert(hit.call + " " + hit.where);
        // Sticky: the lost device is not used again; later work fails fast without a Vulkan call.
        CHECK(e.deviceLost());
        const uint64_t calls = faultCallCount();
        auto again = e.run({req});
        REQUIRE_FALSE(again.isOk());
        CHECK(faultCallCount() == calls);
        CHECK((again.message().find("the device was lost earlier (device lost (") == 0 ||
               again.message().find("there is no Vulkan device") == 0));
        // Recovered: a new device gives the undisturbed text. Every other point, to save time:
        // the next point's run rebuilds the device too, and must get as far as its fault.
        if (i % 2 == 0 && i + 1 < points.size()) continue;
        auto recovered = loadAndGenerate(e, req);
        REQUIRE_MESSAGE(recovered.isOk(), recovered.message());
        CHECK(recovered.value() == expected);
    }
    MESSAGE("device lost at " << in_load << " points of loading and " << in_generate
                              << " of generating, " << sites.size() << " distinct call sites, of "
                              << total << " checked calls");
    CHECK(in_load >= 20);
    CHECK(in_generate >= 8);
    CHECK(sites.size() >= 15);
    CHECK(e.validationErrors() == 0u);
    u.engine = Status::error("closed");  // destroyed before the check: leaks would show now
    scope.checkClean();
}

TEST_CASE("device loss: out of device memory is reported and the same device goes on") {
    FaultScope scope;
    Undisturbed u = openUndisturbed(4);
    Engine& e = u.e();
    const GenerationRequest& req = u.req;
    const std::string& expected = u.text;

    struct Case {
        const char* call;
        uint64_t at, count;
        const char* context;  // what the message says was running ("": the run succeeds)
    };
    const Case cases[] = {
        // Every memory type refused: the machine cannot be made.
        {"vkAllocateMemory", 1, 2, "while loading the model onto the device"},
        {"vkAllocateMemory", 3, 2, "while loading the model onto the device"},
        // One memory type refused: the next preference has room, the run succeeds.
        {"vkAllocateMemory", 1, 1, ""},
        {"vkCreateDescriptorPool", 1, 1, "while loading the model onto the device"},
        {"vkQueueSubmit", 2, 1, "while generating (no request started yet"},
        {"vkWaitForFences", 2, 1, "while generating request 0 ("},
    };
    for (const Case& c : cases) {
        CAPTURE(c.call);
        CAPTURE(c.at);
        const uint64_t hits = faultHits();
        faultInject({VK_ERROR_OUT_OF_DEVICE_MEMORY, c.at, c.call, c.count});
        auto out = e.run({req});
        faultClear();
        REQUIRE(faultHits() == hits + c.count);
        if (!*c.context) {
            REQUIRE_MESSAGE(out.isOk(), out.message());
            CHECK(out.value()[0].text == expected);
            continue;
        }
        REQUIRE_FALSE(out.isOk());
        checkNamesHit(out.message(), faultLastHit(), "out of device memory");
        CHECK(out.message().find(c.context) != std::string::npos);
        // Not lost: the same device runs the next request.
        CHECK_FALSE(e.deviceLost());
        auto next = e.run({req});
        REQUIRE_MESSAGE(next.isOk(), next.message());
        CHECK(next.value()[0].text == expected);
    }
    CHECK(e.validationErrors() == 0u);
    u.engine = Status::error("closed");
    scope.checkClean();
}

// ---- serving -----------------------------------------------------------------------------------

struct Served {
    int status = 0;    // HTTP status (-1: no response)
    std::string text;  // completion text (streamed: the deltas)
    json error;        // the error object, when there is one (a stream's last event)
    std::string retry_after;
};

struct LossServer : TestServer {
    LossServer(uint32_t instances, uint32_t chain_cycles, uint32_t ctx = 64)
        : TestServer(instances, ctx, 0, {}, {.chain_cycles = chain_cycles}) {}
    Served complete(const std::string& prompt, uint32_t n, bool stream) const {
        json body = {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"stream", stream}};
        auto r = client().Post("/v1/completions", body.dump(), "application/json");
        Served s;
        if (!r) {
            s.status = -1;
            return s;
        }
        s.status = r->status;
        s.retry_after = r->get_header_value("Retry-After");
        if (!stream || r->status != 200) {
            json j = json::parse(r->body, nullptr, false);
            if (j.contains("error")) s.error = j["error"];
            if (r->status == 200) s.text = j["choices"][0]["text"];
            return s;
        }
        std::istringstream events(r->body);
        for (std::string line; std::getline(events, line);) {
            if (line.rfind("data: {", 0) != 0) continue;
            json j = json::parse(line.substr(6));
            if (j.contains("error")) {
                s.error = j["error"];
            } else if (!j["choices"].empty()) {
                s.text += j["choices"][0]["text"].get<std::string>();
            }
        }
        return s;
    }
    json health(int* status = nullptr) const {
        auto r = client().Get("/health");
        REQUIRE(r);
        if (status) *status = r->status;
        return json::parse(r->body);
    }
    // Waits (bounded) until /health says ok; returns its body.
    json waitHealthy() const {
        const auto until = Clock::now() + std::chrono::seconds(60);
        for (;;) {
            int status = 0;
            json h = health(&status);
            if (status == 200 && h["status"] == "ok") return h;
            REQUIRE_MESSAGE(Clock::now() < until, "the server did not recover: " << h.dump());
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
};

// Runs requests concurrently, each bounded in time: a hang fails the test instead of blocking it.
std::vector<Served> concurrently(const LossServer& s,
                                 const std::vector<std::pair<std::string, bool>>& reqs,
                                 uint32_t n) {
    std::vector<std::future<Served>> futures;
    for (const auto& [prompt, stream] : reqs) {
        futures.push_back(std::async(
            std::launch::async, [&s, prompt, stream, n] { return s.complete(prompt, n, stream); }));
    }
    std::vector<Served> out;
    for (auto& f : futures) {
        REQUIRE(f.wait_for(std::chrono::seconds(90)) == std::future_status::ready);
        out.push_back(f.get());
    }
    return out;
}

TEST_CASE(
    "device loss: bluevm serve answers the requests in flight with 503, rebuilds, serves the same "
    "text") {
    FaultScope scope;
    {
        LossServer s(2, 4);
        const std::vector<std::pair<std::string, bool>> pair = {{"Once upon a time", false},
                                                                {"The dog", true}};
        // Undisturbed: the text each prompt gives, and the checked calls two requests take.
        std::vector<Served> ref = concurrently(s, pair, 8);
        const uint64_t base = faultCallCount();
        ref = concurrently(s, pair, 8);
        const uint64_t window = faultCallCount() - base;
        REQUIRE(ref[0].status == 200);
        REQUIRE(ref[1].status == 200);
        REQUIRE(window >= 6);

        uint32_t recoveries = 0;
        size_t failed_requests = 0, points = 0;
        std::set<std::string> sites;
        // The calls a pair of requests takes vary with timing (idle pumps), so points past the
        // end of a shorter run do not fire: stride over the window until 16 have fired.
        for (uint64_t k : spread(window, 32)) {
            if (points >= 16) break;
            CAPTURE(k);
            const uint64_t hits = faultHits();
            faultInject({VK_ERROR_DEVICE_LOST, k});
            std::vector<Served> got = concurrently(s, pair, 8);
            const bool fired = faultHits() > hits;
            faultClear();
            if (fired) {
                const FaultHit hit = faultLastHit();
                ++points;
                sites.insert(hit.call + " " + hit.where);
                for (size_t i = 0; i < got.size(); ++i) {
                    CAPTURE(i);
                    if (got[i].error.is_null()) {  // it ended before the device was lost
                        CHECK(got[i].status == 200);
                        CHECK(got[i].text == ref[i].text);
                        continue;
                    }
                    ++failed_requests;
                    const std::string message = got[i].error["message"];
                    if (got[i].error["code"] == "recovering") {  // it arrived during the rebuild
                        CHECK(got[i].status == 503);
                        CHECK(got[i].retry_after == "1");
                        checkNamesHit(message, hit, "device lost");
                        continue;
                    }
                    // Plain: a 503 status; streamed: 200 was sent, the error is the last event.
                    CHECK(got[i].status == (pair[i].second ? 200 : 503));
                    CHECK(got[i].error["code"] == "device_lost");
                    checkNamesHit(message, hit, "device lost");
                    CHECK(message.find("while serving") != std::string::npos);
                }
                json h = s.waitHealthy();
                CHECK(h["recoveries"] == ++recoveries);
                CHECK(h["last_failure"].get<std::string>().find(hit.call) != std::string::npos);
            }
            // Later requests get exactly the undisturbed text.
            std::vector<Served> after = concurrently(s, pair, 8);
            for (size_t i = 0; i < after.size(); ++i) {
                CHECK(after[i].status == 200);
                CHECK(after[i].text == ref[i].text);
            }
        }
        MESSAGE("device lost at " << points << " points while serving, of a window of " << window
                                  << " calls (" << sites.size() << " call sites); "
                                  << failed_requests << " requests answered 503");
        CHECK(points >= 14);
        CHECK(failed_requests >= points);
        // Out of device memory while serving: the same answer and recovery.
        faultInject({VK_ERROR_OUT_OF_DEVICE_MEMORY, 1, "vkQueueSubmit", 1});
        Served oom = s.complete("Once upon a time", 8, false);
        CHECK(oom.status == 503);
        CHECK(oom.error["message"].get<std::string>().find(
                  "out of device memory (VK_ERROR_OUT_OF_DEVICE_MEMORY from vkQueueSubmit") !=
              std::string::npos);
        s.waitHealthy();
        CHECK(s.complete("Once upon a time", 8, false).text == ref[0].text);
    }
    scope.checkClean();
}

TEST_CASE(
    "device loss: while the rebuild itself fails, /health and new requests say 503 recovering") {
    FaultScope scope;
    {
        LossServer s(1, 4);
        Served ref = s.complete("Once upon a time", 8, false);
        REQUIRE(ref.status == 200);
        // Every checked call fails from the next one on: the request in flight fails, and so does
        // every attempt to rebuild the device.
        faultInject({VK_ERROR_DEVICE_LOST, 1, "", kFaultForever});
        Served lost = s.complete("Once upon a time", 8, false);
        CHECK(lost.status == 503);
        CHECK(lost.retry_after == "1");
        const auto until = Clock::now() + std::chrono::seconds(30);
        json h;
        int status = 0;
        do {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            h = s.health(&status);
            REQUIRE(Clock::now() < until);
        } while (h.value("failed_attempts", 0) < 2);
        CHECK(status == 503);
        CHECK(h["status"] == "recovering");
        CHECK(h["attempt_error"].get<std::string>().find(
                  "device lost (VK_ERROR_DEVICE_LOST from ") != std::string::npos);
        Served refused = s.complete("The dog", 8, true);
        CHECK(refused.status == 503);
        CHECK(refused.retry_after == "1");
        CHECK(refused.error["code"] == "recovering");
        auto metrics = s.client().Get("/metrics");
        REQUIRE(metrics);
        CHECK(metrics->body.find("bluevm_device_recovering 1\n") != std::string::npos);
        // The device works again: the next attempt rebuilds it and the server serves.
        faultClear();
        h = s.waitHealthy();
        CHECK(h["recoveries"] == 1);
        Served after = s.complete("Once upon a time", 8, false);
        CHECK(after.status == 200);
        CHECK(after.text == ref.text);
    }
    scope.checkClean();
}

TEST_CASE(
    "device loss: the C API reports BLUEVM_ERR_DEVICE_LOST and the engine can be made again") {
    FaultScope scope;
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 64;
    bluevm_model* model = nullptr;
    REQUIRE(bluevm_model_open(stories().c_str(), &mo, &model) == BLUEVM_OK);
    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = 1;
    bluevm_engine* engine = nullptr;
    faultInject({VK_ERROR_DEVICE_LOST, 2, "vkCreateBuffer"});
    CHECK(bluevm_engine_create(model, &eo, &engine) == BLUEVM_ERR_DEVICE_LOST);
    CHECK(std::string(bluevm_last_error())
              .find("device lost (VK_ERROR_DEVICE_LOST from vkCreateBuffer at host/buffer.cpp:") !=
          std::string::npos);
    CHECK(engine == nullptr);
    // Again: the lost device is replaced and the engine serves.
    REQUIRE_MESSAGE(bluevm_engine_create(model, &eo, &engine) == BLUEVM_OK, bluevm_last_error());
    faultInject({VK_ERROR_DEVICE_LOST, 1, "vkWaitForFences"});
    bluevm_request r;
    bluevm_request_init(&r);
    r.prompt = "Once upon a time";
    r.max_tokens = 8;
    r.temperature = 0;
    uint64_t id = 0;
    REQUIRE(bluevm_submit(engine, &r, &id) == BLUEVM_OK);
    bluevm_event ev{};
    for (int i = 0; i < 600 && !ev.finished; ++i) {
        bluevm_status st = bluevm_poll(engine, id, 100, &ev);
        REQUIRE((st == BLUEVM_OK || st == BLUEVM_ERR_TIMEOUT));
    }
    REQUIRE(ev.finished);
    CHECK(ev.reason == BLUEVM_FINISH_ERROR);
    CHECK(ev.error == BLUEVM_ERR_DEVICE_LOST);
    CHECK(std::string(bluevm_last_error()).find("from vkWaitForFences at host/machine.cpp:") !=
          std::string::npos);
    bluevm_release(engine, id);
    bluevm_health h{};
    for (int i = 0; i < 3000 && (h.state != BLUEVM_ENGINE_SERVING || h.recoveries == 0); ++i) {
        REQUIRE(bluevm_engine_health(engine, &h) == BLUEVM_OK);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(h.recoveries == 1);
    CHECK(std::string(h.failure).find("vkWaitForFences") != std::string::npos);
    bluevm_model_info info;
    bluevm_model_get_info(model, &info);
    CHECK(info.validation_errors == 0u);
    bluevm_engine_destroy(engine);
    bluevm_model_close(model);
    scope.checkClean();
}

TEST_CASE("device loss: a held (non-streamed) response still sees its client leave") {
    FaultScope scope;
    {
        LossServer s(1, 4, 512);
        httplib::Client c("127.0.0.1", s.http->port());
        c.set_read_timeout(0, 100000);  // gone after 0.1 s
        json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 500},
                     {"temperature", 0},
                     {"ignore_eos", true}};
        CHECK_FALSE(c.Post("/v1/completions", body.dump(), "application/json"));
        c.stop();
        std::string metrics;
        for (int i = 0;
             i < 200 && metrics.find("bluevm_requests_cancelled_total 1\n") == std::string::npos;
             ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            metrics = s.client().Get("/metrics")->body;
        }
        CHECK(metrics.find("bluevm_requests_cancelled_total 1\n") != std::string::npos);
        CHECK(metrics.find("bluevm_completion_tokens_total 500\n") == std::string::npos);
    }
    scope.checkClean();
}

// ---- processes: BLUE_FAULT ---------------------------------------------------------------------

std::string binary(const std::string& rel) {
    return std::string(BLUE_BINARY_DIR) + "/" + rel;
}

// A child process with BLUE_FAULT set, its stderr read through a pipe.
struct FaultyChild {
    pid_t pid = -1;
    int err = -1;
    std::string err_text;

    FaultyChild(const std::string& fault, const std::vector<std::string>& args) {
        int pe[2];
        REQUIRE(pipe(pe) == 0);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            dup2(pe[1], 2);
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            close(pe[0]);
            setenv("BLUE_FAULT", fault.c_str(), 1);
            std::vector<char*> argv;
            for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(pe[1]);
        err = pe[0];
    }
    ~FaultyChild() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (err >= 0) close(err);
    }
    void read(int ms) {
        pollfd p{err, POLLIN, 0};
        if (err < 0 || poll(&p, 1, ms) <= 0) return;
        char buf[4096];
        ssize_t got = ::read(err, buf, sizeof buf);
        if (got > 0) {
            err_text.append(buf, size_t(got));
        } else {
            close(err);
            err = -1;
        }
    }
    int wait(int timeout_s) {
        const auto until = Clock::now() + std::chrono::seconds(timeout_s);
        while (err >= 0 && Clock::now() < until) read(100);
        if (err >= 0) kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
};

TEST_CASE(
    "device loss: BLUE_FAULT makes bluevm generate fail with a message, and bluevm serve recover") {
    FaultyChild gen(
        "device_lost@vkWaitForFences:2",
        {binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Once upon a time",
         "-n", "8", "--temp", "0", "--ctx", "64", "--chain-cycles", "4", "--no-echo"});
    CHECK(gen.wait(120) == 1);
    INFO(gen.err_text);
    CHECK(std::regex_search(
        gen.err_text,
        std::regex("bluevm: device lost \\(VK_ERROR_DEVICE_LOST from vkWaitForFences "
                   "at host/machine\\.cpp:[0-9]+\\)( in chain [0-9]+)? while generating request 0 \\(")));

    FaultyChild srv("device_lost@vkWaitForFences:1",
                    {binary("host/bluevm"), "serve", "--model", stories(), "--port", "0",
                     "--instances", "1", "--ctx", "64", "--chain-cycles", "4"});
    std::smatch m;
    const std::regex listening("on http://127\\.0\\.0\\.1:([0-9]+) ");
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (!std::regex_search(srv.err_text, m, listening) && srv.err >= 0 && Clock::now() < until)
        srv.read(100);
    REQUIRE_MESSAGE(std::regex_search(srv.err_text, m, listening), srv.err_text);
    httplib::Client client("127.0.0.1", std::stoi(m[1]));
    client.set_read_timeout(60, 0);
    const std::string body =
        json{{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}}.dump();
    auto lost = client.Post("/v1/completions", body, "application/json");
    REQUIRE(lost);
    CHECK(lost->status == 503);
    CHECK(json::parse(lost->body)["error"]["message"].get<std::string>().find(
              "device lost (VK_ERROR_DEVICE_LOST from vkWaitForFences") != std::string::npos);
    int status = 0;
    std::string text;
    for (int i = 0; i < 300 && (status == 0 || status == 503); ++i) {
        if (i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        auto r = client.Post("/v1/completions", body, "application/json");
        REQUIRE(r);
        status = r->status;
        if (status == 200) text = json::parse(r->body)["choices"][0]["text"];
    }
    CHECK(status == 200);
    CHECK(text.rfind(", there was a little girl", 0) == 0);
    kill(srv.pid, SIGTERM);
    CHECK(srv.wait(60) == 0);
    CHECK(srv.err_text.find("serving again") != std::string::npos);
    CHECK(srv.err_text.find("[validation") == std::string::npos);
    CHECK(gen.err_text.find("[validation") == std::string::npos);
}

}  // namespace
}  // namespace blue::test
