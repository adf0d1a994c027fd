// The shared test device (see gpu_fixture.h).
#include "tests/gpu_fixture.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "host/machine_plan.h"

namespace blue::test {

Gpu& gpu() {
    static Gpu* instance = [] {
        auto* g = new Gpu();
        DeviceOptions opt;
        const char* v = std::getenv("BLUE_VALIDATION");
        opt.validation = !(v && std::string(v) == "0");
        auto dev = Device::create(opt);
        REQUIRE_MESSAGE(dev.isOk(), dev.message());
        g->device = std::move(dev.value());
        auto p = Pipelines::create(*g->device);
        REQUIRE_MESSAGE(p.isOk(), p.message());
        g->pipelines = std::move(p.value());
        std::string note = "GPU tests run on " + g->device->info().name + ", subgroup " +
                           std::to_string(g->device->info().subgroup_size) +
                           (g->device->validationEnabled()
                                ? " with validation (" + g->device->validationChecks() + ")"
                                : "");
        if (const char* limits = std::getenv("BLUE_DEVICE_LIMITS"); limits && *limits) {
            note += std::string(", limits of the profile ") + limits;
        }
        MESSAGE(note);
        return g;
    }();
    return *instance;
}

std::unique_ptr<Device> emulatedDevice(const std::string& profile_json) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("blue_profile_" + std::to_string(getpid()) + ".json")).string();
    std::ofstream(path) << profile_json;
    DeviceOptions opt;
    opt.limits = path;
    const char* v = std::getenv("BLUE_VALIDATION");
    opt.validation = !(v && std::string(v) == "0");
    auto made = Device::create(opt);
    std::remove(path.c_str());
    REQUIRE_MESSAGE(made.isOk(), made.message());
    return std::move(made.value());
}

BothRuns runBoth(const Module& m, const WeightSource& w, uint32_t instances,
                 const std::vector<std::vector<uint32_t>>& inputs, uint64_t max_cycles,
                 uint32_t chain_cycles, double max_submit_ms) {
    BothRuns out;
    // The cycle's step budget of the GPU machine on this device (capped on lavapipe).
    const uint32_t cap = maxCycleSteps(deviceLoopLimit(gpu().device->info().cpu));
    RefMachine ref(m, w, MachineOptions{instances, max_cycles, cap == UINT32_MAX ? 0u : cap});
    for (const auto& msg : inputs) ref.pushInput(msg);
    ref.closeInput();
    out.ref = ref.run();

    GpuOptions opt;
    opt.instances = instances;
    opt.max_cycles = max_cycles;
    opt.chain_cycles = chain_cycles;
    opt.max_submit_ms = max_submit_ms;
    auto machine = GpuMachine::create(*gpu().device, *gpu().pipelines, m, w, opt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    for (const auto& msg : inputs) REQUIRE(machine.value()->pushInput(msg).isOk());
    machine.value()->closeInput();
    auto report = machine.value()->run();
    REQUIRE_MESSAGE(report.isOk(), report.message());
    out.gpu = std::move(report.value());
    out.stats = machine.value()->stats();
    return out;
}

}  // namespace blue::test
