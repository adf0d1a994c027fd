// Cascades (compiler/cascade, host/cascade): the programs in programs/*.cas give the same slots on
// the GPU as on the reference interpreter; skip rules, loop bounds, budgets and stop strings do
// what the source says, checked against the statistics the run reports; bad sources fail with
// FILE:LINE:COL and never crash, and neither do mutated sources and compiled modules; the CLI
// compiles, runs and reports `round_trips: 0`.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "compiler/cascade/cascade.h"
#include "compiler/gguf.h"
#include "compiler/quantize.h"
#include "compiler/tokenizer.h"
#include "host/cascade/cascade_run.h"
#include "tests/child.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "vm/cascade_abi.h"
#include "vm/interp.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

namespace fs = std::filesystem;

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }
std::string binary(const std::string& rel) { return std::string(BLUE_BINARY_DIR) + "/" + rel; }

std::string readFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
std::string program(const std::string& name) { return readFile(sourceDir() + "/programs/" + name + ".cas"); }


// Every model of a source pointed at stories260K (or at `other` for the names listed).
CascadeOptions optionsFor(const std::string& source, const std::map<std::string, std::string>& other = {}) {
    CascadeOptions o;
    auto p = parseCascade(source, "test.cas");
    REQUIRE_MESSAGE(p, p.message());
    for (const auto& m : p->models) o.models[m.name] = other.count(m.name) ? other.at(m.name) : stories();
    return o;
}

// Model paths are recorded relative to `module_dir`, where the module is written.
Module compileOk(const std::string& source, const std::map<std::string, std::string>& other = {},
                 const std::string& module_dir = ".") {
    CascadeOptions o = optionsFor(source, other);
    o.module_dir = module_dir;
    auto m = compileCascade(source, "test.cas", o);
    REQUIRE_MESSAGE(m, m.message());
    return std::move(m.value());
}

// Compiles, writes and runs a source on the reference interpreter or the GPU.
std::vector<CascadeResult> runSource(const std::string& source, bool reference,
                                     const std::vector<CascadeTask>& tasks, uint32_t instances = 1,
                                     const std::map<std::string, std::string>& other = {}) {
    TempDir dir;
    Module m = compileOk(source, other, dir.path);
    std::string path = dir.path + "/c.bir";
    REQUIRE(writeModuleFile(m, path));
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.instances = instances;
    ro.max_submit_ms = 0;
    auto runner = CascadeRunner::open(path, ro);
    REQUIRE_MESSAGE(runner, runner.message());
    auto results = runner.value()->run(tasks);
    REQUIRE_MESSAGE(results, results.message());
    CHECK(runner.value()->validationErrors() == 0);
    for (const CascadeResult& r : results.value()) REQUIRE(r.complete);
    return std::move(results.value());
}

const StageStats& stage(const CascadeResult& r, const std::string& name) {
    for (const StageStats& s : r.stages) {
        if (s.name == name) return s;
    }
    FAIL("no stage " << name);
    return r.stages[0];
}

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
    size_t at = s.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, "'" << from << "' not in the source");
    for (; at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    return s;
}

// A task's token ids as CascadeRunner encodes them (stories260K's vocabulary).
std::vector<uint32_t> taskIds(const std::string& text) {
    auto g = ggufOpen(stories());
    REQUIRE(g);
    auto t = Tokenizer::fromGguf(g.value());
    REQUIRE(t);
    std::vector<int32_t> ids = t->encode(text, false, true);
    return {ids.begin(), ids.end()};
}

const std::vector<CascadeTask> kTasks = {{"Once upon a time", 1}, {"The dog", 2}, {"Lily wanted", 3}};

// The source with every stage greedy.
std::string greedy(std::string src) {
    for (size_t at = src.find("temperature "); at != std::string::npos; at = src.find("temperature ", at + 1)) {
        size_t end = src.find('\n', at);
        src.replace(at, end - at, "temperature 0");
    }
    return src;
}

// The smallest gap between the two largest logits any greedy step of the task saw on the
// reference interpreter: where it is tiny, the GPU's last-bit differences may pick the other token.
float smallestTop2Gap(const std::string& source, const CascadeTask& task, const std::vector<uint32_t>& ids) {
    Module m = compileOk(source);
    auto w = WeightSource::open(m, ".");
    REQUIRE(w);
    std::vector<uint32_t> logits;
    for (uint32_t i = 0; i < m.tensors.size(); ++i) {
        const std::string& n = m.tensors[i].name;
        if (n.size() > 7 && n.compare(n.size() - 7, 7, "/logits") == 0) logits.push_back(i);
    }
    RefMachine machine(m, w.value(), MachineOptions{1, 1000000});
    float smallest = 1e30f;
    machine.setAfterCycle([&](uint64_t) {
        for (uint32_t id : logits) {
            const auto& data = machine.tensors().data[id];
            const float* f = reinterpret_cast<const float*>(data.data());
            size_t n = data.size() / 4, best = 0;
            for (size_t i = 1; i < n; ++i) best = f[i] > f[best] ? i : best;
            for (size_t i = 0; i < n; ++i) {
                if (i != best) smallest = std::min(smallest, f[best] - f[i]);
            }
        }
    });
    std::vector<uint32_t> msg = {0, task.seed, 0};  // tag, seed, flags (vm/cascade_abi.h)
    msg.insert(msg.end(), ids.begin(), ids.end());
    machine.pushInput(msg);
    machine.closeInput();
    machine.run();
    return smallest;
}

TEST_CASE("cascade: every program in programs/ gives the same slots and decisions on the GPU as on the reference interpreter") {
    // Greedy, token for token, except where the reference saw a near tie: the GPU's logits differ
    // from the reference's in the last bits (sums in another order, its own exp), so a step whose
    // two best logits are within ~1e-3 may go either way. Sampled, a draw that falls that close to
    // the boundary between two tokens may too; the agreement is reported.
    uint32_t same = 0, total = 0;
    for (std::string name : {"draft_refine", "entropy_skip", "review_loop", "best_of"}) {
        CAPTURE(name);
        for (bool sampled : {false, true}) {
            CAPTURE(sampled);
            std::string src = sampled ? program(name) : greedy(program(name));
            auto ref = runSource(src, true, kTasks);
            auto gpu = runSource(src, false, kTasks, 2);
            REQUIRE(ref.size() == gpu.size());
            for (size_t i = 0; i < ref.size(); ++i) {
                CAPTURE(i);
                CHECK(ref[i].generated > 0);
                if (sampled) {
                    total += 1;
                    same += ref[i].slots == gpu[i].slots;
                    continue;
                }
                if (ref[i].slots != gpu[i].slots) {
                    float gap = smallestTop2Gap(src, kTasks[i], taskIds(kTasks[i].text));
                    MESSAGE(name << " task " << i << ": greedy slots differ; the reference's closest call was a logit gap of " << gap);
                    CHECK(gap < 2e-3f);
                    continue;
                }
                for (size_t s = 0; s < ref[i].stages.size(); ++s) {
                    const StageStats &a = ref[i].stages[s], &b = gpu[i].stages[s];
                    CHECK(a.state == b.state);
                    CHECK(a.tokens == b.tokens);
                    CHECK(a.runs == b.runs);
                    CHECK(std::fabs(a.entropy_sum - b.entropy_sum) < 1e-3f * (1 + a.tokens));
                    CHECK(std::fabs(a.logprob_sum - b.logprob_sum) < 1e-3f * (1 + a.tokens));
                }
            }
        }
    }
    MESSAGE("sampled cascades: " << same << " of " << total << " tasks gave the same slots on the GPU and the reference");
}

TEST_CASE("cascade: two different models (stories260K and its Q8_0 copy) share the cascade; weights of each are loaded once") {
    TempDir dir;
    std::string q8 = dir.path + "/s-q8_0.gguf";
    auto q = quantizeGguf(stories(), q8, DType::Q8_0);
    REQUIRE_MESSAGE(q, q.message());
    std::string src = program("draft_refine");
    auto ref = runSource(src, true, kTasks, 1, {{"draft", q8}});
    auto gpu = runSource(src, false, kTasks, 3, {{"draft", q8}});
    for (size_t i = 0; i < ref.size(); ++i) CHECK(ref[i].slots == gpu[i].slots);
    // The module has one extern per model and their weights apart.
    Module m = compileOk(src, {{"draft", q8}});
    REQUIRE(m.externs.size() == 2);
    size_t q8_weights = 0;
    for (const TensorDecl& t : m.tensors) q8_weights += t.extern_index == 0 && t.dtype == DType::Q8_0;
    CHECK(q8_weights > 0);
}

TEST_CASE("cascade: the entropy rule skips the stage exactly when its condition holds") {
    std::string src = program("entropy_skip");
    // The draft's mean entropy per task, with the rule never holding.
    std::string never = replaceAll(src, "draft.entropy_mean < 1.0", "draft.entropy_mean < -1");
    auto base = runSource(never, true, kTasks);
    for (float delta : {-0.05f, 0.05f}) {
        for (size_t i = 0; i < kTasks.size(); ++i) {
            float mean = stage(base[i], "draft").entropyMean();
            float threshold = mean + delta;
            CAPTURE(i);
            CAPTURE(threshold);
            std::string rule = replaceAll(src, "draft.entropy_mean < 1.0", "draft.entropy_mean < " + std::to_string(threshold));
            auto r = runSource(rule, i == 0 ? false : true, {kTasks[i]});
            bool holds = mean < threshold;
            CHECK(stage(r[0], "rewrite").state == (holds ? BLUE_CAS_STATE_SKIPPED : BLUE_CAS_STATE_RAN));
            CHECK(r[0].slots[1].empty() == holds);  // `answer` is written only when the rewrite runs
            CHECK(r[0].slots[0] == base[i].slots[0]);  // the draft is the same either way
        }
    }
}

TEST_CASE("cascade: a repeat loop stops at its bound, and at its break condition") {
    std::string src = program("review_loop");
    // A break condition that never holds: the loop runs its 3 rounds.
    auto never = runSource(replaceAll(src, "break if verdict contains \"happy\"", "break if verdict.length > 1000"), true, kTasks);
    for (const CascadeResult& r : never) {
        CHECK(stage(r, "review").runs == 3);
        CHECK(stage(r, "extend").runs == 3);
    }
    // One that always holds: one review, no extension.
    auto always = runSource(replaceAll(src, "break if verdict contains \"happy\"", "break if verdict.length >= 0"), true, kTasks);
    for (const CascadeResult& r : always) {
        CHECK(stage(r, "review").runs == 1);
        CHECK(stage(r, "extend").runs == 0);
        CHECK(stage(r, "extend").state == BLUE_CAS_STATE_NOT_REACHED);
    }
    // The program as written: the loop ended early exactly when the verdict mentions "happy".
    auto real = runSource(src, false, kTasks, 3);
    for (const CascadeResult& r : real) {
        bool happy = r.slot_text[1].find("happy") != std::string::npos;
        CHECK((stage(r, "review").runs < 3 || happy) == happy);
        if (!happy) CHECK(stage(r, "review").runs == 3);
    }
}

TEST_CASE("cascade: the token budget and max_tokens bound generation; stop strings end a stage and are dropped") {
    std::string src = program("review_loop");
    auto r = runSource(replaceAll(src, "budget 400", "budget 30"), true, kTasks);
    for (const CascadeResult& c : r) {
        CHECK(c.generated <= 30);
        CHECK(stage(c, "review").state == BLUE_CAS_STATE_NO_BUDGET);  // `tell` took 30 of its 48
        CHECK(stage(c, "tell").tokens == 30);
    }
    auto d = runSource(program("draft_refine"), true, kTasks);
    for (const CascadeResult& c : d) {
        const StageStats& draft = stage(c, "draft_it");
        CHECK(draft.tokens <= 40);
        // The sketch stopped at its first "." (dropped) or ran out of tokens without one.
        CHECK(c.slot_text[0].find('.') == std::string::npos);
        if (draft.tokens < 40) CHECK(c.slots[0].size() + 1 == draft.tokens);
        CHECK(stage(c, "refine").tokens == 96);
    }
}

TEST_CASE("cascade: conditions on slots and statistics, else branches and `run` of an earlier stage") {
    const std::string src = R"(
model m = "x.gguf"
slot a[32]
slot b[32]
stage first {
    prompt input
    write a
    max_tokens 12
    temperature 0
}
if first.tokens == 12 and not (a contains "zebra") {
    stage second {
        prompt a
        write b
        max_tokens 5
        temperature 0
    }
} else {
    run first
}
if first.logprob_mean > 0 or first.entropy_max < 0 {
    run second
}
run second
output a, b
)";
    auto r = runSource(src, true, {{"Once upon a time", 0}});
    CHECK(stage(r[0], "first").runs == 1);
    CHECK(stage(r[0], "second").runs == 2);  // the if body and the last line; not the or-branch
    CHECK(r[0].slots[1].size() == 5);
}

struct BadSource {
    std::string source;
    const char* where;    // "LINE:COL"
    const char* message;  // part of the message
};

TEST_CASE("cascade: bad sources fail with FILE:LINE:COL and a message that names the problem") {
    const std::string m = "model m = \"x.gguf\"\nslot s[16]\n";
    const std::string st = "stage a {\n prompt input\n write s\n max_tokens 4\n}\n";
    const std::vector<BadSource> table = {
        {"model = \"x\"\n", "1:7", "expected a model name"},
        {"model m \"x\"\n", "1:9", "expected '='"},
        {"model m = x\n", "1:11", "quoted string"},
        {"slot s[0]\n", "1:8", "between 1 and 65536"},
        {"slot s[16\n", "1:10", "expected ']'"},
        {"slot s[16]\nslot s[8]\n", "2:6", "already a slot"},
        {"slot stage[4]\n", "1:6", "is a keyword"},
        {"frobnicate\n", "1:1", "expected a statement"},
        {"model m = \"x.gguf\n", "1:11", "string not closed"},
        {"model m = \"a\\qb\"\n", "1:13", "unknown escape"},
        {"slot s[4] $\n", "1:11", "unexpected character '$'"},
        {m + "stage a {\n prompt input\n}\n", "5:1", "writes no slot"},
        {m + "stage a {\n write s\n}\n", "5:1", "has no prompt"},
        {m + "stage a {\n prompt input\n write s\n colour red\n}\n", "6:2", "unknown stage property 'colour'"},
        {m + "stage a {\n prompt input\n write s\n write s\n}\n", "6:2", "given twice"},
        {m + "stage a {\n prompt input\n write s\n temperature -1\n}\n", "6:14", "between 0 and 100"},
        {m + "stage a {\n prompt input\n write s\n top_p 2\n}\n", "6:8", "top_p must be between"},
        {m + "stage a {\n prompt input\n write s\n max_tokens 1.5\n}\n", "6:13", "whole number"},
        {m + "stage a {\n prompt input\n write s\n stop \"\"\n}\n", "6:7", "empty stop string"},
        {m + "stage a {\n prompt input\n write s\n", "6:1", "not closed"},
        {m + "break\n", "3:1", "'break' outside a repeat"},
        {m + "repeat 0 {\n}\n", "3:8", "between 1 and 1000"},
        {m + "if a.tokens > {\n}\n", "3:15", "expected a number"},
        {m + "if a.tokens 3 {\n}\n", "3:13", "expected a comparison"},
        {m + "run nothing\n", "3:5", "no stage 'nothing'"},
        {m + "repeat 2 {\n slot t[3]\n}\n", "4:2", "belongs at the top level"},
        {m + st + "output s, s, \n", "8:14", "expected a slot name"},
        // Checked against the model:
        {m + "stage a {\n prompt input\n write nowhere\n}\n", "5:8", "no slot named 'nowhere'"},
        {m + "stage a {\n prompt input + ghost\n write s\n}\n", "4:17", "no slot named 'ghost'"},
        {m + "stage a {\n model other\n prompt input\n write s\n}\n", "4:8", "no model named 'other'"},
        {m + "stage a {\n prompt input\n write input\n}\n", "5:8", "read-only"},
        {m + "stage a {\n prompt input\n write s\n max_tokens 40\n}\n", "3:7", "more than slot 's' holds (16)"},
        {m + st + "if a.perplexity > 3 {\n}\n", "8:6", "unknown statistic 'perplexity'"},
        {m + st + "if s.tokens > 3 {\n}\n", "8:6", "one statistic, 'length'"},
        {m + st + "if nobody.tokens > 3 {\n}\n", "8:4", "no stage or slot named 'nobody'"},
        {m + "if a.tokens > 3 {\n}\n" + st, "3:4", "written after this condition"},
        {m + st + "output input\n", "8:8", "'input' is the task itself"},
        {m + "model n = \"x.gguf\"\n" + st, "4:7", "names no model, and the cascade has several"},
        {m + "slot big[2000]\nstage a {\n prompt big + big\n write s\n max_tokens 4\n}\n", "5:2", "more than the context"},
        {m + "context 99999\n" + st, "3:9", "between 16 and 32768"},
        {"slot s[4]\n", "1:1", "declares no model"},
    };
    int i = 0;
    for (const BadSource& b : table) {
        CAPTURE(i++);
        CAPTURE(b.source);
        CascadeOptions o;
        o.models["m"] = stories();
        o.models["n"] = stories();
        auto parsed = parseCascade(b.source, "bad.cas");
        if (parsed) {
            for (auto it = o.models.begin(); it != o.models.end();) {
                bool declared = false;
                for (const auto& d : parsed->models) declared |= d.name == it->first;
                it = declared ? std::next(it) : o.models.erase(it);
            }
        }
        auto r = compileCascade(b.source, "bad.cas", o);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(std::string("bad.cas:") + b.where + ": ") == 0, r.message());
        CHECK_MESSAGE(r.message().find(b.message) != std::string::npos, r.message());
    }
    CHECK(table.size() >= 20);
}

TEST_CASE("cascade: models the cascade cannot use are refused with the reason") {
    TempDir dir;
    const std::string src = "model m = \"x.gguf\"\nslot s[8]\nstage a {\n prompt input\n write s\n}\n";
    CascadeOptions o;
    o.models["m"] = dir.path + "/missing.gguf";
    auto r = compileCascade(src, "c.cas", o);
    REQUIRE_FALSE(r);
    CHECK(r.message().find("missing.gguf") != std::string::npos);
    o.models["ghost"] = stories();
    r = compileCascade(src, "c.cas", o);
    REQUIRE_FALSE(r);
    CHECK(r.message().find("declares no model 'ghost'") != std::string::npos);
    // stories260K with one token's text changed: the same model, another vocabulary.
    std::string other = dir.path + "/other-vocab.gguf";
    {
        auto g = ggufOpen(stories());
        REQUIRE(g);
        GgufWriter w;
        for (const GgufKv& kv : g->kvs()) w.setValue(kv.key, kv.value);
        auto tokens = g->getStringArray("tokenizer.ggml.tokens");
        REQUIRE(tokens);
        std::vector<std::string> changed(tokens->begin(), tokens->end());
        changed[300] = "\xE2\x96\x81zebra";
        w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(changed));
        for (const GgufTensor& t : g->tensors()) {
            std::vector<int64_t> dims(t.ne.begin(), t.ne.begin() + t.n_dims);
            REQUIRE(w.addTensor(t.name, t.type, dims, g->rawTensorData(t)));
        }
        REQUIRE(w.write(other));
    }
    const std::string two = "model a = \"x\"\nmodel b = \"y\"\nslot s[8]\nstage x {\n model a\n prompt input\n write s\n}\n"
                            "stage y {\n model b\n prompt s\n write s\n}\n";
    CascadeOptions o2;
    o2.models["a"] = stories();
    o2.models["b"] = other;
    auto v = compileCascade(two, "c.cas", o2);
    REQUIRE_FALSE(v);
    CHECK_MESSAGE(v.message().find("c.cas:2:7: model 'b' has another vocabulary than model 'a'") == 0, v.message());
    CHECK(v.message().find("re-tokenizing") != std::string::npos);
}

TEST_CASE("cascade: run-time --model rebinding accepts the same tensors and refuses other types, naming the tensor") {
    TempDir dir;
    Module m = compileOk(program("entropy_skip"), {}, dir.path);
    std::string path = dir.path + "/c.bir";
    REQUIRE(writeModuleFile(m, path));
    CascadeRunOptions ro;
    ro.reference = true;
    ro.models["target"] = stories();
    auto ok = CascadeRunner::open(path, ro);
    REQUIRE_MESSAGE(ok, ok.message());
    std::string q8 = dir.path + "/q8.gguf";
    REQUIRE(quantizeGguf(stories(), q8, DType::Q8_0));
    ro.models["target"] = q8;
    auto bad = CascadeRunner::open(path, ro);
    REQUIRE_FALSE(bad);
    CHECK_MESSAGE(bad.message().find("--model target") == 0, bad.message());
    CHECK_MESSAGE(bad.message().find("compiled for") != std::string::npos, bad.message());
    ro.models = {{"nobody", stories()}};
    auto none = CascadeRunner::open(path, ro);
    REQUIRE_FALSE(none);
    CHECK(none.message().find("has no model 'nobody'") != std::string::npos);
}

// Byte-level damage to a source: flips, deletions, duplications and splices of other lines.
std::string mutate(const std::string& s, std::mt19937& rng) {
    std::string out = s;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !out.empty(); ++e) {
        size_t at = rng() % out.size();
        switch (rng() % 6) {
            case 0: out[at] = char(rng() % 256); break;
            case 1: out.erase(at, 1 + rng() % 8); break;
            case 2: out.insert(at, out.substr(rng() % out.size(), 1 + rng() % 24)); break;
            case 3: out[at] = "{}[]()=+,.<>\"#\n 0123456789"[rng() % 27]; break;
            case 4: {
                static const char* words[] = {"stage", "repeat", "break", "if", "else", "run", "and", "or", "not",
                                              "contains", "input", "slot", "model", "output", "budget", "skip if",
                                              "-1", "99999999999", "1e40", "\"\"", "\\"};
                out.insert(at, std::string(" ") + words[rng() % 21] + " ");
                break;
            }
            default: {
                size_t line = out.rfind('\n', at);
                size_t end = out.find('\n', at);
                if (line != std::string::npos && end != std::string::npos) out.insert(end, out.substr(line, end - line));
                break;
            }
        }
    }
    return out;
}

TEST_CASE("cascade: mutated sources compile or fail with FILE:LINE:COL; what compiles verifies and runs to a clean end") {
    std::mt19937 rng(1234);
    uint32_t compiled = 0, refused = 0, ran = 0;
    for (const char* name : {"draft_refine", "entropy_skip", "review_loop", "best_of"}) {
        std::string src = program(name);
        CascadeOptions o = optionsFor(src);
        for (int i = 0; i < 400; ++i) {
            std::string bad = mutate(src, rng);
            auto r = compileCascade(bad, "m.cas", o);
            if (!r) {
                ++refused;
                bool located = r.message().rfind("m.cas:", 0) == 0 || r.message().rfind("--model", 0) == 0;
                CHECK_MESSAGE(located, r.message());
                continue;
            }
            ++compiled;
            REQUIRE(verifyModule(r.value()));
            if (compiled % 8 != 0) continue;
            // Run a sample on the reference machine with a tight watchdog: it ends cleanly.
            auto w = WeightSource::open(r.value(), ".");
            REQUIRE_MESSAGE(w, w.message());
            RefMachine machine(r.value(), w.value(), MachineOptions{1, 400});
            machine.pushInput({0, 7, 0, 403, 407});
            machine.closeInput();
            RunReport rep = machine.run();
            CHECK(describeFaults(r.value(), rep.instances).empty());
            ++ran;
        }
    }
    MESSAGE("source mutants: " << compiled << " compiled, " << refused << " refused; " << ran << " ran");
    CHECK(refused > 0);
    CHECK(compiled > 0);
}

TEST_CASE("cascade: mutated compiled modules are refused at load or by CascadeInfo, or run without a crash") {
    TempDir dir;
    std::mt19937 rng(99);
    uint32_t refused = 0, loaded = 0;
    // best_of forks: its mutants run on three instances, so siblings take branches.
    for (const char* name : {"entropy_skip", "best_of"}) {
        Module m = compileOk(program(name), {}, dir.path);
        std::vector<uint8_t> bytes = serializeModule(m);
        const uint32_t instances = std::string(name) == "best_of" ? 3 : 1;
        for (int i = 0; i < 750; ++i) {
            std::vector<uint8_t> b = bytes;
            for (int e = 0; e < 1 + int(rng() % 3); ++e) b[rng() % b.size()] = uint8_t(rng());
            auto mod = parseModule(b, "mutant");
            if (!mod || !verifyModule(mod.value())) { ++refused; continue; }
            auto info = CascadeInfo::fromModule(mod.value());
            if (!info) { ++refused; continue; }
            ++loaded;
            if (loaded % 16 != 0) continue;
            auto w = WeightSource::open(mod.value(), dir.path);
            if (!w) continue;  // a damaged external path or offset
            RefMachine machine(mod.value(), w.value(), MachineOptions{instances, 300});
            machine.pushInput({0, 7, 0, 403, 407});
            machine.closeInput();
            (void)machine.run();  // faults and watchdog stops are fine; crashing is not
        }
    }
    MESSAGE("module mutants: " << refused << " refused, " << loaded << " loaded");
    CHECK(refused > 0);
}

TEST_CASE("cascade: every program in programs/ through bluec cascade and bluevm run prints the reference interpreter's slots") {
    for (std::string name : {"draft_refine", "entropy_skip", "review_loop", "speculative", "best_of"}) {
        CAPTURE(name);
        TempDir dir;
        const std::string src = greedy(program(name)), cas = dir.path + "/" + name + ".cas", bir = dir.path + "/p.bir";
        std::ofstream(cas) << src;
        std::vector<std::string> args = {binary("compiler/bluec"), "cascade", cas, "-o", bir};
        auto parsed = parseCascade(src, name);
        REQUIRE(parsed);
        for (const auto& m : parsed->models) args.insert(args.end(), {"--model", m.name + "=" + stories()});
        Child c(args);
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
        Child r({binary("host/bluevm"), "run", bir, "--prompt", "Once upon a time", "--seed", "3", "--stats",
                 "--dump-slots", dir.path + "/slots"});
        REQUIRE_MESSAGE(r.wait() == 0, r.err_text);
        auto stats = nlohmann::json::parse(r.err_text.substr(0, r.err_text.find('\n')));
        CHECK(stats["machine"]["round_trips"] == 0);
        auto ref = runSource(src, true, {{"Once upon a time", 3}});
        for (size_t k = 0; k < parsed->slots.size(); ++k) {
            const std::string& slot = parsed->slots[k].name;
            CAPTURE(slot);
            CHECK(readFile(dir.path + "/slots/" + slot + ".txt") == ref[0].slot_text[k]);
        }
        CHECK(r.out_text.find(ref[0].slot_text.back()) != std::string::npos);
    }
}

TEST_CASE("cascade: a stage's repetition penalties over a window longer than the device can walk are refused at load") {
    Child d({binary("host/bluevm"), "devices"});
    REQUIRE(d.wait() == 0);
    const bool cpu = d.out_text.find("(CPU)") != std::string::npos;
    TempDir dir;
    // 18,000 tokens of window at a context of 20,000: past lavapipe's loop limit (maxPenaltyWindow:
    // about 8,100 at a 300-token vocabulary); no limit on a GPU. A tiny synthetic model trained
    // for 32,768 positions (a cascade's context is at most its models').
    const std::string model = dir.path + "/long.gguf";
    Child synth({binary("tools/synth/blue-synth"), "--preset", "stories15M", "--layers", "1", "--dim", "64",
                 "--heads", "4", "--ff", "128", "--vocab", "300", "--ctx", "32768", "-t", "f32", "-o", model});
    REQUIRE_MESSAGE(synth.wait() == 0, synth.err_text);
    auto compile = [&](const std::string& name, uint32_t window, uint32_t context) {
        std::string src = dir.path + "/" + name + ".cas";
        std::ofstream(src) << "model m = \"" << model << "\"\ncontext " << context << "\nslot a[8]\nslot b[8]\n"
                           << "stage plain {\n prompt input\n write a\n max_tokens 2\n temperature 0\n}\n"
                           << "stage wide {\n prompt a\n write b\n max_tokens 2\n temperature 0\n"
                           << " repeat_penalty 1.1\n repeat_last_n " << window << "\n}\n";
        std::string bir = dir.path + "/" + name + ".bir";
        Child c({binary("compiler/bluec"), "cascade", src, "-o", bir});
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
        return bir;
    };
    const std::string wide = compile("wide", 18000, 20000);
    Child r({binary("host/bluevm"), "run", wide, "--prompt", "Lily"});
    if (cpu) {
        CHECK(r.wait(120) == 1);
        CHECK_MESSAGE(r.err_text.find("bluevm: " + wide + ": stage 'wide' applies repetition penalties over 18000 "
                                      "tokens (repeat_last_n), and this device applies them over at most ") == 0,
                      r.err_text);
        CHECK(r.err_text.find("give that stage repeat_last_n ") != std::string::npos);
        CHECK(r.out_text.empty());
    } else {
        CHECK(r.wait(120) == 0);
    }
    // Within the limit it runs (at a context whose buffers fit every emulated device's bindings).
    Child ok({binary("host/bluevm"), "run", compile("narrow", 2000, 2048), "--prompt", "Lily"});
    CHECK_MESSAGE(ok.wait(120) == 0, ok.err_text);
}

TEST_CASE("cascade: bluec cascade and bluevm run through the command line, with --stats, --dump-slots and errors") {
    TempDir dir;
    std::string bir = dir.path + "/loop.bir";
    {
        Child c({binary("compiler/bluec"), "cascade", sourceDir() + "/programs/review_loop.cas", "-o", bir,
                 "--model", "writer=" + stories(), "--model", "reviewer=" + stories()});
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    }
    std::string task = dir.path + "/task.txt";
    std::ofstream(task) << "Once upon a time\n";
    Child c({binary("host/bluevm"), "run", bir, "--input", task, "--seed", "5", "--stats", "--dump-slots", dir.path + "/slots"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    auto stats = nlohmann::json::parse(c.err_text.substr(0, c.err_text.find('\n')));
    CHECK(stats["machine"]["round_trips"] == 0);
    CHECK(stats["stages"].size() == 3);
    CHECK(stats["stages"][0]["name"] == "tell");
    // The printed output is the output slots, equal to the dumped slot files and to the reference run.
    auto ref = runSource(program("review_loop"), true, {{"Once upon a time", 5}});
    std::string story = readFile(dir.path + "/slots/story.txt");
    CHECK(story == ref[0].slot_text[0]);
    CHECK(readFile(dir.path + "/slots/verdict.txt") == ref[0].slot_text[1]);
    CHECK(c.out_text == "--- story ---\n" + ref[0].slot_text[0] + "\n--- verdict ---\n" + ref[0].slot_text[1] + "\n");
    // A bad source: one line, FILE:LINE:COL, exit 1.
    std::string bad = dir.path + "/bad.cas";
    std::ofstream(bad) << "model m = \"" << stories() << "\"\nslot s[4]\nstage a {\n prompt input\n write t\n}\n";
    Child e({binary("compiler/bluec"), "cascade", bad, "-o", dir.path + "/bad.bir"});
    CHECK(e.wait() == 1);
    CHECK_MESSAGE(e.err_text == "bluec: " + bad + ":5:8: no slot named 't'\n", e.err_text);
    // A task longer than the input slot.
    Child l({binary("host/bluevm"), "run", bir, "--prompt", std::string(3000, 'a') + " b c d e f g"});
    CHECK(l.wait() == 1);
    CHECK_MESSAGE(l.err_text.find("more than the cascade's input slot holds") != std::string::npos, l.err_text);
}

}  // namespace
}  // namespace blue::test
