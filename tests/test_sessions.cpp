// Sessions: conversations whose tokens and KV rows the generation program keeps in a GLOBAL store
// between turns (BLUE_REQ_SESSION, KVCOPY). On the reference machine and the GPU, a turn that
// follows other conversations on the same instance reuses its own earlier rows from the store and
// generates exactly what a full recomputation does; over HTTP, `session_id` on any instance,
// one turn at a time (409), least-recently-used eviction counted in /metrics, and the errors.
#include <doctest/doctest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "tests/generation_runs.h"
#include "tests/server_fixture.h"
#include "tests/test_paths.h"
#include "vm/llm_request.h"

namespace blue::test {
namespace {

using json = nlohmann::json;

GenerationRequest turn(uint32_t tag, std::vector<uint32_t> prompt, uint32_t session = 0, bool fresh = false) {
    GenerationRequest r;
    r.tag = tag;
    r.prompt = std::move(prompt);
    r.max_new = 8;
    r.sampling.temperature = 0;
    r.session = session;
    r.session_new = fresh;
    return r;
}

std::vector<uint32_t> concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

}  // namespace

// One instance serves, in order: conversations A and B's first turns (new in slots 0 and 1), C
// without a session (its rows replace the instance's), then A's and B's second turns, whose
// prompts repeat their first turns and answers: each takes |prompt| + 8 rows from its slot
// (instead of 0 from the instance), and generates what the second turn alone generates. The same
// with a paged KV cache (the slot's rows copied into the pages the turn takes).
TEST_CASE("sessions: a conversation's turns reuse its KV rows from its slot on the reference machine and the GPU, same tokens") {
  for (uint32_t kv_page : {0u, 16u}) {
    CAPTURE(kv_page);
    const std::string path = sharedDir() + "/models/stories260K/stories260K.gguf";
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE(cfg.isOk());
    LowerOptions lo;
    lo.ctx = 128;
    lo.grammar_words = 0;
    lo.sessions = 2;
    lo.kv_page = kv_page;
    lo.model_path = path;
    auto m = lowerModel(g.value(), cfg.value(), lo);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    CHECK(*m->metaValue(kMetaSessions) == "2");
    const std::vector<uint32_t> pa = {1, 403, 407, 261, 378, 280, 261}, pb = {1, 20, 30, 40, 50};
    const std::vector<uint32_t> pc = {1, 9, 8, 7, 6, 5, 4, 3, 2}, more = {300, 301, 302};
    // The first turns' answers (deterministic, greedy) make the second turns' prompts.
    Generated first = runOnRef(m.value(), 1, {turn(0, pa, 1, true), turn(1, pb, 2, true)});
    REQUIRE(first.tokens[0].size() == 8);
    REQUIRE(first.tokens[1].size() == 8);
    const std::vector<uint32_t> pa2 = concat(concat(pa, first.tokens[0]), more);
    const std::vector<uint32_t> pb2 = concat(concat(pb, first.tokens[1]), more);
    const std::vector<GenerationRequest> reqs = {turn(0, pa, 1, true), turn(1, pb, 2, true), turn(2, pc),
                                                 turn(3, pa2, 1), turn(4, pb2, 2)};
    Generated alone = runOnRef(m.value(), 1, {turn(3, pa2), turn(4, pb2)});  // fresh machines' instance
    Generated ref = runOnRef(m.value(), 1, reqs);
    GpuGenerated gpu = runOnGpu(m.value(), 1, reqs);
    for (uint32_t tag = 0; tag < 5; ++tag) {
        CAPTURE(tag);
        CHECK(gpu.out.tokens[tag] == ref.tokens[tag]);
        CHECK(gpu.out.cached[tag] == ref.cached[tag]);
    }
    CHECK(ref.tokens[3] == alone.tokens[3]);
    CHECK(ref.cached[3] == pa.size() + 8);  // the first turn's prompt and all 8 answer tokens
    CHECK(ref.cached[4] == pb.size() + 8);
    CHECK(alone.cached.count(3) == 0);  // a fresh instance has nothing to reuse
    CHECK(ref.tokens[4] == alone.tokens[4]);
    // A new conversation in an occupied slot loads nothing from it (the host says so).
    Generated evicted = runOnRef(m.value(), 1, {turn(0, pa, 1, true), turn(1, pb, 2, true), turn(2, pc),
                                               turn(3, pa2, 1, true)});
    // Only BOS, shared with C's rows that the instance holds; paged, nothing (no full page).
    CHECK(evicted.cached[3] == (kv_page ? 0u : 1u));
    CHECK(evicted.tokens[3] == alone.tokens[3]);
  }
}

TEST_CASE("server: session_id keeps a conversation's KV rows between turns on any instance; one turn at a time; LRU eviction") {
  for (uint32_t kv_page : {0u, 16u}) {
    CAPTURE(kv_page);
    TestServer s(2, 512, 8, {}, {.sessions = 2, .kv_page = kv_page});
    auto complete = [&](const json& body) { return postOk(s, "/v1/completions", body); };
    const std::string p1 = "Once upon a time, there was a little girl named Lily.";
    json t1 = complete({{"prompt", p1}, {"max_tokens", 24}, {"temperature", 0}, {"session_id", "conv-a"}});
    const std::string a1 = t1["choices"][0]["text"];
    CHECK(s.metric("bluevm_sessions") == 1);
    // Other traffic on both instances replaces their own KV rows.
    for (int i = 0; i < 4; ++i) {
        complete({{"prompt", "The dog ran to the park number " + std::to_string(i)}, {"max_tokens", 12}, {"temperature", 0}});
    }
    const std::string p2 = p1 + a1 + " Then";
    json t2 = complete({{"prompt", p2}, {"max_tokens", 24}, {"temperature", 0}, {"session_id", "conv-a"}});
    json full = complete({{"prompt", p2}, {"max_tokens", 24}, {"temperature", 0}, {"cache_prompt", false}});
    CHECK(t2["choices"][0]["text"] == full["choices"][0]["text"]);
    const uint32_t p1_tokens = t1["usage"]["prompt_tokens"];
    const uint32_t cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"];
    CHECK(cached > p1_tokens);  // the answer's rows came back too
    CHECK(cached < uint32_t(t2["usage"]["prompt_tokens"]));

    // One turn at a time: a second request of a session whose turn runs gets 409. (The session is
    // busy from its submit to its end; the long turn is running once an instance is busy.)
    std::atomic<int> long_status{0};
    std::thread slow([&] {
        auto res = post(s, "/v1/completions", {{"prompt", "Lily"}, {"max_tokens", 400}, {"ignore_eos", true},
                                               {"session_id", "conv-b"}});
        long_status = res ? res->status : -1;
    });
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s.metric("bluevm_instances_busy") < 1 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto busy = post(s, "/v1/completions", {{"prompt", "Lily"}, {"max_tokens", 2}, {"session_id", "conv-b"}});
    REQUIRE(busy);
    CHECK(busy->status == 409);
    CHECK(json::parse(busy->body)["error"]["code"] == "session_busy");
    slow.join();
    CHECK(long_status == 200);

    // Two slots, a third conversation: the least recently used one (conv-a) is forgotten.
    complete({{"prompt", "A cat"}, {"max_tokens", 4}, {"session_id", "conv-c"}});
    CHECK(s.metric("bluevm_session_evictions_total") == 1);
    CHECK(s.metric("bluevm_sessions") == 2);
    json again = complete({{"prompt", p2}, {"max_tokens", 24}, {"temperature", 0}, {"session_id", "conv-a"}});
    CHECK(again["choices"][0]["text"] == full["choices"][0]["text"]);  // same text, recomputed
    CHECK(s.metric("bluevm_session_evictions_total") == 2);

    // A turn that a stop string ends for its client may still be ending on its instance (its end
    // marker comes a chain later): the next turn, sent at once, waits for that end, not a 409.
    for (int i = 0; i < 3; ++i) {
        const std::string p = "Lily saw a big bird in the tree " + std::to_string(i);
        json d1 = complete({{"prompt", p}, {"max_tokens", 200}, {"ignore_eos", true}, {"temperature", 0},
                            {"stop", {" the"}}, {"session_id", "conv-d"}});
        CHECK(d1["choices"][0]["finish_reason"] == "stop");
        json d2 = complete({{"prompt", p + d1["choices"][0]["text"].get<std::string>() + " the"}, {"max_tokens", 4},
                            {"temperature", 0}, {"session_id", "conv-d"}});
        CHECK(d2["choices"][0]["text"].is_string());
    }

    auto bad = post(s, "/v1/completions", {{"prompt", "x"}, {"session_id", 7}});
    REQUIRE(bad);
    CHECK(bad->status == 400);
    CHECK(json::parse(bad->body)["error"]["param"] == "session_id");
    auto meta = json::parse(s.client().Get("/v1/models")->body);
    CHECK(meta["data"][0]["meta"]["sessions"] == 2);
  }
}

TEST_CASE("server: without --sessions a session_id is refused with a message saying how") {
    TestServer s(1, 64, 4);
    auto res = post(s, "/v1/completions", {{"prompt", "Lily"}, {"max_tokens", 2}, {"session_id", "a"}});
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(json::parse(res->body)["error"]["message"].get<std::string>().find("--sessions N") != std::string::npos);
}

}  // namespace blue::test
