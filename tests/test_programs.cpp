// Golden programs: every programs/*.blue runs on the reference machine and on the GPU; both must
// print the program's `; expect:` lines (or `; expect-unordered:` lines as a set), and the GPU's
// per-instance output must equal the reference machine's.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/asm.h"
#include "tests/gpu_fixture.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/output.h"

namespace blue::test {
namespace {

struct Golden {
    std::string path;
    uint32_t instances = 1;
    std::string input;
    std::vector<std::string> expect, unordered;
};

Golden readGolden(const std::string& path) {
    Golden g{path};
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("; run:", 0) == 0) {
            std::istringstream ss(line.substr(6));
            std::string flag;
            while (ss >> flag) {
                if (flag == "--instances") ss >> g.instances;
                if (flag == "--input") ss >> g.input;
            }
        } else if (line.rfind("; expect: ", 0) == 0) {
            g.expect.push_back(line.substr(10));
        } else if (line.rfind("; expect-unordered: ", 0) == 0) {
            g.unordered.push_back(line.substr(20));
        }
    }
    return g;
}

std::vector<std::vector<uint32_t>> readInput(const std::string& path) {
    std::vector<std::vector<uint32_t>> messages;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        std::vector<uint32_t> msg;
        long long v;
        while (ss >> v) msg.push_back(uint32_t(v));
        if (!msg.empty()) messages.push_back(msg);
    }
    return messages;
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream ss(text);
    std::string l;
    while (std::getline(ss, l)) out.push_back(l);
    return out;
}

// The text lines without the "[id] " prefix, sorted.
std::vector<std::string> sortedBodies(const std::vector<std::string>& ls) {
    std::vector<std::string> out;
    for (const std::string& l : ls) {
        size_t cut = l.rfind('[', 0) == 0 ? l.find("] ") : std::string::npos;
        out.push_back(cut == std::string::npos ? l : l.substr(cut + 2));
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::string> listing(const Module& m, const RunReport& r, uint32_t instances) {
    std::vector<std::string> text(instances);
    appendOutputText(m, r.output, &text);
    return lines(formatInstanceOutput(text));
}

std::vector<std::string> goldenPrograms() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(sourceDir() + "/programs")) {
        if (e.path().extension() == ".blue") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

TEST_CASE("every golden program prints its expected output on the reference machine and the GPU") {
    std::vector<std::string> programs = goldenPrograms();
    REQUIRE(programs.size() >= 5);
    for (const std::string& path : programs) {
        CAPTURE(path);
        Golden g = readGolden(path);
        REQUIRE_MESSAGE(g.expect.size() + g.unordered.size() > 0, "no expect lines");
        auto m = assembleFile(path);
        REQUIRE_MESSAGE(m.isOk(), m.message());
        auto w = WeightSource::open(m.value(), sourceDir() + "/programs");
        REQUIRE(w.isOk());
        auto inputs = g.input.empty() ? std::vector<std::vector<uint32_t>>{}
                                       : readInput(sourceDir() + "/programs/" + g.input);
        BothRuns runs = runBoth(m.value(), w.value(), g.instances, inputs);
        for (const RunReport* r : {&runs.ref, &runs.gpu}) {
            CHECK_MESSAGE(r->status.isOk(), r->status.message());
            for (const InstanceReport& ir : r->instances) CHECK(ir.status == BLUE_ST_HALTED);
            std::vector<std::string> got = listing(m.value(), *r, g.instances);
            if (!g.expect.empty()) CHECK(got == g.expect);
            if (!g.unordered.empty()) CHECK(sortedBodies(got) == sortedBodies(g.unordered));
        }
        // Per instance, the GPU prints exactly what the reference machine prints, except where
        // the program's work distribution is timing-dependent (unordered expectations).
        if (g.unordered.empty()) {
            CHECK(listing(m.value(), runs.gpu, g.instances) == listing(m.value(), runs.ref, g.instances));
        }
        CHECK(runs.stats.round_trips == 0);
        CHECK_NO_VALIDATION_ERRORS();
    }
}

// An independent check of collatz.blue's answer, so the expected lines are not merely echoed.
TEST_CASE("collatz expectation matches a direct computation") {
    uint32_t best = 0, best_n = 0;
    uint64_t total = 0;
    for (uint32_t n = 1; n <= 100000; ++n) {
        uint64_t x = n;
        uint32_t steps = 0;
        while (x != 1) {
            x = (x & 1) ? 3 * x + 1 : x / 2;
            ++steps;
        }
        total += steps;
        if (steps > best) {
            best = steps;
            best_n = n;
        }
    }
    Golden g = readGolden(sourceDir() + "/programs/collatz.blue");
    REQUIRE(g.expect.size() == 2);
    CHECK(g.expect[0] == strFormat("[0] longest chain below 100001: %u steps from %u", best, best_n));
    CHECK(g.expect[1] == strFormat("[0] total steps: %llu", (unsigned long long)total));
}

TEST_CASE("the collatz run uses few submits, no round trips, and matches the reference counters") {
    auto m = assembleFile(sourceDir() + "/programs/collatz.blue");
    REQUIRE(m.isOk());
    auto w = WeightSource::open(m.value(), "");
    REQUIRE(w.isOk());
    BothRuns runs = runBoth(m.value(), w.value(), 10000, {}, 100000, 64);
    CHECK(runs.stats.submits <= 4);
    CHECK(runs.stats.round_trips == 0);
    CHECK(runs.stats.steps == runs.ref.steps);
    CHECK(runs.gpu.cycles == runs.ref.cycles);
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test
