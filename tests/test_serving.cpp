// ServingEngine: continuous batching on the GPU. Requests arriving together or one by one, on
// any number of instances, give exactly the greedy text of a single-instance run; stop strings
// cut the text; cancelled requests end and free their instance; a full queue is refused.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "host/llm/serving.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

std::string storiesPath() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

struct Collector {
    std::mutex m;
    std::condition_variable cv;
    std::map<uint64_t, std::string> text;
    std::map<uint64_t, FinishReason> done;

    StreamCallback callback() {
        return [this](const StreamEvent& ev) {
            std::lock_guard<std::mutex> lock(m);
            text[ev.id] += ev.text;
            if (ev.finished) done[ev.id] = ev.reason;
            cv.notify_all();
        };
    }
    bool waitAll(size_t n) {
        std::unique_lock<std::mutex> lock(m);
        return cv.wait_for(lock, std::chrono::seconds(120), [&] { return done.size() >= n; });
    }
};

GenerationRequest greedy(const Engine& e, const std::string& prompt, uint32_t n) {
    GenerationRequest r;
    r.prompt = e.promptTokens(prompt);
    r.max_new = n;
    r.sampling.temperature = 0;
    return r;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The dog", "Lily wanted", "",
                                           "One day, a little", "Tom and his mom", "The sun", "Sue"};

TEST_CASE("serving: concurrent greedy requests equal single-instance runs, for 1, 3 and 8 instances") {
    EngineOptions eo;
    eo.ctx = 128;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(engine.isOk(), engine.message());
    Engine& e = *engine.value();
    std::vector<std::string> expected;
    for (const std::string& p : kPrompts) {
        auto r = e.run({greedy(e, p, 40)});
        REQUIRE(r.isOk());
        expected.push_back(r.value()[0].text);
    }
    for (uint32_t instances : {1u, 3u, 8u}) {
        CAPTURE(instances);
        Collector c;
        auto s = ServingEngine::create(e, ServeOptions{instances, 64, 8});
        REQUIRE_MESSAGE(s.isOk(), s.message());
        std::vector<uint64_t> ids;
        for (const std::string& p : kPrompts) {
            auto id = s.value()->submit(greedy(e, p, 40), {}, c.callback());
            REQUIRE_MESSAGE(id.isOk(), id.message());
            ids.push_back(id.value());
        }
        REQUIRE(c.waitAll(ids.size()));
        for (size_t i = 0; i < ids.size(); ++i) {
            CAPTURE(kPrompts[i]);
            CHECK(c.text[ids[i]] == expected[i]);
        }
        ServeMetrics m = s.value()->metrics();
        CHECK(m.requests_total == ids.size());
        CHECK(m.requests_finished == ids.size());
        CHECK(m.round_trips == 0);
        CHECK(m.busy_instances == 0);
    }
    CHECK(e.device().validationErrors() == 0);
}

TEST_CASE("serving: stop strings, cancellation and a full queue") {
    EngineOptions eo;
    eo.ctx = 256;
    auto engine = Engine::open(storiesPath(), eo);
    REQUIRE(engine.isOk());
    Engine& e = *engine.value();
    auto full = e.run({greedy(e, "Once upon a time", 60)});
    REQUIRE(full.isOk());
    const std::string whole = full.value()[0].text;
    size_t at = whole.find("Lily");
    REQUIRE(at != std::string::npos);

    Collector c;  // outlives the serving engine, whose shutdown may still call back
    auto s = ServingEngine::create(e, ServeOptions{2, 4, 8});
    REQUIRE(s.isOk());
    auto stopped = s.value()->submit(greedy(e, "Once upon a time", 60), {"Lily"}, c.callback());
    REQUIRE(stopped.isOk());
    REQUIRE(c.waitAll(1));
    CHECK(c.text[stopped.value()] == whole.substr(0, at));
    CHECK(c.done[stopped.value()] == FinishReason::Stop);

    // A long request cancelled soon after it starts ends as Cancelled and frees its instance.
    auto long_id = s.value()->submit(greedy(e, "The dog", 200), {}, c.callback());
    REQUIRE(long_id.isOk());
    s.value()->cancel(long_id.value());
    REQUIRE(c.waitAll(2));
    CHECK(c.done[long_id.value()] == FinishReason::Cancelled);
    // Both instances are free again: two more requests finish normally.
    auto a = s.value()->submit(greedy(e, "Sue", 10), {}, c.callback());
    auto b = s.value()->submit(greedy(e, "Tom", 10), {}, c.callback());
    REQUIRE(a.isOk());
    REQUIRE(b.isOk());
    REQUIRE(c.waitAll(4));
    CHECK(c.done[a.value()] == FinishReason::Length);

    // max_queue 4: a burst beyond the queue is refused with queue_full, nothing is lost.
    size_t accepted = 0, refused = 0;
    for (int i = 0; i < 12; ++i) {
        bool queue_full = false;
        auto id = s.value()->submit(greedy(e, "One day", 30), {}, c.callback(), &queue_full);
        if (id.isOk()) {
            ++accepted;
        } else {
            CHECK(queue_full);
            ++refused;
        }
    }
    CHECK(refused > 0);
    REQUIRE(c.waitAll(4 + accepted));
    ServeMetrics m = s.value()->metrics();
    CHECK(m.requests_rejected == refused);
    CHECK(m.requests_finished == 4 + accepted);
    CHECK(e.device().validationErrors() == 0);
}

}  // namespace
}  // namespace blue::test
