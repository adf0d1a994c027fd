// Paged KV caches in the generation program (LowerOptions::kv_page, compiler/lower_kv_pages.cpp):
// each layer's K and V rows in pools all instances share, pages taken by a request as it writes
// them (admission reserves its worst case first) and given back when it ends, all decided by the
// program on the GPU. What must hold, on stories260K: the ids are those of per-instance caches,
// greedy and seeded, on 1 and 16 instances, with the reference machine agreeing with the GPU; a
// pool far smaller than instances x ctx only makes requests wait (same ids, the peak within the
// pool), down to a pool of one context beside a request that needs all of it; no round trips;
// and the options and their refusals through bluec and bluevm.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "host/llm/engine.h"
#include "host/llm/serving.h"
#include "tests/child.h"
#include "tests/generation_runs.h"
#include "tests/gpu_fixture.h"
#include "tests/scoped_env.h"
#include "tests/server_fixture.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/kv_pages_abi.h"
#include "vm/module.h"
#include "vm/weights.h"

namespace blue::test {
namespace {

std::string storiesPath() {
    return sharedDir() + "/models/stories260K/stories260K.gguf";
}
std::string binary(const std::string& rel) {
    return std::string(BLUE_BINARY_DIR) + "/" + rel;
}

std::unique_ptr<Engine> openEngine(uint32_t instances, uint32_t ctx, uint32_t kv_page,
                                   uint32_t kv_pool = 0) {
    EngineOptions eo;
    eo.instances = instances;
    eo.ctx = ctx;
    eo.kv_page = kv_page;
    eo.kv_pool = kv_pool;
    auto e = Engine::open(storiesPath(), eo);
    REQUIRE_MESSAGE(e.isOk(), e.message());
    return std::move(e.value());
}

// `n` requests of different prompts and lengths; temperature 0 is greedy, else seeded per request.
std::vector<GenerationRequest> requests(const Engine& e, size_t n, float temperature,
                                        uint32_t max_new) {
    static const char* kOpenings[] = {
        "Once upon a time",       "The dog",     "Lily wanted to",    "Tom and his mom went",
        "One day, a little bird", "The sun was", "Sam had a big red", "Anna"};
    std::vector<GenerationRequest> out;
    for (size_t i = 0; i < n; ++i) {
        GenerationRequest r;
        r.prompt = e.promptTokens(kOpenings[i % 8]);
        for (size_t k = 0; k < i / 8; ++k) {  // later rounds: longer prompts
            std::vector<uint32_t> more =
                e.continuationTokens(std::string(" ") + kOpenings[(i + k) % 8] + ".");
            r.prompt.insert(r.prompt.end(), more.begin(), more.end());
        }
        r.max_new = max_new + uint32_t(i % 5) * 7;
        r.ignore_eog = i % 2 == 0;
        r.sampling.temperature = temperature;
        r.sampling.seed = 100 + uint32_t(i);
        r.tag = uint32_t(i);  // the machines' records by tag (Engine::run sets its own)
        out.push_back(r);
    }
    return out;
}

std::vector<std::vector<uint32_t>> ids(Engine& e, const std::vector<GenerationRequest>& reqs) {
    auto out = e.run(reqs);
    REQUIRE_MESSAGE(out.isOk(), out.message());
    std::vector<std::vector<uint32_t>> v;
    for (const Completion& c : out.value()) {
        CHECK(c.finished);
        v.push_back(c.tokens);
    }
    CHECK(e.stats().round_trips == 0);
    return v;
}

Module lowered(uint32_t ctx, uint32_t kv_page, uint32_t kv_pool) {
    auto g = ggufOpen(storiesPath());
    REQUIRE(g.isOk());
    auto cfg = modelConfigFromGguf(g.value());
    REQUIRE(cfg.isOk());
    LowerOptions lo;
    lo.ctx = ctx;
    lo.kv_page = kv_page;
    lo.kv_pool = kv_pool;
    lo.grammar_words = 0;
    lo.model_path = storiesPath();
    auto m = lowerModel(g.value(), cfg.value(), lo);
    REQUIRE_MESSAGE(m.isOk(), m.message());
    return std::move(m.value());
}

// Real text of `n` tokens (BOS first): a story opening and the model's own greedy continuation.
std::vector<uint32_t> storyTokens(Engine& e, size_t n) {
    GenerationRequest seed;
    seed.prompt = e.promptTokens("Once upon a time, there was a little girl named Lily.");
    seed.max_new = uint32_t(n);
    seed.ignore_eog = true;
    seed.sampling.temperature = 0;
    auto story = e.run({seed});
    REQUIRE_MESSAGE(story.isOk(), story.message());
    std::vector<uint32_t> out = seed.prompt;
    out.insert(out.end(), story.value()[0].tokens.begin(), story.value()[0].tokens.end());
    out.resize(n);
    return out;
}

// `reqs` with `prefix` before each prompt (a shared system prompt; the prompt's BOS dropped).
std::vector<GenerationRequest> withPrefix(std::vector<GenerationRequest> reqs,
                                          const std::vector<uint32_t>& prefix) {
    for (GenerationRequest& r : reqs) {
        std::vector<uint32_t> p = prefix;
        p.insert(p.end(), r.prompt.begin() + 1, r.prompt.end());
        r.prompt = p;
    }
    return reqs;
}

}  // namespace

TEST_CASE(
    "kv pages: paged and per-instance caches give the same ids, greedy and seeded, on 1 and 16 "
    "instances") {
    for (uint32_t instances : {1u, 16u}) {
        auto flat = openEngine(instances, 128, 0);
        for (uint32_t page :
             instances == 1 ? std::vector<uint32_t>{8, 32} : std::vector<uint32_t>{16}) {
            auto paged = openEngine(instances, 128, page);
            CHECK(paged->kvPage() == page);
            CHECK(paged->kvPages() == instances * 128 / page);  // default pool: instances x ctx
            for (float temp : {0.0f, 0.9f}) {
                CAPTURE(instances);
                CAPTURE(page);
                CAPTURE(temp);
                // 24 requests on 16 instances: later ones take pages earlier ones gave back.
                const auto reqs = requests(*flat, instances == 1 ? 4 : 24, temp, 30);
                const auto want = ids(*flat, reqs);
                CHECK(ids(*paged, reqs) == want);
                CHECK(paged->kvPagesPeak() >= 1);
                CHECK(paged->kvPagesPeak() <= paged->kvPages());
                if (instances == 16)
                    CHECK(paged->kvPagesPeak() > 128 / page);  // more than one instance's
            }
        }
    }
}

TEST_CASE(
    "kv pages: the reference machine and the GPU agree on a paged program, and with per-instance "
    "caches") {
    const Module paged = lowered(96, 8, 0);
    const Module flat = lowered(96, 0, 0);
    CHECK(*paged.metaValue(kMetaKvPage) == "8");
    CHECK(*paged.metaValue(kMetaKvPages) ==
          std::to_string(8 * 96 / 8));  // bluec's default: 8 x ctx
    auto e = openEngine(1, 96, 0);
    for (float temp : {0.0f, 0.9f}) {
        CAPTURE(temp);
        const auto reqs = requests(*e, 3, temp, 25);
        Generated ref = runOnRef(paged, 1, reqs);
        GpuGenerated gpu = runOnGpu(paged, 1, reqs);
        GpuGenerated gpu_flat = runOnGpu(flat, 1, reqs);
        REQUIRE(ref.tokens.size() == 3);
        CHECK(ref.tokens == gpu.out.tokens);
        CHECK(gpu.out.tokens == gpu_flat.out.tokens);
        CHECK(gpu.out.cached.empty());  // prompts shorter than a page: nothing to share
    }
}

// The prefix index on one instance, where which request computes what is fixed: each machine gives
// its unpaged ids, and both reuse the same positions. A prompt shares the pages
// its key chain matches, full pages before its last token: the same story after the same 200
// tokens reuses 192 (12 pages), the repeat of a prompt all of its full pages but the one with its
// last token, a different first token nothing.
TEST_CASE("kv pages: the prefix index shares full pages by key, the same on the reference machine and the GPU") {
    const Module paged = lowered(320, 16, 0);
    auto e = openEngine(1, 320, 0);
    const auto prefix = storyTokens(*e, 200);
    std::vector<GenerationRequest> reqs = withPrefix(requests(*e, 3, 0.0f, 12), prefix);
    reqs.push_back(reqs[0]);  // the first again: its own pages
    reqs[3].tag = 3;
    GenerationRequest other = reqs[1];
    other.prompt[1] = other.prompt[1] == 100 ? 101 : 100;  // the second token differs: page 0 does
    other.tag = 4;
    reqs.push_back(other);
    GenerationRequest opted = reqs[0];  // opted out of prefix reuse: computes all
    opted.prefix_reuse = false;
    opted.tag = 5;
    reqs.push_back(opted);
    Generated ref = runOnRef(paged, 1, reqs);
    GpuGenerated gpu = runOnGpu(paged, 1, reqs);
    const Module flat = lowered(320, 0, 0);
    GpuGenerated gpu_flat = runOnGpu(flat, 1, reqs);
    // The reference machine computes in double: over 200-token prompts its greedy ids can part
    // from a GPU's float ones (request 2 here, paged or not), so each machine is compared with
    // itself unpaged, and the two on what they reused.
    Generated ref_flat = runOnRef(flat, 1, reqs);
    REQUIRE(ref.tokens.size() == reqs.size());
    CHECK(ref.tokens == ref_flat.tokens);
    CHECK(gpu.out.tokens == gpu_flat.out.tokens);
    CHECK(ref.cached == gpu.out.cached);
    auto cached = [&](uint32_t tag) { return gpu.out.cached.count(tag) ? gpu.out.cached.at(tag) : 0u; };
    CHECK(cached(0) == 0);
    CHECK(cached(1) == 192);
    CHECK(cached(2) == 192);
    CHECK(cached(3) == (reqs[0].prompt.size() - 1) / 16 * 16);
    CHECK(cached(4) == 0);
    CHECK(cached(5) == 0);
}

// A request's answer goes into the index at its end, after its prompt's pages: the next turn of
// the conversation (the prompt, the answer, a new sentence) reuses every full page of both, as
// per-instance caches reuse the rows of the instance's last request, with the same ids.
TEST_CASE("kv pages: a conversation's next turn reuses the pages of the earlier answer too") {
    auto flat = openEngine(1, 256, 0);
    auto paged = openEngine(1, 256, 16);
    GenerationRequest first = requests(*flat, 1, 0.0f, 0)[0];
    first.prompt = storyTokens(*flat, 37);
    first.max_new = 45;
    first.ignore_eog = true;
    const auto answer = ids(*flat, {first})[0];
    REQUIRE(answer.size() == 45);
    GenerationRequest next = first;
    next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
    const auto more = flat->continuationTokens(" Then they went home.");
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    next.max_new = 20;
    const std::vector<GenerationRequest> turns = {first, next};
    auto want = flat->run(turns);
    REQUIRE(want.isOk());
    auto got = paged->run(turns);
    REQUIRE_MESSAGE(got.isOk(), got.message());
    for (size_t i = 0; i < turns.size(); ++i) CHECK(got.value()[i].tokens == want.value()[i].tokens);
    // The first turn's rows: 37 prompt positions and the 45 of its answer (each emitted token is
    // run before the length check), 82, whose 5 full pages the next turn maps.
    CHECK(want.value()[1].cached_tokens == 82);
    CHECK(got.value()[1].cached_tokens == 80);
}

// The headline case: 16 agents with one 200-token system prompt, all at once on 16 instances. One
// computes the prompt's pages; the others find them pending in the index, wait for them and map
// them, so the prefix is computed once and held once. Ids are those of per-instance caches
// (rows kernels and no tiles: sharing changes how many rows a chunk has, README "Batch
// invariance").
TEST_CASE("kv pages: 16 requests sharing a 200-token prefix give the unpaged ids, the prefix computed and held once") {
    ScopedEnv rows("BLUE_DECODE_KERNEL", "rows");
    ScopedEnv no_tiles("BLUE_GEMM_MIN_ITEMS", "65535");
    const uint32_t ctx = 320;
    auto flat = openEngine(16, ctx, 0);
    auto paged = openEngine(16, ctx, 16);
    const auto prefix = storyTokens(*flat, 200);
    for (float temp : {0.0f, 0.9f}) {
        CAPTURE(temp);
        const auto reqs = withPrefix(requests(*flat, 16, temp, 20), prefix);
        const auto want = ids(*flat, reqs);
        auto out = paged->run(reqs);
        REQUIRE_MESSAGE(out.isOk(), out.message());
        size_t saved = 0, computed = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            CHECK(out.value()[i].tokens == want[i]);
            const size_t c = out.value()[i].cached_tokens;
            // None, or the 12 pages before the prompts differ (13 for the later rounds' prompts
            // that begin like an earlier one's).
            CHECK((c == 0 || (c >= 192 && c % 16 == 0)));
            saved += c;
            computed += c == 0;
        }
        MESSAGE("prefix positions reused: " << saved << ", requests that computed it: " << computed
                                            << ", peak pages " << paged->kvPagesPeak());
        CHECK(computed >= 1);
        CHECK(saved >= 14 * 192);  // one computes it; (on lavapipe) every other waits for it
        // Each request holds at most ceil((205 + 48) / 16) = 16 pages; shared, the prefix's 12
        // are held once: 12 + 16 x 4 at most (when all 15 waited), against 16 x 16 unshared.
        CHECK(paged->kvPagesPeak() <= 12 * (computed) + 16 * 5);
        CHECK(paged->stats().round_trips == 0);
    }
}

// A small pool on one instance: published pages stay cached after their request and the sweep
// takes them for other rows when the pool runs short (evictions), with the same ids; the prompt
// just run is still cached and reused.
TEST_CASE("kv pages: cached pages are evicted when the pool runs short, with the same ids") {
    auto flat = openEngine(1, 128, 0);
    auto paged = openEngine(1, 128, 16, 128);  // 8 pages; each request reserves 3
    const auto story = storyTokens(*flat, 120);
    std::vector<GenerationRequest> reqs;
    for (size_t k = 0; k < 6; ++k) {  // six different 40-token prompts: 2 pages published each
        GenerationRequest r;
        r.prompt.assign(story.begin() + long(k * 9), story.begin() + long(k * 9 + 40));
        r.prompt[0] = story[0];
        r.prompt[1] = uint32_t(50 + k);
        r.max_new = 8;
        r.ignore_eog = true;
        r.sampling.temperature = 0;
        reqs.push_back(r);
    }
    reqs.push_back(reqs[5]);  // the last again, at once: its pages are still cached
    reqs.push_back(reqs[0]);  // the first again: evicted by now, computed again
    const auto want = ids(*flat, reqs);
    auto out = paged->run(reqs);
    REQUIRE_MESSAGE(out.isOk(), out.message());
    for (size_t i = 0; i < reqs.size(); ++i) {
        CAPTURE(i);
        CHECK(out.value()[i].tokens == want[i]);
        CHECK(out.value()[i].cached_tokens == (i == 6 ? 32u : 0u));
    }
    CHECK(paged->kvEvictions() >= 4);
    CHECK(paged->kvPagesPeak() <= 8);
}

TEST_CASE(
    "kv pages: a pool of 2 x ctx on 16 instances makes requests wait, with the same ids, the peak "
    "within it") {
    // Waiting changes which requests share a cycle. Ids equal across batch compositions need
    // matmuls that sum a row in one order whatever the batch: the rows kernels (lavapipe's); the
    // GPU shapes pick a kernel per item count, and on an NVIDIA H200 the sampled ids differed
    // (README, Batch invariance).
    ScopedEnv rows("BLUE_DECODE_KERNEL", "rows");
    auto flat = openEngine(16, 128, 0);
    auto paged = openEngine(16, 128, 16, 256);  // 16 pages; each request reserves 3 to 7
    REQUIRE(paged->kvPages() == 16);
    for (float temp : {0.0f, 0.9f}) {
        CAPTURE(temp);
        const auto reqs = requests(*flat, 16, temp, 50);
        CHECK(ids(*paged, reqs) == ids(*flat, reqs));
        CHECK(paged->kvPagesPeak() <= 16);
        CHECK(paged->kvPagesPeak() >= 7);
    }
}

TEST_CASE(
    "kv pages: with a pool of one context on 4 instances, a long request beside short ones gets "
    "its ids") {
    const uint32_t ctx = 256;
    auto flat = openEngine(4, ctx, 0);
    auto paged = openEngine(4, ctx, 16, ctx);  // 16 pages: the long request needs 15 of them
    // The long prompt: a story opening and the model's own greedy continuation (real text).
    GenerationRequest seed;
    seed.prompt = flat->promptTokens("Once upon a time, there was a little girl named Lily.");
    seed.max_new = 170;
    seed.ignore_eog = true;
    seed.sampling.temperature = 0;
    auto story = flat->run({seed});
    REQUIRE(story.isOk());
    GenerationRequest long_req = seed;
    long_req.prompt.insert(long_req.prompt.end(), story.value()[0].tokens.begin(),
                           story.value()[0].tokens.end());
    long_req.prompt.resize(160);
    long_req.max_new = 80;  // 240 positions: 15 pages
    std::vector<GenerationRequest> reqs = requests(*flat, 3, 0.0f, 12);
    reqs.insert(reqs.begin() + 1, long_req);
    for (const GenerationRequest& r : requests(*flat, 4, 0.9f, 12)) reqs.push_back(r);
    const auto want = ids(*flat, reqs);
    REQUIRE(want[1].size() == 80);
    CHECK(ids(*paged, reqs) == want);
    CHECK(paged->kvPagesPeak() <= 16);
    CHECK(paged->kvPagesPeak() >= 15);
}

TEST_CASE(
    "kv pages: embedding requests of a paged program pool the same vectors, beside generation") {
    for (Pooling pooling : {Pooling::Mean, Pooling::Last}) {
        CAPTURE(std::string(poolingName(pooling)));
        std::unique_ptr<Engine> engines[2];
        for (uint32_t page : {0u, 16u}) {
            EngineOptions eo;
            eo.instances = 4;
            eo.ctx = 128;
            eo.kv_page = page;
            eo.kv_pool = page ? 128 : 0;  // one context: embeddings and generations wait for pages
            eo.pooling = pooling;
            auto e = Engine::open(storiesPath(), eo);
            REQUIRE_MESSAGE(e.isOk(), e.message());
            engines[page ? 1 : 0] = std::move(e.value());
        }
        std::vector<GenerationRequest> reqs = requests(*engines[0], 6, 0.0f, 20);
        for (size_t i = 0; i < reqs.size(); i += 2) reqs[i].embed = true;
        std::vector<Completion> out[2];
        for (int k = 0; k < 2; ++k) {
            auto r = engines[k]->run(reqs);
            REQUIRE_MESSAGE(r.isOk(), r.message());
            out[k] = r.value();
        }
        for (size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            CHECK(out[1][i].tokens == out[0][i].tokens);
            REQUIRE(out[1][i].embedding.size() == out[0][i].embedding.size());
            CHECK(out[1][i].embedding.size() == (reqs[i].embed ? 64u : 0u));
            for (size_t d = 0; d < out[0][i].embedding.size(); ++d) {
                CHECK(out[1][i].embedding[d] == out[0][i].embedding[d]);  // the same kernels' bits
            }
        }
        CHECK(engines[1]->kvPagesPeak() <= 8);
    }
}

// A request that holds the whole pool is cancelled while others wait for pages: the cancel gives
// its pages back (the program's release at `finish`), so the waiters are admitted and finish
// with their unpaged ids. A waiter cancelled meanwhile ends for its client at once (the GPU side
// of that is the next test).
TEST_CASE(
    "kv pages: serving, a cancelled request gives its pages back to requests waiting for them") {
    auto flat = openEngine(1, 512, 0);
    auto paged = openEngine(1, 512, 16, 512);  // 32 pages: the long request reserves all of them
    std::vector<GenerationRequest> shorts = requests(*flat, 4, 0.0f, 15);
    const auto want = ids(*flat, shorts);
    struct Collector {
        std::mutex m;
        std::condition_variable cv;
        std::map<uint64_t, std::vector<uint32_t>> tokens;
        std::map<uint64_t, FinishReason> done;
    } c;
    auto callback = [&c](const StreamEvent& ev) {
        std::lock_guard<std::mutex> lock(c.m);
        auto& t = c.tokens[ev.id];
        t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) c.done[ev.id] = ev.reason;
        c.cv.notify_all();
    };
    auto wait = [&c](auto pred) {
        std::unique_lock<std::mutex> lock(c.m);
        return c.cv.wait_for(lock, std::chrono::seconds(120), pred);
    };
    auto s = ServingEngine::create(*paged, ServeOptions{2, 16, 8});
    REQUIRE_MESSAGE(s.isOk(), s.message());
    GenerationRequest long_req = requests(*flat, 1, 0.0f, 0)[0];
    long_req.max_new = 2000;
    long_req.ignore_eog = true;
    auto long_id = s.value()->submit(long_req, {}, callback);
    REQUIRE(long_id.isOk());
    REQUIRE(wait([&] { return c.tokens[long_id.value()].size() >= 4; }));  // it holds pages now
    std::vector<uint64_t> short_ids;
    for (const GenerationRequest& r : shorts)
        short_ids.push_back(s.value()->submit(r, {}, callback).value());
    // The first short request waits to be admitted (the long one decodes about 500 tokens more,
    // a second or so on lavapipe): cancelled, it ends with no token.
    s.value()->cancel(short_ids[0]);
    REQUIRE(wait([&] { return c.done.count(short_ids[0]) == 1; }));
    CHECK(c.done[short_ids[0]] == FinishReason::Cancelled);
    CHECK(c.tokens[short_ids[0]].empty());
    CHECK(c.done.count(long_id.value()) == 0);
    s.value()->cancel(long_id.value());
    REQUIRE(wait([&] { return c.done.size() == 1 + shorts.size(); }));
    CHECK(c.done[long_id.value()] == FinishReason::Cancelled);
    CHECK(c.tokens[long_id.value()].size() < 500);  // ended early, not by the context's end
    for (size_t i = 1; i < shorts.size(); ++i) {
        CAPTURE(i);
        CHECK(c.tokens[short_ids[i]] == want[i]);
    }
    CHECK(s.value()->metrics().round_trips == 0);
}

// A request waiting to be admitted (the pool held by another) sees its cancel there and ends
// with no token, holding nothing; the other is unaffected. The host's flag word is set before the
// run on every instance to tag 1 + 1, the cancel mark of the waiting request wherever it runs.
TEST_CASE(
    "kv pages: a request cancelled while it waits for admission ends there, on both machines") {
    const Module paged = lowered(64, 16, 64);  // 4 pages: the long request reserves all of them
    auto e = openEngine(1, 64, 0);
    std::vector<GenerationRequest> reqs = requests(*e, 2, 0.0f, 40);
    reqs[0].max_new = 60;
    reqs[0].ignore_eog = true;
    const auto want = ids(*e, {reqs[0]})[0];
    auto w = WeightSource::open(paged, "");
    REQUIRE(w.isOk());
    RefMachine ref(paged, w.value(), MachineOptions{2, 100000});
    GpuOptions opt;
    opt.instances = 2;
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, paged, w.value(), opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    for (uint32_t i = 0; i < 2; ++i) {
        ref.setFlag(i, 2);
        machine.value()->setFlag(i, 2);
    }
    for (const GenerationRequest& r : reqs) {
        ref.pushInput(encodeRequest(r));
        REQUIRE(machine.value()->pushInput(encodeRequest(r)).isOk());
    }
    ref.closeInput();
    machine.value()->closeInput();
    RunReport rr = ref.run();
    REQUIRE_MESSAGE(rr.status.isOk(), rr.status.message());
    auto gr = machine.value()->run();
    REQUIRE_MESSAGE(gr.isOk(), gr.message());
    for (const Generated& g :
         std::vector<Generated>{generatedByTag(rr), generatedByTag(gr.value())}) {
        REQUIRE(g.tokens.count(1) == 1);
        CHECK(g.tokens.at(1).empty());  // admitted, it would have sampled a token first
        CHECK(g.tokens.at(0) == want);
    }
    CHECK(ref.heap()[BLUE_KVP_BASE(paged.layout.in_slots) + BLUE_KVP_COMMITTED] ==
          0);  // all given back
    CHECK(ref.heap()[BLUE_KVP_BASE(paged.layout.in_slots) + BLUE_KVP_IN_USE] == 0);
    CHECK(ref.heap()[BLUE_KVP_BASE(paged.layout.in_slots) + BLUE_KVP_PEAK] == 4);
    CHECK(machine.value()->stats().round_trips == 0);
}

TEST_CASE(
    "kv pages: bluec lower --kv-page/--kv-pool write the pools and metadata; bad values are "
    "refused with numbers") {
    TempDir dir("blue_kv_pages");
    const std::string out = dir.path + "/paged.bir";
    Child ok({binary("compiler/bluec"), "lower", "--model", storiesPath(), "-o", out, "--ctx",
              "128", "--kv-page", "16", "--kv-pool", "1000"});
    REQUIRE(ok.wait() == 0);
    CHECK(ok.out_text == "bluec: paged KV: 63 pages of 16 positions in each layer's pool\n");
    auto m = readModuleFile(out);
    REQUIRE(m.isOk());
    CHECK(*m.value().metaValue(kMetaKvPage) == "16");
    CHECK(*m.value().metaValue(kMetaKvPages) == "63");
    bool pool = false, cache = false;
    for (const TensorDecl& t : m.value().tensors) {
        if (t.name == "kpool.0")
            pool = t.ndim == 3 && t.ne[0] == 32 && t.ne[1] == 16 && t.ne[2] == 63 &&
                   t.cls == BLUE_TC_GLOBAL;
        cache = cache || t.name == "kcache.0";
    }
    CHECK(pool);
    CHECK(!cache);

    struct Bad {
        std::vector<std::string> args;
        std::string message;
    };
    for (const Bad& b : std::vector<Bad>{{{"--kv-page", "12"},
                                          "bluec: kv page 12: positions per page must be a power "
                                          "of two from 8 to 32 (8, 16 or 32)\n"},
                                         {{"--kv-page", "64"},
                                          "bluec: kv page 64: positions per page must be a power "
                                          "of two from 8 to 32 (8, 16 or 32)\n"},
                                         {{"--kv-page", "16", "--kv-pool", "100"},
                                          "bluec: kv pool of 100 positions (7 pages of 16) is "
                                          "smaller than one request of the full context: 128 "
                                          "positions need 8 pages (128 positions)\n"},
                                         {{"--kv-page", "16", "--kv-pool", "134217728"},
                                          "bluec: kv pool of 134217728 positions needs 8.0 GiB per "
                                          "layer for K and as much for V; a tensor holds at "
                                          "most 4 GiB (67108864 positions)\n"}}) {
        std::vector<std::string> argv = {
            binary("compiler/bluec"), "lower", "--model", storiesPath(), "-o", out, "--ctx", "128"};
        argv.insert(argv.end(), b.args.begin(), b.args.end());
        Child c(argv);
        CHECK(c.wait() == 1);
        CHECK(c.err_text == b.message);
    }
}

TEST_CASE(
    "kv pages: bluevm generate --kv-page gives the unpaged text, reports the peak; refusals are "
    "one line") {
    auto gen = [](std::vector<std::string> extra) {
        std::vector<std::string> argv = {binary("host/bluevm"),
                                         "generate",
                                         "--model",
                                         storiesPath(),
                                         "--prompt",
                                         "Once upon a time",
                                         "-n",
                                         "40",
                                         "--temp",
                                         "0",
                                         "--ctx",
                                         "128",
                                         "--no-echo"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        return argv;
    };
    Child flat(gen({}));
    REQUIRE(flat.wait() == 0);
    Child paged(gen({"--kv-page", "16", "--stats"}));
    REQUIRE(paged.wait() == 0);
    CHECK(paged.out_text == flat.out_text);
    auto line = paged.err_text.substr(paged.err_text.rfind('{'));
    auto j = nlohmann::json::parse(line);
    CHECK(j["kv_page"] == 16);
    CHECK(j["kv_pages"] == 8);       // one instance: a pool of ctx
    CHECK(j["kv_pages_peak"] == 3);  // 4 + 40 positions
    CHECK(j["kv_evictions"] == 0);
    CHECK(j["round_trips"] == 0);

    Child page12(gen({"--kv-page", "12"}));
    CHECK(page12.wait() == 1);
    CHECK(page12.err_text ==
          "bluevm: kv page 12: positions per page must be a power of two from 8 to 32 (8, 16 or "
          "32)\n");
    Child small(gen({"--kv-page", "16", "--kv-pool", "64"}));
    CHECK(small.wait() == 1);
    CHECK(small.err_text.find("kv pool of 64 positions (4 pages of 16) is smaller than one request "
                              "of the full context: "
                              "128 positions need 8 pages") != std::string::npos);
    // 2^22 positions of 64 bytes (kv_dim 32, F16): 256 MiB a pool, past a 128 MiB binding (the
    // Vulkan minimum: lavapipe's, and the Adreno profile's on any device).
    Child big(gen({"--kv-page", "32", "--kv-pool", "4194304", "--device-limits", "adreno-740-turnip"}));
    CHECK(big.wait() == 1);
    CHECK(std::count(big.err_text.begin(), big.err_text.end(), '\n') == 1);
    CHECK(big.err_text.find("a KV pool of 4194304 positions (131072 pages of 32) needs 256.0 MiB "
                            "per layer for K and "
                            "as much for V") != std::string::npos);
    CHECK(big.err_text.find("more than the device's largest storage binding") != std::string::npos);
}

// /metrics reads the pool's counters from every chain's snapshot (GpuOptions::heap_watch): the
// pages a streaming request holds and reserves while it runs, none after, and the peak.
TEST_CASE("kv pages: /metrics shows the pool, the pages a streaming request holds, none after it") {
    TestModel tm;
    tm.kv_page = 16;
    tm.kv_pool = 512;  // 32 pages
    TestServer s(2, 128, 0, {}, tm);
    CHECK(s.metric("bluevm_kv_pages") == 32);
    CHECK(s.metric("bluevm_kv_page_positions") == 16);
    CHECK(s.metric("bluevm_kv_pages_in_use") == 0);
    CHECK(s.metric("bluevm_kv_pages_committed") == 0);
    // 5 prompt tokens + 100 to generate: a reservation of ceil(105 / 16) = 7 pages.
    const nlohmann::json body = {{"prompt", "Once upon a time"}, {"max_tokens", 100},
                                 {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
    httplib::Client c = s.client();
    httplib::Request req = jsonPost("/v1/completions", body);
    // Read while it streams (every chunk: a client can be slow to see the first one, under load
    // even until the request has ended): the most seen.
    double in_use = 0, committed = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
        in_use = std::max(in_use, s.metric("bluevm_kv_pages_in_use"));
        committed = std::max(committed, s.metric("bluevm_kv_pages_committed"));
        return true;
    };
    httplib::Response res;
    httplib::Error err;
    REQUIRE(c.send(req, res, err));
    CHECK(res.status == 200);
    CAPTURE(in_use);
    CAPTURE(committed);
    CHECK(in_use >= 1);
    CHECK(in_use <= 7);
    CHECK(committed == 7);
    // After it the pages are back; the peak is what it held at its end, the whole reservation
    // (105 positions take 7 pages).
    for (int i = 0; i < 200 && s.metric("bluevm_kv_pages_in_use") != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(s.metric("bluevm_kv_pages_in_use") == 0);
    CHECK(s.metric("bluevm_kv_pages_committed") == 0);
    CHECK(s.metric("bluevm_kv_pages_peak") == 7);
}

}  // namespace blue::test

namespace blue::test {

// Over HTTP, as agents use it: one long system prompt, then eight requests at once on four
// instances, each after that system prompt with its own question. Each maps the system prompt's
// pages from the index (usage.prompt_tokens_details.cached_tokens), whichever instance computed
// them; the same prompt again reuses all its full pages but the last token's; cache_prompt: false
// computes all; a conversation's next turn maps its earlier answer's pages too; no page is held
// after, and none was evicted (the pool is 8 contexts).
TEST_CASE("kv pages: over HTTP, requests after one system prompt share its pages across instances") {
    TestModel tm;
    tm.kv_page = 16;
    TestServer s(4, 512, 16, {}, tm);
    std::string system;  // about 240 tokens
    for (int i = 0; i < 20; ++i) system += "Lily and Tom went to the park. ";
    auto complete = [&](const std::string& prompt, bool cache, nlohmann::json* out, int max_tokens = 8) {
        nlohmann::json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"cache_prompt", cache}};
        auto r = post(s, "/v1/completions", body);
        REQUIRE(r);
        REQUIRE(r->status == 200);
        *out = nlohmann::json::parse(r->body);
    };
    auto cached = [](const nlohmann::json& j) { return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<uint32_t>(); };
    nlohmann::json first;
    complete(system + "The dog", true, &first);
    const uint32_t prompt_tokens = first["usage"]["prompt_tokens"].get<uint32_t>();
    CHECK(prompt_tokens > 200);
    CHECK(cached(first) == 0);
    const std::vector<std::string> questions = {"Then the cat", "A bird sang", "Sue ran home", "The sun was hot",
                                                "Ben had a car", "Mom baked a cake", "It was late", "They saw a frog"};
    std::vector<nlohmann::json> answers(questions.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < questions.size(); ++i) {
        clients.emplace_back([&, i] { complete(system + questions[i], true, &answers[i]); });
    }
    for (std::thread& t : clients) t.join();
    uint32_t saved = 0;
    for (size_t i = 0; i < questions.size(); ++i) {
        CAPTURE(i);
        const uint32_t c = cached(answers[i]);
        CHECK(c >= 224);  // the system prompt's full pages (it ends within its 15th or 16th)
        CHECK(c % 16 == 0);
        saved += c;
        nlohmann::json alone;  // the same answer as computed without sharing
        complete(system + questions[i], false, &alone);
        CHECK(cached(alone) == 0);
        CHECK(alone["choices"][0]["text"] == answers[i]["choices"][0]["text"]);
    }
    nlohmann::json again;
    complete(system + "The dog", true, &again);
    CHECK(cached(again) == (prompt_tokens - 1) / 16 * 16);
    CHECK(again["choices"][0]["text"] == first["choices"][0]["text"]);
    // A conversation: its next turn (the prompt, the answer, a new sentence) maps the pages of
    // the earlier answer too, whichever instance took either turn.
    nlohmann::json turn1, turn2;
    complete(system + "Ben had a car", true, &turn1, 40);
    const uint32_t turn1_prompt = turn1["usage"]["prompt_tokens"].get<uint32_t>();
    complete(system + "Ben had a car" + turn1["choices"][0]["text"].get<std::string>() + " Then they went home.",
             true, &turn2);
    CAPTURE(turn1_prompt);
    CHECK(cached(turn2) >= (turn1_prompt / 16 + 1) * 16);
    for (int i = 0; i < 200 && s.metric("bluevm_kv_pages_in_use") != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(s.metric("bluevm_kv_pages_in_use") == 0);
    CHECK(s.metric("bluevm_kv_pages_committed") == 0);
    CHECK(s.metric("bluevm_kv_evictions_total") == 0);
    CHECK(s.metric("bluevm_prefix_hits_total") == 11);
    CHECK(s.metric("bluevm_prefix_tokens_total") == double(saved + cached(again) + cached(turn1) + cached(turn2)));
    CHECK(s.metric("bluevm_host_round_trips_total") == 0);
}

}  // namespace blue::test
