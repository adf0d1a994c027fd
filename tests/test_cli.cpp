// The command-line programs as a user runs them: `bluevm serve` answers HTTP and stops cleanly on
// SIGTERM, `bluevm generate --prompts` writes one JSONL result per prompt, the C example runs, and
// user errors print one line and exit 1.
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
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/child.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

using json = nlohmann::json;

std::string binary(const std::string& rel) { return std::string(BLUE_BINARY_DIR) + "/" + rel; }
std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

// Greedy text of `bluevm generate` (one instance) for a prompt: what the server must return.
std::string generateAlone(const std::string& prompt, int n) {
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", prompt, "-n",
             std::to_string(n), "--temp", "0", "--ctx", "128", "--no-echo"});
    REQUIRE(c.wait() == 0);
    REQUIRE(!c.out_text.empty());
    return c.out_text.substr(0, c.out_text.size() - 1);  // generate ends with a newline
}

TEST_CASE("cli: bluevm serve gives single-instance greedy text to concurrent clients; SIGTERM stops it") {
    const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily wanted", "Tom and his mom"};
    std::vector<std::string> alone;
    for (const std::string& p : prompts) alone.push_back(generateAlone(p, 24));
    Child c({binary("host/bluevm"), "serve", "--model", stories(), "--port", "0", "--instances",
             "3", "--ctx", "128", "--alias", "tiny"});
    std::smatch m;
    const std::regex listening("on http://127\\.0\\.0\\.1:([0-9]+) ");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::regex_search(c.err_text, m, listening) && std::chrono::steady_clock::now() < until) {
        c.pump(100);
    }
    REQUIRE_MESSAGE(std::regex_search(c.err_text, m, listening), c.err_text);
    const int port = std::stoi(m[1]);
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60, 0);
    auto models = client.Get("/v1/models");
    REQUIRE(models);
    CHECK(json::parse(models->body)["data"][0]["id"] == "tiny");
    // Every prompt twice, streamed and not, all at once and in reverse order of the list: more
    // requests than instances, arriving in any order.
    std::vector<std::thread> clients;
    std::vector<std::string> got(2 * prompts.size());
    for (size_t k = 0; k < got.size(); ++k) {
        clients.emplace_back([&, k] {
            const size_t i = (got.size() - 1 - k) % prompts.size();
            const bool stream = k % 2 == 0;
            httplib::Client cl("127.0.0.1", port);
            cl.set_read_timeout(60, 0);
            auto r = cl.Post("/v1/completions",
                             json{{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 24},
                                  {"temperature", 0}, {"stream", stream}}.dump(),
                             "application/json");
            if (!r || r->status != 200) return;
            std::string text;
            if (!stream) {
                text = json::parse(r->body)["choices"][0]["text"];
            } else {
                std::istringstream events(r->body);
                for (std::string line; std::getline(events, line);) {
                    if (line.rfind("data: {", 0) != 0) continue;
                    text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
                }
            }
            got[k] = prompts[i] + "\n" + text;
        });
    }
    for (std::thread& t : clients) t.join();
    for (size_t k = 0; k < got.size(); ++k) {
        const size_t i = (got.size() - 1 - k) % prompts.size();
        CHECK(got[k] == prompts[i] + "\n" + alone[i]);
    }
    auto metrics = client.Get("/metrics");
    REQUIRE(metrics);
    CHECK(metrics->body.find("bluevm_requests_total 8\n") != std::string::npos);
    CHECK(metrics->body.find("bluevm_host_round_trips_total 0\n") != std::string::npos);
    CHECK(metrics->body.find("# TYPE bluevm_queue_depth gauge") != std::string::npos);
    kill(c.pid, SIGTERM);
    CHECK(c.wait(60) == 0);
    CHECK(c.err_text.find("bluevm: server stopped") != std::string::npos);
}

TEST_CASE("cli: bluevm serve and generate refuse bad input with one line and exit 1") {
    Child missing({binary("host/bluevm"), "serve", "--model", "/nonexistent.gguf", "--port", "0"});
    CHECK(missing.wait(60) == 1);
    CHECK(missing.err_text == "bluevm: /nonexistent.gguf: no such file\n");
    // A port that is taken.
    httplib::Server blocker;
    const int port = blocker.bind_to_any_port("127.0.0.1");
    REQUIRE(port > 0);
    Child taken({binary("host/bluevm"), "serve", "--model", stories(), "--port", std::to_string(port)});
    CHECK(taken.wait(60) == 1);
    CHECK(taken.err_text.find("cannot listen on 127.0.0.1:" + std::to_string(port)) != std::string::npos);
    Child bad_prompts({binary("host/bluevm"), "generate", "--model", stories(), "--prompts", "/nonexistent.txt"});
    CHECK(bad_prompts.wait() == 1);
    CHECK(bad_prompts.err_text == "bluevm: /nonexistent.txt: cannot open prompts file\n");
}

TEST_CASE("cli: bluevm generate --prompts runs many prompts on many instances and writes JSONL") {
    const std::string file = "/tmp/blue_test_prompts.jsonl";
    {
        std::ofstream f(file);
        f << "Once upon a time\n"
          << R"({"prompt": "The dog", "max_tokens": 7})" << "\n"
          << "Once upon a time\n"
          << R"({"prompt": "Lily", "temperature": 0.8, "seed": 5})" << "\n";
    }
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--prompts", file,
             "--instances", "3", "-n", "20", "--temp", "0", "--ctx", "128", "--stats"});
    REQUIRE(c.wait() == 0);
    std::istringstream lines(c.out_text);
    std::vector<json> results;
    for (std::string line; std::getline(lines, line);) results.push_back(json::parse(line));
    REQUIRE(results.size() == 4);
    CHECK(results[0]["index"] == 0);
    CHECK(results[0]["tokens"] == 20);
    CHECK(results[0]["text"] == results[2]["text"]);  // the same greedy prompt twice
    CHECK(results[1]["tokens"] == 7);
    CHECK(results[1]["prompt"] == "The dog");
    json stats = json::parse(c.err_text.substr(c.err_text.rfind('{')));
    CHECK(stats["instances"] == 3);
    CHECK(stats["round_trips"] == 0);
    CHECK(stats["generated_tokens"].get<int>() >= 47);
    std::remove(file.c_str());
}

TEST_CASE("cli: the C API example serves its prompts") {
    Child c({binary("tools/blue-capi-example"), stories(), "Once upon a time", "The dog"});
    REQUIRE(c.wait() == 0);
    CHECK(c.out_text.find("Once upon a time, there was a little girl named Lily.") != std::string::npos);
    CHECK(c.out_text.find("] The dog") != std::string::npos);
    CHECK(c.err_text.find(", 0 round trips") != std::string::npos);
}

}  // namespace
}  // namespace blue::test
