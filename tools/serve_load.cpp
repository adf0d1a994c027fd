// blue-serve-load: a load generator for `bluevm serve` (or any OpenAI-compatible server).
// C clients each send R streamed completion requests back to back; reports aggregate generated
// tokens/s, time to first token and request latency percentiles, and the HTTP status counts.
//
//   blue-serve-load --port 8080 --clients 64 --requests 2 --max-tokens 64
//   blue-serve-load --port 8080 --clients 64 --system-words 150 [--no-cache-prompt]
//     (every prompt starts with the same 150-word "system prompt"; the server reuses its KV rows
//      unless told not to: compare the two runs)
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct Sample {
    double ttft_ms = 0, total_ms = 0;
    int tokens = 0;
    long prompt_tokens = 0, cached_tokens = 0;
};

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"blue-serve-load: concurrent streamed completions against an OpenAI-compatible server"};
    std::string host = "127.0.0.1", prompt = "Once upon a time";
    int port = 8080, clients = 16, requests = 2, max_tokens = 64;
    bool ignore_eos = true, cache_prompt = true;
    int system_words = 0;
    app.add_option("--host", host, "server address");
    app.add_option("--port", port, "server port");
    app.add_option("--clients", clients, "concurrent clients")->check(CLI::Range(1, 4096));
    app.add_option("--requests", requests, "requests per client, back to back")->check(CLI::Range(1, 100000));
    app.add_option("--max-tokens", max_tokens, "tokens per request")->check(CLI::Range(1, 1 << 20));
    app.add_option("--prompt", prompt, "the prompt");
    app.add_flag("!--stop-at-eos", ignore_eos, "let requests end at the model's end-of-text token");
    app.add_option("--system-words", system_words,
                   "start every prompt with the same text of this many words (a shared system prompt)")
        ->check(CLI::Range(0, 100000));
    app.add_flag("!--no-cache-prompt", cache_prompt,
                 "send cache_prompt: false (the server recomputes every prompt token)");
    CLI11_PARSE(app, argc, argv);
    std::string system;
    {
        const char* words[] = {"Lily", "and", "Tom", "went", "to", "the", "park", "with", "their",
                               "mom.", "They", "saw", "a", "big", "red", "ball", "near", "tree."};
        for (int i = 0; i < system_words; ++i) system += std::string(i ? " " : "") + words[i % 18];
        if (system_words) system += "\n";
    }

    std::mutex mutex;
    std::vector<Sample> samples;
    std::map<int, int> statuses;
    auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
            httplib::Client cli(host, port);
            cli.set_read_timeout(600, 0);
            for (int r = 0; r < requests; ++r) {
                // With a system prompt, each client asks its own question after it.
                std::string text = system_words ? system + prompt + " " + std::to_string(c) : prompt;
                json body = {{"prompt", text}, {"max_tokens", max_tokens}, {"stream", true},
                             {"temperature", 0.8}, {"seed", c * 1000 + r}, {"ignore_eos", ignore_eos},
                             {"cache_prompt", cache_prompt}, {"stream_options", {{"include_usage", true}}}};
                httplib::Request req;
                req.method = "POST";
                req.path = "/v1/completions";
                req.body = body.dump();
                req.set_header("Content-Type", "application/json");
                Sample s;
                auto start = Clock::now();
                bool first = false;
                std::string buffer;
                // Time to first token: the first event with data (the server sends SSE comments,
                // ": ...", while a request waits, so the first byte is not the first token).
                req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
                    size_t from = buffer.size() > 6 ? buffer.size() - 6 : 0;
                    buffer.append(data, len);
                    if (!first && buffer.find("data: {", from) != std::string::npos) {
                        first = true;
                        s.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                    }
                    return true;
                };
                httplib::Response res;
                httplib::Error err;
                bool ok = cli.send(req, res, err);
                s.total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
                size_t at = buffer.find("\"usage\":");
                if (at != std::string::npos) {
                    size_t k = buffer.find("\"completion_tokens\":", at);
                    if (k != std::string::npos) s.tokens = std::atoi(buffer.c_str() + k + 20);
                    k = buffer.find("\"prompt_tokens\":", at);
                    if (k != std::string::npos) s.prompt_tokens = std::atol(buffer.c_str() + k + 16);
                    k = buffer.find("\"cached_tokens\":", at);
                    if (k != std::string::npos) s.cached_tokens = std::atol(buffer.c_str() + k + 16);
                }
                std::lock_guard<std::mutex> lock(mutex);
                ++statuses[ok ? res.status : -1];
                if (ok && res.status == 200) samples.push_back(s);
            }
        });
    }
    for (std::thread& t : threads) t.join();
    double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> ttft, total;
    long tokens = 0, prompt_tokens = 0, cached_tokens = 0;
    for (const Sample& s : samples) {
        ttft.push_back(s.ttft_ms);
        total.push_back(s.total_ms);
        tokens += s.tokens;
        prompt_tokens += s.prompt_tokens;
        cached_tokens += s.cached_tokens;
    }
    std::printf("clients %d x %d requests, %d tokens each: %zu ok in %.2f s\n", clients, requests,
                max_tokens, samples.size(), wall);
    std::printf("aggregate %.1f generated tok/s; per request %.1f tok/s (median)\n",
                double(tokens) / wall,
                samples.empty() ? 0.0 : double(max_tokens) / (percentile(total, 0.5) / 1000.0));
    std::printf("time to first token p50 %.0f ms  p95 %.0f ms\n", percentile(ttft, 0.5), percentile(ttft, 0.95));
    std::printf("request latency     p50 %.0f ms  p95 %.0f ms\n", percentile(total, 0.5), percentile(total, 0.95));
    std::printf("prompt tokens %ld, of which reused from an instance's KV rows %ld\n", prompt_tokens, cached_tokens);
    for (const auto& [code, n] : statuses) std::printf("HTTP %d: %d\n", code, n);
    return statuses.size() == 1 && statuses.count(200) ? 0 : 1;
}
