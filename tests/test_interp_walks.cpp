// The control ops a shared KV page index is built from (vm/opcodes.def): HASHL hashes up to 8
// words of local memory into a chained key hash, HCMPL compares them with the heap, HCPYL copies
// them there. Expected values are worked out here from the ops' definitions; the GPU sequencer
// must give the same records, status, fault and pc as the reference machine.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "compiler/asm.h"
#include "tests/gpu_fixture.h"
#include "vm/abi.h"
#include "vm/interp.h"

namespace blue::test {
namespace {

uint32_t fnvWords(uint32_t h, const std::vector<uint32_t>& words, size_t first, size_t n) {
    for (size_t i = first; i < first + n; ++i) h = (h ^ words[i]) * 16777619u;
    return h;
}

std::vector<uint32_t> valuesOf(const std::vector<OutputRecord>& records) {
    std::vector<uint32_t> out;
    for (const OutputRecord& r : records) out.push_back(r.value);
    return out;
}

Module assembled(const std::string& source, const std::string& name) {
    Result<Module> m = assemble(source, name);
    REQUIRE_MESSAGE(m.isOk(), (m.message() + "\n" + source));
    return m.value();
}

// Both machines, one instance per program run; the reference's report is returned after the
// GPU's records, status, fault and pc were checked against it.
RunReport runBothAgree(const Module& m, uint32_t instances = 1) {
    Result<WeightSource> w = WeightSource::open(m, "");
    REQUIRE(w.isOk());
    BothRuns both = runBoth(m, w.value(), instances);
    REQUIRE(both.ref.status.isOk());
    REQUIRE(both.gpu.status.isOk());
    CHECK(valuesOf(both.gpu.output) == valuesOf(both.ref.output));
    REQUIRE(both.gpu.instances.size() == both.ref.instances.size());
    for (size_t i = 0; i < both.ref.instances.size(); ++i) {
        CHECK(both.gpu.instances[i].status == both.ref.instances[i].status);
        CHECK(both.gpu.instances[i].fault == both.ref.instances[i].fault);
        CHECK(both.gpu.instances[i].pc == both.ref.instances[i].pc);
    }
    CHECK_NO_VALIDATION_ERRORS();
    return both.ref;
}

// local[i] = 3i + 1 for i < 16, then r0 = 0.
constexpr const char* kFill = R"(
    li r1, 0
    li r2, 1
fill:
    st r2, r1, 0
    addi r1, r1, 1
    addi r2, r2, 3
    sltsi r3, r1, 16
    bnez r3, fill
)";

std::vector<uint32_t> filledLocal() {
    std::vector<uint32_t> v(16);
    for (uint32_t i = 0; i < 16; ++i) v[i] = 3 * i + 1;
    return v;
}

}  // namespace

TEST_CASE("interp walks: HASHL chains, HCPYL copies and HCMPL counts as defined, on both machines") {
    const std::string src = std::string(".layout regs=16 local=16 heap=32 heap_static=32\nmain:") + kFill + R"(
    li r4, -2128831035      ; the FNV offset basis, 0x811C9DC5
    li r5, 0
    li r6, 8
    hashl r4, r5, r6        ; words 0..7
    outu r4
    li r5, 8
    hashl r4, r5, r6        ; chained over words 8..15
    outu r4
    li r7, 0
    li r5, 3
    li r6, 5
    hashl r7, r5, r6        ; seed 0, words 3..7
    outu r7
    li r8, 77
    li r6, 0
    hashl r8, r5, r6        ; no words: unchanged
    outu r8
    li r9, 10
    li r5, 4
    li r6, 8
    hcpyl r9, r5, r6        ; heap[10..18) = local[4..12)
    outu r9                 ; A is not written
    ldg r10, r9, 0
    outu r10
    ldg r10, r9, 7
    outu r10
    ldg r10, r9, 8          ; past the copy: still 0
    outu r10
    mov r11, r9
    hcmpl r11, r5, r6       ; all 8 equal
    outu r11
    li r12, 999
    stg r12, r9, 3
    mov r11, r9
    hcmpl r11, r5, r6       ; heap[13] differs: 3
    outu r11
    mov r11, r9
    li r5, 5
    hcmpl r11, r5, r6       ; shifted by one word: 0
    outu r11
    mov r11, r9
    li r6, 0
    hcmpl r11, r5, r6       ; no words: 0
    outu r11
    halt
)";
    Module m = assembled(src, "walks");
    RunReport r = runBothAgree(m);
    REQUIRE(r.instances[0].status == BLUE_ST_HALTED);
    const std::vector<uint32_t> local = filledLocal();
    // Pinned values (computed apart from this code) guard against both machines sharing an error.
    CHECK(fnvWords(0x811C9DC5u, local, 0, 8) == 0xb591f905u);
    CHECK(fnvWords(0x811C9DC5u, local, 0, 16) == 0xecab34c5u);
    CHECK(fnvWords(0, local, 3, 5) == 0x62de270au);
    const std::vector<uint32_t> expected = {
        0xb591f905u, 0xecab34c5u, 0x62de270au, 77, 10, local[4], local[11], 0, 8, 3, 0, 0};
    CHECK(valuesOf(r.output) == expected);
}

TEST_CASE("interp walks: a walk past 8 words, local memory or the heap faults at the walk") {
    struct Case {
        const char* name;
        const char* code;
        uint32_t fault;
    };
    const Case cases[] = {
        {"nine words", "li r1, 0\n li r2, 0\n li r3, 9\n hashl r1, r2, r3", BLUE_FAULT_WALK},
        {"nine words to the heap", "li r1, 0\n li r2, 0\n li r3, 9\n hcpyl r1, r2, r3", BLUE_FAULT_WALK},
        {"past local memory", "li r1, 0\n li r2, 12\n li r3, 5\n hashl r1, r2, r3", BLUE_FAULT_LOCAL_OOB},
        {"local start past the end", "li r1, 0\n li r2, 17\n li r3, 0\n hcmpl r1, r2, r3", BLUE_FAULT_LOCAL_OOB},
        {"past the heap", "li r1, 30\n li r2, 0\n li r3, 3\n hcmpl r1, r2, r3", BLUE_FAULT_HEAP_OOB},
        {"heap start wraps", "li r1, -1\n li r2, 0\n li r3, 2\n hcpyl r1, r2, r3", BLUE_FAULT_HEAP_OOB},
        {"ends exactly at both ends", "li r1, 24\n li r2, 8\n li r3, 8\n hcpyl r1, r2, r3", BLUE_FAULT_NONE},
        {"a hash is not an address", "li r1, -1\n li r2, 16\n li r3, 0\n hashl r1, r2, r3", BLUE_FAULT_NONE},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const std::string src = std::string(".layout regs=16 local=16 heap=32 heap_static=32\nmain:\n ") +
                                c.code + "\nwalk_done:\n    halt\n";
        Module m = assembled(src, "walk_fault");
        RunReport r = runBothAgree(m);
        CHECK(r.instances[0].fault == c.fault);
        if (c.fault != BLUE_FAULT_NONE) {
            CHECK(r.instances[0].status == BLUE_ST_FAULT);
            CHECK(r.instances[0].pc == 3);  // the walk, after three LIs
        } else {
            CHECK(r.instances[0].status == BLUE_ST_HALTED);
        }
    }
    CHECK(std::string(faultName(BLUE_FAULT_WALK)).find("8 words") != std::string::npos);
}

// 16 instances, each hashing its 16 words 3,000 times (12,000 steps), in cycles of at most
// 4,000 steps (max_steps; a device's own step limit may cut them shorter): walks are unrolled, so
// a cycle of them takes none of lavapipe's loop iterations beyond the step loop's own.
TEST_CASE("interp walks: many cycles of walks on 16 instances agree with the reference") {
    const std::string src = std::string(".layout regs=16 local=16 heap=32 heap_static=32 max_steps=4000\nmain:") +
                            kFill + R"(
    iid r4                  ; each instance starts from its id
    li r5, 0
    li r6, 8
    li r7, 8
    li r9, 3000
again:
    hashl r4, r5, r6
    hashl r4, r7, r6
    addi r9, r9, -1
    bnez r9, again
    outu r4
    halt
)";
    Module m = assembled(src, "walk_loop");
    RunReport r = runBothAgree(m, 16);
    REQUIRE(r.output.size() == 16);
    const std::vector<uint32_t> local = filledLocal();
    for (uint32_t i = 0; i < 16; ++i) {
        uint32_t h = i;
        for (int k = 0; k < 3000; ++k) h = fnvWords(h, local, 0, 16);
        CAPTURE(i);
        bool found = false;
        for (const OutputRecord& rec : r.output) found |= rec.inst == i && rec.value == h;
        CHECK(found);
    }
    CHECK(r.cycles >= 3);
}

}  // namespace blue::test
