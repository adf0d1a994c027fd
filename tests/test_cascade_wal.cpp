// Durable slots and traces of cascades (host/cascade/cascade_wal, cascade_durable, cascade_trace;
// the checkpoints and resume jump table of compiler/cascade/lower.cpp): a run resumed from any
// checkpoint ends exactly as an uninterrupted one; `bluevm run --wal` killed with SIGKILL at
// several points and restarted ends with the uninterrupted run's slots, on the GPU and on the
// reference interpreter; corrupt or foreign logs are refused naming the file, the byte and the
// fault, a torn last record is dropped with a notice; byte flips and truncations of a log are
// always detected and never crash; traces carry the run's statistics, slots and preference pair.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "compiler/cascade/cascade.h"
#include "host/cascade/cascade_durable.h"
#include "host/cascade/cascade_trace.h"
#include "host/cascade/cascade_wal.h"
#include "tests/child.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "vm/cascade_abi.h"

namespace blue::test {
namespace {

namespace fs = std::filesystem;

std::string stories() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }
std::string binary(const std::string& rel) { return std::string(BLUE_BINARY_DIR) + "/" + rel; }

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}
std::vector<uint8_t> readBytes(const std::string& path) {
    std::string s = readText(path);
    return {s.begin(), s.end()};
}
void writeBytes(const std::string& path, std::span<const uint8_t> b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}


// review_loop.cas with more rounds, so that a run reports enough checkpoints to be killed
// between them.
std::string longReviewLoop() {
    std::string src = readText(sourceDir() + "/programs/review_loop.cas");
    size_t at = src.find("repeat 3 {");
    REQUIRE(at != std::string::npos);
    src.replace(at, 10, "repeat 5 {");
    return src;
}

// Compiles a source with bluec (every model stories260K) into DIR/NAME.bir.
std::string compileCli(const TempDir& dir, const std::string& name, const std::string& source) {
    std::string cas = dir.path + "/" + name + ".cas", bir = dir.path + "/" + name + ".bir";
    std::ofstream(cas) << source;
    auto p = parseCascade(source, cas);
    REQUIRE_MESSAGE(p, p.message());
    std::vector<std::string> args = {binary("compiler/bluec"), "cascade", cas, "-o", bir};
    for (const auto& m : p->models) {
        args.push_back("--model");
        args.push_back(m.name + "=" + stories());
    }
    Child c(args);
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    return bir;
}

std::unique_ptr<CascadeRunner> openRunner(const std::string& bir, bool reference) {
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.max_submit_ms = 0;
    auto r = CascadeRunner::open(bir, ro);
    REQUIRE_MESSAGE(r, r.message());
    return std::move(r.value());
}

// Stage statistics without cycles (which count the machine's cycles, not the text's).
void checkSameStages(const CascadeResult& a, const CascadeResult& b) {
    REQUIRE(a.stages.size() == b.stages.size());
    for (size_t s = 0; s < a.stages.size(); ++s) {
        INFO("stage " << a.stages[s].name);
        CHECK(a.stages[s].state == b.stages[s].state);
        CHECK(a.stages[s].tokens == b.stages[s].tokens);
        CHECK(a.stages[s].runs == b.stages[s].runs);
        CHECK(a.stages[s].entropy_sum == b.stages[s].entropy_sum);
        CHECK(a.stages[s].entropy_max == b.stages[s].entropy_max);
        CHECK(a.stages[s].logprob_sum == b.stages[s].logprob_sum);
    }
}

CascadeCheckpoint withoutCycles(CascadeCheckpoint c) {
    c.stats[BLUE_CAS_ST_CYCLES] = 0;
    return c;
}

// ---- the program's checkpoints and resume requests -------------------------------------------

// Runs `source` once, then again resumed after each of its checkpoints; returns the
// uninterrupted run's checkpoints.
std::vector<CascadeCheckpoint> resumeFromEveryCheckpoint(const std::string& source, bool reference, uint32_t steps,
                                                         uint32_t loops, uint32_t seed) {
    TempDir dir;
    std::string bir = compileCli(dir, "c", source);
    auto runner = openRunner(bir, reference);
    const CascadeInfo& info = runner->info();
    CHECK(info.steps == steps);
    CHECK(info.loops == loops);
    CascadeTask task{"Once upon a time", seed};
    auto full = runner->run({task});
    REQUIRE_MESSAGE(full, full.message());
    const CascadeResult& base = full.value()[0];
    REQUIRE(base.complete);
    const auto& cps = base.checkpoints;
    MESSAGE(std::string(reference ? "reference" : "GPU") << ": " << cps.size() << " checkpoints");
    REQUIRE(cps.size() >= 5);
    // The checkpoints follow the program: step 1 (tell) first, counters never go back, the slot
    // of the last one that wrote `story` is the final story.
    CHECK(cps[0].step == 1);
    CHECK(cps[0].stage == 0);
    CHECK(cps[0].runs == 1);
    for (size_t k = 1; k < cps.size(); ++k) {
        CHECK(cps[k].runs == cps[k - 1].runs + (cps[k].stats[BLUE_CAS_ST_STATE] == BLUE_CAS_STATE_RAN ? 1 : 0));
        CHECK(cps[k].total >= cps[k - 1].total);
        CHECK(cps[k].loops[0] >= cps[k - 1].loops[0]);
        CHECK(cps[k].total == cps[k - 1].total + (cps[k].stats[BLUE_CAS_ST_STATE] == BLUE_CAS_STATE_RAN ? cps[k].stats[BLUE_CAS_ST_TOKENS] : 0));
    }
    for (size_t k = cps.size(); k-- > 0;) {
        if (cps[k].slot == 0) {
            CHECK(std::vector<int32_t>(cps[k].tokens.begin(), cps[k].tokens.end()) == base.slots[0]);
            break;
        }
    }
    // Resumed after each checkpoint, the run ends with the same slots and statistics and reports
    // the remaining checkpoints again.
    CascadeResume state = CascadeResume::initial(info);
    for (size_t k = 0; k < cps.size(); ++k) {
        state.apply(cps[k]);
        CascadeTask t = task;
        t.resume = &state;
        auto r = runner->run({t});
        REQUIRE_MESSAGE(r, r.message());
        const CascadeResult& res = r.value()[0];
        INFO("resumed after checkpoint " << k + 1);
        REQUIRE(res.complete);
        CHECK(res.slots == base.slots);
        checkSameStages(res, base);
        REQUIRE(res.checkpoints.size() == cps.size() - k - 1);
        for (size_t j = 0; j < res.checkpoints.size(); ++j) CHECK(withoutCycles(res.checkpoints[j]) == withoutCycles(cps[k + 1 + j]));
    }
    return cps;
}

TEST_CASE("cascade wal: a run resumed after any checkpoint ends as the uninterrupted run (reference)") {
    resumeFromEveryCheckpoint(longReviewLoop(), true, 3, 1, 11);
}

TEST_CASE("cascade wal: a run resumed after any checkpoint ends as the uninterrupted run (GPU)") {
    resumeFromEveryCheckpoint(longReviewLoop(), false, 3, 1, 11);
}

TEST_CASE("cascade wal: resuming inside nested loops, if/else branches, `run`, skips and a spent budget") {
    const std::string src = R"(
model m = "x.gguf"
slot a[60]
slot b[40]
budget 64
stage first {
    prompt input
    write a
    max_tokens 8
    temperature 0.9
}
repeat 3 {
    repeat 2 {
        stage grow {
            skip if a.length > 12
            prompt a
            append a
            max_tokens 6
            temperature 0.9
        }
        if b.length == 0 and grow.tokens > 0 {
            stage note {
                prompt a + " So"
                write b
                max_tokens 5
                temperature 0.9
            }
        } else {
            run first
        }
    }
    run note
    break if b contains "zzzz"
}
output a, b
)";
    auto cps = resumeFromEveryCheckpoint(src, true, 5, 2, 3);
    std::set<uint32_t> states, steps;
    bool inner_loop_moved = false;
    for (const CascadeCheckpoint& c : cps) {
        states.insert(c.stats[BLUE_CAS_ST_STATE]);
        steps.insert(c.step);
        inner_loop_moved |= c.loops[1] > 0;
    }
    CHECK(states.count(BLUE_CAS_STATE_RAN));
    CHECK(states.count(BLUE_CAS_STATE_SKIPPED));
    CHECK(states.count(BLUE_CAS_STATE_NO_BUDGET));
    CHECK(inner_loop_moved);
    MESSAGE("nested: " << cps.size() << " checkpoints over " << steps.size() << " of 5 steps");
    CHECK(steps.size() == 5);
}

// ---- the log format ----------------------------------------------------------------------------

CascadeInfo smallInfo() {
    CascadeInfo info;
    info.stages = {"a", "b"};
    info.slots = {"s", "t"};
    info.slot_capacity = {8, 4};
    info.steps = 3;
    info.loops = 1;
    return info;
}

std::vector<CascadeCheckpoint> smallCheckpoints() {
    std::vector<CascadeCheckpoint> cps;
    for (uint32_t k = 0; k < 4; ++k) {
        CascadeCheckpoint c;
        c.step = 1 + k % 3;
        c.stage = k % 2;
        c.runs = k + 1;
        c.total = 3 * k;
        c.loops = {k / 2};
        c.stats = {BLUE_CAS_STATE_RAN, k, 0x3f800000u, 0x40000000u, 0xbf000000u, 100 + k, k + 1};
        c.slot = k % 2;
        for (uint32_t i = 0; i <= k; ++i) c.tokens.push_back(300 + 7 * i);
        cps.push_back(c);
    }
    return cps;
}

CascadeResult smallFinal() {
    CascadeResult r;
    r.stages.resize(2);
    r.stages[0].name = "a";
    r.stages[1].name = "b";
    r.stages[0].state = BLUE_CAS_STATE_RAN;
    r.stages[0].tokens = 3;
    r.stages[0].entropy_sum = 1.5f;
    r.stages[1].state = BLUE_CAS_STATE_SKIPPED;
    r.slots = {{1, 2, 3}, {}};
    return r;
}

const WalIdentity kId{0, 0x1122334455667788ull, 0x99aabbccddeeff00ull, 42};

// Header, checkpoints, final record; `ends[k]`: the offset where record k ends.
std::vector<uint8_t> smallLog(std::vector<size_t>* ends, bool with_final = true) {
    std::vector<uint8_t> log = walHeader(kId);
    for (const CascadeCheckpoint& c : smallCheckpoints()) {
        auto rec = walRecord(walCheckpointPayload(c));
        log.insert(log.end(), rec.begin(), rec.end());
        if (ends) ends->push_back(log.size());
    }
    if (with_final) {
        auto rec = walRecord(walFinalPayload(smallFinal()));
        log.insert(log.end(), rec.begin(), rec.end());
        if (ends) ends->push_back(log.size());
    }
    return log;
}

TEST_CASE("cascade wal: records round-trip; byte flips are always refused, truncations keep a prefix and report a torn record") {
    const CascadeInfo info = smallInfo();
    std::vector<size_t> ends;
    const std::vector<uint8_t> log = smallLog(&ends);
    auto whole = walParse(log, "t.wal", kId, info);
    REQUIRE_MESSAGE(whole, whole.message());
    CHECK(whole->checkpoints == smallCheckpoints());
    REQUIRE(whole->final);
    CHECK(whole->final->slots == smallFinal().slots);
    CHECK(whole->final->stages[0].entropy_sum == 1.5f);
    CHECK(whole->final->stages[1].state == BLUE_CAS_STATE_SKIPPED);
    CHECK(whole->final->generated == 3);
    CHECK(whole->torn.empty());
    CHECK(whole->valid_bytes == log.size());

    std::mt19937 rng(7);
    int flips = 0;
    for (int trial = 0; trial < 4000; ++trial) {
        std::vector<uint8_t> bad = log;
        size_t at = rng() % bad.size();
        bad[at] ^= uint8_t(1 + rng() % 255);
        auto r = walParse(bad, "t.wal", kId, info);
        INFO("byte " << at << " flipped");
        REQUIRE_FALSE(r);
        CHECK(r.message().rfind("t.wal: byte ", 0) == 0);
        ++flips;
    }
    // Every byte once, too.
    for (size_t at = 0; at < log.size(); ++at) {
        std::vector<uint8_t> bad = log;
        bad[at] ^= 0x01;
        INFO("byte " << at << " flipped");
        CHECK_FALSE(walParse(bad, "t.wal", kId, info));
    }
    int torn = 0, clean = 0;
    for (size_t len = 0; len < log.size(); ++len) {
        std::span<const uint8_t> cut(log.data(), len);
        auto r = walParse(cut, "t.wal", kId, info);
        INFO("cut to " << len << " bytes");
        if (len < kWalHeaderBytes) {
            REQUIRE_FALSE(r);
            CHECK((r.message().find("truncated header") != std::string::npos || r.message().find("empty file") != std::string::npos));
            continue;
        }
        REQUIRE_MESSAGE(r, r.message());
        size_t complete = 0;
        while (complete < ends.size() && ends[complete] <= len) ++complete;
        size_t boundary = complete ? ends[complete - 1] : kWalHeaderBytes;
        CHECK(r->valid_bytes == boundary);
        CHECK(r->torn.empty() == (len == boundary));
        if (!r->torn.empty()) {
            CHECK(r->torn.find("t.wal: byte " + std::to_string(boundary) + ": the last record is torn") == 0);
            ++torn;
        } else {
            ++clean;
        }
        const auto all = smallCheckpoints();
        CHECK(r->checkpoints == std::vector<CascadeCheckpoint>(all.begin(), all.begin() + ptrdiff_t(std::min(complete, all.size()))));
        CHECK(!r->final);
    }
    MESSAGE(flips << " random flips refused; truncations: " << torn << " torn, " << clean << " at record boundaries");
    // Garbage never crashes and is refused.
    for (int trial = 0; trial < 500; ++trial) {
        std::vector<uint8_t> junk(rng() % 300);
        for (uint8_t& b : junk) b = uint8_t(rng());
        if (trial % 2 && junk.size() >= kWalHeaderBytes) {
            auto h = walHeader(kId);
            std::copy(h.begin(), h.end(), junk.begin());  // a good header, then garbage
        }
        auto r = walParse(junk, "g.wal", kId, info);
        if (junk.size() == kWalHeaderBytes && trial % 2) continue;  // the header alone is a valid empty log
        bool refused_or_torn = !r || !r->torn.empty();
        CHECK(refused_or_torn);
    }
}

TEST_CASE("cascade wal: the header names what does not match, with its byte offset") {
    const CascadeInfo info = smallInfo();
    const std::vector<uint8_t> log = smallLog(nullptr);
    auto refused = [&](WalIdentity want, const std::string& expect) {
        auto r = walParse(log, "x.wal", want, info);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(expect) != std::string::npos, r.message());
    };
    WalIdentity id = kId;
    id.seed = 43;
    refused(id, "x.wal: byte 32: written for seed 42; this run's seed is 43");
    id = kId;
    id.module_hash ^= 1;
    refused(id, "x.wal: byte 16: written for another module");
    id = kId;
    id.task_hash ^= 1;
    refused(id, "x.wal: byte 24: written for another task");
    id = kId;
    id.engine = 1;
    refused(id, "x.wal: byte 12: written by a run on the GPU; this run uses the reference interpreter");
    std::vector<uint8_t> v = log;
    v[0] = 'X';
    CHECK(walParse(v, "x.wal", kId, info).message() == "x.wal: byte 0: not a BlueVM write-ahead log (no BLUEWAL magic)");
    CHECK(walParse(std::span(log.data(), 20), "x.wal", kId, info).message() == "x.wal: byte 20: truncated header (20 of 40 bytes)");
    // A record that does not fit the module: slot 1 holds 4 tokens.
    CascadeCheckpoint c = smallCheckpoints()[3];
    c.slot = 1;
    c.tokens.push_back(1);
    std::vector<uint8_t> big = walHeader(kId);
    auto rec = walRecord(walCheckpointPayload(c));
    big.insert(big.end(), rec.begin(), rec.end());
    auto r = walParse(big, "x.wal", kId, info);
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.message().find("x.wal: byte 40: record 0:") == 0, r.message());
    // Records after a final record.
    std::vector<uint8_t> after = log;
    after.insert(after.end(), rec.begin(), rec.end());
    auto a = walParse(after, "x.wal", kId, info);
    REQUIRE_FALSE(a);
    CHECK_MESSAGE(a.message().find("data after the final record") != std::string::npos, a.message());
}

TEST_CASE("cascade wal: the writer creates a whole header, appends records and cuts a torn tail") {
    TempDir dir;
    const CascadeInfo info = smallInfo();
    std::string path = dir.path + "/w.wal";
    {
        auto w = WalWriter::create(path, kId);
        REQUIRE_MESSAGE(w, w.message());
        for (const CascadeCheckpoint& c : smallCheckpoints()) REQUIRE(w->append(walCheckpointPayload(c)));
    }
    CHECK(fs::directory_iterator(dir.path)->path() == path);  // no temporary left
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
    CHECK_FALSE(WalWriter::create(path, kId));  // never over an existing log
    auto r = walRead(path, kId, info);
    REQUIRE_MESSAGE(r, r.message());
    CHECK(r->checkpoints == smallCheckpoints());
    // A torn tail: half of another record.
    std::vector<uint8_t> bytes = readBytes(path);
    size_t good = bytes.size();
    auto rec = walRecord(walCheckpointPayload(smallCheckpoints()[0]));
    bytes.insert(bytes.end(), rec.begin(), rec.begin() + ptrdiff_t(rec.size() / 2));
    writeBytes(path, bytes);
    auto t = walRead(path, kId, info);
    REQUIRE_MESSAGE(t, t.message());
    CHECK(t->valid_bytes == good);
    CHECK(t->torn.find(path + ": byte " + std::to_string(good) + ": the last record is torn") == 0);
    {
        auto w = WalWriter::open(path);
        REQUIRE_MESSAGE(w, w.message());
        auto bytes_read = w->contents();
        REQUIRE(bytes_read);
        CHECK(bytes_read.value() == bytes);
        // While one writer holds the log, another cannot open it.
        auto second = WalWriter::open(path);
        REQUIRE_FALSE(second);
        CHECK(second.message() == path + ": the log is in use by another process");
        REQUIRE(w->cut(t->valid_bytes));
        REQUIRE(w->append(walFinalPayload(smallFinal())));
    }
    auto f = walRead(path, kId, info);
    REQUIRE_MESSAGE(f, f.message());
    CHECK(f->torn.empty());
    CHECK(f->checkpoints == smallCheckpoints());
    CHECK(f->final);
}

// ---- bluevm run --wal: SIGKILL and restart ------------------------------------------------------

// Complete records in a log file (header and whole records only; 0 before the header).
size_t recordsIn(const std::string& path) {
    std::vector<uint8_t> b = readBytes(path);
    if (b.size() < kWalHeaderBytes) return 0;
    size_t at = kWalHeaderBytes, n = 0;
    while (b.size() - at >= kWalRecordHeaderBytes) {
        uint32_t len = uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 | uint32_t(b[at + 3]) << 24;
        if (b.size() - at - kWalRecordHeaderBytes < len) break;
        at += kWalRecordHeaderBytes + len;
        ++n;
    }
    return n;
}

std::vector<std::string> runArgs(const std::string& bir, const std::string& wal, const std::string& slots, bool ref,
                                 const std::string& seed = "11") {
    std::vector<std::string> a = {binary("host/bluevm"), "run", bir, "--prompt", "Once upon a time", "--seed", seed,
                                  "--wal", wal, "--dump-slots", slots};
    if (ref) a.push_back("--ref");
    return a;
}

void killAndResume(bool ref) {
    TempDir dir;
    std::string bir = compileCli(dir, "loop", longReviewLoop());
    // The uninterrupted run; its log ends with the final record.
    std::string base_wal = dir.path + "/base.wal";
    Child base(runArgs(bir, base_wal, dir.path + "/base", ref));
    REQUIRE_MESSAGE(base.wait() == 0, base.err_text);
    const size_t base_records = recordsIn(base_wal);
    MESSAGE(std::string(ref ? "reference" : "GPU") << ": the uninterrupted run logged " << base_records << " records");
    REQUIRE(base_records >= 6);  // at least 5 checkpoints and the final record
    const std::string story = readText(dir.path + "/base/story.txt"), verdict = readText(dir.path + "/base/verdict.txt");
    CHECK(!story.empty());
    for (size_t kill_after : {1u, 2u, 4u}) {
        INFO("killed after checkpoint " << kill_after);
        std::string wal = dir.path + "/k" + std::to_string(kill_after) + ".wal";
        std::string slots = dir.path + "/k" + std::to_string(kill_after);
        size_t logged = 0;
        {
            Child c(runArgs(bir, wal, slots, ref));
            auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
            while ((logged = recordsIn(wal)) < kill_after && std::chrono::steady_clock::now() < until) {
                c.pump(0);
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            REQUIRE(waitpid(c.pid, nullptr, WNOHANG) == 0);  // still running: the kill lands mid-cascade
            kill(c.pid, SIGKILL);
            waitpid(c.pid, nullptr, 0);
            c.pid = -1;
        }
        logged = recordsIn(wal);
        MESSAGE("killed with " << logged << " records in the log");
        REQUIRE(logged >= kill_after);
        REQUIRE(logged < base_records);
        Child again(runArgs(bir, wal, slots, ref));
        REQUIRE_MESSAGE(again.wait() == 0, again.err_text);
        CHECK_MESSAGE(again.err_text.find(wal + ": resuming after step ") != std::string::npos, again.err_text);
        CHECK_MESSAGE(again.err_text.find("checkpoint " + std::to_string(logged)) != std::string::npos, again.err_text);
        CHECK(readText(slots + "/story.txt") == story);
        CHECK(readText(slots + "/verdict.txt") == verdict);
        CHECK(recordsIn(wal) == base_records);
    }
    // A finished log answers without running; a torn tail is dropped with a notice.
    Child done(runArgs(bir, base_wal, dir.path + "/done", ref));
    REQUIRE_MESSAGE(done.wait() == 0, done.err_text);
    CHECK_MESSAGE(done.err_text.find("the run finished before") != std::string::npos, done.err_text);
    CHECK(readText(dir.path + "/done/story.txt") == story);
    CHECK(done.out_text == base.out_text);
    std::vector<uint8_t> bytes = readBytes(dir.path + "/k2.wal");
    std::string torn_wal = dir.path + "/torn.wal";
    // The first three records and half of the fourth.
    {
        size_t at = kWalHeaderBytes;
        for (int k = 0; k < 3; ++k) {
            at += kWalRecordHeaderBytes + (uint32_t(bytes[at]) | uint32_t(bytes[at + 1]) << 8 | uint32_t(bytes[at + 2]) << 16);
        }
        bytes.resize(at + 9);
        writeBytes(torn_wal, bytes);
    }
    Child torn(runArgs(bir, torn_wal, dir.path + "/torn", ref));
    REQUIRE_MESSAGE(torn.wait() == 0, torn.err_text);
    CHECK_MESSAGE(torn.err_text.find("the last record is torn (9 of its 12 header bytes); dropped") != std::string::npos, torn.err_text);
    CHECK_MESSAGE(torn.err_text.find("checkpoint 3") != std::string::npos, torn.err_text);
    CHECK(readText(dir.path + "/torn/story.txt") == story);
    CHECK(readText(dir.path + "/torn/verdict.txt") == verdict);
}

TEST_CASE("cascade wal: bluevm run --wal killed with SIGKILL after 1, 2 and 4 checkpoints resumes to the same slots (GPU)") {
    killAndResume(false);
}

TEST_CASE("cascade wal: bluevm run --wal killed with SIGKILL after 1, 2 and 4 checkpoints resumes to the same slots (reference)") {
    killAndResume(true);
}

TEST_CASE("cascade wal: bluevm run refuses corrupt and foreign logs, naming the file, the byte and the fault") {
    TempDir dir;
    std::string bir = compileCli(dir, "loop", readText(sourceDir() + "/programs/review_loop.cas"));
    std::string good = dir.path + "/good.wal";
    {
        Child c(runArgs(bir, good, dir.path + "/s", true));
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    }
    const std::vector<uint8_t> log = readBytes(good);
    REQUIRE(log.size() > kWalHeaderBytes + 64);
    auto refused = [&](const std::string& name, const std::vector<uint8_t>& bytes, const std::string& expect,
                       bool ref = true, const std::string& seed = "11") {
        std::string wal = dir.path + "/" + name;
        writeBytes(wal, bytes);
        Child c(runArgs(bir, wal, dir.path + "/" + name + ".slots", ref, seed));
        INFO(name);
        CHECK(c.wait() == 1);
        CHECK_MESSAGE(c.err_text.find("bluevm: " + wal + ": byte " + expect) != std::string::npos, c.err_text);
        CHECK(c.out_text.empty());
        CHECK(readBytes(wal) == bytes);  // a refused log is left as it was
    };
    std::vector<uint8_t> flipped = log;
    flipped[kWalHeaderBytes + kWalRecordHeaderBytes + 5] ^= 0x10;
    refused("flipped.wal", flipped, "40: record 0: payload checksum mismatch");
    refused("header.wal", std::vector<uint8_t>(log.begin(), log.begin() + 30), "30: truncated header (30 of 40 bytes)");
    std::vector<uint8_t> garbage(200);
    std::mt19937 rng(3);
    for (uint8_t& b : garbage) b = uint8_t(rng());
    refused("garbage.wal", garbage, "0: not a BlueVM write-ahead log");
    refused("seed.wal", log, "32: written for seed 11; this run's seed is 12", true, "12");
    refused("engine.wal", log, "12: written by a run on the reference interpreter; this run uses the GPU", false);
    {
        // A log another run holds.
        auto held = WalWriter::open(good);
        REQUIRE(held);
        Child c(runArgs(bir, good, dir.path + "/held", true));
        CHECK(c.wait() == 1);
        CHECK_MESSAGE(c.err_text == "bluevm: " + good + ": the log is in use by another process\n", c.err_text);
    }
    // Another module: the same source with another stage length.
    std::string src = readText(sourceDir() + "/programs/review_loop.cas");
    size_t at = src.find("max_tokens 40");
    REQUIRE(at != std::string::npos);
    src.replace(at, 13, "max_tokens 36");
    std::string other = compileCli(dir, "other", src);
    std::string wal = dir.path + "/module.wal";
    writeBytes(wal, log);
    std::vector<std::string> args = runArgs(other, wal, dir.path + "/m", true);
    Child c(args);
    CHECK(c.wait() == 1);
    CHECK_MESSAGE(c.err_text.find("bluevm: " + wal + ": byte 16: written for another module") != std::string::npos, c.err_text);
}

// ---- traces ---------------------------------------------------------------------------------------

TEST_CASE("cascade trace: one JSON line per task with the runner's statistics, every slot and the preference pair") {
    TempDir dir;
    std::string src = readText(sourceDir() + "/programs/draft_refine.cas");
    REQUIRE(src.find("prefer story over sketch") != std::string::npos);
    std::string bir = compileCli(dir, "dr", src);
    std::string trace = dir.path + "/t.jsonl";
    for (int pass = 0; pass < 2; ++pass) {  // appends
        Child c({binary("host/bluevm"), "run", bir, "--prompt", "Lily wanted", "--seed", "4", "--instances", "2", "--ref",
                 "--trace", trace});
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    }
    auto runner = openRunner(bir, true);
    CHECK(runner->info().prefer_chosen == 1);
    CHECK(runner->info().prefer_rejected == 0);
    std::vector<CascadeTask> tasks = {{"Lily wanted", 4}, {"Lily wanted", 5}};
    auto results = runner->run(tasks);
    REQUIRE_MESSAGE(results, results.message());
    std::ifstream in(trace);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    REQUIRE(lines.size() == 4);
    for (size_t i = 0; i < lines.size(); ++i) {
        const nlohmann::json& j = lines[i];
        const CascadeResult& r = results.value()[i % 2];
        INFO("line " << i);
        CHECK(j["task"] == "Lily wanted");
        CHECK(j["seed"] == tasks[i % 2].seed);
        CHECK(j["generated"] == r.generated);
        REQUIRE(j["stages"].size() == r.stages.size());
        for (size_t s = 0; s < r.stages.size(); ++s) {
            const auto& js = j["stages"][s];
            const StageStats& st = r.stages[s];
            CHECK(js["name"] == st.name);
            CHECK(js["state"] == st.stateName());
            CHECK(js["runs"] == st.runs);
            CHECK(js["tokens"] == st.tokens);
            CHECK(js["cycles"] == st.cycles);
            CHECK(float(js["entropy_mean"].get<double>()) == st.entropyMean());
            CHECK(float(js["entropy_max"].get<double>()) == st.entropy_max);
            CHECK(float(js["logprob_mean"].get<double>()) == st.logprobMean());
        }
        CHECK(j["stages"][0]["tokens"].get<uint32_t>() > 0);
        CHECK(j["slots"]["sketch"] == r.slot_text[0]);
        CHECK(j["slots"]["story"] == r.slot_text[1]);
        CHECK(j["preference"]["prompt"] == "Lily wanted");
        CHECK(j["preference"]["chosen"] == r.slot_text[1]);
        CHECK(j["preference"]["rejected"] == r.slot_text[0]);
        CHECK(!r.slot_text[1].empty());
    }
    CHECK(lines[0]["slots"] != lines[1]["slots"]);  // two seeds, two samples
}

TEST_CASE("cascade prefer: bad preference statements fail with FILE:LINE:COL") {
    const std::string head = "model m = \"" + stories() + "\"\nslot a[80]\nslot b[80]\nstage s {\n prompt input\n write a\n}\n";
    auto fails = [&](const std::string& line, const std::string& expect) {
        CascadeOptions o;
        auto r = compileCascade(head + line + "\n", "p.cas", o);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message() == "p.cas:" + expect, r.message());
    };
    fails("prefer c over a", "8:8: prefer: no slot named 'c'");
    fails("prefer a over a", "8:15: prefer: a slot cannot be preferred over itself");
    fails("prefer input over a", "8:8: prefer: 'input' is the task (the pair's prompt); name slots the stages write");
    fails("prefer a b", "8:10: expected 'over' after the preferred slot, found 'b'");
    fails("prefer a over b\nprefer b over a", "9:1: 'prefer' is given twice (line 8)");
    fails("repeat 2 {\n prefer a over b\n}", "9:2: 'prefer' belongs at the top level, not inside a block");
    CascadeOptions o;
    auto ok = compileCascade(head + "prefer b over a\n", "p.cas", o);
    REQUIRE_MESSAGE(ok, ok.message());
    auto info = CascadeInfo::fromModule(ok.value());
    REQUIRE(info);
    CHECK(info->prefer_chosen == 1);
    CHECK(info->prefer_rejected == 0);
    CHECK(info->steps == 1);
    CHECK(info->loops == 0);
}

}  // namespace
}  // namespace blue::test
