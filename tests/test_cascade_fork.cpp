// Fork and join: `fork K` runs a stage's K branches at once on sibling instances, each drawing
// from its own seed (branch b of a stage run with seed S draws what the unforked stage draws
// with seed S + b * 0x85EBCA6B), and `join` keeps one. Checked against the unforked stage run
// with each branch's seed, on the reference and the GPU, with siblings and without (the request's
// own instance runs every branch), alone and served beside other requests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/cascade/cascade.h"
#include "host/cascade/cascade_run.h"
#include "host/cascade/cascade_serving.h"
#include "tests/child.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

constexpr uint32_t kBranchSeedStep = 0x85EBCA6Bu;

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

std::string stage(const std::string& extra) {
    return "model m = \"x\"\nslot story[64]\n"
           "stage draft {\n prompt \"Once upon a time\" + input\n write story\n max_tokens 20\n temperature 1.0\n" +
           extra + "}\n";
}

std::string compile(const TempDir& dir, const std::string& src, const std::string& name, uint32_t records = 16) {
    CascadeOptions o;
    o.fork_records = records;
    o.models["m"] = stories();
    o.module_dir = dir.path;
    auto m = compileCascade(src, name + ".cas", o);
    REQUIRE_MESSAGE(m, m.message());
    std::string path = dir.path + "/" + name + ".bir";
    REQUIRE(writeModuleFile(m.value(), path));
    return path;
}

std::vector<CascadeResult> run(const std::string& bir, bool reference, const std::vector<CascadeTask>& tasks,
                               int32_t siblings = -1, uint32_t instances = 1) {
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.siblings = siblings;
    ro.instances = instances;
    ro.max_submit_ms = 0;
    auto r = CascadeRunner::open(bir, ro);
    REQUIRE_MESSAGE(r, r.message());
    auto out = r.value()->run(tasks);
    REQUIRE_MESSAGE(out, out.message());
    CHECK(r.value()->validationErrors() == 0);
    for (const CascadeResult& c : out.value()) REQUIRE(c.complete);
    return std::move(out.value());
}

// Each branch alone: the unforked stage with the branch's seed.
std::vector<std::vector<CascadeResult>> branchesAlone(const TempDir& dir, const std::string& extra,
                                                      const std::vector<CascadeTask>& tasks, uint32_t K) {
    std::string plain = compile(dir, stage(extra), "plain");
    std::vector<std::vector<CascadeResult>> alone(tasks.size());
    for (uint32_t b = 0; b < K; ++b) {
        std::vector<CascadeTask> seeded = tasks;
        for (CascadeTask& t : seeded) t.seed += b * kBranchSeedStep;
        auto r = run(plain, true, seeded);
        for (size_t i = 0; i < tasks.size(); ++i) alone[i].push_back(r[i]);
    }
    return alone;
}

const std::vector<CascadeTask> kTasks = {{"", 5}, {" in a park", 9}, {" a dog", 40}, {"", 77}};

TEST_CASE("fork: join logprob keeps the branch with the highest mean log-probability, each branch the unforked stage with its seed") {
    TempDir dir;
    const uint32_t K = 3;
    auto alone = branchesAlone(dir, "", kTasks, K);
    std::string forked = compile(dir, stage(" fork 3\n join logprob\n"), "fork");
    struct Way {
        bool reference;
        int32_t siblings;
    };
    for (Way w : {Way{true, -1}, Way{true, 0}, Way{false, -1}, Way{false, 0}, Way{false, 1}}) {
        CAPTURE(w.reference);
        CAPTURE(w.siblings);
        auto r = run(forked, w.reference, kTasks, w.siblings, 2);
        uint32_t gpu_same = 0;
        for (size_t i = 0; i < kTasks.size(); ++i) {
            CAPTURE(i);
            const StageStats& st = r[i].stages[0];
            size_t best = 0;
            uint32_t total = 0;
            for (size_t b = 0; b < K; ++b) {
                total += alone[i][b].stages[0].tokens;
                if (alone[i][b].stages[0].logprobMean() > alone[i][best].stages[0].logprobMean()) best = b;
            }
            CHECK(st.branches == K);
            // Idle instances take branches, and new tasks when no branch waits: how many branches
            // siblings ran depends on the timing, but never more than K - 1, and none without.
            CHECK(st.siblings <= (w.siblings == 0 ? 0u : K - 1));
            if (!w.reference && r[i].slot_text[0] != alone[i][st.choice].slot_text[0]) {
                // Sampled on the GPU, a draw that falls within the last bits of a boundary may
                // differ from the reference's; the rest must agree.
                continue;
            }
            gpu_same += !w.reference;
            CHECK(st.choice == best);
            CHECK(r[i].slot_text[0] == alone[i][best].slot_text[0]);
            CHECK(st.tokens == alone[i][best].stages[0].tokens);
            CHECK(st.branch_tokens == total);
            CHECK(r[i].generated == total);  // usage counts every branch
            CHECK(std::fabs(st.logprobMean() - alone[i][best].stages[0].logprobMean()) < 1e-3f);
        }
        if (!w.reference) CHECK(gpu_same >= kTasks.size() - 1);
    }
}

TEST_CASE("fork: join first keeps the branch that finished first; without siblings that is branch 0") {
    TempDir dir;
    const std::string extra = " stop \".\"\n fork 4\n join first\n";
    auto alone = branchesAlone(dir, " stop \".\"\n", kTasks, 4);
    std::string forked = compile(dir, stage(extra), "first");
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        for (size_t i = 0; i < kTasks.size(); ++i) {
            CAPTURE(i);
            // One task a run: its siblings are idle when it forks.
            auto seq = run(forked, reference, {kTasks[i]}, 0);
            auto par = run(forked, reference, {kTasks[i]}, -1);
            CHECK(seq[0].stages[0].choice == 0);  // one after another: branch 0 ends first
            CHECK(seq[0].stages[0].siblings == 0);
            CHECK(par[0].stages[0].siblings == 3);
            // At once, the branches start within a cycle of each other and take a cycle a token:
            // the first to finish generated the fewest tokens, give or take one.
            uint32_t fewest = 1000;
            for (const CascadeResult& b : alone[i]) fewest = std::min(fewest, b.stages[0].tokens);
            CHECK(par[0].stages[0].tokens <= fewest + 1);
            if (reference) CHECK(par[0].slot_text[0] == alone[i][par[0].stages[0].choice].slot_text[0]);
        }
    }
}

TEST_CASE("fork: join judge with the stage's own model keeps what join logprob keeps (T = 1: the same likelihoods)") {
    TempDir dir;
    std::string judge = compile(dir, stage(" fork 3\n join judge m\n"), "judge");
    std::string logprob = compile(dir, stage(" fork 3\n"), "logprob");
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        auto j = run(judge, reference, kTasks);
        auto l = run(logprob, reference, kTasks);
        for (size_t i = 0; i < kTasks.size(); ++i) {
            CAPTURE(i);
            CHECK(j[i].stages[0].choice == l[i].stages[0].choice);
            CHECK(j[i].slot_text[0] == l[i].slot_text[0]);
        }
    }
}

TEST_CASE("fork: the branches share the budget and an append keeps the slot; later stages read the kept branch") {
    TempDir dir;
    const std::string src =
        "model m = \"x\"\nslot story[64]\nbudget 40\n"
        "stage first {\n prompt \"Once upon a time\"\n write story\n max_tokens 10\n temperature 0\n}\n"
        "stage more {\n prompt story\n append story\n max_tokens 20\n temperature 1.0\n fork 4\n}\n"
        "stage last {\n skip if more.tokens > 100\n prompt story\n append story\n max_tokens 20\n temperature 0\n}\n";
    std::string bir = compile(dir, src, "budget");
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        auto r = run(bir, reference, {{"", 3}, {"", 4}});
        for (const CascadeResult& c : r) {
            const StageStats &first = c.stages[0], &more = c.stages[1], &last = c.stages[2];
            CHECK(first.tokens == 10);
            // 30 tokens left for 4 branches: 7 each at most.
            CHECK(more.branches == 4);
            CHECK(more.tokens <= 7);
            CHECK(more.branch_tokens <= 28);
            CHECK(c.generated <= 40);
            // The slot holds the first stage's tokens, the kept branch's, then the last stage's.
            CHECK(c.slots[0].size() == first.tokens + more.tokens + (last.state == 1 ? last.tokens : 0));
            CHECK(last.state == (10 + more.branch_tokens < 40 ? 1u : 3u));  // ran, or no budget
        }
    }
}

TEST_CASE("fork: served beside other requests (more branches than idle instances, forks waiting for a record), answers equal the runner's") {
    TempDir dir;
    std::string bir = compile(dir, stage(" fork 3\n"), "served");
    std::string one_record = compile(dir, stage(" fork 3\n"), "one", 1);
    auto want = run(bir, false, kTasks, -1, 4);
    struct Way {
        const std::string* bir;
        uint32_t instances;
    };
    for (Way w : {Way{&bir, 1}, Way{&bir, 3}, Way{&bir, 8}, Way{&one_record, 8}}) {
        const uint32_t instances = w.instances;
        CAPTURE(instances);
        CAPTURE(*w.bir);
        CascadeRunOptions ro;
        auto runner = CascadeRunner::open(*w.bir, ro);
        REQUIRE_MESSAGE(runner, runner.message());
        CascadeServeOptions so;
        so.instances = instances;
        auto engine = CascadeServingEngine::create(*runner.value(), so);
        REQUIRE_MESSAGE(engine, engine.message());
        std::mutex mu;
        std::condition_variable cv;
        std::vector<CascadeOutcome> got(kTasks.size());
        size_t done = 0;
        for (size_t i = 0; i < kTasks.size(); ++i) {
            auto id = engine.value()->submit(kTasks[i].text, kTasks[i].seed, [&, i](const CascadeOutcome& o) {
                std::lock_guard<std::mutex> lock(mu);
                got[i] = o;
                ++done;
                cv.notify_all();
            });
            REQUIRE_MESSAGE(id, id.message());
        }
        std::unique_lock<std::mutex> lock(mu);
        REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done == kTasks.size(); }));
        for (size_t i = 0; i < kTasks.size(); ++i) {
            CAPTURE(i);
            REQUIRE(got[i].reason == FinishReason::Stop);
            CHECK(got[i].result.slot_text[0] == want[i].slot_text[0]);
            CHECK(got[i].result.stages[0].choice == want[i].stages[0].choice);
            CHECK(got[i].result.stages[0].branches == 3);
            if (instances == 1) CHECK(got[i].result.stages[0].siblings == 0);
        }
        CHECK(engine.value()->metrics().round_trips == 0);
        engine.value().reset();
        CHECK(runner.value()->validationErrors() == 0);
    }
}

TEST_CASE("fork: bluevm run programs/best_of.cas prints the same story with its branches at once and one after another") {
    TempDir dir;
    const std::string bir = dir.path + "/best.bir";
    Child c({std::string(BLUE_BINARY_DIR) + "/compiler/bluec", "cascade", sourceDir() + "/programs/best_of.cas", "-o", bir,
             "--model", "writer=" + stories(), "--forks", "4"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    std::vector<std::string> out;
    std::vector<nlohmann::json> stats;
    for (const char* siblings : {"0", "3"}) {
        Child r({std::string(BLUE_BINARY_DIR) + "/host/bluevm", "run", bir, "--prompt", " Lily", "--seed", "7", "--stats",
                 "--siblings", siblings});
        REQUIRE_MESSAGE(r.wait() == 0, r.err_text);
        out.push_back(r.out_text);
        stats.push_back(nlohmann::json::parse(r.err_text.substr(0, r.err_text.find('\n'))));
    }
    CHECK(out[0] == out[1]);
    CHECK(out[0].size() > 40);
    for (size_t k = 0; k < 2; ++k) {
        CHECK(stats[k]["machine"]["round_trips"] == 0);
        CHECK(stats[k]["stages"][0]["branches"] == 4);
        CHECK(stats[k]["stages"][1]["branches"] == 3);
        CHECK(stats[k]["stages"][0]["by_siblings"] == (k == 0 ? 0 : 3));
        CHECK(stats[k]["stages"][0]["kept"] == stats[0]["stages"][0]["kept"]);
    }
    // At once, the forks take fewer VM cycles than one branch after another.
    CHECK(stats[1]["machine"]["cycles"].get<uint64_t>() * 2 < stats[0]["machine"]["cycles"].get<uint64_t>());
    Child bad({std::string(BLUE_BINARY_DIR) + "/compiler/bluec", "cascade", sourceDir() + "/programs/best_of.cas", "-o", bir,
               "--forks", "0"});
    CHECK(bad.wait() == 1);
    CHECK(bad.err_text.find("--forks needs a positive number") != std::string::npos);
}

TEST_CASE("fork: bad uses are refused with FILE:LINE:COL") {
    CascadeOptions o;
    o.models["m"] = stories();
    auto bad = [&](const std::string& src, const char* where, const char* what) {
        auto r = compileCascade(src, "f.cas", o);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(std::string("f.cas:") + where) == 0, r.message());
        CHECK_MESSAGE(r.message().find(what) != std::string::npos, r.message());
    };
    const std::string head = "model m = \"x\"\nslot s[8]\n";
    auto st = [&](const std::string& body) { return head + "stage a {\n prompt input\n write s\n max_tokens 4\n" + body + "}\n"; };
    bad(st(" fork 1\n"), "7:7", "fork must be between 2 and 16");
    bad(st(" fork 17\n"), "7:7", "fork must be between 2 and 16");
    bad(st(" fork two\n"), "7:7", "expected fork (a whole number)");
    bad(st(" join logprob\n"), "7:7", "'join' needs 'fork K'");
    bad(st(" fork 2\n join best\n"), "8:7", "unknown join rule 'best'");
    bad(st(" fork 2\n join judge\n"), "8:12", "expected the judge's model name");
    bad(st(" fork 2\n join judge ghost\n"), "8:13", "no model named 'ghost'");
    bad(st(" fork 2\n fork 3\n"), "8:2", "'fork' is given twice");
    bad(head + "stage a {\n prompt input\n write s\n select \" a\"\n fork 2\n}\n", "7:2", "a select stage cannot fork");
    bad(head + "stage a {\n prompt input\n write s\n speculate m\n fork 2\n}\n", "7:2", "cannot both fork and speculate");
    bad(head + "slot fork[2]\n", "3:6", "'fork' is a keyword");
}

}  // namespace
}  // namespace blue::test
