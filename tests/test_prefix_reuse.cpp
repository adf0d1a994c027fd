// Prefix reuse: an instance keeps the KV rows of the positions its last request processed, and
// the generation program starts a request whose prompt begins with the same tokens after them
// (INCMP against the instance's history, on the GPU; vm/llm_abi.h). What must hold: the ids are
// those of a full recomputation, greedy and seeded, on 1 and 16 instances; the program reports
// exactly how many prompt tokens it did not recompute; a request can opt out.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "host/llm/engine.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

std::string storiesPath() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

// A 200-token "system prompt": BOS and the model's own greedy continuation of a story opening
// (real text, so the positions carry real attention patterns).
std::vector<uint32_t> systemPrompt(Engine& e) {
    GenerationRequest r;
    r.prompt = e.promptTokens("Once upon a time, there was a little girl named Lily.");
    r.max_new = 240;
    r.ignore_eog = true;
    r.sampling.temperature = 0;
    auto out = e.run({r});
    REQUIRE(out.isOk());
    std::vector<uint32_t> p = r.prompt;
    p.insert(p.end(), out.value()[0].tokens.begin(), out.value()[0].tokens.end());
    REQUIRE(p.size() >= 200);
    p.resize(200);
    return p;
}

GenerationRequest ask(const Engine& e, const std::vector<uint32_t>& system, const std::string& q,
                      float temperature, uint32_t seed, uint32_t n = 12) {
    GenerationRequest r;
    r.prompt = system;
    std::vector<uint32_t> t = e.continuationTokens(q);
    r.prompt.insert(r.prompt.end(), t.begin(), t.end());
    r.max_new = n;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return r;
}

// What the instance holds after `c` ran `r`: the prompt and every generated token but the last
// (the program feeds a token back before sampling the next; the last one, or the stop token
// that ended the request, is never fed).
std::vector<uint32_t> processed(const GenerationRequest& r, const Completion& c, bool ended_by_stop) {
    std::vector<uint32_t> h = r.prompt;
    h.insert(h.end(), c.tokens.begin(), c.tokens.end());
    if (!ended_by_stop && !c.tokens.empty()) h.pop_back();
    return h;
}

size_t sharedPrefix(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

}  // namespace

TEST_CASE("prefix reuse: a request sharing a prefix with the instance's last one starts after it, same ids") {
    EngineOptions eo;
    eo.ctx = 320;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(engine.isOk(), engine.message());
    Engine& e = *engine.value();
    const std::vector<uint32_t> system = systemPrompt(e);

    for (float temp : {0.0f, 0.8f}) {
        CAPTURE(temp);
        GenerationRequest a = ask(e, system, " The dog ran to the park.", temp, 3);
        GenerationRequest b = ask(e, system, " Then the cat said hello.", temp, 9);
        a.ignore_eog = true;  // a ends by length: its last token is not fed back
        // Alone on a fresh machine: nothing to reuse.
        auto alone = e.run({b});
        REQUIRE(alone.isOk());
        CHECK(alone.value()[0].cached_tokens == 0);
        // After a on the same instance: b starts after the tokens it shares with a's history.
        auto both = e.run({a, b});
        REQUIRE(both.isOk());
        const Completion& ca = both.value()[0];
        const Completion& cb = both.value()[1];
        CHECK(ca.cached_tokens == 0);
        const size_t shared = sharedPrefix(processed(a, ca, false), b.prompt);
        CHECK(shared >= 200);
        CHECK(cb.cached_tokens == std::min(shared, b.prompt.size() - 1));
        CHECK(cb.tokens == alone.value()[0].tokens);
        CHECK(cb.text == alone.value()[0].text);
        // Opting out recomputes everything, same ids.
        b.prefix_reuse = false;
        auto off = e.run({a, b});
        REQUIRE(off.isOk());
        CHECK(off.value()[1].cached_tokens == 0);
        CHECK(off.value()[1].tokens == alone.value()[0].tokens);
    }

    // The same prompt again: everything but its last token (whose logits give the first sample).
    GenerationRequest r = ask(e, system, " The end.", 0.0f, 0, 8);
    auto twice = e.run({r, r});
    REQUIRE(twice.isOk());
    CHECK(twice.value()[1].cached_tokens == r.prompt.size() - 1);
    CHECK(twice.value()[1].tokens == twice.value()[0].tokens);
    // A prompt that differs from the first token on (no BOS) reuses nothing.
    GenerationRequest other = r;
    other.prompt = e.continuationTokens("Lily and Tom played all day in the sun.");
    REQUIRE(other.prompt[0] != r.prompt[0]);
    auto differ = e.run({r, other});
    REQUIRE(differ.isOk());
    CHECK(differ.value()[1].cached_tokens == 0);
    // A shorter prompt inside the last history: all but its last token.
    GenerationRequest part = r;
    part.prompt.resize(120);
    auto inside = e.run({r, part});
    REQUIRE(inside.isOk());
    CHECK(inside.value()[1].cached_tokens == 119);
    auto part_alone = e.run({part});
    REQUIRE(part_alone.isOk());
    CHECK(inside.value()[1].tokens == part_alone.value()[0].tokens);
    CHECK(e.stats().round_trips == 0);
}

TEST_CASE("prefix reuse: 48 requests sharing a 200-token prompt on 16 instances: same ids, 200 tokens saved per reuse") {
    EngineOptions eo;
    eo.ctx = 320;
    eo.instances = 16;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(engine.isOk(), engine.message());
    Engine& e = *engine.value();
    e.setInstances(1);
    const std::vector<uint32_t> system = systemPrompt(e);
    e.setInstances(16);
    const char* questions[] = {" The dog", " Then the cat", " Lily smiled", " Tom", " The sun was hot",
                               " A bird sang", " Mom said", " They ran"};
    std::vector<GenerationRequest> reqs;
    for (uint32_t i = 0; i < 48; ++i) {
        reqs.push_back(ask(e, system, questions[i % 8], i % 2 ? 0.8f : 0.0f, i, 6 + i % 5));
    }
    auto reused = e.run(reqs);
    REQUIRE(reused.isOk());
    const GpuStats with = e.stats();
    for (GenerationRequest& r : reqs) r.prefix_reuse = false;
    auto full = e.run(reqs);
    REQUIRE(full.isOk());
    const GpuStats without = e.stats();
    uint64_t saved = 0, hits = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        CAPTURE(i);
        CHECK(reused.value()[i].tokens == full.value()[i].tokens);
        CHECK(full.value()[i].cached_tokens == 0);
        saved += reused.value()[i].cached_tokens;
        hits += reused.value()[i].cached_tokens > 0;
    }
    // Every request after an instance's first shares at least the 200 tokens with its last one.
    MESSAGE("prefix reuse: " << hits << " of 48 requests reused " << saved << " prompt tokens; VM cycles "
                             << with.cycles << " with, " << without.cycles << " without");
    CHECK(hits >= 48 - 16);
    CHECK(saved >= (48 - 16) * 200);
    CHECK(with.round_trips == 0);
}

}  // namespace blue::test
