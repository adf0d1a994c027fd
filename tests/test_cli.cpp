// The command-line programs as a user runs them: `bluevm serve` answers HTTP and stops cleanly on
// SIGTERM, `bluevm generate --prompts` writes one JSONL result per prompt, the C example runs,
// `--kv-save`/`--kv-load` continue a conversation exactly, and user errors (a damaged snapshot or
// one of another model included) print one line and exit 1.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/child.h"
#include "vm/llm_abi.h"
#include "vm/module.h"
#include "vm/verify.h"
#include "tests/temp_dir.h"
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

// The kernel shapes are the device's (lavapipe, a CPU driver: lanes over rows, a lane per head;
// a GPU: split K and shared-memory tiles, a workgroup per head)
// unless BLUE_DECODE_KERNEL / BLUE_ATTN_KERNEL choose; a bad value is named, and refused at load.
TEST_CASE("cli: bluevm devices names the kernel shapes, which BLUE_DECODE_KERNEL and BLUE_ATTN_KERNEL choose") {
    auto shapes = [](const std::vector<std::string>& env) {
        std::vector<std::string> args = {"/usr/bin/env"};
        args.insert(args.end(), env.begin(), env.end());
        args.insert(args.end(), {binary("host/bluevm"), "devices"});
        Child c(args);
        REQUIRE(c.wait() == 0);
        const size_t at = c.out_text.find("kernel shapes: ");
        REQUIRE(at != std::string::npos);
        return c.out_text.substr(at, c.out_text.find('\n', at) - at);
    };
    const std::string native = shapes({});
    std::string device;
    {
        Child d({binary("host/bluevm"), "devices"});
        REQUIRE(d.wait() == 0);
        device = d.out_text;
    }
    if (device.find("(CPU)") != std::string::npos) {
        CHECK(native == "kernel shapes: matmul: lanes over rows for 1-15 items (block types: 1-31), register tiles (F32, F16, BF16) for 16+, lanes "
                        "over items (block types) for 32+, 16-64 lanes a "
                        "workgroup by the matrix's rows (CPU-driver shapes); attention: a lane per head; sampling: 8-64 "
                        "lanes up to 4096 tokens, else 8-256, the fewest whose walks fit the loop limit over the model's context; "
                        "fused: matmuls over one x (a layer's Q, K and V) as one, RoPE with the KV store");
    } else {  // a GPU (with the int8 GEMM named between them where its integer dot products are fast)
        CHECK(native.rfind("kernel shapes: matmul: split K for 1-64 items, shared-memory tiles for 65+ (GPU shapes); ", 0) == 0);
        CHECK(native.find("attention: a workgroup per head") != std::string::npos);
    }
    CHECK(shapes({"BLUE_DECODE_KERNEL=split", "BLUE_ATTN_KERNEL=split", "BLUE_MATMUL_INT8=0"})
              .rfind("kernel shapes: matmul: split K for 1-64 items, shared-memory tiles for 65+ (GPU shapes); attention: a "
                     "workgroup per head",
                     0) == 0);
    // (BLUE_MATMUL_INT8=0 above and below: a GPU with fast integer dot products names its int8
    // GEMM between the matmul and attention shapes.)
    // BLUE_GEMM_MIN_ITEMS moves the split; a count out of range is refused naming the variable.
    CHECK(shapes({"BLUE_DECODE_KERNEL=split", "BLUE_GEMM_MIN_ITEMS=16"}).find("split K for 1-15 items, shared-memory tiles for 16+") !=
          std::string::npos);
    CHECK(shapes({"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=40"}).find("lanes over rows for 1-39 items, lanes over items (block types) or register tiles (F32, F16, BF16) for 40+") !=
          std::string::npos);
    CHECK(shapes({"BLUE_GEMM_MIN_ITEMS=1"}).find("BLUE_GEMM_MIN_ITEMS is '1': it takes a count of items from 2 to 65535") !=
          std::string::npos);
    CHECK(shapes({"BLUE_DECODE_KERNEL=rows", "BLUE_ATTN_KERNEL=lanes", "BLUE_MATMUL_INT8=0"})
              .rfind("kernel shapes: matmul: lanes over rows for 1-15 items (block types: 1-31), register tiles (F32, F16, BF16) for 16+, lanes "
                        "over items (block types) for 32+, 16-64 lanes a "
                     "workgroup by the matrix's rows (CPU-driver shapes); attention: a lane per head",
                     0) == 0);
    CHECK(shapes({"BLUE_DECODE_KERNEL=fast"}).find("BLUE_DECODE_KERNEL is 'fast': it takes 'rows' or 'split'") !=
          std::string::npos);
    // The int8 GEMM: named when on (forced here; a device with accelerated integer dot products
    // has it by default), refused with the values it takes.
    CHECK(shapes({"BLUE_MATMUL_INT8=1"}).find("; block types' GEMM: int8 (x quantized per 32 elements, packed integer dot products") !=
          std::string::npos);
    CHECK(shapes({"BLUE_MATMUL_INT8=0"}).find("int8") == std::string::npos);
    CHECK(shapes({"BLUE_MATMUL_INT8=yes"}).find("BLUE_MATMUL_INT8 is 'yes': it takes '0' or '1'") != std::string::npos);
    // Dispatches the plan makes one (Q, K and V stacked, RoPE with the KV store): on unless turned off.
    CHECK(native.find("; fused: matmuls over one x (a layer's Q, K and V) as one, RoPE with the KV store") !=
          std::string::npos);
    CHECK(shapes({"BLUE_FUSE=0"}).find("fused") == std::string::npos);
    CHECK(shapes({"BLUE_FUSE=on"}).find("BLUE_FUSE is 'on': it takes '0' or '1'") != std::string::npos);
    Child refused({"/usr/bin/env", "BLUE_ATTN_KERNEL=wide", binary("host/bluevm"), "generate", "--model", stories(),
                   "-n", "1"});
    CHECK(refused.wait() == 1);
    CHECK(refused.err_text.find("BLUE_ATTN_KERNEL is 'wide': it takes 'lanes' or 'split'") != std::string::npos);
}

// Sixteen short story openings, one a line, written into `dir`; the file's path.
std::string sixteenPrompts(const std::string& dir) {
    const std::string path = dir + "/prompts.txt";
    std::ofstream f(path);
    for (const char* p : {"Once upon a time", "The dog", "Lily went", "One day", "Tom", "A cat", "The sun",
                          "Mom said", "The bird", "Ben and", "It was", "She saw", "They ran", "The big", "A little",
                          "He was"}) {
        f << p << "\n";
    }
    return path;
}

// Batch invariance (README, How it runs): 16 sampled prompts with their log-probabilities, all
// sharing cycles on 16 instances or one at a time on one, give the same bytes with the rows
// kernels and with the GPU shapes kept on split-K tiles for every batch (BLUE_GEMM_MIN_ITEMS
// 65535), and with the rows kernels on Q4_0 and IQ4_NL weights, a Q4_0 mix with a Q6_K output
// matrix and Q4_K_M and Q5_K_M mixes, the int8 mode included (Q4_0 and the mixes). Run here
// with GPU shapes on whatever device runs the tests. The plan's fused dispatches (Q, K and V
// stacked into one matmul, RoPE with the KV store) or the ops one by one (BLUE_FUSE=0) give the
// same bytes too.
TEST_CASE("cli: batch-invariant kernel choices give the same log-probabilities whatever shares a cycle") {
    TempDir dir("blue_invariance");
    const std::string prompts = sixteenPrompts(dir.path);
    auto run = [&](const std::vector<std::string>& env, const char* instances, std::string model = stories()) {
        std::vector<std::string> args = {"/usr/bin/env"};
        args.insert(args.end(), env.begin(), env.end());
        args.insert(args.end(), {binary("host/bluevm"), "generate", "--model", model, "--prompts", prompts,
                                 "--instances", instances, "-n", "40", "--temp", "0.9", "--seed", "7",
                                 "--grammar-words", "0", "--logprobs", "2"});
        Child c(args);
        INFO(c.err_text);
        REQUIRE(c.wait() == 0);
        return c.out_text;
    };
    for (const auto& env : std::vector<std::vector<std::string>>{
             {"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16", "BLUE_MATMUL_INT8=0"},
             {"BLUE_DECODE_KERNEL=split", "BLUE_GEMM_MIN_ITEMS=65535", "BLUE_MATMUL_INT8=0"}}) {
        CAPTURE(env[0]);
        const std::string together = run(env, "16"), alone = run(env, "1");
        CHECK(std::count(together.begin(), together.end(), '\n') == 16);
        CHECK(together.find("\"logprob\"") != std::string::npos);
        CHECK(together == alone);
        // Fused or one by one: every row summed alike, every pair rotated alike, the same bytes.
        std::vector<std::string> unstacked = env;
        unstacked.push_back("BLUE_FUSE=0");
        CHECK(run(unstacked, "16") == together);
    }
    // Quantized (stories260K's 64-wide matrices in Q4_0 and IQ4_NL), the rows kernels too: the
    // single-item kernel, the 4-item tile and the lanes-over-items GEMM (`_i`) sum a row alike.
    // The int8 mode too, where the device offers it: on CPU-driver shapes the one-item, 4-item and
    // GEMM kernels of Q4_0, Q4_K, Q5_K and Q6_K all read x packed by PACKX and sum a row alike.
    const bool int8 = Child({"/usr/bin/env", "BLUE_MATMUL_INT8=1", binary("host/bluevm"), "generate", "--model",
                             stories(), "-p", "Once", "-n", "1"}).wait() == 0;
    const std::vector<std::string> rows_int8 = {"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16", "BLUE_MATMUL_INT8=1"};
    for (const std::string type : {"q4_0", "iq4_nl"}) {
        CAPTURE(type);
        const std::string model = dir.path + "/" + type + ".gguf";
        Child q({binary("host/bluevm"), "quantize", stories(), model, "--type", type});
        REQUIRE(q.wait() == 0);
        const std::vector<std::string> rows = {"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16", "BLUE_MATMUL_INT8=0"};
        CHECK(run(rows, "16", model) == run(rows, "1", model));
        if (int8 && type == "q4_0") CHECK(run(rows_int8, "16", model) == run(rows_int8, "1", model));
    }
    // llama.cpp's Q4_0 mix (blue-synth: the output matrix in Q6_K, which has a decode of its own)
    // and its Q4_K_M and Q5_K_M mixes (Q4_K or Q5_K, with V and FFN down in Q6_K).
    for (const std::string type : {"q4_0", "q4_k_m", "q5_k_m"}) {
        CAPTURE(type);
        const std::string model = dir.path + "/mix_" + type + ".gguf";
        Child synth({binary("tools/synth/blue-synth"), "--preset", "stories15M", "--layers", "2", "--dim", "256",
                     "--heads", "4", "--vocab", "300", "-t", type, "-o", model});
        REQUIRE_MESSAGE(synth.wait() == 0, synth.err_text);
        const std::vector<std::string> rows = {"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16", "BLUE_MATMUL_INT8=0"};
        const std::string together = run(rows, "16", model);
        CHECK(together == run(rows, "1", model));
        if (type == "q4_0") {  // fused or not (the lanes-over-items GEMM, Q4_0 and Q6_K): the same bytes
            std::vector<std::string> unstacked = rows;
            unstacked.push_back("BLUE_FUSE=0");
            CHECK(run(unstacked, "16", model) == together);
        }
        if (int8) CHECK(run(rows_int8, "16", model) == run(rows_int8, "1", model));
    }
    // qwen2 (Q/K/V biases read through the stacked views; neox RoPE into the F16 caches, two
    // frequencies an invocation): fused or not, the same bytes.
    {
        const std::string model = dir.path + "/qwen2.gguf";
        Child synth({binary("tools/synth/blue-synth"), "--preset", "qwen2-0.5b", "--layers", "2", "--dim", "256",
                     "--heads", "4", "--vocab", "300", "-t", "q4_0", "-o", model});
        REQUIRE_MESSAGE(synth.wait() == 0, synth.err_text);
        const std::vector<std::string> rows = {"BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16", "BLUE_MATMUL_INT8=0"};
        std::vector<std::string> unfused = rows;
        unfused.push_back("BLUE_FUSE=0");
        CHECK(run(unfused, "16", model) == run(rows, "16", model));
    }
    // The GPU default, a tiled GEMM from 65 items, sums a prompt's rows in another order than
    // the split-K tiles: said, not asserted (it may agree on some device).
    const std::string tiled = run({"BLUE_DECODE_KERNEL=split", "BLUE_GEMM_MIN_ITEMS=16"}, "16");
    const std::string split = run({"BLUE_DECODE_KERNEL=split", "BLUE_GEMM_MIN_ITEMS=65535"}, "16");
    const std::string verdict = tiled == split ? "equal" : "differ from";
    MESSAGE("GPU shapes with the tiled GEMM from 16 items: log-probabilities " << verdict << " the split-K tiles'");
}

// The int8 GEMM (BLUE_MATMUL_INT8=1): 16 greedy prompts on 16 instances, so every cycle (the
// prompts' 16+ rows, then 16 decode rows) runs the GEMM, against the float GEMM: stories260K in
// Q8_0 and Q4_0, with CPU-driver shapes, where Q4_0 runs its integer-SWAR `_iq` on x packed by
// PACKX (the profile says so) and Q8_0 keeps the float `_i` (identical output). Rounding x to
// int8 moves a logit by a few 1e-3 of the largest (the op test's bound), so the greedy tokens
// agree until a near-tie and their log-probabilities stay close: measured on lavapipe, at most
// 0.12 nats (Q4_0) over 24 tokens, where Q4_0 weights themselves move them 0.49 from F32's.
// A wrong scale or offset moves them by whole nats from the first token on. A device without
// integer dot products refuses the variable instead.
TEST_CASE("cli: the int8 GEMM gives the float GEMM's greedy tokens with close log-probabilities") {
    TempDir dir("blue_int8");
    const std::string prompts = sixteenPrompts(dir.path);
    // A device without the feature (a profile turns it off) runs without the int8 GEMM and
    // refuses it when asked, naming the device.
    const std::string no_dot = dir.path + "/no-dot.json";
    std::ofstream(no_dot) << R"({"name": "no-dot", "device": "lavapipe without integer dot products",
        "source": "tests/test_cli.cpp", "apiVersion": "1.2", "limits": {},
        "features": {"shaderIntegerDotProduct": false}})";
    {
        Child plain({"/usr/bin/env", "BLUE_DEVICE_LIMITS=" + no_dot, binary("host/bluevm"), "generate", "--model",
                     stories(), "-p", "Once upon a time", "-n", "4", "--temp", "0"});
        INFO(plain.err_text);
        CHECK(plain.wait() == 0);
        Child forced({"/usr/bin/env", "BLUE_DEVICE_LIMITS=" + no_dot, "BLUE_MATMUL_INT8=1", binary("host/bluevm"),
                      "generate", "--model", stories(), "-p", "Once upon a time", "-n", "4", "--temp", "0"});
        CHECK(forced.wait() == 1);
        CHECK(forced.err_text.find("the int8 GEMM (BLUE_MATMUL_INT8=1) needs integer dot products "
                                   "(VK_KHR_shader_integer_dot_product, shaderIntegerDotProduct), which device") !=
              std::string::npos);
        Child devices({"/usr/bin/env", "BLUE_DEVICE_LIMITS=" + no_dot, binary("host/bluevm"), "devices"});
        REQUIRE(devices.wait() == 0);
        CHECK(devices.out_text.find("without it the int8 GEMM (`_tq`) cannot run") != std::string::npos);
    }
    for (const std::string type : {"q8_0", "q4_0"}) {
        CAPTURE(type);
        const std::string model = dir.path + "/" + type + ".gguf";
        Child q({binary("host/bluevm"), "quantize", stories(), model, "--type", type});
        REQUIRE(q.wait() == 0);
        std::string err[2];
        std::vector<nlohmann::json> out[2];
        for (int int8 = 0; int8 < 2; ++int8) {
            Child c({"/usr/bin/env", "BLUE_DECODE_KERNEL=rows", "BLUE_GEMM_MIN_ITEMS=16",
                     int8 ? "BLUE_MATMUL_INT8=1" : "BLUE_MATMUL_INT8=0", binary("host/bluevm"), "generate", "--model",
                     model, "--prompts", prompts, "--instances", "16", "-n", "24", "--temp", "0", "--logprobs", "0",
                     "--grammar-words", "0", "--profile"});
            const int rc = c.wait();
            err[int8] = c.err_text;
            if (int8 && rc != 0) {
                CHECK(c.err_text.find("the int8 GEMM (BLUE_MATMUL_INT8=1) needs integer dot products") != std::string::npos);
                MESSAGE("this device has no integer dot products: the int8 GEMM is refused");
                return;
            }
            INFO(c.err_text);
            REQUIRE(rc == 0);
            std::istringstream lines(c.out_text);
            for (std::string line; std::getline(lines, line);) out[int8].push_back(nlohmann::json::parse(line));
            REQUIRE(out[int8].size() == 16);
        }
        if (type == "q8_0") {
            // CPU-driver shapes: Q8_0 has no int8 kernel there, so it keeps the float `_i` (the
            // int8 tiles ran at 0.37x of it on lavapipe) and nothing changes.
            CHECK(err[1].find("matmul_q8_0_i ") != std::string::npos);
            CHECK(err[1].find("matmul_q8_0_tq") == std::string::npos);
            CHECK(out[0] == out[1]);
            continue;
        }
        // Q4_0: `_iq` (and `_b1q`, `_q`), on x rounded and packed by PACKX once per input.
        CHECK(err[1].find("matmul_q4_0_iq") != std::string::npos);
        CHECK(err[1].find("packx") != std::string::npos);
        CHECK(err[0].find("matmul_q4_0_iq") == std::string::npos);
        CHECK(err[0].find("packx") == std::string::npos);
        size_t first_agree = 0, compared = 0;
        double max_diff = 0;
        for (size_t i = 0; i < 16; ++i) {
            const nlohmann::json &a = out[0][i]["logprobs"], &b = out[1][i]["logprobs"];
            REQUIRE((!a.empty() && !b.empty()));
            first_agree += a[0]["id"] == b[0]["id"];
            for (size_t t = 0; t < std::min(a.size(), b.size()) && a[t]["id"] == b[t]["id"]; ++t, ++compared) {
                max_diff = std::max(max_diff, std::abs(a[t]["logprob"].get<double>() - b[t]["logprob"].get<double>()));
            }
        }
        MESSAGE(type << ": first tokens agree on " << first_agree << " of 16 prompts; " << compared
                     << " tokens before the first difference, log-probabilities within " << max_diff);
        CHECK(first_agree >= 14);
        CHECK(compared >= 200);
        CHECK(max_diff <= 0.25);
    }
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

// Words of `text` made only of letters (an apostrophe or trailing punctuation allowed), and all.
std::pair<int, int> countWords(const std::string& text) {
    std::istringstream in(text);
    int letters = 0, all = 0;
    for (std::string w; in >> w; ++all) {
        while (!w.empty() && std::strchr(".,!?\"", w.back())) w.pop_back();
        bool ok = !w.empty();
        for (char c : w) ok = ok && (std::isalpha(static_cast<unsigned char>(c)) || c == '\'');
        letters += ok ? 1 : 0;
    }
    return {letters, all};
}

// `bluevm quantize --type iq4_nl|iq4_xs`, then `bluevm generate` on the result. stories260K's rows
// of 64 are IQ4_NL under both targets (256-element IQ4_XS blocks do not divide them; llama.cpp
// falls back the same way), so the GPU's IQ4_XS kernels are covered by the synthetic models in
// test_moe.cpp. Greedy text must stay a story (words of letters, the f32 model's opening), and a
// truncated file is refused in one line.
TEST_CASE(
    "cli: stories260K quantized to iq4_nl and iq4_xs tells a story; a truncated file is refused") {
    TempDir dir("blue_cli_iq4");
    const std::string f32_text = generateAlone("Once upon a time", 40);
    for (const std::string type : {"iq4_nl", "iq4_xs"}) {
        CAPTURE(type);
        const std::string out = dir.path + "/" + type + ".gguf";
        Child q({binary("host/bluevm"), "quantize", stories(), out, "--type", type});
        REQUIRE(q.wait() == 0);
        Child g({binary("host/bluevm"), "generate", "--model", out, "--prompt", "Once upon a time",
                 "-n", "40", "--temp", "0", "--ctx", "128", "--no-echo"});
        REQUIRE(g.wait() == 0);
        const std::string text = g.out_text;
        MESSAGE(type << ": " << text);
        auto [letters, all] = countWords(text);
        CHECK(all >= 20);
        CHECK(letters >= all * 9 / 10);
        CHECK(text.substr(0, 12) == f32_text.substr(0, 12));

        std::filesystem::resize_file(out, std::filesystem::file_size(out) / 2);
        Child t({binary("host/bluevm"), "generate", "--model", out, "--prompt", "Once", "-n", "4"});
        CHECK(t.wait() == 1);
        CHECK(std::count(t.err_text.begin(), t.err_text.end(), '\n') == 1);
        CHECK(t.err_text.find(out) != std::string::npos);
        CHECK(t.err_text.find("runs past end of file") != std::string::npos);
    }
}

// llama.cpp's mix sizes by name: q4_k_s writes its ftype (14) and a model that generates (the
// mix's per-tensor types are checked in test_quantize.cpp); a size llama.cpp does not have is
// refused with the list.
TEST_CASE("cli: bluevm quantize --type q4_k_s and q3_k_l name llama.cpp's mixes; q6_k_m is refused") {
    TempDir dir("blue_cli_ksize");
    for (auto [type, ftype] : {std::pair<std::string, std::string>{"q4_k_s", "14"}, {"Q3_K_L", "13"}}) {
        CAPTURE(type);
        const std::string out = dir.path + "/" + type + ".gguf";
        Child q({binary("host/bluevm"), "quantize", stories(), out, "--type", type});
        REQUIRE_MESSAGE(q.wait() == 0, q.err_text);
        CHECK(q.out_text.find("(" + type + ", file_type " + ftype + ")") != std::string::npos);
        Child g({binary("host/bluevm"), "generate", "--model", out, "--prompt", "Once upon a time", "-n", "8",
                 "--temp", "0", "--ctx", "64"});
        CHECK_MESSAGE(g.wait() == 0, g.err_text);
    }
    Child bad({binary("host/bluevm"), "quantize", stories(), dir.path + "/x.gguf", "--type", "q6_k_m"});
    CHECK(bad.wait() != 0);
    CHECK(bad.err_text.find("unknown --type 'q6_k_m' (choose one of: ") != std::string::npos);
    CHECK(bad.err_text.find("q3_k_s, q3_k_m (q3_k), q3_k_l") != std::string::npos);
}

// `bluevm bench --temp T` measures sampled decode (the draw with the default filters) instead of
// greedy; the JSON says which, and a negative temperature is refused. The batched test gives each
// count's generation speed after the prompts and its speed with them.
TEST_CASE("cli: bluevm bench --temp measures sampled generation") {
    Child c({binary("host/bluevm"), "bench", "-m", stories(), "-p", "8", "-n", "8", "--reps", "1",
             "--no-ceilings", "--json", "--temp", "0.8", "--instances", "1,4"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    json j = json::parse(c.out_text);
    CHECK(j["temperature"].get<double>() == doctest::Approx(0.8));
    CHECK(j["tg"]["tok_per_s"].get<double>() > 0);
    REQUIRE(j["batched"].size() == 2);
    for (const json& b : j["batched"]) {
        CHECK(b["tok_per_s"].get<double>() > 0);
        CHECK(b["with_prompt_tok_per_s"].get<double>() > 0);
        CHECK(b["gflops"].get<double>() > 0);
    }
    CHECK(j["batched"][0]["instances"].get<uint32_t>() == 1);
    CHECK(j["batched"][1]["instances"].get<uint32_t>() == 4);
    CHECK(j["batched"][0]["ratio_to_first"].get<double>() == doctest::Approx(1.0));
    Child bad({binary("host/bluevm"), "bench", "-m", stories(), "--temp", "-1"});
    CHECK(bad.wait() != 0);
    CHECK(bad.err_text.find("--temp") != std::string::npos);
}

TEST_CASE("cli: the C API example serves its prompts") {
    Child c({binary("tools/blue-capi-example"), stories(), "Once upon a time", "The dog"});
    REQUIRE(c.wait() == 0);
    CHECK(c.out_text.find("Once upon a time, there was a little girl named Lily.") != std::string::npos);
    CHECK(c.out_text.find("] The dog") != std::string::npos);
    CHECK(c.err_text.find(", 0 round trips") != std::string::npos);
}

// The JSON objects among `text`'s lines (--logprobs-format json on stderr).
std::vector<json> jsonLines(const std::string& text) {
    std::istringstream lines(text);
    std::vector<json> out;
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty() && line[0] == '{') out.push_back(json::parse(line));
    }
    return out;
}

TEST_CASE("cli: generate --logprobs N prints each token's log-probability and N sorted alternatives") {
    const std::string prompt = "Once upon a time";
    const std::string alone = generateAlone(prompt, 12);
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", prompt, "-n",
             "12", "--temp", "0", "--ctx", "128", "--no-echo", "--logprobs", "4",
             "--logprobs-format", "json"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    CHECK(c.out_text == alone + "\n");  // stdout stays the text
    const std::vector<json> tokens = jsonLines(c.err_text);
    REQUIRE(tokens.size() == 12);
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
        CAPTURE(i);
        const json& t = tokens[i];
        CHECK(t["index"] == i);
        const float lp = t["logprob"];
        CHECK(lp <= 0.0f);
        joined += t["token"].get<std::string>();
        const json& top = t["top_logprobs"];
        REQUIRE(top.size() == 4);
        // Greedy: the chosen token is the first alternative, with the same log-probability.
        CHECK(top[0]["id"] == t["id"]);
        CHECK(top[0]["token"] == t["token"]);
        CHECK(top[0]["logprob"].get<float>() == lp);
        for (size_t k = 1; k < top.size(); ++k) {
            CHECK(top[k]["logprob"].get<float>() <= top[k - 1]["logprob"].get<float>());
            CHECK(top[k]["id"] != top[0]["id"]);
        }
    }
    CHECK((joined == alone || joined == " " + alone));  // SentencePiece drops the first space

    // The table: one line a token, the token quoted, then its alternatives.
    Child table({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", prompt, "-n",
                 "5", "--temp", "0", "--ctx", "128", "--no-echo", "--logprobs", "2"});
    REQUIRE_MESSAGE(table.wait() == 0, table.err_text);
    const std::regex row(
        "^ +([0-9]+) +(-[0-9.]+|0\\.0000) +(\"[^\"]*\") +\\| \\3 \\2 \"[^\"]*\" -[0-9.]+$");
    std::istringstream lines(table.err_text);
    int rows = 0;
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (!std::regex_match(line, m, row)) continue;
        CHECK(std::stoi(m[1]) == rows);
        ++rows;
    }
    CHECK_MESSAGE(rows == 5, table.err_text);

    // Sampled, N = 0: each token's log-probability alone; --prompts: in each JSONL result.
    Child sampled({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", prompt,
                   "-n", "10", "--temp", "0.9", "--seed", "3", "--ctx", "128", "--logprobs", "0",
                   "--logprobs-format", "json"});
    REQUIRE_MESSAGE(sampled.wait() == 0, sampled.err_text);
    const std::vector<json> drawn = jsonLines(sampled.err_text);
    CHECK(drawn.size() == 10);
    for (const json& t : drawn) {
        CHECK(t["logprob"].get<float>() <= 0.0f);
        CHECK(t["top_logprobs"].empty());
    }
    TempDir dir;
    const std::string file = dir.path + "/prompts.txt";
    std::ofstream(file) << "Once upon a time\nThe dog\n";
    Child many({binary("host/bluevm"), "generate", "--model", stories(), "--prompts", file,
                "--instances", "2", "-n", "6", "--temp", "0", "--ctx", "128", "--logprobs", "1"});
    REQUIRE_MESSAGE(many.wait() == 0, many.err_text);
    const std::vector<json> results = jsonLines(many.out_text);
    REQUIRE(results.size() == 2);
    for (const json& r : results) {
        REQUIRE(r["logprobs"].size() == r["tokens"].get<size_t>());
        for (const json& t : r["logprobs"]) CHECK(t["top_logprobs"][0]["id"] == t["id"]);
    }
}

TEST_CASE("cli: generate --logprobs refuses N outside 0..20 and an unknown format with one line") {
    for (const char* n : {"21", "-1", "100"}) {
        CAPTURE(n);
        Child c({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n",
                 "2", "--logprobs", n});
        CHECK(c.wait(60) == 1);
        CHECK(c.err_text == std::string("bluevm: --logprobs ") + n +
                                ": N is the number of alternatives per token, 0 to 20\n");
        CHECK(c.out_text.empty());
    }
    Child f({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n", "2",
             "--logprobs", "1", "--logprobs-format", "xml"});
    CHECK(f.wait(60) == 1);
    CHECK(f.err_text == "bluevm: --logprobs-format xml: 'text' or 'json'\n");
}

TEST_CASE("cli: generate refuses repetition penalties over a window longer than the device can walk") {
    Child d({binary("host/bluevm"), "devices"});
    REQUIRE(d.wait() == 0);
    const bool cpu = d.out_text.find("(CPU)") != std::string::npos;
    // 18,000 tokens of window at a context of 20,000: past lavapipe's loop limit (about 8,100
    // at stories260K's 512 tokens, sampled on 64 lanes: maxPenaltyWindow); no limit on a GPU.
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--ctx", "20000", "--prompt", "Lily", "-n", "2",
             "--repeat-penalty", "1.1", "--repeat-last-n", "18000"});
    if (cpu) {
        CHECK(c.wait(120) == 1);
        CHECK(c.err_text.find("bluevm: request 0: repeat_last_n 18000: the penalties would walk 18000 tokens, and "
                              "this device applies them over at most ") == 0);
        CHECK(c.err_text.find("LP_MAX_TGSI_LOOP_ITERATIONS); use --repeat-last-n ") != std::string::npos);
        CHECK(c.out_text.empty());
    } else {
        CHECK(c.wait(120) == 0);
    }
    // Without penalties the window is not walked: no limit.
    Child plain({binary("host/bluevm"), "generate", "--model", stories(), "--ctx", "20000", "--prompt", "Lily", "-n",
                 "2", "--repeat-last-n", "18000"});
    CHECK_MESSAGE(plain.wait(120) == 0, plain.err_text);
}

TEST_CASE("cli: generate refuses more grammar words than the device copies in one cycle") {
    Child d({binary("host/bluevm"), "devices"});
    REQUIRE(d.wait() == 0);
    const bool cpu = d.out_text.find("(CPU)") != std::string::npos;
    // 65,536 words: past lavapipe's loop limit for one cycle's copy (maxGrammarWords: 58,368).
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n", "2",
             "--grammar-words", "65536"});
    if (cpu) {
        CHECK(c.wait(120) == 1);
        CHECK_MESSAGE(c.err_text.find("grammar words 65536: an instance copies a request's automaton in one cycle, "
                                      "and this device copies at most 58368 words there (its compiler ends every "
                                      "loop of a shader invocation after 65535 iterations: lavapipe's "
                                      "LP_MAX_TGSI_LOOP_ITERATIONS); use --grammar-words 58368 or less\n") !=
                          std::string::npos,
                      c.err_text);
        CHECK(c.out_text.empty());
    } else {
        CHECK(c.wait(120) == 0);
    }
    Child fits({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n", "2",
                "--grammar-words", "58368"});
    CHECK_MESSAGE(fits.wait(120) == 0, fits.err_text);
}

// `bluevm generate --ids` token ids of one run (REQUIREs exit 0).
std::vector<uint32_t> generateIds(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {binary("host/bluevm"), "generate", "--model", stories(), "--ctx", "128", "--ids"};
    args.insert(args.end(), extra.begin(), extra.end());
    Child c(args);
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    std::istringstream in(c.out_text);
    std::vector<uint32_t> ids;
    for (uint32_t id; in >> id;) ids.push_back(id);
    return ids;
}

TEST_CASE("cli: generate --kv-save then --kv-load continues exactly as one uninterrupted run, greedy and seeded") {
    TempDir dir;
    const std::string a = dir.path + "/a.kv", b = dir.path + "/b.kv";
    for (std::vector<std::string> sampling : {std::vector<std::string>{"--temp", "0"},
                                              std::vector<std::string>{"--temp", "0.9", "--seed", "5"}}) {
        CAPTURE(sampling[1]);
        auto with = [&](std::vector<std::string> args) {
            args.insert(args.end(), sampling.begin(), sampling.end());
            return generateIds(args);
        };
        const std::vector<uint32_t> whole = with({"-p", "Once upon a time", "-n", "36"});
        REQUIRE(whole.size() == 36);
        // Per-instance caches, then a paged KV cache, then per-instance again, then paged with
        // 8 positions a page: the snapshot is the same file either way.
        std::vector<uint32_t> parts = with({"-p", "Once upon a time", "-n", "10", "--kv-save", a});
        const std::vector<std::vector<std::string>> runs = {
            {"-n", "11", "--kv-page", "16"}, {"-n", "9"}, {"-n", "6", "--kv-page", "8"}};
        for (std::vector<std::string> run : runs) {  // each going on from the last
            run.insert(run.end(), {"--kv-load", a, "--kv-save", b});
            std::vector<uint32_t> more = with(run);
            parts.insert(parts.end(), more.begin(), more.end());
            std::filesystem::rename(b, a);
        }
        CHECK(parts == whole);
    }
    // Restoring is I/O before the run: the continued run makes no host round trip.
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "--ctx", "128", "-n", "8", "--kv-load", a,
             "-p", " Lily", "--stats", "--no-echo"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    json stats = json::parse(c.err_text.substr(c.err_text.rfind('{')));
    CHECK(stats["round_trips"] == 0);
    CHECK(stats["instances"] == 1);
}

TEST_CASE("cli: run --ref takes a generation program's --prompt and prints the GPU run's text, greedy and seeded") {
    TempDir dir;
    const std::string bir = dir.path + "/s.bir";
    Child lower({binary("compiler/bluec"), "lower", "--model", stories(), "-o", bir, "--ctx", "64"});
    REQUIRE_MESSAGE(lower.wait() == 0, lower.err_text);
    for (const char* temp : {"0", "0.8"}) {
        CAPTURE(temp);
        std::vector<std::string> args = {binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "16",
                                         "--temp", temp, "--seed", "3"};
        Child gpu(args);
        REQUIRE_MESSAGE(gpu.wait() == 0, gpu.err_text);
        args.push_back("--ref");
        Child ref(args);
        REQUIRE_MESSAGE(ref.wait() == 0, ref.err_text);
        CHECK(ref.out_text.rfind("Lily ", 0) == 0);
        CHECK(ref.out_text.size() > 30);  // 16 tokens generated, not just the prompt
        CHECK(ref.out_text == gpu.out_text);
    }
    Child too_long({binary("host/bluevm"), "run", bir, "--ref", "--prompt", std::string(400, 'a')});
    CHECK(too_long.wait() == 1);
    CHECK(too_long.err_text.find("the program's context is 64") != std::string::npos);
}

TEST_CASE("cli: a generation program lowered before request layout 3 (no log-probability word) is refused") {
    TempDir dir;
    const std::string bir = dir.path + "/s.bir";
    Child lower({binary("compiler/bluec"), "lower", "--model", stories(), "-o", bir, "--ctx", "64"});
    REQUIRE_MESSAGE(lower.wait() == 0, lower.err_text);
    Child fresh({binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "4"});
    CHECK(fresh.wait() == 0);
    auto m = loadModuleFile(bir);
    REQUIRE_MESSAGE(m, m.message());
    std::erase_if(m->meta, [](const auto& kv) { return kv.first == "llm.request"; });
    REQUIRE(writeModuleFile(m.value(), bir).isOk());
    Child old({binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "4"});
    CHECK(old.wait() == 1);
    const std::string now = std::to_string(BLUE_REQ_LAYOUT);
    CHECK(old.err_text == "bluevm: " + bir + ": lowered by an older bluec (request layout 1; this build's is " + now + "): lower the model again\n");
    m->meta.push_back({"llm.request", "2"});  // a start position, no log-probability word
    REQUIRE(writeModuleFile(m.value(), bir).isOk());
    Child two({binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "4"});
    CHECK(two.wait() == 1);
    CHECK(two.err_text == "bluevm: " + bir + ": lowered by an older bluec (request layout 2; this build's is " + now + "): lower the model again\n");
    Child ref({binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "4", "--ref"});
    CHECK(ref.wait() == 1);
    CHECK(ref.err_text == two.err_text);
    // A context that is not a number is refused by name, on either machine (it used to throw).
    std::erase_if(m->meta, [](const auto& kv) { return kv.first == "llm.request" || kv.first == "llm.context"; });
    m->meta.push_back({"llm.request", now});
    m->meta.push_back({"llm.context", "64x"});
    REQUIRE(writeModuleFile(m.value(), bir).isOk());
    for (bool on_ref : {false, true}) {
        std::vector<std::string> args = {binary("host/bluevm"), "run", bir, "--prompt", "Lily", "--n-predict", "4"};
        if (on_ref) args.push_back("--ref");
        Child bad(args);
        CHECK(bad.wait() == 1);
        CHECK(bad.err_text == "bluevm: " + bir + ": llm.context '64x' is not a context length\n");
    }
}

TEST_CASE("cli: generate --kv-load refuses a snapshot of another model, a damaged or truncated one, with one line") {
    TempDir dir;
    const std::string kv = dir.path + "/s.kv", bad = dir.path + "/bad.kv", tiny = dir.path + "/tiny.gguf";
    generateIds({"-p", "Once upon a time", "-n", "8", "--temp", "0", "--kv-save", kv});
    Child synth({binary("tools/synth/blue-synth"), "--preset", "stories15M", "--layers", "2", "--dim", "64",
                 "--heads", "4", "--vocab", "300", "-t", "f32", "-o", tiny});
    REQUIRE_MESSAGE(synth.wait() == 0, synth.err_text);
    auto refused = [&](const std::string& model, const std::string& file, const std::string& part) {
        Child c({binary("host/bluevm"), "generate", "--model", model, "--ctx", "128", "-n", "4", "--kv-load", file});
        CHECK(c.wait() == 1);
        CHECK_MESSAGE(c.err_text.find("bluevm: " + file + part) != std::string::npos, c.err_text);
        CHECK(std::count(c.err_text.begin(), c.err_text.end(), '\n') == 1);
    };
    refused(tiny, kv, ": saved with another model (model hash ");
    std::ifstream in(kv, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(bad, std::ios::binary) << bytes.substr(0, bytes.size() - 3);
    refused(stories(), bad, ": truncated: ");
    std::string flipped = bytes;
    flipped[70] ^= 1;
    std::ofstream(bad, std::ios::binary) << flipped;
    refused(stories(), bad, ": byte 64: payload checksum mismatch (the file is corrupt)");
    std::string header = bytes;
    header[20] ^= 1;
    std::ofstream(bad, std::ios::binary) << header;
    refused(stories(), bad, ": byte 60: header checksum mismatch (the file is corrupt)");
    std::string v3 = bytes;
    v3[8] = 3;
    std::ofstream(bad, std::ios::binary) << v3;
    refused(stories(), bad, ": snapshot format version 3; this build reads version 1");
    refused(stories(), dir.path + "/missing.kv", ": cannot open KV snapshot");
    Child many({binary("host/bluevm"), "generate", "--model", stories(), "--prompts", kv, "--kv-load", kv});
    CHECK(many.wait() == 1);
    CHECK(many.err_text == "bluevm: --kv-save and --kv-load take one --prompt, not --prompts\n");
}

TEST_CASE("cli: generate --json-schema, --grammar and --json constrain the text; a bad file is one line naming it") {
    TempDir dir;
    const std::string schema = dir.path + "/pet.json", grammar = dir.path + "/g.gbnf";
    std::ofstream(schema) << R"({"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8}}, "required": ["pet", "legs"]})";
    std::ofstream(grammar) << "# a yes or a no, then a period\nroot ::= (\"yes\" | \"no\") \".\"\n";
    Child a({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n", "40", "--temp", "0.9",
             "--seed", "3", "--no-echo", "--json-schema", schema});
    REQUIRE_MESSAGE(a.wait() == 0, a.err_text);
    json j = json::parse(a.out_text, nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), a.out_text);
    CHECK((j["pet"] == "cat" || j["pet"] == "dog"));
    CHECK(j["legs"].get<int>() >= 0);
    CHECK(j["legs"].get<int>() <= 8);
    Child b({binary("host/bluevm"), "generate", "--model", stories(), "--prompt", "Lily", "-n", "10", "--temp", "0",
             "--no-echo", "--grammar", grammar});
    REQUIRE_MESSAGE(b.wait() == 0, b.err_text);
    CHECK((b.out_text == "yes.\n" || b.out_text == "no.\n"));
    Child c({binary("host/bluevm"), "generate", "--model", stories(), "-n", "30", "--temp", "0", "--no-echo", "--json"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    CHECK(c.out_text.rfind("{", 0) == 0);
    // Errors: one line naming the option, the file and the place.
    std::ofstream(grammar) << "root ::= \"a\"\nb ::= (\"c\"\n";
    Child bad({binary("host/bluevm"), "generate", "--model", stories(), "-n", "4", "--grammar", grammar});
    CHECK(bad.wait(60) == 1);
    CHECK(bad.err_text == "bluevm: --grammar " + grammar +
                              ": grammar line 3, column 1: expected ')' to close the '(' on line 2, found end of text\n");
    CHECK(std::count(bad.err_text.begin(), bad.err_text.end(), '\n') == 1);
    std::ofstream(schema) << R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}})";
    Child bad_schema({binary("host/bluevm"), "generate", "--model", stories(), "-n", "4", "--json-schema", schema});
    CHECK(bad_schema.wait(60) == 1);
    CHECK(bad_schema.err_text.find("/properties/a") != std::string::npos);
    CHECK(bad_schema.err_text.find("pattern") != std::string::npos);
    Child both({binary("host/bluevm"), "generate", "--model", stories(), "-n", "4", "--json", "--grammar", grammar});
    CHECK(both.wait(60) == 1);
    CHECK(both.err_text == "bluevm: --grammar, --json-schema and --json: at most one\n");
}

}  // namespace
}  // namespace blue::test
