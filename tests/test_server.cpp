// The OpenAI-compatible server, through HTTP with a real client (cpp-httplib): responses and
// streams carry the engine's text, bad requests get 400/404/413 with a message naming the field
// and harm nothing else, a full queue answers 429, a client that disconnects frees its instance,
// and 64 concurrent clients all get exactly their greedy text.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host/server/http_server.h"
#include "host/server/openai.h"
#include "host/server/tools.h"
#include "tests/child.h"
#include "tests/moe_models.h"
#include "tests/schema_check.h"
#include "tests/server_fixture.h"
#include "tests/scoped_env.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "tools/synth/synth.h"

namespace blue::test {
namespace {

using json = nlohmann::json;

// The text of a streamed response: the concatenated deltas; checks the event framing.
struct Streamed {
    std::string text, finish;
    int chunks = 0;
    bool done = false;
    json usage;
};

Streamed parseStream(const std::string& body, bool chat) {
    Streamed s;
    size_t at = 0;
    while (at < body.size()) {
        size_t end = body.find("\n\n", at);
        REQUIRE(end != std::string::npos);
        std::string event = body.substr(at, end - at);
        at = end + 2;
        if (event[0] == ':') continue;  // keep-alive comment
        REQUIRE(event.rfind("data: ", 0) == 0);
        std::string data = event.substr(6);
        if (data == "[DONE]") {
            s.done = true;
            continue;
        }
        json j = json::parse(data);
        CHECK(j["object"] == (chat ? "chat.completion.chunk" : "text_completion"));
        if (j.contains("usage")) s.usage = j["usage"];
        if (j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        ++s.chunks;
        if (chat) {
            if (c["delta"].contains("content")) s.text += c["delta"]["content"].get<std::string>();
        } else {
            s.text += c["text"].get<std::string>();
        }
        if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"];
    }
    return s;
}

TEST_CASE("server: completions and chat, plain and streamed, carry the same greedy text") {
    TestServer s(4, 256, 0);
    auto health = s.client().Get("/health");
    REQUIRE(health);
    CHECK(health->status == 200);
    CHECK(json::parse(health->body)["status"] == "ok");
    auto models = s.client().Get("/v1/models");
    REQUIRE(models);
    CHECK(json::parse(models->body)["data"][0]["id"] == "stories260K");

    json body = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
    auto plain = post(s, "/v1/completions", body);
    REQUIRE(plain);
    CHECK(plain->status == 200);
    json j = json::parse(plain->body);
    CHECK(j["object"] == "text_completion");
    const std::string text = j["choices"][0]["text"];
    CHECK(text.rfind(", there was a little girl named Lily.", 0) == 0);
    CHECK(j["choices"][0]["finish_reason"] == "length");
    CHECK(j["usage"]["completion_tokens"] == 40);
    CHECK(j["usage"]["prompt_tokens"] == 5);
    CHECK(j["usage"]["total_tokens"] == 45);

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto streamed = post(s, "/v1/completions", body);
    REQUIRE(streamed);
    CHECK(streamed->status == 200);
    CHECK(streamed->get_header_value("Content-Type") == "text/event-stream");
    Streamed st = parseStream(streamed->body, false);
    CHECK(st.text == text);
    CHECK(st.finish == "length");
    CHECK(st.done);
    CHECK(st.chunks >= 2);
    CHECK(st.usage["completion_tokens"] == 40);

    // echo, a token-id prompt and a stop string.
    auto echo = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"echo", true}});
    REQUIRE(echo);
    CHECK(json::parse(echo->body)["choices"][0]["text"] == "Once upon a time" + text);
    auto stop = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"Lily"}}});
    REQUIRE(stop);
    json sj = json::parse(stop->body);
    CHECK(sj["choices"][0]["text"] == text.substr(0, text.find("Lily")));
    CHECK(sj["choices"][0]["finish_reason"] == "stop");

    json chat = {{"messages", {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", 24}, {"temperature", 0}};
    auto cplain = post(s, "/v1/chat/completions", chat);
    REQUIRE(cplain);
    CHECK(cplain->status == 200);
    json cj = json::parse(cplain->body);
    CHECK(cj["object"] == "chat.completion");
    CHECK(cj["choices"][0]["message"]["role"] == "assistant");
    const std::string ctext = cj["choices"][0]["message"]["content"];
    CHECK(!ctext.empty());
    chat["stream"] = true;
    auto cstream = post(s, "/v1/chat/completions", chat);
    REQUIRE(cstream);
    Streamed cs = parseStream(cstream->body, true);
    CHECK(cs.text == ctext);
    CHECK(cs.done);
    // Same seed, same text; sampled requests run too.
    json sampled = {{"prompt", "The dog"}, {"max_tokens", 30}, {"temperature", 0.9}, {"top_p", 0.9}, {"seed", 42}};
    auto s1 = post(s, "/v1/completions", sampled), s2 = post(s, "/v1/completions", sampled);
    REQUIRE(s1);
    REQUIRE(s2);
    CHECK(json::parse(s1->body)["choices"][0]["text"] == json::parse(s2->body)["choices"][0]["text"]);
    CHECK(s.metric("bluevm_requests_total") == 8);
    CHECK(s.metric("bluevm_completion_tokens_total") > 200);
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
}

// Mutations of valid bodies: random byte edits and truncations (mostly invalid JSON), and values
// replaced by every JSON type at random keys. The parser answers each with a request or an error
// naming a status 400/404 and a message, never an exception.
std::vector<std::string> mutatedBodies(uint32_t seed, size_t count) {
    const std::vector<json> seeds = {
        {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"stop", {"a", "b"}}},
        {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}, {"stream", true},
         {"stream_options", {{"include_usage", true}}}},
        {{"prompt", {1, 2, 3}}, {"max_tokens", 4}, {"seed", 7}, {"top_p", 0.5}, {"top_k", 3}},
    };
    const std::vector<json> values = {nullptr, true, false, 0, -1, 1, 65, 1e300, -1e300, 0.5,
                                      "", "x", json::array(), json::array({1, "a", nullptr}),
                                      json::object(), json{{"type", "text"}}, 18446744073709551615ull,
                                      -9223372036854775807ll - 1, std::string(300, 'z')};
    std::mt19937 rng(seed);
    std::vector<std::string> out;
    for (size_t i = 0; i < count; ++i) {
        json j = seeds[rng() % seeds.size()];
        std::string body;
        switch (rng() % 3) {
            case 0: {  // a value replaced, or a key added, at the top level or one level down
                std::vector<std::string> keys = {"prompt", "messages", "max_tokens", "temperature",
                                                 "top_p", "top_k", "min_p", "seed", "stop", "stream",
                                                 "n", "echo", "model", "stream_options", "logprobs",
                                                 "max_completion_tokens", "presence_penalty"};
                j[keys[rng() % keys.size()]] = values[rng() % values.size()];
                if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty() &&
                    j["messages"][0].is_object() && rng() % 2) {
                    j["messages"][0][rng() % 2 ? "role" : "content"] = values[rng() % values.size()];
                }
                body = j.dump();
                break;
            }
            case 1: {  // bytes changed
                body = j.dump();
                for (int k = 0, n = 1 + int(rng() % 4); k < n && !body.empty(); ++k) {
                    body[rng() % body.size()] = char(rng() % 256);
                }
                break;
            }
            default:  // cut short
                body = j.dump();
                body.resize(rng() % (body.size() + 1));
        }
        out.push_back(std::move(body));
    }
    return out;
}

TEST_CASE("server: mutated request bodies parse or fail with a 4xx message, never throw") {
    size_t accepted = 0;
    for (const std::string& body : mutatedBodies(1234, 20000)) {
        for (server::Endpoint ep : {server::Endpoint::Completions, server::Endpoint::Chat}) {
            server::ApiRequest r;
            std::optional<server::ApiError> e;
            REQUIRE_NOTHROW(e = server::parseRequest(ep, body, 64, &r));
            if (e) {
                CHECK((e->status == 400 || e->status == 404));
                CHECK(!e->message.empty());
                CHECK(json::parse(server::errorBody(*e), nullptr, false).is_object());
            } else {
                ++accepted;
                CHECK(r.max_tokens <= 64);
                CHECK(r.top_p > 0);
            }
        }
    }
    CHECK(accepted > 100);  // the mutations also make valid requests
}

TEST_CASE("server: 300 mutated requests over HTTP are each answered, and the server still serves") {
    TestServer s(2, 64, 16);
    std::map<int, int> statuses;
    const std::vector<std::string> bodies = mutatedBodies(99, 300);
    for (size_t i = 0; i < bodies.size(); ++i) {
        CAPTURE(bodies[i]);
        auto r = s.client().Post(i % 2 ? "/v1/chat/completions" : "/v1/completions", bodies[i], "application/json");
        REQUIRE(r);
        ++statuses[r->status];
        CHECK((r->status == 200 || r->status == 400 || r->status == 404));
        if (r->status != 200) CHECK(json::parse(r->body)["error"]["message"].get<std::string>().size() > 0);
    }
    CHECK(statuses[200] > 0);
    CHECK(statuses[400] > 0);
    auto ok = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
    REQUIRE(ok);
    CHECK(ok->status == 200);
    CHECK(s.metric("bluevm_instances_busy") == 0);
}

TEST_CASE("server: bad requests get a clear 4xx and harm nothing else") {
    TestServer s(2, 64, 0);
    struct Case {
        const char* path;
        std::string body;
        int status;
        const char* message;  // a part of the error message
        const char* param;    // "" when none
    };
    const std::string long_prompt = [] {
        std::string p;
        for (int i = 0; i < 60; ++i) p += "Once upon a time ";
        return p;
    }();
    const Case cases[] = {
        {"/v1/completions", "{\"prompt\": \"x\"", 400, "invalid JSON", ""},
        {"/v1/completions", "[1, 2]", 400, "must be a JSON object", ""},
        {"/v1/completions", "{}", 400, "'prompt' is required", "prompt"},
        {"/v1/completions", R"({"prompt": {"a": 1}})", 400, "'prompt' must be a string", "prompt"},
        {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "'temperature' must be a number", "temperature"},
        {"/v1/completions", R"({"prompt": "x", "temperature": 7})", 400, "'temperature' must be between 0 and 2", "temperature"},
        {"/v1/completions", R"({"prompt": "x", "top_p": 1.5})", 400, "'top_p' must be between 0 and 1", "top_p"},
        {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "'max_tokens' must be between 1 and 64", "max_tokens"},
        {"/v1/completions", R"({"prompt": "x", "max_tokens": 2.5})", 400, "'max_tokens' must be an integer", "max_tokens"},
        {"/v1/completions", R"({"prompt": "x", "n": 3})", 400, "'n' must be 1", "n"},
        {"/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "'stream' must be true or false", "stream"},
        {"/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "'stop[0]' must be a string", "stop"},
        {"/v1/completions", R"({"prompt": "x", "logprobs": 21})", 400, "'logprobs' must be between 0 and 20", "logprobs"},
        {"/v1/completions", R"({"prompt": "x", "logprobs": -1})", 400, "'logprobs' must be between 0 and 20", "logprobs"},
        {"/v1/completions", R"({"prompt": "x", "logprobs": true})", 400, "'logprobs' must be an integer", "logprobs"},
        {"/v1/completions", R"({"prompt": "x", "top_logprobs": 2})", 400, "'top_logprobs' is a chat field", "top_logprobs"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3})", 400, "'logprobs' must be true or false", "logprobs"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21})", 400, "'top_logprobs' must be between 0 and 20", "top_logprobs"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": "5"})", 400, "'top_logprobs' must be an integer", "top_logprobs"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400, "'top_logprobs' needs 'logprobs': true", "top_logprobs"},
        {"/detokenize", R"({"tokens": [1, 99999]})", 400, "'tokens[1]' (99999) is not a token id", "tokens"},
        {"/detokenize", R"({"tokens": [-3]})", 400, "'tokens[0]' (-3) is not a token id", "tokens"},
        {"/detokenize", R"({"tokens": "1 2"})", 400, "'tokens' must be an array", "tokens"},
        {"/v1/completions", R"({"prompt": [1, 99999]})", 400, "outside the vocabulary", "prompt"},
        {"/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "the model 'gpt-4' does not exist", "model"},
        {"/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "the context holds 64", "prompt"},
        {"/v1/chat/completions", R"({"messages": []})", 400, "'messages' must be a non-empty array", "messages"},
        {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", 400, "'messages[0].role' must be a string", "messages[0].role"},
        {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400, "reads text only", "messages[0].content"},
        {"/v1/nothing", "{}", 404, "no route for POST /v1/nothing", ""},
        {"/v1/completions", std::string(2 << 20, ' '), 413, "too large", ""},
    };
    for (const Case& c : cases) {
        CAPTURE(c.body.substr(0, 80));
        auto res = s.client().Post(c.path, c.body, "application/json");
        REQUIRE(res);
        CHECK(res->status == c.status);
        json j = json::parse(res->body, nullptr, false);
        REQUIRE(j.is_object());
        REQUIRE(j.contains("error"));
        CHECK(j["error"]["message"].get<std::string>().find(c.message) != std::string::npos);
        if (*c.param) {
            CHECK(j["error"]["param"] == c.param);
        } else {
            CHECK(j["error"]["param"].is_null());
        }
    }
    // The server still serves.
    auto ok = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
    REQUIRE(ok);
    CHECK(ok->status == 200);
    CHECK(s.metric("bluevm_requests_total") == 1);
}

// Reads a streamed response until `chunks` events arrived, then drops the connection.
void streamThenDisconnect(const TestServer& s, const json& body, int chunks) {
    httplib::Client c = s.client();
    httplib::Request req = jsonPost("/v1/completions", body);
    int seen = 0;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        for (size_t i = 0; i + 1 < len; ++i) seen += data[i] == '\n' && data[i + 1] == '\n';
        return seen < chunks;  // false: the client closes the connection
    };
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
    CHECK(seen >= chunks);
}

TEST_CASE("server: a client that disconnects cancels its request; a full queue answers 429") {
    TestServer s(1, 512, 1);
    json longer = {{"prompt", "Once upon a time"}, {"max_tokens", 500}, {"temperature", 0},
                   {"ignore_eos", true}, {"stream", true}};
    streamThenDisconnect(s, longer, 2);
    // The instance is freed: the cancellation shows in the metrics and the next request runs.
    for (int i = 0; i < 200 && s.metric("bluevm_requests_cancelled_total") < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(s.metric("bluevm_requests_cancelled_total") == 1);
    CHECK(s.metric("bluevm_completion_tokens_total") < 500);
    auto ok = post(s, "/v1/completions", {{"prompt", "The dog"}, {"max_tokens", 8}, {"temperature", 0}});
    REQUIRE(ok);
    CHECK(ok->status == 200);

    // One instance and a queue of one: with one request running and one waiting, a third is
    // refused with 429 and Retry-After.
    std::atomic<int> statuses[2] = {0, 0};
    std::thread first([&] {
        auto r = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 300}, {"temperature", 0}, {"ignore_eos", true}});
        statuses[0] = r ? r->status : -1;
    });
    for (int i = 0; i < 400 && s.metric("bluevm_instances_busy") < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::thread second([&] {
        auto r = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"temperature", 0}});
        statuses[1] = r ? r->status : -1;
    });
    for (int i = 0; i < 400 && s.metric("bluevm_queue_depth") < 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    auto third = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}});
    REQUIRE(third);
    CHECK(third->status == 429);
    CHECK(third->get_header_value("Retry-After") == "1");
    CHECK(json::parse(third->body)["error"]["code"] == "queue_full");
    first.join();
    second.join();
    CHECK(statuses[0] == 200);
    CHECK(statuses[1] == 200);
    CHECK(s.metric("bluevm_requests_rejected_total") == 1);
}

TEST_CASE("server: 64 concurrent clients on 16 instances each get exactly their greedy text") {
    TestServer s(16, 128, 64);
    const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily wanted", "",
                                              "One day, a little", "Tom and his mom", "The sun", "Sue"};
    // One at a time first: the text each prompt must give.
    std::vector<std::string> expected;
    for (const std::string& p : prompts) {
        auto r = post(s, "/v1/completions", {{"prompt", p}, {"max_tokens", 24}, {"temperature", 0}});
        REQUIRE(r);
        REQUIRE(r->status == 200);
        expected.push_back(json::parse(r->body)["choices"][0]["text"]);
    }
    const int kClients = 64;
    std::vector<std::string> got(kClients);
    std::vector<int> status(kClients, 0);
    std::vector<std::string> errors(kClients);
    std::vector<std::thread> clients;
    for (int i = 0; i < kClients; ++i) {
        clients.emplace_back([&, i] {
            const bool stream = i % 2 == 1;
            json body = {{"prompt", prompts[i % prompts.size()]}, {"max_tokens", 24}, {"temperature", 0}, {"stream", stream}};
            auto r = post(s, "/v1/completions", body);
            if (!r) {
                errors[i] = httplib::to_string(r.error());
                return;
            }
            status[i] = r->status;
            if (r->status != 200) return;
            got[i] = stream ? parseStream(r->body, false).text : json::parse(r->body)["choices"][0]["text"].get<std::string>();
        });
    }
    for (std::thread& t : clients) t.join();
    for (int i = 0; i < kClients; ++i) {
        CAPTURE(i);
        CAPTURE(errors[i]);
        CHECK(status[i] == 200);
        CHECK(got[i] == expected[i % prompts.size()]);
    }
    CHECK(s.metric("bluevm_requests_total") == kClients + double(prompts.size()));
    CHECK(s.metric("bluevm_requests_finished_total") == kClients + double(prompts.size()));
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
    CHECK(s.metric("bluevm_instances_busy") == 0);
}

TEST_CASE("server: an API key guards every endpoint but /health, and is compared whole") {
    server::ServerOptions extra;
    extra.api_keys = {"sk-first", "sk-second-key"};
    TestServer s(1, 64, 4, extra);
    httplib::Client c = s.client();
    auto health = c.Get("/health");
    REQUIRE(health);
    CHECK(health->status == 200);
    const json body = {{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}};
    for (const char* header : {"", "Bearer ", "Bearer sk-firs", "Bearer sk-first-", "Bearer SK-FIRST", "Basic sk-first",
                               "sk-first"}) {
        httplib::Headers h;
        if (*header) h.emplace("Authorization", header);
        for (const char* path : {"/v1/models", "/metrics"}) {
            auto res = c.Get(path, h);
            REQUIRE(res);
            CHECK_MESSAGE(res->status == 401, path, " with '", header, "'");
            CHECK(res->get_header_value("WWW-Authenticate") == "Bearer");
            json err = json::parse(res->body);
            CHECK(err["error"]["code"] == "invalid_api_key");
            CHECK(err["error"]["type"] == "invalid_request_error");
        }
        auto res = c.Post("/v1/completions", h, body.dump(), "application/json");
        REQUIRE(res);
        CHECK(res->status == 401);
    }
    for (const char* key : {"sk-first", "sk-second-key"}) {
        httplib::Headers h = {{"Authorization", std::string("Bearer ") + key}};
        auto models = c.Get("/v1/models", h);
        REQUIRE(models);
        CHECK(models->status == 200);
        auto res = c.Post("/v1/completions", h, body.dump(), "application/json");
        REQUIRE(res);
        CHECK(res->status == 200);
        auto tok = c.Post("/tokenize", h, json{{"content", "Once"}}.dump(), "application/json");
        REQUIRE(tok);
        CHECK(tok->status == 200);
    }
}

TEST_CASE("server: /tokenize answers the model's token ids and names a bad field") {
    TestServer s(1, 64, 4);
    httplib::Client c = s.client();
    auto res = post(s, "/tokenize", {{"content", "Once upon a time"}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    json plain = json::parse(res->body)["tokens"];
    REQUIRE(plain.is_array());
    CHECK(plain.size() >= 2);
    res = post(s, "/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    json special = json::parse(res->body)["tokens"];
    CHECK(special.size() >= plain.size());  // BOS when the vocabulary asks for it
    // The ids are the ones a completion with prompt ids accepts.
    auto done = post(s, "/v1/completions", {{"prompt", plain}, {"max_tokens", 2}, {"temperature", 0}});
    REQUIRE(done);
    CHECK(done->status == 200);
    res = post(s, "/tokenize", {{"content", ""}});
    REQUIRE(res);
    CHECK(res->status == 200);
    // parse_special: control-token text becomes the token (as chat prompts are tokenized);
    // without it the text is text.
    res = post(s, "/tokenize", {{"content", "a</s>"}, {"parse_special", true}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const json parsed = json::parse(res->body)["tokens"];
    REQUIRE(!parsed.empty());
    CHECK(parsed.back() == 2);  // stories260K's </s>
    res = post(s, "/tokenize", {{"content", "a</s>"}});
    REQUIRE(res);
    const json spelled = json::parse(res->body)["tokens"];
    CHECK(std::find(spelled.begin(), spelled.end(), json(2)) == spelled.end());
    CHECK(spelled.size() > parsed.size());
    // with_pieces: each id with its text (control tokens' own), in llama.cpp server's shape.
    res = post(s, "/tokenize", {{"content", "Once upon a</s>"}, {"parse_special", true}, {"with_pieces", true}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const json pieces = json::parse(res->body)["tokens"];
    REQUIRE(pieces.size() >= 3);
    std::string joined;
    for (const json& p : pieces) {
        REQUIRE(p["id"].is_number_unsigned());
        REQUIRE(p["piece"].is_string());
        joined += p["piece"].get<std::string>();
    }
    CHECK(joined == " Once upon a</s>");  // SentencePiece's leading space stays on the first piece
    CHECK(pieces.back() == json({{"id", 2}, {"piece", "</s>"}}));
    // Byte tokens that are not whole UTF-8 (an emoji stories260K spells in bytes) come as their
    // byte values.
    res = post(s, "/tokenize", {{"content", "\xF0\x9F\x98\x80"}, {"with_pieces", true}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    std::vector<unsigned> bytes;
    const json emoji = json::parse(res->body)["tokens"];
    for (const json& p : emoji) {
        if (p["piece"].is_array()) {
            for (const json& b : p["piece"]) bytes.push_back(b.get<unsigned>());
        }
    }
    CHECK(bytes == std::vector<unsigned>{0xF0, 0x9F, 0x98, 0x80});
    struct Case {
        std::string body, param;
    };
    for (const Case& k : {Case{"{}", "content"}, Case{R"({"content": 3})", "content"},
                          Case{R"({"content": "a", "add_special": "yes"})", "add_special"},
                          Case{R"({"content": "a", "parse_special": 1})", "parse_special"},
                          Case{R"({"content": "a", "with_pieces": "no"})", "with_pieces"},
                          Case{"[1,2]", ""}, Case{"{\"content\": ", ""}}) {
        auto r = c.Post("/tokenize", k.body, "application/json");
        REQUIRE(r);
        CHECK_MESSAGE(r->status == 400, k.body);
        json err = json::parse(r->body, nullptr, false);
        REQUIRE(err.is_object());
        if (!k.param.empty()) CHECK(err["error"]["param"] == k.param);
    }
}

// Streamed chunks' logprobs, concatenated: completions' token_logprobs, chat's content entries.
json streamedLogprobs(const std::string& body, bool chat) {
    json all = json::array();
    size_t at = 0;
    while ((at = body.find("data: {", at)) != std::string::npos) {
        size_t end = body.find("\n\n", at);
        json j = json::parse(body.substr(at + 6, end - at - 6));
        at = end;
        if (j["choices"].empty() || j["choices"][0]["logprobs"].is_null()) continue;
        const json& lp = j["choices"][0]["logprobs"];
        for (const json& e : chat ? lp["content"] : lp["token_logprobs"]) all.push_back(e);
    }
    return all;
}

TEST_CASE("server: log-probabilities from the GPU in the OpenAI shapes; /detokenize inverts /tokenize") {
    // The streamed request reuses the plain one's cached prefix, so its last prompt token runs as
    // a batch of its own: equal log-probabilities need batch-invariant matmuls (the rows kernels;
    // on an NVIDIA H200 the GPU shapes differed in the last bits; README, Batch invariance).
    ScopedEnv rows("BLUE_DECODE_KERNEL", "rows");
    TestServer s(2, 128, 0);
    const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
    json with = base;
    with["logprobs"] = 5;
    auto plain = post(s, "/v1/completions", base);
    auto res = post(s, "/v1/completions", with);
    REQUIRE(plain);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    json a = json::parse(plain->body), b = json::parse(res->body);
    // The same request without logprobs returns the same text, and no logprobs.
    CHECK(a["choices"][0]["text"] == b["choices"][0]["text"]);
    CHECK(a["choices"][0]["logprobs"].is_null());
    const json& lp = b["choices"][0]["logprobs"];
    const size_t n = b["usage"]["completion_tokens"];
    REQUIRE(lp["tokens"].size() == n);
    REQUIRE(lp["token_logprobs"].size() == n);
    REQUIRE(lp["top_logprobs"].size() == n);
    REQUIRE(lp["text_offset"].size() == n);
    std::string joined;
    for (size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        const std::string tok = lp["tokens"][i];
        const float chosen = lp["token_logprobs"][i];
        CHECK(lp["text_offset"][i] == joined.size());
        joined += tok;
        CHECK(chosen <= 0.0f);
        const json& top = lp["top_logprobs"][i];
        CHECK(top.size() >= 1);
        CHECK(top.size() <= 5);
        double mass = 0, best = -INFINITY;
        for (auto& [text, v] : top.items()) {
            CHECK(v.get<float>() <= 0.0f);
            mass += std::exp(v.get<double>());
            best = std::max(best, v.get<double>());
        }
        CHECK(mass <= 1.0 + 1e-5);
        // Greedy: the chosen token is the argmax, its log-probability the top alternative's.
        CHECK(top.contains(tok));
        if (top.contains(tok)) CHECK(top[tok].get<float>() == chosen);
        CHECK(chosen == doctest::Approx(best).epsilon(1e-6));
    }
    // SentencePiece: the first piece's leading space is dropped from the text.
    std::string text = b["choices"][0]["text"];
    CHECK((joined == text || joined == " " + text));

    // Chat: logprobs: true with top_logprobs, sorted and carrying bytes.
    json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}, {"max_tokens", 8},
                 {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
    res = post(s, "/v1/chat/completions", chat);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    json c = json::parse(res->body);
    const json& content = c["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == c["usage"]["completion_tokens"].get<size_t>());
    for (const json& e : content) {
        REQUIRE(e["top_logprobs"].size() == 3);
        CHECK(e["top_logprobs"][0]["logprob"] == e["logprob"]);
        CHECK(e["top_logprobs"][0]["token"] == e["token"]);
        CHECK(e["bytes"].size() == e["token"].get<std::string>().size());
        for (size_t k = 1; k < 3; ++k) CHECK(e["top_logprobs"][k]["logprob"] <= e["top_logprobs"][k - 1]["logprob"]);
    }
    // Streamed: the chunks' logprobs concatenate to the non-streamed ones.
    json streamed = with;
    streamed["stream"] = true;
    res = post(s, "/v1/completions", streamed);
    REQUIRE(res);
    CHECK(streamedLogprobs(res->body, false) == lp["token_logprobs"]);
    chat["stream"] = true;
    res = post(s, "/v1/chat/completions", chat);
    REQUIRE(res);
    CHECK(streamedLogprobs(res->body, true) == content);
    // Sampled (T > 0) with penalties: still log-probabilities <= 0 of a distribution.
    json sampled = with;
    sampled["temperature"] = 0.9;
    sampled["seed"] = 7;
    sampled["repeat_penalty"] = 1.3;
    res = post(s, "/v1/completions", sampled);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const json sampled_body = json::parse(res->body);  // named: a range-for over a temporary's member dangles
    for (const json& v : sampled_body["choices"][0]["logprobs"]["token_logprobs"]) CHECK(v.get<float>() <= 0.0f);
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);

    // /detokenize(/tokenize(x)) == x.
    for (const char* x : {"Once upon a time", "Lily was happy. She said, \"hi!\"", ""}) {
        auto t = post(s, "/tokenize", {{"content", x}});
        REQUIRE(t);
        auto d = post(s, "/detokenize", {{"tokens", json::parse(t->body)["tokens"]}});
        REQUIRE(d);
        REQUIRE(d->status == 200);
        CHECK(json::parse(d->body)["content"] == x);
    }
}

TEST_CASE("server: a prompt sharing its start with the instance's last one reuses its KV rows; cache_prompt: false opts out") {
    TestServer s(1, 512, 4);
    std::string system;  // about 240 tokens
    for (int i = 0; i < 20; ++i) system += "Lily and Tom went to the park. ";
    json body = {{"prompt", system + "The dog"}, {"max_tokens", 12}, {"temperature", 0}};
    auto first = post(s, "/v1/completions", body);
    REQUIRE(first);
    REQUIRE(first->status == 200);
    const json a = json::parse(first->body);
    const uint32_t prompt_tokens = a["usage"]["prompt_tokens"].get<uint32_t>();
    CHECK(prompt_tokens > 200);
    CHECK(a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    // The same prompt again on the one instance: all but its last token are reused; same text.
    auto again = post(s, "/v1/completions", body);
    REQUIRE(again);
    const json b = json::parse(again->body);
    CHECK(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<uint32_t>() == prompt_tokens - 1);
    CHECK(b["choices"][0]["text"] == a["choices"][0]["text"]);
    // Another question after the same system text: at least the system text's tokens (streamed:
    // the usage chunk says it too).
    json other = body;
    other["prompt"] = system + "Then the cat";
    other["stream"] = true;
    other["stream_options"] = {{"include_usage", true}};
    auto streamed = post(s, "/v1/completions", other);
    REQUIRE(streamed);
    size_t at = streamed->body.find("\"cached_tokens\":");
    REQUIRE(at != std::string::npos);
    CHECK(std::atoi(streamed->body.c_str() + at + 16) >= 200);
    body["cache_prompt"] = false;
    auto off = post(s, "/v1/completions", body);
    REQUIRE(off);
    const json c = json::parse(off->body);
    CHECK(c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    CHECK(c["choices"][0]["text"] == a["choices"][0]["text"]);
    CHECK(s.metric("bluevm_prefix_hits_total") == 2);
    CHECK(s.metric("bluevm_prefix_tokens_total") >= double(prompt_tokens - 1 + 200));
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
    body["cache_prompt"] = "yes";
    auto bad = post(s, "/v1/completions", body);
    REQUIRE(bad);
    CHECK(bad->status == 400);
    CHECK(bad->body.find("cache_prompt") != std::string::npos);
}

// Which idle instance takes a request is decided on the GPU by what the instances hold: four
// conversations, one after another, first spread over the four idle instances (a new
// conversation goes to an empty instance before it displaces anyone's rows), then every later
// turn, in another order each round, goes to the instance holding its conversation and reuses
// all of it. Taking the next request by whoever claims first put later conversations on the
// instance of earlier ones, whose rows they replaced.
TEST_CASE("server: a conversation's next turn goes to the instance that holds it, decided on the GPU") {
    TestServer s(4, 512, 8);
    const std::vector<std::string> openings = {
        "Lily and Tom went to the park. They played with a red ball all day long. ",
        "The little dog ran into the garden. He dug a hole under the big tree. ",
        "Once there was a bird who could not fly. She sat on a branch and sang. ",
        "Ben had a new toy car. It was blue and fast, and he raced it on the floor. "};
    std::vector<std::string> texts;
    for (const std::string& o : openings) {
        std::string t;
        for (int i = 0; i < 4; ++i) t += o;
        texts.push_back(t);
    }
    auto turn = [&](size_t c, uint32_t* cached, uint32_t* prompt_tokens) {
        json body = {{"prompt", texts[c]}, {"max_tokens", 8}, {"temperature", 0}};
        auto r = post(s, "/v1/completions", body);
        REQUIRE(r);
        REQUIRE(r->status == 200);
        const json j = json::parse(r->body);
        *cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<uint32_t>();
        *prompt_tokens = j["usage"]["prompt_tokens"].get<uint32_t>();
        // The next turn: this one's prompt, its answer and a new sentence.
        texts[c] += j["choices"][0]["text"].get<std::string>() + " Then they went home. ";
    };
    uint32_t cached = 0, prompt_tokens = 0;
    for (size_t c = 0; c < texts.size(); ++c) {
        CAPTURE(c);
        turn(c, &cached, &prompt_tokens);
        CHECK(cached <= 1);  // nothing of it anywhere (the BOS token at most)
    }
    const std::vector<std::vector<size_t>> orders = {{2, 0, 3, 1}, {1, 3, 0, 2}, {3, 2, 1, 0}};
    uint32_t cached_sum = 0, prompt_sum = 0;
    for (const std::vector<size_t>& order : orders) {
        for (size_t c : order) {
            CAPTURE(c);
            turn(c, &cached, &prompt_tokens);
            cached_sum += cached;
            prompt_sum += prompt_tokens;
            // All of the earlier prompt (about 70 tokens and more) came from the instance's rows.
            CHECK(cached >= 60);
            CHECK(cached < prompt_tokens);
        }
    }
    MESSAGE("12 later turns: " << cached_sum << " of " << prompt_sum << " prompt tokens from the instances' rows");
    CHECK(s.metric("bluevm_prefix_hits_total") >= 12);
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
}

TEST_CASE("server: CORS is off by default and answers only the origins it names") {
    {
        TestServer s(1, 64, 4);
        httplib::Client c = s.client();
        auto res = c.Get("/v1/models", {{"Origin", "https://app.example"}});
        REQUIRE(res);
        CHECK(res->status == 200);
        CHECK_FALSE(res->has_header("Access-Control-Allow-Origin"));
    }
    server::ServerOptions extra;
    extra.cors_origins = {"https://app.example"};
    extra.api_keys = {"sk-k"};
    TestServer s(1, 64, 4, extra);
    httplib::Client c = s.client();
    // A preflight carries no key and is answered all the same.
    auto pre = c.Options("/v1/completions", {{"Origin", "https://app.example"},
                                             {"Access-Control-Request-Method", "POST"},
                                             {"Access-Control-Request-Headers", "authorization, content-type"}});
    REQUIRE(pre);
    CHECK(pre->status == 204);
    CHECK(pre->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
    CHECK(pre->get_header_value("Access-Control-Allow-Methods").find("POST") != std::string::npos);
    CHECK(pre->get_header_value("Access-Control-Allow-Headers") == "Authorization, Content-Type");
    auto ok = c.Get("/v1/models", {{"Origin", "https://app.example"}, {"Authorization", "Bearer sk-k"}});
    REQUIRE(ok);
    CHECK(ok->status == 200);
    CHECK(ok->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
    auto other = c.Get("/v1/models", {{"Origin", "https://evil.example"}, {"Authorization", "Bearer sk-k"}});
    REQUIRE(other);
    CHECK(other->status == 200);
    CHECK_FALSE(other->has_header("Access-Control-Allow-Origin"));
    // A refusal still carries the header, so the browser lets the page read the 401.
    auto refused = c.Get("/v1/models", {{"Origin", "https://app.example"}});
    REQUIRE(refused);
    CHECK(refused->status == 401);
    CHECK(refused->get_header_value("Access-Control-Allow-Origin") == "https://app.example");
}

// A connected socket to the server that has sent `bytes`; -1 when it cannot connect.
int rawConnection(int port, const std::string& bytes) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size())) {
        close(fd);
        return -1;
    }
    return fd;
}

// The value of `line` ("name{labels}") in /metrics text, or -1.
double metricLine(const std::string& text, const std::string& line) {
    size_t at = text.find("\n" + line + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size() + 2));
}

TEST_CASE("server: 500 slow connections hold no worker; they are dropped at the body timeout") {
    constexpr int kSlow = 500;
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    const rlim_t want = 2 * kSlow + 256;  // both ends of every connection, and the engine's own
    if (lim.rlim_cur < want) {
        lim.rlim_cur = std::min<rlim_t>(want, lim.rlim_max);
        setrlimit(RLIMIT_NOFILE, &lim);
        getrlimit(RLIMIT_NOFILE, &lim);
    }
    if (lim.rlim_cur < want) {
        MESSAGE("skipped: the process may open only ", lim.rlim_cur, " files, the test needs ", want);
        return;
    }
    server::ServerOptions extra;
    extra.header_timeout_ms = 3000;
    extra.body_timeout_ms = 3000;
    extra.max_connections = 2 * kSlow;
    extra.max_connections_per_address = 2 * kSlow;  // every client here is 127.0.0.1
    TestServer s(4, 64, 16, extra);
    const std::string half =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{\"prompt\": \"Once";
    std::vector<int> slow;
    for (int i = 0; i < kSlow; ++i) {
        const int fd = rawConnection(s.http->port(), half);
        REQUIRE_MESSAGE(fd >= 0, "connection ", i);
        slow.push_back(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the front has seen them all
    const auto t0 = std::chrono::steady_clock::now();
    auto res = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(res);
    CHECK(res->status == 200);
    MESSAGE("a completion under ", kSlow, " slow connections took ", seconds, " s");
    CHECK(seconds < 5.0);
    auto before = s.client().Get("/metrics");
    REQUIRE(before);
    CHECK(metricLine(before->body, "bluevm_http_connections_waiting") >= kSlow);
    std::this_thread::sleep_for(std::chrono::milliseconds(extra.body_timeout_ms + 1500));
    auto after = s.client().Get("/metrics");
    REQUIRE(after);
    CHECK(metricLine(after->body, "bluevm_http_connections_dropped_total{reason=\"timeout\"}") >= kSlow);
    CHECK(metricLine(after->body, "bluevm_http_connections_waiting") == 0);
    for (int fd : slow) close(fd);
}

TEST_CASE("server: connections over the per-address limit get 503, and the count frees on close") {
    server::ServerOptions extra;
    extra.max_connections_per_address = 4;
    extra.header_timeout_ms = 60000;
    TestServer s(1, 64, 4, extra);
    std::vector<int> idle;
    for (int i = 0; i < 4; ++i) idle.push_back(rawConnection(s.http->port(), "GET /hea"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int extra_fd = rawConnection(s.http->port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    REQUIRE(extra_fd >= 0);
    char buf[256] = {};
    const ssize_t n = recv(extra_fd, buf, sizeof buf - 1, 0);
    REQUIRE(n > 0);
    CHECK(std::string(buf).rfind("HTTP/1.1 503", 0) == 0);
    close(extra_fd);
    for (int fd : idle) close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the front sees them close
    auto res = s.client().Get("/metrics");
    REQUIRE(res);
    CHECK_MESSAGE(res->status == 200, res->body);
    CHECK(metricLine(res->body, "bluevm_http_connections_dropped_total{reason=\"limit\"}") >= 1);
}

TEST_CASE("server: response_format and grammar constrain the text on the GPU; a bad schema or grammar is a 400 naming the field") {
    TestServer s(2, 256, 0);
    const json person = json::parse(R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "happy": {"type": "boolean"}}, "required": ["name", "age", "happy"]})");
    for (uint32_t seed = 1; seed <= 3; ++seed) {
        CAPTURE(seed);
        json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about Lily."}}}},
                     {"max_tokens", 120}, {"temperature", 0.9}, {"seed", seed},
                     {"response_format", {{"type", "json_schema"},
                                          {"json_schema", {{"name", "person"}, {"schema", person}, {"strict", true}}}}}};
        auto res = post(s, "/v1/chat/completions", body);
        REQUIRE(res);
        REQUIRE(res->status == 200);
        json j = json::parse(res->body);
        const std::string content = j["choices"][0]["message"]["content"];
        CAPTURE(content);
        REQUIRE(j["choices"][0]["finish_reason"] == "stop");
        json value = json::parse(content, nullptr, false);
        REQUIRE(!value.is_discarded());
        CHECK(value["name"].is_string());
        CHECK(value["name"].get<std::string>().size() <= 10 * 4);
        CHECK(value["age"].get<int>() >= 1);
        CHECK(value["age"].get<int>() <= 99);
        CHECK(value["happy"].is_boolean());
        CHECK(value.size() == 3);
    }
    // A GBNF grammar (llama.cpp's `grammar` field), streamed: the text is a sentence of it.
    json body = {{"prompt", "Once"}, {"max_tokens", 60}, {"temperature", 0.8}, {"seed", 4}, {"stream", true},
                 {"grammar", R"(root ::= " upon a time, " ("a" | "the") " " [a-z]+ ("." | "!"))"}};
    auto res = post(s, "/v1/completions", body);
    REQUIRE(res);
    REQUIRE(res->status == 200);
    Streamed st = parseStream(res->body, false);
    CAPTURE(st.text);
    REQUIRE(st.finish == "stop");
    CHECK((st.text.rfind(" upon a time, a ", 0) == 0 || st.text.rfind(" upon a time, the ", 0) == 0));
    CHECK((st.text.back() == '.' || st.text.back() == '!'));
    // json_object: one JSON object.
    res = post(s, "/v1/completions", {{"prompt", "{"}, {"max_tokens", 60}, {"temperature", 0}, {"response_format", {{"type", "json_object"}}}});
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const std::string text = json::parse(res->body)["choices"][0]["text"];
    CHECK(text.front() == '{');
    // Malformed: each a 400 naming the field; the server still serves.
    struct Bad {
        json extra;
        const char* message;
        const char* param;
    };
    const Bad bad[] = {
        {{{"response_format", {{"type", "xml"}}}}, "'response_format.type' must be", "response_format"},
        {{{"response_format", {{"type", "json_schema"}}}}, "'response_format.json_schema' must be an object", "response_format"},
        {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"pattern", "^a"}}}}}}}}, "pattern", "response_format"},
        {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", 5}}}}}}}}, "schema at", "response_format"},
        {{{"grammar", "root ::= (\"a\""}}, "grammar line 1", "grammar"},
        {{{"grammar", "root ::= value"}}, "value", "grammar"},
        {{{"grammar", 7}}, "'grammar' must be a string", "grammar"},
        {{{"grammar", "root ::= \"a\""}, {"response_format", {{"type", "json_object"}}}}, "at most one", "grammar"},
    };
    for (const Bad& b : bad) {
        json req = {{"prompt", "x"}, {"max_tokens", 4}};
        req.update(b.extra);
        CAPTURE(req.dump());
        auto r = post(s, "/v1/completions", req);
        REQUIRE(r);
        CHECK(r->status == 400);
        json e = json::parse(r->body);
        CHECK(e["error"]["message"].get<std::string>().find(b.message) != std::string::npos);
        CHECK(e["error"]["param"] == b.param);
    }
    auto ok = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}});
    REQUIRE(ok);
    CHECK(ok->status == 200);
}

// A tool adding two integers in 0..99.
json addTool() {
    return {{"type", "function"},
            {"function", {{"name", "add"},
                          {"parameters", {{"type", "object"},
                                          {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}},
                                                          {"b", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}}},
                                          {"required", {"a", "b"}}}}}}};
}

// An answer to a history that offered `add` with tool_choice "auto": a call of it, or text whose
// first byte is none of `call_starts` (it cannot be taken for the start of a call in the format).
void checkAddOrText(const httplib::Result& res, const std::string& call_starts) {
    REQUIRE(res);
    REQUIRE(res->status == 200);
    const json c = json::parse(res->body)["choices"][0];
    if (c["finish_reason"] == "tool_calls") {
        CHECK(c["message"]["tool_calls"][0]["function"]["name"] == "add");
    } else {
        const std::string text = c["message"]["content"];
        CHECK((text.empty() || call_starts.find(text[0]) == std::string::npos));
    }
}

TEST_CASE("server: tools answer tool_calls in the OpenAI shape, arguments valid against the tool's parameters") {
    // Each tool format: stories260K's template is ChatML, so "auto" is Hermes.
    std::string format;
    SUBCASE("auto: hermes") { format = "auto"; }
    SUBCASE("json") { format = "json"; }
    SUBCASE("llama3") { format = "llama3"; }
    CAPTURE(format);
    server::ServerOptions extra;
    extra.tool_format = format;
    TestServer s(2, 1024, 0, extra);
    const json weather = {{"type", "function"},
                          {"function", {{"name", "get_weather"}, {"description", "The weather in a city"},
                                        {"parameters", {{"type", "object"},
                                                        {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}},
                                                                        {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
                                                        {"required", {"city", "days"}}}}}}};
    const json add = addTool();
    const json messages = {{{"role", "user"}, {"content", "What is the weather in Paris?"}}};
    size_t most_calls = 0;
    for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "add"}}}})}) {
        for (bool stream : {false, true}) {
            CAPTURE(choice.dump());
            CAPTURE(stream);
            json body = {{"messages", messages}, {"tools", {weather, add}}, {"tool_choice", choice},
                         {"max_tokens", 400}, {"temperature", 0.7}, {"seed", 3}, {"stream", stream}};
            auto res = post(s, "/v1/chat/completions", body);
            REQUIRE(res);
            REQUIRE(res->status == 200);
            json calls = json::array();
            std::string finish;
            if (!stream) {
                json j = json::parse(res->body);
                const json& c = j["choices"][0];
                finish = c["finish_reason"];
                CHECK(c["message"]["content"].is_null());
                calls = c["message"]["tool_calls"];
            } else {
                for (size_t at = 0; (at = res->body.find("data: {", at)) != std::string::npos; ++at) {
                    json j = json::parse(res->body.substr(at + 6, res->body.find("\n\n", at) - at - 6));
                    const json& c = j["choices"][0];
                    if (c["delta"].contains("tool_calls")) {
                        for (const json& call : c["delta"]["tool_calls"]) calls.push_back(call);
                    }
                    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
                }
            }
            CHECK(finish == "tool_calls");
            REQUIRE(calls.is_array());
            REQUIRE(calls.size() >= 1);
            REQUIRE(calls.size() <= server::kMaxParallelCalls);
            if (format == "llama3") CHECK(calls.size() == 1);  // one call per answer in that format
            most_calls = std::max(most_calls, calls.size());
            for (size_t k = 0; k < calls.size(); ++k) {
                const json& call = calls[k];
                CHECK(call["type"] == "function");
                CHECK(call["id"].get<std::string>().rfind("call_", 0) == 0);
                if (k > 0) CHECK(call["id"] != calls[k - 1]["id"]);
                const std::string name = call["function"]["name"];
                json args = json::parse(call["function"]["arguments"].get<std::string>());
                if (choice.is_object()) CHECK(name == "add");
                if (name == "add") {
                    CHECK(args["a"].get<int>() <= 99);
                    CHECK(args["b"].get<int>() >= 0);
                } else {
                    REQUIRE(name == "get_weather");
                    CHECK(args["city"].is_string());
                    CHECK(args["days"].get<int>() >= 1);
                    CHECK(args["days"].get<int>() <= 7);
                }
            }
        }
    }
    // stories260K answers with calls until the bound ends them, where the format has several.
    CHECK(most_calls == (format == "llama3" ? 1u : server::kMaxParallelCalls));
    // /v1/models says which format the server chose.
    auto models = s.client().Get("/v1/models");
    REQUIRE(models);
    const json meta = json::parse(models->body)["data"][0]["meta"];
    CHECK(meta["chat_template"] == "chatml");
    CHECK(meta["tool_format"] == (format == "auto" ? "hermes" : format));
    // Without parallel calls the answer holds exactly one.
    for (int seed = 0; seed < 3; ++seed) {
        auto one = post(s, "/v1/chat/completions",
                        {{"messages", messages}, {"tools", {weather, add}}, {"tool_choice", "required"},
                         {"parallel_tool_calls", false}, {"max_tokens", 200}, {"temperature", 1.0}, {"seed", seed}});
        REQUIRE(one);
        REQUIRE(one->status == 200);
        const json c = json::parse(one->body)["choices"][0];
        CHECK(c["finish_reason"] == "tool_calls");
        CHECK(c["message"]["tool_calls"].size() == 1);
    }
    // A conversation that carries a call and its result; "auto" may call or answer in text.
    json history = {{{"role", "user"}, {"content", "Add 2 and 3."}},
                    {{"role", "assistant"}, {"content", nullptr},
                     {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                      {"function", {{"name", "add"}, {"arguments", "{\"a\": 2, \"b\": 3}"}}}}}}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "5"}}};
    auto res = post(s, "/v1/chat/completions", {{"messages", history}, {"tools", {add}}, {"max_tokens", 40}, {"temperature", 0}});
    checkAddOrText(res, format == "auto" ? "<" : format == "json" ? "{[" : "{");
    // "none": plain text.
    res = post(s, "/v1/chat/completions", {{"messages", messages}, {"tools", {add}}, {"tool_choice", "none"}, {"max_tokens", 8}, {"temperature", 0}});
    REQUIRE(res);
    CHECK(json::parse(res->body)["choices"][0]["message"]["content"].is_string());
    // Malformed tools: 400 naming the field.
    struct Bad {
        json extra;
        const char* message;
        const char* param;
    };
    const Bad bad[] = {
        {{{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}}, "letters, digits", "tools"},
        {{{"tools", {{{"type", "retrieval"}}}}}, "must be {\"type\": \"function\"", "tools"},
        {{{"tools", {add}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "'nope', which is not among", "tool_choice"},
        {{{"tool_choice", "required"}}, "'tool_choice' needs 'tools'", "tool_choice"},
        {{{"tools", {add}}, {"tool_choice", "always"}}, "'tool_choice' must be", "tool_choice"},
        {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "string"}, {"pattern", "x"}}}}}}}}, {"tool_choice", "required"}}, "pattern", "tools"},
        {{{"tools", {add}}, {"response_format", {{"type", "json_object"}}}}, "at most one", "tools"},
    };
    for (const Bad& b : bad) {
        json req = {{"messages", messages}, {"max_tokens", 4}};
        req.update(b.extra);
        CAPTURE(req.dump());
        auto r = post(s, "/v1/chat/completions", req);
        REQUIRE(r);
        CHECK(r->status == 400);
        json e = json::parse(r->body);
        CHECK(e["error"]["message"].get<std::string>().find(b.message) != std::string::npos);
        CHECK(e["error"]["param"] == b.param);
    }
}

// Mistral's format on a model with Mistral v3's control tokens (blue-synth's mistral-tiny, whose
// template is inferred as mistral-v3): the GPU's automaton lets the [TOOL_CALLS] control token
// through (it has the marker's bytes in the grammar's table), the answer starts with that token
// and reads back as calls; a history with calls and results is taken; a ChatML model refuses the
// format by name.
TEST_CASE("server: Mistral's tool format: calls after the [TOOL_CALLS] control token") {
    TempDir dir("blue_mistral_tools");
    TestModel tm;
    tm.path = dir.path + "/mistral-tiny.gguf";
    Status written = synthWrite(*synthPreset("mistral-tiny"), SynthOptions{}, tm.path);
    REQUIRE_MESSAGE(written, written.message());
    TestServer s(2, 1024, 0, {}, tm);
    auto models = s.client().Get("/v1/models");
    REQUIRE(models);
    const json meta = json::parse(models->body)["data"][0]["meta"];
    CHECK(meta["chat_template"] == "mistral-v3");
    CHECK(meta["tool_format"] == "mistral");
    const json add = addTool();
    const json city = {{"type", "function"},
                       {"function", {{"name", "get_weather"},
                                     {"parameters", {{"type", "object"},
                                                     {"properties", {{"city", {{"type", "string"}, {"maxLength", 10}}}}},
                                                     {"required", {"city"}}}}}}};
    const json messages = {{{"role", "system"}, {"content", "Use the tools."}},
                           {{"role", "user"}, {"content", "What is 2 + 3?"}}};
    size_t most_calls = 0;
    int control_token_first = 0;
    for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "add"}}}})}) {
        for (int seed = 0; seed < 3; ++seed) {
            CAPTURE(choice.dump());
            CAPTURE(seed);
            auto res = post(s, "/v1/chat/completions",
                            {{"messages", messages}, {"tools", {add, city}}, {"tool_choice", choice}, {"max_tokens", 300},
                             {"temperature", 0.8}, {"seed", seed}, {"logprobs", true}});
            REQUIRE(res);
            REQUIRE(res->status == 200);
            const json c = json::parse(res->body)["choices"][0];
            CHECK(c["finish_reason"] == "tool_calls");
            CHECK(c["message"]["content"].is_null());
            // The marker: the control token itself, or spelled in pieces (random weights may
            // prefer those); the token must have been let through at least once (below).
            REQUIRE(c["logprobs"]["content"].size() > 2);
            const std::string first = c["logprobs"]["content"][0]["token"];
            CHECK((first == "[TOOL_CALLS]" || first == "["));
            control_token_first += first == "[TOOL_CALLS]";
            const json calls = c["message"]["tool_calls"];
            REQUIRE(calls.is_array());
            REQUIRE(calls.size() >= 1);
            REQUIRE(calls.size() <= server::kMaxParallelCalls);
            most_calls = std::max(most_calls, calls.size());
            for (const json& call : calls) {
                const std::string name = call["function"]["name"];
                const json args = json::parse(call["function"]["arguments"].get<std::string>());
                if (choice.is_object()) CHECK(name == "add");
                if (name == "add") {
                    CHECK(args["a"].get<int>() >= 0);
                    CHECK(args["b"].get<int>() <= 99);
                } else {
                    REQUIRE(name == "get_weather");
                    const std::string text = args["city"];  // maxLength counts characters
                    CHECK(std::count_if(text.begin(), text.end(), [](char ch) { return (ch & 0xC0) != 0x80; }) <= 10);
                }
            }
        }
    }
    CHECK(most_calls > 1);  // parallel calls: several in one array
    CHECK(control_token_first >= 3);
    // Streamed: the calls come as one tool_calls delta at the end.
    auto streamed = post(s, "/v1/chat/completions",
                         {{"messages", messages}, {"tools", {add}}, {"tool_choice", "required"}, {"max_tokens", 300},
                          {"temperature", 0.8}, {"seed", 1}, {"stream", true}});
    REQUIRE(streamed);
    REQUIRE(streamed->status == 200);
    CHECK(streamed->body.find("\"tool_calls\":[{") != std::string::npos);
    CHECK(streamed->body.find("\"finish_reason\":\"tool_calls\"") != std::string::npos);
    // A conversation that carries calls (with ids) and results: "auto" calls or answers in text
    // that cannot start the way calls do.
    const json history = {
        {{"role", "user"}, {"content", "Add 2 and 3."}},
        {{"role", "assistant"}, {"content", nullptr},
         {"tool_calls", {{{"id", "a1b2c3d4e"}, {"type", "function"},
                          {"function", {{"name", "add"}, {"arguments", "{\"a\": 2, \"b\": 3}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "a1b2c3d4e"}, {"content", "5"}},
        {{"role", "user"}, {"content", "And 4 and 4?"}}};
    for (int seed = 0; seed < 4; ++seed) {
        checkAddOrText(post(s, "/v1/chat/completions",
                            {{"messages", history}, {"tools", {add}}, {"max_tokens", 60}, {"temperature", 1.0}, {"seed", seed}}),
                       "[");
    }
    // The format needs a Mistral template: stories260K's is ChatML.
    Child refused(std::vector<std::string>{std::string(BLUE_BINARY_DIR) + "/host/bluevm", "serve", "-m",
                                           sharedDir() + "/models/stories260K/stories260K.gguf", "--tool-format",
                                           "mistral", "--port", "0"});
    CHECK(refused.wait() != 0);
    CHECK(refused.err_text.find("tool format 'mistral' needs a Mistral chat template (mistral-v3, mistral-v3-tekken "
                                "or mistral-v7: its turns have the tool markers); this model's is 'chatml'") !=
          std::string::npos);
}

// With tool_choice "auto", an answer whose first byte shows it is text streams as it comes,
// instead of being held to the end in case it is a call.
TEST_CASE("server: a streamed answer to a request with tools streams as soon as it is known to be text") {
    TestServer s(1, 1024, 0);
    json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story about a cat."}}}},
                 {"tools", {{{"type", "function"},
                             {"function", {{"name", "add"},
                                           {"parameters", {{"type", "object"},
                                                           {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "integer"}}}}},
                                                           {"required", {"a", "b"}}}}}}}}},
                 {"max_tokens", 60}, {"temperature", 0.8}, {"seed", 1}};
    auto whole = post(s, "/v1/chat/completions", body);
    REQUIRE(whole);
    REQUIRE(whole->status == 200);
    const json c = json::parse(whole->body)["choices"][0];
    REQUIRE_MESSAGE(c["message"]["content"].is_string(), "stories260K answered this one with text before");
    const std::string text = c["message"]["content"];
    REQUIRE(text.size() > 20);
    body["stream"] = true;
    auto streamed = post(s, "/v1/chat/completions", body);
    REQUIRE(streamed);
    REQUIRE(streamed->status == 200);
    std::string joined, finish;
    int content_chunks = 0;
    for (size_t at = 0; (at = streamed->body.find("data: {", at)) != std::string::npos; ++at) {
        const json j = json::parse(streamed->body.substr(at + 6, streamed->body.find("\n\n", at) - at - 6));
        const json& ch = j["choices"][0];
        CHECK_FALSE(ch["delta"].contains("tool_calls"));
        if (ch["delta"].contains("content") && !ch["delta"]["content"].get<std::string>().empty()) {
            joined += ch["delta"]["content"].get<std::string>();
            ++content_chunks;
        }
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    CHECK(joined == text);
    CHECK(finish == c["finish_reason"]);
    CHECK(content_chunks > 1);  // 60 tokens in chains of 16 cycles: sent chain by chain
}

// Several calls in one answer need an automaton several times one call's; where an instance's
// grammar memory cannot hold it, the answer is one call instead of a refusal.
TEST_CASE("server: parallel tool calls that do not fit the grammar memory fall back to one call") {
    TestServer s(1, 1024, 0, {}, {.grammar_words = 16384});
    const json weather = {{"type", "function"},
                          {"function", {{"name", "get_weather"},
                                        {"parameters", {{"type", "object"},
                                                        {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                                                        {"required", {"city"}}}}}}};
    const json add = {{"type", "function"},
                      {"function", {{"name", "add"},
                                    {"parameters", {{"type", "object"},
                                                    {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "integer"}}}}},
                                                    {"required", {"a", "b"}}}}}}};
    const json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris and 2 + 3?"}}}},
                       {"tools", {weather, add}}, {"tool_choice", "required"}, {"max_tokens", 200},
                       {"temperature", 0.7}, {"seed", 5}};
    auto res = post(s, "/v1/chat/completions", body);
    REQUIRE(res);
    REQUIRE_MESSAGE(res->status == 200, res->body);
    const json j = json::parse(res->body);
    const json c = j["choices"][0];
    CHECK(c["finish_reason"] == "tool_calls");
    CHECK(c["message"]["tool_calls"].size() == 1);
    // It ran as the same request with parallel_tool_calls false: the same prompt (the tools text
    // asks for one call), the same answer.
    json single = body;
    single["parallel_tool_calls"] = false;
    auto one = post(s, "/v1/chat/completions", single);
    REQUIRE(one);
    REQUIRE(one->status == 200);
    const json j1 = json::parse(one->body);
    CHECK(j1["usage"]["prompt_tokens"] == j["usage"]["prompt_tokens"]);
    CHECK(j1["choices"][0]["message"]["tool_calls"][0]["function"] == c["message"]["tool_calls"][0]["function"]);
    // A single call that does not fit either is still refused, naming the memory.
    TestServer tiny(1, 1024, 0, {}, {.grammar_words = 1024});
    res = post(tiny, "/v1/chat/completions", body);
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(res->body.find("--grammar-words") != std::string::npos);
    CHECK(json::parse(res->body)["error"]["code"] == "grammar_too_large");
}

// Parameters as pydantic writes them: definitions under "$defs" referenced by "$ref", a
// self-reference ("#"), and two tools that each define "Unit" differently. Each tool's
// references resolve to its own definitions once the parameters sit inside the call schema.
TEST_CASE("server: tool parameters with $defs and $ref, two tools defining the same name, resolve per tool") {
    TestServer s(2, 1024, 0);
    const json convert_params = {
        {"title", "Convert"}, {"type", "object"},
        {"$defs", {{"Unit", {{"title", "Unit"}, {"enum", {"celsius", "fahrenheit"}}}}}},
        {"properties", {{"to", {{"$ref", "#/$defs/Unit"}}}, {"value", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
        {"required", {"to", "value"}}};
    const json order_params = {
        {"type", "object"},
        {"definitions", {{"Unit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 3}}}}},
        {"properties", {{"count", {{"$ref", "#/definitions/Unit"}}}, {"then", {{"anyOf", {{{"$ref", "#"}}, {{"type", "null"}}}}}}}},
        {"required", {"count", "then"}}};
    const json tools = {{{"type", "function"}, {"function", {{"name", "convert"}, {"parameters", convert_params}}}},
                        {{"type", "function"}, {"function", {{"name", "order"}, {"parameters", order_params}}}}};
    const json messages = {{{"role", "user"}, {"content", "Convert 5 to fahrenheit."}}};
    std::map<std::string, int> seen;
    for (int seed = 1; seed <= 6; ++seed) {
        for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "order"}}}})}) {
            CAPTURE(seed);
            CAPTURE(choice.dump());
            json body = {{"messages", messages}, {"tools", tools}, {"tool_choice", choice}, {"parallel_tool_calls", false},
                         {"max_tokens", 200}, {"temperature", 1.0}, {"seed", seed}};
            auto res = post(s, "/v1/chat/completions", body);
            REQUIRE(res);
            REQUIRE_MESSAGE(res->status == 200, res->body);
            const json c = json::parse(res->body)["choices"][0];
            REQUIRE(c["finish_reason"] == "tool_calls");
            const json call = c["message"]["tool_calls"][0]["function"];
            const std::string name = call["name"];
            const json args = json::parse(call["arguments"].get<std::string>());
            CAPTURE(args.dump());
            ++seen[name];
            CHECK(schemaViolation(name == "convert" ? convert_params : order_params, args) == "");
            if (name == "convert") CHECK((args["to"] == "celsius" || args["to"] == "fahrenheit"));
            if (name == "order") CHECK(args["count"].is_number_integer());
        }
    }
    CHECK(seen["order"] >= 6);  // the named choice, six times
}

// An MoE model served under a VRAM budget that leaves room for two of every layer's eight
// experts: the same greedy text as without a budget, and /metrics (and the C API's metrics)
// count what the GPU's routing found in the cache and copied into it.
TEST_CASE("server: an MoE model under --vram-budget pages its experts on the GPU, same text, counted in /metrics") {
    const std::string model = "/tmp/blue_test_server_moe.gguf";
    const SynthConfig c = writeSmallMoe(model);
    // Device memory without a budget, and one expert's bytes (all layers), from `bluevm generate`.
    auto stats = [&](const std::vector<std::string>& extra) {
        std::vector<std::string> args = {std::string(BLUE_BINARY_DIR) + "/host/bluevm", "generate", "--model", model,
                                         "-n", "1", "--ctx", "128", "--instances", "2", "--stats"};
        args.insert(args.end(), extra.begin(), extra.end());
        Child ch(args);
        INFO("stderr: " << ch.err_text);
        REQUIRE(ch.wait() == 0);
        return json::parse(ch.err_text.substr(ch.err_text.rfind('{')));
    };
    const uint64_t vram = stats({})["vram_bytes"];
    // Weights beyond the budget read in place: the default streams on a GPU with its own memory,
    // and the stream slots would take budget from the experts' cache.
    const json almost = stats({"--vram-budget", std::to_string(vram - 1), "--host-weights", "read"});
    const uint64_t per_slot = almost["expert_cache_bytes"].get<uint64_t>() / (c.n_expert - 1);
    const uint64_t budget = budgetForSlots(vram, per_slot, c.n_expert, 2);

    const json body = {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
    std::string plain_text;
    {
        TestServer s(2, 128, 8, {}, {.path = model});
        auto res = post(s, "/v1/completions", body);
        REQUIRE(res);
        REQUIRE(res->status == 200);
        plain_text = json::parse(res->body)["choices"][0]["text"];
        CHECK(s.metric("bluevm_expert_cache_misses_total") == 0);
    }
    TestServer s(2, 128, 8, {}, {.path = model, .vram_budget = budget, .host_weights = 1});
    for (int i = 0; i < 2; ++i) {
        auto res = post(s, "/v1/completions", body);
        REQUIRE(res);
        REQUIRE(res->status == 200);
        CHECK(json::parse(res->body)["choices"][0]["text"] == plain_text);
    }
    const double misses = s.metric("bluevm_expert_cache_misses_total");
    CHECK(misses >= 2 * c.n_layer);
    CHECK(s.metric("bluevm_expert_cache_hits_total") > 0);
    CHECK(s.metric("bluevm_expert_paged_bytes_total") == misses * double(per_slot / c.n_layer));
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
    // The C API reports the same counters (read again until a chain still finishing after the
    // answers left has reached both).
    bluevm_metrics m;
    for (int tries = 0; tries < 20; ++tries) {
        REQUIRE(bluevm_engine_metrics(s.engine, &m) == BLUEVM_OK);
        if (double(m.expert_misses) == s.metric("bluevm_expert_cache_misses_total")) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(double(m.expert_misses) == s.metric("bluevm_expert_cache_misses_total"));
    CHECK(double(m.expert_misses) >= misses);
    CHECK(m.expert_hits > 0u);
    std::remove(model.c_str());
}

}  // namespace
}  // namespace blue::test
