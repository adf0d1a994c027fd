// GpuMachine (host/machine.h) behaviour beyond single programs: an output ring smaller than the
// output, input streamed through a small ring, one chain versus two, the watchdog at exactly
// max_cycles, faults reported per instance, more than 10,000 instances, and the errors of its
// API. Every run is compared with the reference machine or with values worked out here.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "compiler/asm.h"
#include "shaders/blue_config.h"
#include "tests/gpu_fixture.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"

namespace blue::test {
namespace {

struct Loaded {
    Module module;
    WeightSource weights;
};

// Modules live in a stable place: WeightSource and GpuMachine keep pointers to them.
const Loaded& load(const std::string& source) {
    static std::map<std::string, std::unique_ptr<Loaded>> cache;
    auto& slot = cache[source];
    if (!slot) {
        Result<Module> m = assemble(source, "gpu_machine");
        REQUIRE_MESSAGE(m.isOk(), m.message());
        slot = std::make_unique<Loaded>();
        slot->module = std::move(m.value());
        Result<WeightSource> w = WeightSource::open(slot->module, "");
        REQUIRE(w.isOk());
        slot->weights = std::move(w.value());
    }
    return *slot;
}

std::unique_ptr<GpuMachine> makeMachine(const Loaded& l, const GpuOptions& opt) {
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, l.module, l.weights, opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    return std::move(machine.value());
}

RunReport runMachine(GpuMachine& machine, const std::vector<std::vector<uint32_t>>& input = {}) {
    for (const auto& msg : input) REQUIRE(machine.pushInput(msg).isOk());
    machine.closeInput();
    Result<RunReport> r = machine.run();
    REQUIRE_MESSAGE(r.isOk(), r.message());
    return std::move(r.value());
}

std::vector<uint32_t> valuesOf(const std::vector<OutputRecord>& records, uint32_t inst) {
    std::vector<uint32_t> out;
    for (const OutputRecord& r : recordsOf(records, inst)) out.push_back(r.value);
    return out;
}

constexpr const char* kCountSource = R"(.layout regs=8
    li r1, 0
    li r2, 500
loop:
    out r1
    addi r1, r1, 1
    bltu r1, r2, loop
    halt
)";

TEST_CASE("gpu machine: an output ring of 16 records delivers 1000 records in order per instance") {
    const Loaded& l = load(kCountSource);
    std::vector<uint32_t> want(500);
    for (uint32_t i = 0; i < 500; ++i) want[i] = i;
    for (bool keep : {true, false}) {
        CAPTURE(keep);
        GpuOptions opt;
        opt.instances = 2;
        opt.out_records = 16;
        opt.chain_cycles = 8;
        opt.max_cycles = 100000;
        auto machine = makeMachine(l, opt);
        machine->closeInput();
        std::vector<OutputRecord> sunk;
        Result<RunReport> r = machine->run(
            [&](std::span<const OutputRecord> recs) {
                sunk.insert(sunk.end(), recs.begin(), recs.end());
            },
            keep);
        REQUIRE(r.isOk());
        CHECK(r.value().status.isOk());
        for (uint32_t i = 0; i < 2; ++i) {
            CHECK(r.value().instances[i].status == BLUE_ST_HALTED);
            CHECK(valuesOf(sunk, i) == want);
        }
        CHECK(sunk.size() == 1000);
        CHECK(r.value().output.size() == (keep ? 1000u : 0u));
        if (keep) CHECK(r.value().output == sunk);
        CHECK(machine->stats().output_records == 1000);
        // A full ring makes instances wait: far more cycles than the 500 a free ring needs.
        CHECK(machine->stats().cycles > 1000 / 16);
        CHECK(machine->stats().round_trips == 0);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

constexpr const char* kQueueSource = R"(.layout regs=8 in_slots=2 in_slot_words=4
next:
    inrecv r1
    li r2, -1
    beq r1, r2, done
    inld r3, r1, r0
    li r4, 1
    inld r5, r1, r4
    li r4, 2
    inld r6, r1, r4
    add r5, r5, r6
    infree r1
    out r3
    out r5
    jmp next
done:
    halt
)";

TEST_CASE("gpu machine: 50 input messages stream through a 2-slot ring, each served once") {
    const Loaded& l = load(kQueueSource);
    std::vector<std::vector<uint32_t>> input;
    for (uint32_t k = 0; k < 50; ++k) input.push_back({k, 2 * k, 3 * k + 1});
    for (uint32_t chains : {1u, 2u}) {
        CAPTURE(chains);
        GpuOptions opt;
        opt.instances = 3;
        opt.chains = chains;
        opt.chain_cycles = 4;
        opt.max_cycles = 100000;
        auto machine = makeMachine(l, opt);
        RunReport r = runMachine(*machine, input);
        CHECK(r.status.isOk());
        std::multiset<uint32_t> served;
        for (uint32_t i = 0; i < 3; ++i) {
            CHECK(r.instances[i].status == BLUE_ST_HALTED);
            std::vector<uint32_t> v = valuesOf(r.output, i);
            REQUIRE(v.size() % 2 == 0);
            for (size_t j = 0; j < v.size(); j += 2) {
                CHECK(v[j + 1] == 5 * v[j] + 1);  // 2k + 3k + 1
                served.insert(v[j]);
            }
        }
        std::multiset<uint32_t> all;
        for (uint32_t k = 0; k < 50; ++k) all.insert(k);
        CHECK(served == all);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

constexpr const char* kYieldSource = R"(.layout regs=8
    iid r1
    addi r2, r1, 30
    li r3, 0
loop:
    cycle r4
    out r4
    mul r5, r4, r1
    out r5
    yield
    addi r3, r3, 1
    bltu r3, r2, loop
    halt
)";

TEST_CASE("gpu machine: one chain and two chains give the same output; only one chain waits") {
    const Loaded& l = load(kYieldSource);
    std::vector<RunReport> reports;
    std::vector<GpuStats> stats;
    for (uint32_t chains : {1u, 2u, 3u}) {
        GpuOptions opt;
        opt.instances = 4;
        opt.chains = chains;
        opt.chain_cycles = 8;
        auto machine = makeMachine(l, opt);
        reports.push_back(runMachine(*machine));
        stats.push_back(machine->stats());
    }
    BothRuns both = runBoth(l.module, l.weights, 4, {}, 100000, 8);
    for (size_t k = 0; k < reports.size(); ++k) {
        CAPTURE(k);
        CHECK(reports[k].status.isOk());
        CHECK(reports[k].cycles == 34);  // instance 3 yields 33 times
        CHECK(reports[k].cycles == both.ref.cycles);
        for (uint32_t i = 0; i < 4; ++i) {
            CHECK(recordsOf(reports[k].output, i) == recordsOf(both.ref.output, i));
            CHECK(reports[k].instances[i].pc == both.ref.instances[i].pc);
        }
        CHECK(stats[k].steps == both.ref.steps);
    }
    // One chain: every resubmission waits for the only chain, with the queue empty.
    CHECK(stats[0].round_trips > 0);
    CHECK(stats[0].round_trips == stats[0].submits - 1);
    CHECK(stats[1].round_trips == 0);
    CHECK(stats[2].round_trips == 0);
    CHECK(stats[1].submits >= 34 / 8);
    CHECK_NO_VALIDATION_ERRORS();
}

constexpr const char* kWatchdogSource = R"(.layout regs=8 local=1
    iid r1
    andi r2, r1, 1
    bnez r2, stop
    li r3, 0
loop:
    out r3
    addi r3, r3, 1
    yield
    jmp loop
stop:
    halt
)";

TEST_CASE("gpu machine: the watchdog stops at exactly max_cycles and names the live instances") {
    const Loaded& l = load(kWatchdogSource);
    for (uint64_t max_cycles : {37u, 32u, 1u}) {
        CAPTURE(max_cycles);
        GpuOptions opt;
        opt.instances = 5;
        opt.chain_cycles = 16;
        opt.max_cycles = max_cycles;
        auto machine = makeMachine(l, opt);
        RunReport r = runMachine(*machine);
        CHECK(r.cycles == max_cycles);
        CHECK(machine->stats().cycles == max_cycles);
        std::string names;
        for (uint32_t i : {0u, 2u, 4u}) {
            CAPTURE(i);
            CHECK(r.instances[i].status == BLUE_ST_RUNNING);
            // One record per cycle: 0, 1, ..., max_cycles - 1.
            std::vector<uint32_t> want(max_cycles);
            for (uint32_t k = 0; k < max_cycles; ++k) want[k] = k;
            CHECK(valuesOf(r.output, i) == want);
            names += strFormat("%s%u (pc %u)", names.empty() ? "" : ", ", i, r.instances[i].pc);
            CHECK(r.instances[i].pc == 7);  // resumes at JMP after the YIELD
        }
        for (uint32_t i : {1u, 3u}) CHECK(r.instances[i].status == BLUE_ST_HALTED);
        CHECK(r.status.message() ==
              strFormat("watchdog: the program did not finish within %llu cycles (--max-cycles); "
                        "3 instances still running: %s",
                        (unsigned long long)max_cycles, names.c_str()));
        BothRuns both = runBoth(l.module, l.weights, 5, {}, max_cycles, 16);
        CHECK(both.gpu.status.message() == both.ref.status.message());
    }
    CHECK_NO_VALIDATION_ERRORS();
}

constexpr const char* kFaultSource = R"(.layout regs=8 local=2
    iid r1
    li r2, 3
    remu r3, r1, r2
    beqz r3, divide
    li r4, 1
    beq r3, r4, memory
    out r1
    halt
divide:
    out r1
    divu r5, r1, r0
    halt
memory:
    li r6, 2
    ld r7, r6, 0
    halt
)";

TEST_CASE("gpu machine: max_cycles 0 runs nothing, as on the reference machine") {
    const Loaded& l = load(kWatchdogSource);
    BothRuns both = runBoth(l.module, l.weights, 3, {}, 0, 16);
    CHECK(both.ref.cycles == 0);
    CHECK(both.gpu.cycles == 0);
    CHECK(both.gpu.output.empty());
    CHECK(both.gpu.status.message() == both.ref.status.message());
    for (uint32_t i = 0; i < 3; ++i) {
        CHECK(both.gpu.instances[i].status == BLUE_ST_RUNNING);
        CHECK(both.gpu.instances[i].pc == 0);
    }
    CHECK(both.stats.steps == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("gpu machine: faults are reported per instance with their code and pc") {
    const Loaded& l = load(kFaultSource);
    BothRuns both = runBoth(l.module, l.weights, 7);
    const RunReport& r = both.gpu;
    CHECK(r.status.isOk());                  // faulted instances are not live: the run finished
    const uint32_t divide = 9, memory = 12;  // instruction indices of DIVU and LD
    for (uint32_t i = 0; i < 7; ++i) {
        CAPTURE(i);
        const InstanceReport& ir = r.instances[i];
        switch (i % 3) {
            case 0:
                CHECK(ir.status == BLUE_ST_FAULT);
                CHECK(ir.fault == BLUE_FAULT_DIV_ZERO);
                CHECK(ir.pc == divide);
                break;
            case 1:
                CHECK(ir.status == BLUE_ST_FAULT);
                CHECK(ir.fault == BLUE_FAULT_LOCAL_OOB);
                CHECK(ir.pc == memory);
                break;
            default:
                CHECK(ir.status == BLUE_ST_HALTED);
                break;
        }
        CHECK(ir.status == both.ref.instances[i].status);
        CHECK(ir.pc == both.ref.instances[i].pc);
        CHECK(recordsOf(r.output, i) == recordsOf(both.ref.output, i));
    }
    CHECK(describeFaults(l.module, r.instances, 3) ==
          "instance 0: integer division by zero at instruction 9 (DIVU)\n"
          "instance 1: local memory access out of range at instruction 12 (LD)\n"
          "instance 3: integer division by zero at instruction 9 (DIVU)\n"
          "... and 2 more faulted instances\n");
    CHECK_NO_VALIDATION_ERRORS();
}

constexpr const char* kManySource = R"(.layout regs=8
    iid r1
    li r2, 50
    remu r3, r1, r2
    li r4, 0
    li r5, 0
loop:
    bgeu r4, r3, done
    addi r4, r4, 1
    add r5, r5, r4
    jmp loop
done:
    muli r6, r1, 7
    add r6, r6, r5
    out r6
    halt
)";

TEST_CASE("gpu machine: 12,345 instances each compute and print their own value") {
    const Loaded& l = load(kManySource);
    const uint32_t n = 12345;
    GpuOptions opt;
    opt.instances = n;
    auto machine = makeMachine(l, opt);
    RunReport r = runMachine(*machine);
    CHECK(r.status.isOk());
    REQUIRE(r.instances.size() == n);
    REQUIRE(r.output.size() == n);
    std::vector<uint32_t> got(n, 0xFFFFFFFFu);
    for (const OutputRecord& rec : r.output) {
        REQUIRE(rec.inst < n);
        CHECK(got[rec.inst] == 0xFFFFFFFFu);
        got[rec.inst] = rec.value;
    }
    uint32_t wrong = 0, not_halted = 0;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t k = i % 50;
        wrong += got[i] != 7 * i + k * (k + 1) / 2;
        not_halted += r.instances[i].status != BLUE_ST_HALTED;
    }
    CHECK(wrong == 0);
    CHECK(not_halted == 0);
    CHECK(machine->stats().instances == n);
    CHECK(machine->stats().round_trips == 0);
    CHECK_NO_VALIDATION_ERRORS();
}

// Host flags: each instance marks the start of its response (OUTBEGIN), then yields until the
// host sets its flag word, prints the flag and halts. Flags past the last instance read 0.
constexpr const char* kFlagSource = R"(.layout regs=8
    iid r1
    outbegin r1
    li r6, 1000000
    inflag r7, r6
    out r7
wait:
    yield
    inflag r2, r1
    beq r2, r0, wait
    out r2
    halt
)";

TEST_CASE("gpu machine: INFLAG reads the flags the host sets while the chain runs") {
    const Loaded& l = load(kFlagSource);
    const uint32_t n = 5;
    GpuOptions opt;
    opt.instances = n;
    opt.chain_cycles = 4;
    opt.max_cycles = 100000;
    auto machine = makeMachine(l, opt);
    machine->closeInput();
    std::vector<OutputRecord> got;
    auto sink = [&](std::span<const OutputRecord> rs) { got.insert(got.end(), rs.begin(), rs.end()); };
    // A few chains with no flag set: every instance keeps waiting.
    for (int k = 0; k < 3; ++k) {
        Result<bool> p = machine->pump(sink, true);
        REQUIRE_MESSAGE(p.isOk(), p.message());
    }
    CHECK(!machine->gpuDone());
    for (uint32_t i = 0; i < n; ++i) machine->setFlag(i, 100 + i);
    machine->setFlag(n + 7, 1);  // out of range: ignored
    for (int k = 0; k < 100 && !machine->gpuDone(); ++k) {
        Result<bool> p = machine->pump(sink, true);
        REQUIRE_MESSAGE(p.isOk(), p.message());
    }
    while (machine->inFlight()) REQUIRE(machine->pump(sink, false).isOk());
    REQUIRE(machine->gpuDone());
    CHECK(machine->stats().cycles > 3 * opt.chain_cycles);
    for (uint32_t i = 0; i < n; ++i) {
        CAPTURE(i);
        std::vector<OutputRecord> mine = recordsOf(got, i);
        REQUIRE(mine.size() == 3);
        CHECK(mine[0].kind == BLUE_OUT_BEGIN);
        CHECK(mine[0].value == i);
        CHECK(mine[1].value == 0);  // flag word 1000000: past the last instance
        CHECK(mine[2].value == 100 + i);
    }
    // The reference machine reads the same flags.
    RefMachine ref(l.module, l.weights, MachineOptions{n, 1000});
    for (uint32_t i = 0; i < n; ++i) ref.setFlag(i, 100 + i);
    ref.closeInput();
    RunReport r = ref.run();
    REQUIRE(r.status.isOk());
    for (uint32_t i = 0; i < n; ++i) {
        std::vector<OutputRecord> mine = recordsOf(r.output, i);
        REQUIRE(mine.size() == 3);
        CHECK(mine[0].kind == BLUE_OUT_BEGIN);
        CHECK(mine[2].value == 100 + i);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("gpu machine: API misuse gives clear errors") {
    const Loaded& plain = load(kCountSource);
    auto machine = makeMachine(plain, GpuOptions{});
    Status s = machine->pushInput({1, 2});
    REQUIRE(!s.isOk());
    CHECK(s.message() == "this program reads no input (its layout has in_slots=0)");

    const Loaded& queue = load(kQueueSource);
    auto q = makeMachine(queue, GpuOptions{});
    s = q->pushInput({1, 2, 3, 4});
    REQUIRE(!s.isOk());
    CHECK(s.message() == "input message of 4 words is longer than an input slot (3 words)");
    CHECK(q->pushInput({1, 2, 3}).isOk());

    GpuOptions opt;
    opt.chains = 0;
    auto bad =
        GpuMachine::create(*gpu().device, *gpu().pipelines, plain.module, plain.weights, opt);
    REQUIRE(!bad.isOk());
    CHECK(bad.message() ==
          strFormat("chains must be 1..%u and chain cycles at least 1", BLUE_MAX_CHAINS));
    opt.chains = BLUE_MAX_CHAINS + 1;
    CHECK(!GpuMachine::create(*gpu().device, *gpu().pipelines, plain.module, plain.weights, opt)
               .isOk());
    opt.chains = 2;
    opt.chain_cycles = 0;
    CHECK(!GpuMachine::create(*gpu().device, *gpu().pipelines, plain.module, plain.weights, opt)
               .isOk());
    opt.chain_cycles = 8;
    opt.instances = 0;
    bad = GpuMachine::create(*gpu().device, *gpu().pipelines, plain.module, plain.weights, opt);
    REQUIRE(!bad.isOk());
    CHECK(bad.message() == strFormat("--instances must be between 1 and %u", BLUE_MAX_INSTANCES));
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test
