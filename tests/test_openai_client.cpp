// The official `openai` npm package as a client of `bluevm serve`: the test starts the server on a
// free port with stories260K and an API key, and runs tests/openai_client/test.mjs under Node.js
// against it (models, completions and chat plain and streamed, embeddings, log-probabilities, seeds, stops and
// the client's typed errors). Without node or tests/openai_client/node_modules
// (tools/install_deps.sh runs `npm ci` there) the case says why and passes, unless
// BLUE_REQUIRE_OPENAI_CLIENT=1 (set by tools/test.sh when the client was installed) makes that a
// failure.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>

#include "tests/child.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

// The first executable `name` on PATH, or "" (Child runs a path: execv does not search).
std::string findOnPath(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
        if (dir.empty()) continue;
        std::string candidate = dir + "/" + name;
        if (access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate))
            return candidate;
    }
    return "";
}

// Why the npm client cannot run here ("" when it can).
std::string clientMissing(const std::string& node, const std::string& dir) {
    if (node.empty()) return "node is not on PATH (tools/install_deps.sh installs nodejs and npm)";
    if (!std::filesystem::exists(dir + "/node_modules/openai/package.json")) {
        return dir +
               "/node_modules has no openai package (run `npm ci` there, as tools/install_deps.sh "
               "does)";
    }
    return "";
}

TEST_CASE("openai client: the official openai npm package drives bluevm serve (tests/openai_client)") {
    const std::string dir = sourceDir() + "/tests/openai_client";
    const std::string node = findOnPath("node");
    const char* require_env = std::getenv("BLUE_REQUIRE_OPENAI_CLIENT");
    const bool required = require_env && std::string(require_env) == "1";
    if (std::string why = clientMissing(node, dir); !why.empty()) {
        if (required) FAIL("BLUE_REQUIRE_OPENAI_CLIENT=1, but " << why);
        MESSAGE("skipped: " << why);
        return;
    }
    const std::string key = "sk-bluevm-openai-client-test";
    Child server({std::string(BLUE_BINARY_DIR) + "/host/bluevm", "serve", "--model",
                  sharedDir() + "/models/stories260K/stories260K.gguf", "--port", "0",
                  "--instances", "2", "--ctx", "1024", "--pooling", "mean", "--api-key", key});
    std::smatch m;
    const std::regex listening("on http://127\\.0\\.0\\.1:([0-9]+) ");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::regex_search(server.err_text, m, listening) &&
           std::chrono::steady_clock::now() < until && server.err >= 0) {
        server.pump(100);
    }
    REQUIRE_MESSAGE(std::regex_search(server.err_text, m, listening), server.err_text);
    const std::string url = "http://127.0.0.1:" + m[1].str() + "/v1";

    Child client({node, dir + "/test.mjs", url, key});
    const int rc = client.wait(180);
    const std::string output = client.out_text + client.err_text;
    CHECK_MESSAGE(rc == 0, output);
    // node:test's summary: every test ran and passed.
    CHECK_MESSAGE(output.find("# fail 0") != std::string::npos, output);
    CHECK_MESSAGE(output.find("# pass 0") == std::string::npos, output);
    kill(server.pid, SIGTERM);
    CHECK_MESSAGE(server.wait(60) == 0, server.err_text);
}

}  // namespace
}  // namespace blue::test
