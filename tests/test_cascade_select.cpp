// `select` stages: the model scores each listed option by its log-likelihood after the prompt
// (SCORE over the option's tokens) and the most likely one is written. Checked against the
// likelihoods of the options scored one at a time, on the reference and the GPU; `choice` in
// conditions; bad uses refused.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "compiler/cascade/cascade.h"
#include "host/cascade/cascade_run.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

std::string source(const std::string& options) {
    return "model m = \"x\"\nslot story[64]\nslot pick[8]\nslot after[8]\n"
           "stage tell {\n prompt input\n write story\n max_tokens 24\n temperature 0\n}\n"
           "stage judge {\n prompt story + \" The girl was\"\n select " + options + "\n write pick\n}\n"
           "if judge.choice == 1 {\n stage two {\n  prompt pick\n  write after\n  max_tokens 2\n  temperature 0\n }\n}\n"
           "output pick\n";
}

std::vector<CascadeResult> run(const std::string& src, bool reference, const std::vector<CascadeTask>& tasks) {
    char tmpl[] = "/tmp/blue_select_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    std::string dir = tmpl;
    CascadeOptions o;
    o.models["m"] = stories();
    o.module_dir = dir;
    auto m = compileCascade(src, "sel.cas", o);
    REQUIRE_MESSAGE(m, m.message());
    REQUIRE(writeModuleFile(m.value(), dir + "/s.bir"));
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.max_submit_ms = 0;
    auto r = CascadeRunner::open(dir + "/s.bir", ro);
    REQUIRE_MESSAGE(r, r.message());
    auto out = r.value()->run(tasks);
    REQUIRE_MESSAGE(out, out.message());
    CHECK(r.value()->validationErrors() == 0);
    std::filesystem::remove_all(dir);
    return std::move(out.value());
}

TEST_CASE("select: the most likely option is written, as the options' own likelihoods say, on the reference and the GPU") {
    const std::vector<std::string> options = {"\" happy\"", "\" sad\"", "\" very happy\"", "\" tired\""};
    const std::vector<CascadeTask> tasks = {{"Once upon a time", 0}, {"Lily was sad", 0}, {"The dog ran", 0}};
    // Each option alone: its log-likelihood is the stage's log-probability sum.
    std::vector<std::vector<float>> alone(tasks.size());
    for (const std::string& o : options) {
        auto r = run(source(o), true, tasks);
        for (size_t i = 0; i < tasks.size(); ++i) alone[i].push_back(r[i].stages[1].logprob_sum);
    }
    std::string all = options[0];
    for (size_t k = 1; k < options.size(); ++k) all += ", " + options[k];
    for (bool reference : {true, false}) {
        CAPTURE(reference);
        auto r = run(source(all), reference, tasks);
        for (size_t i = 0; i < tasks.size(); ++i) {
            CAPTURE(i);
            const StageStats& judge = r[i].stages[1];
            size_t best = 0;
            for (size_t k = 1; k < options.size(); ++k) best = alone[i][k] > alone[i][best] ? k : best;
            CHECK(judge.choice == best);
            // The reference scored the options alone; the GPU sums in float: within 5e-3.
            CHECK(std::fabs(judge.logprob_sum - alone[i][best]) < 5e-3f);
            std::string want = options[best].substr(1, options[best].size() - 2);
            CHECK(" " + r[i].slot_text[1] == want);  // decoding drops the leading space of a text
            CHECK(r[i].stages[2].state == (best == 1 ? 1u : 0u));  // `if judge.choice == 1`
            MESSAGE("task " << i << " picks" << want << " (log-likelihoods " << alone[i][0] << ", " << alone[i][1]
                            << ", " << alone[i][2] << ", " << alone[i][3] << ")");
        }
    }
}

TEST_CASE("select: bad uses are refused with FILE:LINE:COL") {
    CascadeOptions o;
    o.models["m"] = stories();
    auto bad = [&](const std::string& src, const char* where, const char* what) {
        auto r = compileCascade(src, "s.cas", o);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(std::string("s.cas:") + where) == 0, r.message());
        CHECK_MESSAGE(r.message().find(what) != std::string::npos, r.message());
    };
    const std::string head = "model m = \"x\"\nslot s[2]\n";
    bad(head + "stage a {\n prompt input\n select \"\"\n write s\n}\n", "5:9", "empty option");
    bad(head + "stage a {\n prompt input\n select \" one two three four\"\n write s\n}\n", "5:2", "more than slot 's' holds");
    bad(head + "stage a {\n prompt input\n select \" a\"\n stop \".\"\n write s\n}\n", "6:7", "stop strings do not apply");
    bad(head + "stage a {\n prompt input\n select \" a\"\n write s\n}\nif a.choise == 0 {\n}\n", "8:6", "unknown statistic 'choise'");
}

}  // namespace
}  // namespace blue::test
