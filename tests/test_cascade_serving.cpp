// Serving compiled cascades (host/cascade/cascade_serving.h, the C API's bluevm_cascade_*, the
// HTTP server, `bluevm serve --cascade`): through HTTP every program in programs/*.cas answers
// what CascadeRunner computes for the same task and seed (greedy variants, so token for token),
// with its slots, stage statistics and usage, to more concurrent clients than instances, plain
// and streamed, with round_trips 0; bad requests get 4xx naming the field; the C API runs,
// cancels and refuses misuse; the CLI serves and stops on SIGTERM.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "compiler/cascade/cascade.h"
#include "host/bluevm.h"
#include "host/cascade/cascade_run.h"
#include "host/server/http_server.h"
#include "host/vk_check.h"
#include "tests/child.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string stories() {
    return sharedDir() + "/models/stories260K/stories260K.gguf";
}
std::string binary(const std::string& rel) {
    return std::string(BLUE_BINARY_DIR) + "/" + rel;
}

std::string readFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The source with every stage greedy (as tests/test_cascade.cpp's greedy()).
std::string greedy(std::string src) {
    for (size_t at = src.find("temperature "); at != std::string::npos;
         at = src.find("temperature ", at + 1)) {
        src.replace(at, src.find('\n', at) - at, "temperature 0");
    }
    return src;
}


// A cascade source compiled with every model at stories260K, written to DIR/NAME.bir; returns
// the path.
std::string compileSource(const std::string& src, const std::string& name, const TempDir& dir) {
    CascadeOptions o;
    auto p = parseCascade(src, name + ".cas");
    REQUIRE_MESSAGE(p, p.message());
    for (const auto& m : p->models) o.models[m.name] = stories();
    o.module_dir = dir.path;
    auto m = compileCascade(src, name + ".cas", o);
    REQUIRE_MESSAGE(m, m.message());
    const std::string path = dir.path + "/" + name + ".bir";
    REQUIRE(writeModuleFile(m.value(), path));
    return path;
}

// programs/NAME.cas (greedy unless `sampled`), as compileSource.
std::string compileProgram(const std::string& name, const TempDir& dir, bool sampled = false) {
    std::string src = readFile(sourceDir() + "/programs/" + name + ".cas");
    return compileSource(sampled ? src : greedy(src), name, dir);
}

// What CascadeRunner computes on the GPU for the tasks (one run, `instances` at a time).
struct Expected {
    CascadeInfo info;
    std::vector<CascadeResult> results;
    std::vector<uint32_t> task_tokens;
    // The last output slot that holds text, else the last output slot (a skipped stage's slot is
    // empty and the slot before it stands).
    const std::string& answer(size_t i) const {
        for (auto it = info.outputs.rbegin(); it != info.outputs.rend(); ++it) {
            if (!results[i].slot_text[*it].empty()) return results[i].slot_text[*it];
        }
        return results[i].slot_text[info.outputs.back()];
    }
};

Expected runnerResults(const std::string& bir, const std::vector<CascadeTask>& tasks) {
    CascadeRunOptions ro;
    ro.instances = 2;
    auto runner = CascadeRunner::open(bir, ro);
    REQUIRE_MESSAGE(runner, runner.message());
    auto results = runner.value()->run(tasks);
    REQUIRE_MESSAGE(results, results.message());
    CHECK(runner.value()->validationErrors() == 0);
    Expected e;
    e.info = runner.value()->info();
    e.results = std::move(results.value());
    for (size_t i = 0; i < tasks.size(); ++i) {
        REQUIRE(e.results[i].complete);
        // What the program streamed is a prefix of the stream slot's final tokens.
        const std::vector<int32_t>& slot = e.results[i].slots[size_t(e.info.stream_slot)];
        REQUIRE(e.results[i].streamed.size() <= slot.size());
        CHECK(std::equal(e.results[i].streamed.begin(), e.results[i].streamed.end(), slot.begin()));
        e.task_tokens.push_back(
            uint32_t(runner.value()->tokenizer().encode(tasks[i].text, false, true).size()));
    }
    return e;
}

struct CascadeServer {
    bluevm_cascade* cascade = nullptr;
    std::unique_ptr<server::HttpServer> http;
    std::thread thread;

    CascadeServer(const std::string& bir, uint32_t instances, const std::string& name,
                  uint32_t max_queue = 0) {
        bluevm_cascade_options o;
        bluevm_cascade_options_init(&o);
        o.instances = instances;
        o.max_queue = max_queue;
        REQUIRE_MESSAGE(bluevm_cascade_open(bir.c_str(), &o, &cascade) == BLUEVM_OK,
                        bluevm_last_error());
        server::ServerOptions so;
        so.port = 0;
        so.model_names = {name};
        auto s = server::HttpServer::create(cascade, so);
        REQUIRE_MESSAGE(s.isOk(), s.message());
        http = std::move(s.value());
        REQUIRE(http->bind().isOk());
        thread = std::thread([this] { (void)http->run(); });
    }
    ~CascadeServer() {
        http->stop();
        thread.join();
        http.reset();
        bluevm_cascade_info info;
        bluevm_cascade_get_info(cascade, &info);
        CHECK(info.validation_errors == 0u);
        bluevm_cascade_close(cascade);
    }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", http->port());
        c.set_read_timeout(300, 0);
        return c;
    }
    httplib::Result post(const std::string& path, const json& body) const {
        return client().Post(path.c_str(), body.dump(), "application/json");
    }
    double metric(const std::string& name) const {
        auto res = client().Get("/metrics");
        REQUIRE(res);
        size_t at = res->body.find("\n" + name + " ");
        REQUIRE_MESSAGE(at != std::string::npos, name);
        return std::stod(res->body.substr(at + name.size() + 2));
    }
};

// A streamed response: its content, finish reason, usage and whether it ended with [DONE].
struct Streamed {
    std::string text, finish;
    int content_chunks = 0;
    bool done = false;
    json usage;
};

Streamed parseStream(const std::string& body, bool chat) {
    Streamed s;
    std::istringstream events(body);
    for (std::string line; std::getline(events, line);) {
        if (line.rfind("data: ", 0) != 0) continue;
        if (line == "data: [DONE]") {
            s.done = true;
            continue;
        }
        json j = json::parse(line.substr(6));
        if (j.contains("usage")) s.usage = j["usage"];
        if (j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        std::string piece =
            chat ? c["delta"].value("content", std::string()) : c["text"].get<std::string>();
        s.content_chunks += piece.empty() ? 0 : 1;
        s.text += piece;
        if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"];
    }
    return s;
}

// Checks a non-streamed response against the runner's result for the same task and seed.
void checkResponse(const json& j, const Expected& e, size_t i, bool chat) {
    const CascadeResult& r = e.results[i];
    CHECK((chat ? j["choices"][0]["message"]["content"] : j["choices"][0]["text"]) == e.answer(i));
    CHECK(j["usage"]["prompt_tokens"] == e.task_tokens[i]);
    CHECK(j["usage"]["completion_tokens"] == r.generated);
    const json& c = j["cascade"];
    REQUIRE(c["slots"].size() == e.info.slots.size());
    for (size_t k = 0; k < e.info.slots.size(); ++k)
        CHECK(c["slots"][e.info.slots[k]] == r.slot_text[k]);
    REQUIRE(c["stages"].size() == r.stages.size());
    for (size_t k = 0; k < r.stages.size(); ++k) {
        CHECK(c["stages"][k]["name"] == r.stages[k].name);
        CHECK(c["stages"][k]["state"] == r.stages[k].stateName());
        CHECK(c["stages"][k]["runs"] == r.stages[k].runs);
        CHECK(c["stages"][k]["tokens"] == r.stages[k].tokens);
        CHECK(c["stages"][k]["entropy_mean"].get<double>() ==
              doctest::Approx(r.stages[k].entropyMean()).epsilon(1e-3));
        CHECK(c["stages"][k].contains("entropy_max"));
        CHECK(c["stages"][k].contains("logprob_mean"));
    }
}

const std::vector<CascadeTask> kTasks = {
    {"Once upon a time", 11}, {"The dog", 12}, {"Lily wanted", 13}};

TEST_CASE(
    "cascade serving: every program through HTTP answers what CascadeRunner computes, to more "
    "clients than instances") {
    for (const char* name : {"draft_refine", "entropy_skip", "review_loop", "speculative", "best_of"}) {
        CAPTURE(name);
        TempDir dir;
        const std::string bir = compileProgram(name, dir);
        const Expected e = runnerResults(bir, kTasks);
        CascadeServer s(bir, 2, name);
        auto models = s.client().Get("/v1/models");
        REQUIRE(models);
        json m = json::parse(models->body)["data"][0];
        CHECK(m["id"] == name);
        CHECK(m["meta"]["kind"] == "cascade");
        CHECK(m["meta"]["answer_slot"] == e.info.slots[e.info.outputs.back()]);
        // Every task three ways (completions, chat, streamed completions) at once: 9 clients, 2
        // instances.
        std::vector<std::thread> clients;
        std::vector<std::string> bodies(3 * kTasks.size());
        std::vector<int> statuses(bodies.size(), 0);
        for (size_t k = 0; k < bodies.size(); ++k) {
            clients.emplace_back([&, k] {
                const CascadeTask& t = kTasks[k % kTasks.size()];
                const int way = int(k / kTasks.size());
                json body = {{"model", name}, {"seed", t.seed}, {"max_tokens", 5}};
                if (way == 1) {
                    body["messages"] = json::array({{{"role", "system"}, {"content", "ignored"}},
                                                    {{"role", "user"}, {"content", t.text}}});
                } else {
                    body["prompt"] = t.text;
                }
                if (way == 2) {
                    body["stream"] = true;
                    body["stream_options"] = {{"include_usage", true}};
                }
                auto r = s.post(way == 1 ? "/v1/chat/completions" : "/v1/completions", body);
                if (!r) return;
                statuses[k] = r->status;
                bodies[k] = r->body;
            });
        }
        for (std::thread& t : clients) t.join();
        for (size_t k = 0; k < bodies.size(); ++k) {
            CAPTURE(k);
            REQUIRE_MESSAGE(statuses[k] == 200, bodies[k]);
            const size_t i = k % kTasks.size();
            const int way = int(k / kTasks.size());
            if (way < 2) {
                json j = json::parse(bodies[k]);
                CHECK(j["object"] == (way == 1 ? "chat.completion" : "text_completion"));
                CHECK(j["choices"][0]["finish_reason"] == "stop");
                checkResponse(j, e, i, way == 1);
            } else {
                Streamed st = parseStream(bodies[k], false);
                CHECK(st.text == e.answer(i));
                // draft_refine's answer (story) is written finally by a stage: it streams.
                if (std::string(name) == "draft_refine") CHECK(st.content_chunks > 1);
                CHECK((st.content_chunks > 0) == !e.answer(i).empty());
                CHECK(st.finish == "stop");
                CHECK(st.done);
                CHECK(st.usage["prompt_tokens"] == e.task_tokens[i]);
                CHECK(st.usage["completion_tokens"] == e.results[i].generated);
            }
        }
        uint64_t generated = 0;
        for (const CascadeResult& r : e.results) generated += r.generated;
        CHECK(s.metric("bluevm_requests_total") == double(bodies.size()));
        CHECK(s.metric("bluevm_requests_finished_total") == double(bodies.size()));
        CHECK(s.metric("bluevm_completion_tokens_total") == double(3 * generated));
        CHECK(s.metric("bluevm_host_round_trips_total") == 0);
        CHECK(s.metric("bluevm_gpu_submits_total") > 0);
        CHECK(s.metric("bluevm_instances") == 2);
        auto health = s.client().Get("/health");
        REQUIRE(health);
        CHECK(health->status == 200);
    }
}

TEST_CASE(
    "cascade serving: a sampled cascade gives the runner's result for the same seed, and a chat "
    "stream frames its chunks") {
    TempDir dir;
    const std::string bir = compileProgram("draft_refine", dir, true);
    const std::vector<CascadeTask> tasks = {{"Once upon a time", 5}, {"Once upon a time", 6}};
    const Expected e = runnerResults(bir, tasks);
    CascadeServer s(bir, 1, "dr");
    for (size_t i = 0; i < tasks.size(); ++i) {
        auto r = s.post("/v1/completions", {{"prompt", tasks[i].text}, {"seed", tasks[i].seed}});
        REQUIRE(r);
        REQUIRE_MESSAGE(r->status == 200, r->body);
        checkResponse(json::parse(r->body), e, i, false);
    }
    auto r = s.post("/v1/chat/completions",
                    {{"messages", json::array({{{"role", "user"}, {"content", tasks[0].text}}})},
                     {"seed", tasks[0].seed},
                     {"stream", true}});
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Content-Type") == "text/event-stream");
    Streamed st = parseStream(r->body, true);
    CHECK(st.text == e.answer(0));
    CHECK(st.content_chunks > 1);
    CHECK(st.finish == "stop");
    CHECK(st.done);
    CHECK(r->body.find("\"role\":\"assistant\"") != std::string::npos);
}

TEST_CASE(
    "cascade serving: the answer slot streams as it is written, and the deltas add up to the "
    "answer a plain request gets for the same seed") {
    TempDir dir;
    std::string loop = readFile(sourceDir() + "/programs/review_loop.cas");
    const size_t out = loop.find("output story, verdict");
    REQUIRE(out != std::string::npos);
    struct Case {
        std::string name, src;
        bool streams;  // the answer's writes are final: more than one chunk
    };
    const std::vector<Case> cases = {
        {"dr", readFile(sourceDir() + "/programs/draft_refine.cas"), true},
        // review_loop answering with its story: the first write and the loop's appends are final.
        {"loop_story", loop.substr(0, out) + "output story\n", true},
        // The story rewritten in a loop: no write is final, the answer comes whole at the end.
        {"rewrite", loop.substr(0, out) + "repeat 2 {\n    run tell\n}\noutput story\n", false},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        CascadeServer s(compileSource(c.src, c.name, dir), 1, c.name);
        for (uint32_t seed : {3u, 4u}) {
            CAPTURE(seed);
            const json body = {{"prompt", "Once upon a time"}, {"seed", seed}};
            auto plain = s.post("/v1/completions", body);
            REQUIRE(plain);
            REQUIRE_MESSAGE(plain->status == 200, plain->body);
            const std::string answer = json::parse(plain->body)["choices"][0]["text"];
            json streamed_body = body;
            streamed_body["stream"] = true;
            auto r = s.post("/v1/completions", streamed_body);
            REQUIRE(r);
            REQUIRE(r->status == 200);
            Streamed st = parseStream(r->body, false);
            CHECK(st.done);
            CHECK(st.text == answer);
            if (c.streams) {
                CHECK(st.content_chunks > 1);
            } else {
                CHECK(st.content_chunks <= 1);
            }
            json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Once upon a time"}}})},
                         {"seed", seed},
                         {"stream", true}};
            auto rc = s.post("/v1/chat/completions", chat);
            REQUIRE(rc);
            CHECK(parseStream(rc->body, true).text == answer);
        }
        CHECK(s.metric("bluevm_host_round_trips_total") == 0);
    }
}

TEST_CASE(
    "cascade serving: bad requests get 4xx with an OpenAI error naming the field; the server "
    "serves on") {
    TempDir dir;
    const std::string bir = compileProgram("entropy_skip", dir);
    CascadeServer s(bir, 1, "skip");
    struct Bad {
        std::string path;
        std::string body;
        int status;
        std::string param, code;
    };
    const std::string too_long = json{{"prompt", std::string(3000, 'a') + " b c d e f g"}}.dump();
    const std::vector<Bad> bad = {
        {"/v1/completions", too_long, 400, "prompt", "context_length_exceeded"},
        {"/v1/chat/completions",
         json{{"messages",
               json::array({{{"role", "user"}, {"content", std::string(3000, 'a') + " b c d"}}})}}
             .dump(),
         400, "messages", "context_length_exceeded"},
        {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens", ""},
        {"/v1/completions", R"({"prompt": [1, 2, 3]})", 400, "prompt", ""},
        {"/v1/completions", R"({"prompt": "x", "echo": true})", 400, "echo", ""},
        {"/v1/completions", R"({})", 400, "prompt", ""},
        {"/v1/completions", R"({"prompt": "x", "seed": "five"})", 400, "seed", ""},
        {"/v1/chat/completions", R"({"messages": [{"role": "system", "content": "x"}]})", 400,
         "messages", ""},
        {"/v1/completions", R"({"prompt": "x", "model": "nope"})", 404, "model", "model_not_found"},
        {"/v1/completions", R"({"prompt": )", 400, "", ""},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.body.substr(0, 80));
        auto r = s.client().Post(b.path.c_str(), b.body, "application/json");
        REQUIRE(r);
        CHECK(r->status == b.status);
        json err = json::parse(r->body)["error"];
        CHECK(!err["message"].get<std::string>().empty());
        CHECK(err["param"] == (b.param.empty() ? json() : json(b.param)));
        if (!b.code.empty()) CHECK(err["code"] == b.code);
    }
    auto ok = s.post("/v1/completions", {{"prompt", "The dog"}, {"max_tokens", 1}});
    REQUIRE(ok);
    CHECK(ok->status == 200);
    CHECK(s.metric("bluevm_requests_total") == 1);
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
}

// A cascade whose one stage writes long: a request that runs for seconds.
std::string compileLong(const TempDir& dir) {
    const std::string src =
        "model m = \"" + stories() +
        "\"\nslot input[64]\nslot story[400]\nstage tell {\n    prompt input\n    write story\n"
        "    max_tokens 380\n    temperature 0\n}\n";
    CascadeOptions o;
    o.module_dir = dir.path;
    auto m = compileCascade(src, "long.cas", o);
    REQUIRE_MESSAGE(m, m.message());
    const std::string path = dir.path + "/long.bir";
    REQUIRE(writeModuleFile(m.value(), path));
    return path;
}

TEST_CASE(
    "cascade serving: a client that leaves cancels its request through the flag word and frees the "
    "instance") {
    TempDir dir;
    CascadeServer s(compileLong(dir), 1, "long");
    {
        httplib::Client quick("127.0.0.1", s.http->port());
        quick.set_read_timeout(0, 300000);  // gives up after 0.3 s
        auto r = quick.Post("/v1/completions", json{{"prompt", "Once upon a time"}}.dump(),
                            "application/json");
        CHECK(!r);
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s.metric("bluevm_requests_cancelled_total") < 1 &&
           std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(s.metric("bluevm_requests_cancelled_total") == 1);
    // The one instance is free again: a streamed chat request runs to its end.
    auto r = s.post("/v1/chat/completions",
                    {{"messages", json::array({{{"role", "user"}, {"content", "The dog"}}})},
                     {"stream", true}});
    REQUIRE(r);
    CHECK(r->status == 200);
    Streamed st = parseStream(r->body, true);
    CHECK(st.done);
    CHECK(st.finish == "stop");
    CHECK(!st.text.empty());
    CHECK(s.metric("bluevm_requests_finished_total") == 2);
    CHECK(s.metric("bluevm_instances_busy") == 0);
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
}

TEST_CASE(
    "cascade serving: a device lost while serving answers 503 device_lost, rebuilds, and serves "
    "the same answer") {
    TempDir dir;
    const std::string bir = compileProgram("entropy_skip", dir);
    const Expected e = runnerResults(bir, kTasks);
    CascadeServer s(bir, 2, "skip");
    const json body = {{"prompt", kTasks[0].text}, {"seed", kTasks[0].seed}};
    auto before = s.post("/v1/completions", body);
    REQUIRE(before);
    REQUIRE(before->status == 200);
    faultInject({VK_ERROR_DEVICE_LOST, 1, "vkQueueSubmit", 1});
    auto lost = s.post("/v1/completions", body);
    faultClear();
    REQUIRE(lost);
    CHECK(lost->status == 503);
    json err = json::parse(lost->body)["error"];
    CHECK(err["code"] == "device_lost");
    const std::string message = err["message"];
    CHECK_MESSAGE(message.find("VK_ERROR_DEVICE_LOST from vkQueueSubmit") != std::string::npos,
                  message);
    // The request is running or still waiting for its instance when the submit fails.
    CHECK_MESSAGE(std::regex_search(
                      message, std::regex("while serving [01] cascade requests? \\([01] waiting")),
                  message);
    json health;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        auto h = s.client().Get("/health");
        REQUIRE(h);
        health = json::parse(h->body);
    } while (health["status"] != "ok" && std::chrono::steady_clock::now() < until);
    CHECK(health["status"] == "ok");
    CHECK(health["recoveries"] == 1);
    CHECK(health["last_failure"].get<std::string>().find("vkQueueSubmit") != std::string::npos);
    auto after = s.post("/v1/completions", body);
    REQUIRE(after);
    REQUIRE(after->status == 200);
    checkResponse(json::parse(after->body), e, 0, false);
    CHECK(s.metric("bluevm_device_recoveries_total") == 1);
}

TEST_CASE("capi: bluevm_cascade runs, reports slots and stats, cancels, and refuses misuse") {
    TempDir dir;
    const std::string bir = compileProgram("review_loop", dir);
    const Expected e = runnerResults(bir, kTasks);
    bluevm_cascade* c = nullptr;
    bluevm_cascade_options o;
    bluevm_cascade_options_init(&o);
    o.instances = 2;
    o.max_queue = 1;
    const char* names[] = {"writer"};
    const char* paths[] = {stories().c_str()};
    const std::string stories_path = stories();
    paths[0] = stories_path.c_str();
    o.model_names = names;
    o.model_paths = paths;
    o.n_models = 1;
    REQUIRE_MESSAGE(bluevm_cascade_open(bir.c_str(), &o, &c) == BLUEVM_OK, bluevm_last_error());
    struct Closer {
        bluevm_cascade*& c;
        ~Closer() { bluevm_cascade_close(c); }
    } closer{c};
    bluevm_cascade_info info;
    REQUIRE(bluevm_cascade_get_info(c, &info) == BLUEVM_OK);
    CHECK(info.n_stages == 3);
    CHECK(std::string(info.stages[0]) == "tell");
    CHECK(info.n_slots == 2);
    CHECK(std::string(info.answer_slot) == "verdict");
    CHECK(info.instances == 2);

    bluevm_cascade_result* r = nullptr;
    REQUIRE_MESSAGE(bluevm_cascade_run(c, kTasks[1].text.c_str(), kTasks[1].seed, &r) == BLUEVM_OK,
                    bluevm_last_error());
    CHECK(bluevm_cascade_result_finish(r) == BLUEVM_FINISH_STOP);
    size_t len = 0;
    CHECK(std::string(bluevm_cascade_result_answer(r, &len)) == e.answer(1));
    CHECK(len == e.answer(1).size());
    CHECK(std::string(bluevm_cascade_result_slot(r, "story", &len)) == e.results[1].slot_text[0]);
    CHECK(bluevm_cascade_result_slot(r, "nope", &len) == nullptr);
    json stats = json::parse(bluevm_cascade_result_stats_json(r));
    CHECK(stats["generated"] == e.results[1].generated);
    CHECK(stats["stages"][0]["name"] == "tell");
    uint32_t prompt = 0, completion = 0;
    bluevm_cascade_result_usage(r, &prompt, &completion);
    CHECK(prompt == e.task_tokens[1]);
    CHECK(completion == e.results[1].generated);
    bluevm_status es = BLUEVM_ERR_INTERNAL;
    CHECK(std::string(bluevm_cascade_result_error(r, &es)).empty());
    CHECK(es == BLUEVM_OK);
    bluevm_cascade_result_free(r);

    // Submit/wait for every task, cancelling one: the others keep their answers; the queue holds
    // one waiting request, so a burst is refused with QUEUE_FULL rather than lost.
    std::vector<uint64_t> ids;
    int refused = 0;
    for (int k = 0; k < 6; ++k) {
        uint64_t id = 0;
        bluevm_status st = bluevm_cascade_submit(c, kTasks[size_t(k) % 3].text.c_str(),
                                                 kTasks[size_t(k) % 3].seed, &id);
        if (st == BLUEVM_ERR_QUEUE_FULL) {
            ++refused;
            CHECK(std::string(bluevm_last_error()).find("queue is full") != std::string::npos);
            continue;
        }
        REQUIRE_MESSAGE(st == BLUEVM_OK, bluevm_last_error());
        ids.push_back(id);
    }
    CHECK(refused > 0);
    REQUIRE(!ids.empty());
    CHECK(bluevm_cascade_cancel(c, ids[0]) == BLUEVM_OK);
    CHECK(bluevm_cascade_wait(c, ids[0], -1, &r) == BLUEVM_OK);
    CHECK(bluevm_cascade_result_finish(r) == BLUEVM_FINISH_CANCELLED);
    bluevm_cascade_result_free(r);
    CHECK(bluevm_cascade_wait(c, ids[0], 0, &r) == BLUEVM_ERR_NOT_FOUND);  // handed out: forgotten
    for (size_t k = 1; k < ids.size(); ++k) {
        REQUIRE(bluevm_cascade_wait(c, ids[k], -1, &r) == BLUEVM_OK);
        CHECK(bluevm_cascade_result_finish(r) == BLUEVM_FINISH_STOP);
        bluevm_cascade_result_free(r);
    }
    // Released while another thread waits for it: the wait ends with NOT_FOUND.
    uint64_t waited = 0;
    REQUIRE(bluevm_cascade_submit(c, kTasks[0].text.c_str(), kTasks[0].seed, &waited) == BLUEVM_OK);
    bluevm_status wait_status = BLUEVM_OK;
    std::thread waiter([&] {
        bluevm_cascade_result* lost = nullptr;
        wait_status = bluevm_cascade_wait(c, waited, -1, &lost);
        CHECK(lost == nullptr);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(bluevm_cascade_release(c, waited) == BLUEVM_OK);
    waiter.join();
    CHECK(wait_status == BLUEVM_ERR_NOT_FOUND);
    // The release cancels it (through the driver, after the chain in flight): wait for that, as
    // until then it may hold the queue's one place.
    bluevm_metrics m;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    do {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        REQUIRE(bluevm_cascade_metrics(c, &m) == BLUEVM_OK);
    } while (m.requests_cancelled < 2 && std::chrono::steady_clock::now() < until);
    CHECK(m.requests_cancelled == 2);
    // A cancelled request freed its instance: the next one still gets the runner's answer.
    REQUIRE(bluevm_cascade_run(c, kTasks[2].text.c_str(), kTasks[2].seed, &r) == BLUEVM_OK);
    CHECK(std::string(bluevm_cascade_result_answer(r, nullptr)) == e.answer(2));
    bluevm_cascade_result_free(r);

    uint64_t id = 0;
    CHECK(bluevm_cascade_submit(c, (std::string(3000, 'a') + " b c d e f g").c_str(), 0, &id) ==
          BLUEVM_ERR_TOO_LONG);
    CHECK(std::string(bluevm_last_error()).find("more than the cascade's input slot holds") !=
          std::string::npos);
    CHECK(bluevm_cascade_submit(c, nullptr, 0, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(bluevm_cascade_wait(c, 999999, 0, &r) == BLUEVM_ERR_NOT_FOUND);
    CHECK(bluevm_cascade_cancel(c, 999999) == BLUEVM_ERR_NOT_FOUND);
    REQUIRE(bluevm_cascade_metrics(c, &m) == BLUEVM_OK);
    CHECK(m.round_trips == 0);
    CHECK(m.requests_cancelled == 2);
    CHECK(m.requests_rejected == uint64_t(refused));
    CHECK(m.requests_total == 3 + ids.size());
    bluevm_health h;
    REQUIRE(bluevm_cascade_health(c, &h) == BLUEVM_OK);
    CHECK(h.state == BLUEVM_ENGINE_SERVING);
    REQUIRE(bluevm_cascade_get_info(c, &info) == BLUEVM_OK);
    CHECK(info.validation_errors == 0u);

    bluevm_cascade* none = nullptr;
    CHECK(bluevm_cascade_open("/nonexistent.bir", nullptr, &none) == BLUEVM_ERR_IO);
    CHECK(std::string(bluevm_last_error()) == "/nonexistent.bir: no such file");
    names[0] = "critic";
    CHECK(bluevm_cascade_open(bir.c_str(), &o, &none) == BLUEVM_ERR_MODEL);
    CHECK(std::string(bluevm_last_error()).find("has no model 'critic'") != std::string::npos);
    CHECK(none == nullptr);
    CHECK(bluevm_cascade_open(stories().c_str(), nullptr, &none) == BLUEVM_ERR_MODEL);
    o.instances = 0;
    CHECK(bluevm_cascade_open(bir.c_str(), &o, &none) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(bluevm_cascade_run(nullptr, "x", 0, &r) == BLUEVM_ERR_INVALID_ARGUMENT);
}

TEST_CASE(
    "cli: bluevm serve --cascade answers concurrent clients with the runner's answers; SIGTERM "
    "stops it") {
    TempDir dir;
    const std::string bir = dir.path + "/dr.bir";
    {
        std::string src = greedy(readFile(sourceDir() + "/programs/draft_refine.cas"));
        std::ofstream(dir.path + "/dr.cas") << src;
        Child c({binary("compiler/bluec"), "cascade", dir.path + "/dr.cas", "-o", bir, "--model",
                 "draft=" + stories(), "--model", "target=" + stories()});
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    }
    const Expected e = runnerResults(bir, kTasks);
    const std::string trace = dir.path + "/trace.jsonl";
    Child c({binary("host/bluevm"), "serve", "--cascade", bir, "--model", "draft=" + stories(),
             "--port", "0", "--instances", "2", "--alias", "cas", "--trace", trace});
    std::smatch m;
    const std::regex listening("on http://127\\.0\\.0\\.1:([0-9]+) ");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::regex_search(c.err_text, m, listening) && std::chrono::steady_clock::now() < until)
        c.pump(100);
    REQUIRE_MESSAGE(std::regex_search(c.err_text, m, listening), c.err_text);
    CHECK(c.err_text.find("serving cascade 'cas'") != std::string::npos);
    CHECK(c.err_text.find("answer slot 'story'") != std::string::npos);
    const int port = std::stoi(m[1]);
    std::vector<std::thread> clients;
    std::vector<std::string> got(kTasks.size() + 1);
    for (size_t k = 0; k < got.size(); ++k) {
        clients.emplace_back([&, k] {
            httplib::Client cl("127.0.0.1", port);
            cl.set_read_timeout(300, 0);
            const CascadeTask& t = kTasks[k % kTasks.size()];
            // The file's stem names the model too.
            auto r = cl.Post(
                "/v1/completions",
                json{{"model", k == 0 ? "cas" : "dr"}, {"prompt", t.text}, {"seed", t.seed}}.dump(),
                "application/json");
            if (r && r->status == 200) got[k] = json::parse(r->body)["choices"][0]["text"];
        });
    }
    for (std::thread& t : clients) t.join();
    for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == e.answer(k % kTasks.size()));
    httplib::Client client("127.0.0.1", port);
    auto metrics = client.Get("/metrics");
    REQUIRE(metrics);
    CHECK(metrics->body.find("bluevm_requests_total 4\n") != std::string::npos);
    CHECK(metrics->body.find("bluevm_host_round_trips_total 0\n") != std::string::npos);
    kill(c.pid, SIGTERM);
    CHECK(c.wait(60) == 0);
    CHECK(c.err_text.find("bluevm: server stopped") != std::string::npos);
    // --trace: one line per request, with its task, seed, stages and slots.
    std::istringstream lines(readFile(trace));
    size_t traced = 0;
    for (std::string line; std::getline(lines, line); ++traced) {
        json t = json::parse(line);
        size_t k = 0;
        while (k < kTasks.size() && !(kTasks[k].text == t["task"] && kTasks[k].seed == t["seed"])) ++k;
        REQUIRE(k < kTasks.size());
        CHECK(t["slots"]["story"] == e.answer(k));
        CHECK(t["stages"].size() == 2);
    }
    CHECK(traced == got.size());
    Child unwritable({binary("host/bluevm"), "serve", "--cascade", bir, "--port", "0", "--trace", "/nonexistent/dir/t.jsonl"});
    CHECK(unwritable.wait(60) == 1);
    CHECK(unwritable.err_text == "bluevm: /nonexistent/dir/t.jsonl: cannot open the trace file for appending\n");
    Child llm_trace({binary("host/bluevm"), "serve", "--model", stories(), "--port", "0", "--trace", trace});
    CHECK(llm_trace.wait(60) == 1);
    CHECK(llm_trace.err_text.find("--trace records cascades' stages") != std::string::npos);

    Child missing({binary("host/bluevm"), "serve", "--cascade", "/nonexistent.bir", "--port", "0"});
    CHECK(missing.wait(60) == 1);
    CHECK(missing.err_text == "bluevm: /nonexistent.bir: no such file\n");
    Child bad_model(
        {binary("host/bluevm"), "serve", "--cascade", bir, "--model", stories(), "--port", "0"});
    CHECK(bad_model.wait(60) == 1);
    CHECK(bad_model.err_text ==
          "bluevm: --model needs NAME=PATH with --cascade, got '" + stories() + "'\n");
    Child ctx({binary("host/bluevm"), "serve", "--cascade", bir, "--ctx", "128", "--port", "0"});
    CHECK(ctx.wait(60) == 1);
    CHECK(ctx.err_text.find("bluevm: --ctx does not apply to a cascade") == 0);
    Child nothing({binary("host/bluevm"), "serve", "--port", "0"});
    CHECK(nothing.wait(60) == 1);
    CHECK(nothing.err_text == "bluevm: --model (or --cascade) is required\n");
}

}  // namespace
}  // namespace blue::test
