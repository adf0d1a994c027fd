// The cascade program's side records (vm/cascade_abi.h): streamed answer text and stage times.
// The decoder reads stream and stage-time records between the others and refuses malformed ones;
// the compiler streams exactly the final writes of the stream slot (a write in a loop, or one a
// later `write` replaces, streams nothing), the streamed tokens are a prefix of the slot's final
// tokens on the GPU and the reference interpreter, and stop strings never take back streamed
// text; stage times come from the measured clock, are non-negative, 0 for skipped stages and sum
// to at most the run's wall time. (Streaming through HTTP: tests/test_cascade_serving.cpp.)
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "compiler/cascade/cascade.h"
#include "compiler/gguf.h"
#include "host/cascade/cascade_run.h"
#include "vm/abi.h"
#include "vm/cascade_abi.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

std::string model() { return "model m = \"" + stories() + "\"\n"; }

Module compile(const std::string& source, const std::string& dir = ".") {
    CascadeOptions o;
    o.module_dir = dir;
    auto m = compileCascade(source, "test.cas", o);
    REQUIRE_MESSAGE(m, m.message());
    return std::move(m.value());
}

struct Run {
    CascadeInfo info;
    std::vector<CascadeResult> results;
    double wall_ms = 0;
};

Run runSource(const std::string& source, bool reference, const std::vector<CascadeTask>& tasks) {
    TempDir dir;
    Module m = compile(source, dir.path);
    const std::string path = dir.path + "/c.bir";
    REQUIRE(writeModuleFile(m, path));
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.max_submit_ms = 0;
    auto runner = CascadeRunner::open(path, ro);
    REQUIRE_MESSAGE(runner, runner.message());
    const auto t0 = std::chrono::steady_clock::now();
    auto results = runner.value()->run(tasks);
    const auto t1 = std::chrono::steady_clock::now();
    REQUIRE_MESSAGE(results, results.message());
    CHECK(runner.value()->validationErrors() == 0);
    Run r;
    r.info = runner.value()->info();
    r.results = std::move(results.value());
    r.wall_ms = reference ? std::chrono::duration<double, std::milli>(t1 - t0).count() : runner.value()->gpuStats().wall_ms;
    for (const CascadeResult& res : r.results) REQUIRE(res.complete);
    return r;
}

// The streamed tokens are a prefix of the stream slot's final tokens.
void checkPrefix(const Run& run) {
    REQUIRE(run.info.stream_slot >= 0);
    for (const CascadeResult& r : run.results) {
        const std::vector<int32_t>& slot = r.slots[size_t(run.info.stream_slot)];
        REQUIRE(r.streamed.size() <= slot.size());
        CHECK(std::equal(r.streamed.begin(), r.streamed.end(), slot.begin()));
    }
}

OutputRecord rec(uint32_t kind, uint32_t value) { return OutputRecord{0, kind, value}; }

TEST_CASE("cascade stream: the decoder reads stream and stage-time records and refuses malformed ones") {
    const std::string src = model() + "slot a[8]\nslot b[4]\nstage s {\n prompt input\n write a\n max_tokens 8\n}\n"
                                      "stage t {\n prompt a\n write b\n max_tokens 4\n}\noutput a, b\n";
    Module m = compile(src);
    auto info = CascadeInfo::fromModule(m);
    REQUIRE(info);
    CHECK(info->stream_slot == 1);  // b, the last output
    const uint32_t stream = m.addConstString(BLUE_CAS_STREAM_MARKER);
    const uint32_t time = m.addConstString(BLUE_CAS_STAGE_TIME_MARKER);
    auto gguf = ggufOpen(stories());
    REQUIRE(gguf);
    auto tok = Tokenizer::fromGguf(gguf.value());  // may refer to the file's vocabulary
    REQUIRE(tok);
    // A whole request: stream records, time records, the final records.
    std::vector<OutputRecord> recs = {rec(BLUE_OUT_BEGIN, 7), rec(BLUE_OUT_STR, time), rec(BLUE_OUT_UINT, 0),
                                      rec(BLUE_OUT_UINT, 3), rec(BLUE_OUT_UINT, 10), rec(BLUE_OUT_STR, stream),
                                      rec(BLUE_OUT_UINT, 2), rec(BLUE_OUT_TOKEN, 40), rec(BLUE_OUT_TOKEN, 41),
                                      rec(BLUE_OUT_STR, stream), rec(BLUE_OUT_UINT, 1), rec(BLUE_OUT_TOKEN, 42)};
    for (size_t s = 0; s < 2 * BLUE_CAS_OUT_STAGE_RECORDS; ++s) recs.push_back(rec(BLUE_OUT_UINT, 0));
    recs.push_back(rec(BLUE_OUT_UINT, 0));  // slot a: empty
    recs.push_back(rec(BLUE_OUT_UINT, 3));  // slot b: the streamed tokens
    for (uint32_t t : {40u, 41u, 42u}) recs.push_back(rec(BLUE_OUT_TOKEN, t));
    recs.push_back(rec(BLUE_OUT_END, 7));
    CascadeDecoder dec(info.value(), tok.value(), &m);
    uint32_t tag = 0;
    CascadeResult r;
    for (size_t i = 0; i + 1 < recs.size(); ++i) {
        auto ended = dec.push(recs[i], &tag, &r);
        REQUIRE_MESSAGE(ended, ended.message());
        CHECK(!ended.value());
        if (i == 8) CHECK(dec.streamed(0).size() == 2);
    }
    auto ended = dec.push(recs.back(), &tag, &r);
    REQUIRE_MESSAGE(ended, ended.message());
    REQUIRE(ended.value());
    CHECK(tag == 7);
    CHECK(r.complete);
    CHECK(r.streamed == std::vector<int32_t>{40, 41, 42});
    CHECK(r.slots[1] == r.streamed);
    REQUIRE(r.runs.size() == 1);
    CHECK(r.runs[0].stage == 0);
    CHECK(r.runs[0].start == 3);
    CHECK(r.runs[0].cycles == 10);

    // Malformed groups: an empty stream record, more tokens than the slot holds, a token where
    // the count belongs, a stage that does not exist, a string inside the time record.
    const std::vector<std::vector<OutputRecord>> bad = {
        {rec(BLUE_OUT_STR, stream), rec(BLUE_OUT_UINT, 0)},
        {rec(BLUE_OUT_STR, stream), rec(BLUE_OUT_UINT, 5)},
        {rec(BLUE_OUT_STR, stream), rec(BLUE_OUT_TOKEN, 5)},
        {rec(BLUE_OUT_STR, stream), rec(BLUE_OUT_UINT, 1), rec(BLUE_OUT_UINT, 1)},
        {rec(BLUE_OUT_STR, time), rec(BLUE_OUT_UINT, 2)},
        {rec(BLUE_OUT_STR, time), rec(BLUE_OUT_UINT, 0), rec(BLUE_OUT_STR, time)},
    };
    for (size_t k = 0; k < bad.size(); ++k) {
        CAPTURE(k);
        CascadeDecoder d(info.value(), tok.value(), &m);
        REQUIRE(d.push(rec(BLUE_OUT_BEGIN, 1), &tag, &r));
        bool failed = false;
        for (const OutputRecord& x : bad[k]) {
            auto e = d.push(x, &tag, &r);
            if (!e) {
                failed = true;
                CHECK(e.message().find("instance 0") != std::string::npos);
                break;
            }
        }
        CHECK(failed);
    }
}

TEST_CASE("cascade stream: only final writes of the stream slot stream; the streamed tokens are a prefix of its final tokens") {
    const std::vector<CascadeTask> tasks = {{"Once upon a time", 1}, {"Lily", 2}};
    struct Case {
        const char* name;
        std::string body;
        bool streams;  // some text must stream for these tasks
    };
    const std::vector<Case> cases = {
        // One final write; a multi-token stop string (its tokens are held back until they can no
        // longer be dropped).
        {"final write with stop strings", "slot s[40]\nstage a {\n prompt input\n write s\n max_tokens 40\n temperature 0\n stop \" named\", \" the park\"\n}\n", true},
        // A write replaced later: the first streams nothing; the replacing write streams.
        {"replaced write", "slot s[40]\nstage a {\n prompt input\n write s\n max_tokens 10\n temperature 0\n}\n"
                           "stage b {\n prompt s\n write s\n max_tokens 20\n temperature 0\n}\n", true},
        // A write inside a loop reaches itself: nothing streams, the final text comes at the end.
        {"write in a loop", "slot s[40]\nstage a {\n prompt input\n write s\n max_tokens 10\n temperature 0\n}\n"
                            "repeat 2 {\n stage b {\n prompt s\n write s\n max_tokens 10\n temperature 0\n}\n}\n", false},
        // Appends in a loop after a write (review_loop's shape): the write and every append stream.
        {"appends in a loop", "slot s[60]\nstage a {\n prompt input\n write s\n max_tokens 10\n temperature 0\n}\n"
                              "repeat 2 {\n stage b {\n prompt s\n append s\n max_tokens 10\n temperature 0\n}\n}\n", true},
        // An append after a non-final write catches up with the write's tokens first.
        {"append after a replaced write", "slot s[60]\nstage a {\n prompt input\n write s\n max_tokens 8\n temperature 0\n}\n"
                                          "repeat 2 {\n stage b {\n prompt s\n write s\n max_tokens 8\n temperature 0\n}\n}\n"
                                          "stage c {\n prompt s\n append s\n max_tokens 8\n temperature 0\n}\n", true},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        for (bool reference : {true, false}) {
            CAPTURE(reference);
            const Run run = runSource(model() + c.body, reference, tasks);
            checkPrefix(run);
            for (const CascadeResult& r : run.results) {
                const std::vector<int32_t>& slot = r.slots[size_t(run.info.stream_slot)];
                if (c.streams) {
                    CHECK(r.streamed == slot);  // every write of the slot's final text was final
                } else {
                    CHECK(r.streamed.empty());
                }
            }
        }
    }
    // The stop strings matched and were dropped from the slot, and from what streamed.
    const Run run = runSource(model() + cases[0].body, true, tasks);
    for (const CascadeResult& r : run.results) {
        CHECK(r.slot_text[0].find(" named") == std::string::npos);
        CHECK(r.slot_text[0].find(" the park") == std::string::npos);
        CHECK(r.stages[0].tokens > r.slots[0].size());  // a stop string was cut
    }
}

TEST_CASE("cascade stage times: ms per stage from the measured clock, 0 when skipped, summing to at most the wall time") {
    // Interpolation within a chain's cycles.
    CascadeResult r;
    r.stages.resize(2);
    r.runs = {{0, 5, 10}, {0, 15, 5}};
    const std::vector<CycleTime> clock = {{10, 100}, {20, 300}};
    cascadeStageTimes(r, clock);
    CHECK(r.stages[0].ms == doctest::Approx(100));  // t(20) - t(15) = 300 - 200
    CHECK(r.stages[0].ms_total == doctest::Approx(250));  // + t(15) - t(5) = 200 - 50
    CHECK(r.stages[1].ms == 0);
    CHECK(cascadeStatsJson(r).find("\"ms\":100.000") != std::string::npos);

    const std::string src = model() + "slot a[24]\nslot b[24]\n"
                                      "stage first {\n prompt input\n write a\n max_tokens 24\n temperature 0\n}\n"
                                      "stage never {\n skip if first.tokens > 0\n prompt a\n write b\n max_tokens 8\n}\n"
                                      "stage last {\n prompt a\n append a\n max_tokens 16\n temperature 0\n}\n"
                                      "output a\n";
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        const Run run = runSource(src, reference, {{"Once upon a time", 3}});
        const CascadeResult& res = run.results[0];
        double sum = 0;
        for (const StageStats& st : res.stages) {
            CAPTURE(st.name);
            CHECK(st.ms >= 0);
            CHECK(st.ms_total >= st.ms);
            sum += st.ms_total;
        }
        CHECK(res.stages[0].state == BLUE_CAS_STATE_RAN);
        CHECK(res.stages[0].ms > 0);
        CHECK(res.stages[1].state == BLUE_CAS_STATE_SKIPPED);
        CHECK(res.stages[1].ms == 0);
        CHECK(res.stages[2].ms > 0);
        CHECK(sum <= run.wall_ms + 1e-6);
        CHECK(cascadeStatsJson(res).find("\"ms\":") != std::string::npos);
    }
}

}  // namespace
}  // namespace blue::test
