// Speculative decoding as a cascade stage (`speculate DRAFT`), end to end: the upcycled target
// (compiler/upcycle.h) computes stories260K's function exactly when its new weights are zero;
// with a little noise it is a realistic target for stories260K as the draft. Greedy speculative
// output equals the target alone token for token (256 tokens, reference and GPU); sampled
// speculative runs complete with their acceptance statistics (the distribution itself is tested
// on the op, tests/test_spec.cpp).
#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/cascade/cascade.h"
#include "compiler/upcycle.h"
#include "host/cascade/cascade_run.h"
#include "host/llm/engine.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

namespace fs = std::filesystem;

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }


std::string programText(const std::string& name) {
    std::ifstream in(sourceDir() + "/programs/" + name + ".cas");
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<CascadeResult> run(const TempDir& dir, const std::string& source, const std::map<std::string, std::string>& models,
                               bool reference, const std::vector<CascadeTask>& tasks, uint32_t instances = 1) {
    CascadeOptions o;
    o.models = models;
    o.module_dir = dir.path;
    auto m = compileCascade(source, "spec.cas", o);
    REQUIRE_MESSAGE(m, m.message());
    std::string path = dir.path + "/c" + std::to_string(std::rand()) + ".bir";
    REQUIRE(writeModuleFile(m.value(), path));
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.instances = instances;
    ro.max_submit_ms = 0;
    auto runner = CascadeRunner::open(path, ro);
    REQUIRE_MESSAGE(runner, runner.message());
    auto r = runner.value()->run(tasks);
    REQUIRE_MESSAGE(r, r.message());
    CHECK(runner.value()->validationErrors() == 0);
    return std::move(r.value());
}

// The program without its speculation: the target alone.
std::string targetOnly(std::string src) {
    std::string out, line;
    std::istringstream in(src);
    while (std::getline(in, line)) {
        if (line.find("speculate") != std::string::npos || line.rfind("model draft", 0) == 0) continue;
        out += line + "\n";
    }
    return out;
}

TEST_CASE("upcycle: a widened, deepened stories260K with zero new weights gives its 256 greedy tokens; noise changes it a little") {
    TempDir dir;
    std::string big = dir.path + "/big.gguf";
    UpcycleOptions uo;
    uo.extra_layers = 3;
    uo.head_factor = 2;
    uo.ffn = 344;
    auto r = upcycleGguf(stories(), big, uo);
    REQUIRE_MESSAGE(r, r.message());
    CHECK(r->layers == 8);
    CHECK(r->heads == 16);
    CHECK(double(r->params_after) / double(r->params_before) > 2.5);
    EngineOptions eo;
    eo.ctx = 300;
    auto e = Engine::open(big, eo);
    REQUIRE_MESSAGE(e, e.message());
    GenerationRequest req;
    req.prompt = e.value()->promptTokens("");
    req.max_new = 256;
    req.sampling.temperature = 0;
    req.ignore_eog = true;
    auto out = e.value()->run({req});
    REQUIRE_MESSAGE(out, out.message());
    CHECK(out.value()[0].tokens == expectedGreedyIds());
    // Refusals name the reason.
    uo.ffn = 100;
    auto shrink = upcycleGguf(stories(), dir.path + "/x.gguf", uo);
    REQUIRE_FALSE(shrink);
    CHECK(shrink.message().find("below the model's 172") != std::string::npos);
}

TEST_CASE("speculate: greedy speculative decoding equals the target alone for 256 tokens, on the reference and the GPU") {
    TempDir dir;
    std::string big = dir.path + "/big.gguf";
    UpcycleOptions uo;
    uo.extra_layers = 3;
    uo.head_factor = 2;
    uo.ffn = 344;
    uo.noise = 0.02f;
    REQUIRE(upcycleGguf(stories(), big, uo));
    std::map<std::string, std::string> models = {{"draft", stories()}, {"target", big}};
    std::string spec = programText("speculative");
    std::string alone = targetOnly(spec);
    const std::vector<CascadeTask> tasks = {{"Once upon a time", 1}, {"The dog", 2}};
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        auto s = run(dir, spec, models, reference, tasks, 2);
        auto t = run(dir, alone, {{"target", big}}, reference, tasks, 2);
        for (size_t i = 0; i < tasks.size(); ++i) {
            CAPTURE(i);
            REQUIRE(s[i].complete);
            CHECK(s[i].stages[0].tokens == 256);
            CHECK(s[i].slots == t[i].slots);
            const StageStats& st = s[i].stages[0];
            CHECK(st.passes > 0);
            CHECK(st.accepted <= st.drafted);
            CHECK(st.accepted > 0);
            CHECK(st.accepted < st.drafted);  // the noise makes the target disagree sometimes
            // Every pass emits the accepted drafts and one token of its own; the first token
            // comes from the prefill.
            CHECK(st.tokens <= 1 + st.accepted + st.passes);
            MESSAGE(std::string(reference ? "reference" : "GPU") << " task " << i << ": acceptance "
                    << double(st.accepted) / st.drafted << ", tokens per target pass "
                    << double(st.tokens) / st.passes);
        }
    }
}

TEST_CASE("speculate: with conditional rendering (idle blocks skipped on the GPU), greedy speculation still equals the reference") {
    TempDir dir;
    std::string big = dir.path + "/big.gguf";
    UpcycleOptions uo;
    uo.extra_layers = 1;
    uo.noise = 0.02f;
    REQUIRE(upcycleGguf(stories(), big, uo));
    std::map<std::string, std::string> models = {{"draft", stories()}, {"target", big}};
    const std::vector<CascadeTask> tasks = {{"Once upon a time", 1}};
    auto ref = run(dir, programText("speculative"), models, true, tasks);
    setenv("BLUE_CONDITIONAL", "1", 1);
    auto gpu = run(dir, programText("speculative"), models, false, tasks);
    unsetenv("BLUE_CONDITIONAL");
    CHECK(gpu[0].slots == ref[0].slots);
    CHECK(gpu[0].stages[0].accepted == ref[0].stages[0].accepted);
}

TEST_CASE("speculate: sampled speculative stages complete with their statistics; the source is checked") {
    TempDir dir;
    std::string big = dir.path + "/big.gguf";
    UpcycleOptions uo;
    uo.extra_layers = 1;
    uo.noise = 0.05f;
    REQUIRE(upcycleGguf(stories(), big, uo));
    std::string spec = programText("speculative");
    size_t at = spec.find("temperature 0");
    REQUIRE(at != std::string::npos);
    spec.replace(at, 13, "temperature 0.9");
    auto r = run(dir, spec, {{"draft", stories()}, {"target", big}}, false, {{"Lily", 4}, {"Tom", 5}, {"A cat", 6}}, 3);
    for (const CascadeResult& c : r) {
        REQUIRE(c.complete);
        CHECK(c.stages[0].tokens > 0);
        CHECK(c.stages[0].passes > 0);
        REQUIRE(c.slot_text.size() == 1);  // story
        CHECK(!c.slot_text[0].empty());
    }
    // Speculation cannot be combined with repetition penalties, and needs a declared model.
    CascadeOptions o;
    o.models = {{"draft", stories()}, {"target", stories()}};
    std::string bad = programText("speculative");
    bad.replace(bad.find("temperature 0"), 13, "repeat_penalty 1.1");
    auto b = compileCascade(bad, "s.cas", o);
    REQUIRE_FALSE(b);
    CHECK_MESSAGE(b.message().find("repeat_penalty cannot be combined with speculate") != std::string::npos, b.message());
    std::string ghost = programText("speculative");
    ghost.replace(ghost.find("speculate draft"), 15, "speculate ghost");
    auto g = compileCascade(ghost, "s.cas", o);
    REQUIRE_FALSE(g);
    CHECK_MESSAGE(g.message().find("no model named 'ghost'") != std::string::npos, g.message());
}

}  // namespace
}  // namespace blue::test
