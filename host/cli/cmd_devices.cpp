// `bluevm devices`: lists Vulkan devices with the limits and features BlueVM uses, what it uses
// each for, the kernel variants it chose and why, and whether it can run there at all. With
// --device-limits (or BLUE_DEVICE_LIMITS) it shows the device as an emulated profile sees it;
// --profiles lists the built-in profiles and where their numbers come from; --peak measures the
// device's own ceilings (host/peak.h) beside the host's native ones (host/bench.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <nlohmann/json.hpp>

#include "host/bench.h"
#include "host/cli/commands.h"
#include "host/device.h"
#include "host/machine.h"
#include "host/peak.h"
#include "host/device_profile.h"
#include "host/pipelines.h"

namespace blue::cli {

namespace {

double mib(uint64_t bytes) {
    return double(bytes) / (1 << 20);
}

void printLimits(const DeviceInfo& d) {
    uint64_t page = std::min(d.max_storage_buffer_range, d.max_texel_buffer_elements * 16);
    std::printf(
        "   memory: device-local %.1f GiB%s; largest storage binding %.0f MiB; largest "
        "allocation %.0f MiB, %u allocations at once; largest page %.0f MiB (binding, and texel "
        "view of %llu texels)\n",
        double(d.device_local_bytes) / (1ull << 30), d.unified_memory ? " (host-mappable)" : "",
        mib(d.max_storage_buffer_range), mib(d.max_allocation), d.max_allocations, mib(page),
        (unsigned long long)d.max_texel_buffer_elements);
    std::printf(
        "   compute: max count %u x %u x %u; max size %u x %u x %u, %u invocations; shared "
        "memory %u bytes; subgroup %u\n",
        d.max_workgroup_count[0], d.max_workgroup_count[1], d.max_workgroup_count[2],
        d.max_workgroup_size[0], d.max_workgroup_size[1], d.max_workgroup_size[2],
        d.max_workgroup_invocations, d.max_shared_memory, d.subgroup_size);
    std::printf(
        "   descriptors: %u storage buffers and %u storage texel views per stage, %u "
        "resources per stage, %u sets, %u bytes of push constants\n",
        d.max_stage_storage_buffers, d.max_stage_storage_images, d.max_stage_resources,
        d.max_bound_sets, d.max_push_constants);
    std::printf(
        "   min storage offset alignment %u (unused: every binding starts at offset 0; "
        "tensors sit 256-byte aligned in pages and are addressed by push constants)\n",
        d.min_storage_offset_alignment);
}

void printDevice(const DeviceInfo& d) {
    std::printf("%u: %s (%s)\n", d.index, d.name.c_str(), d.type.c_str());
    std::printf("   driver: %s, Vulkan %s\n", d.driver.c_str(), d.api.c_str());
    if (!d.profile.empty()) {
        std::string changes;
        for (const std::string& c : d.clamped) changes += (changes.empty() ? "" : ", ") + c;
        std::printf("   emulating %s: %s\n", d.profile.c_str(),
                    changes.empty() ? "no limit lower than the device's" : changes.c_str());
    }
    printLimits(d);
    std::printf("   features:\n");
    for (const DeviceFeature& f : d.features) {
        std::printf("     %-42s %-3s  %s\n", f.name.c_str(), f.supported ? "yes" : "no",
                    f.use.c_str());
    }
    std::printf("   sequencer kernel: %s (%s)\n", kernelVariant("sequencer", d).c_str(),
                kernelVariantReason("sequencer", d).c_str());
    const Result<std::string> shapes = describeKernelShapes(GpuOptions{}, d);
    std::printf("   kernel shapes: %s\n", shapes ? shapes.value().c_str() : shapes.message().c_str());
    std::printf("   usable by BlueVM: %s\n",
                d.missing.empty() ? "yes" : ("no, lacks " + d.missing).c_str());
}

int printProfiles() {
    for (const std::string& name : builtinProfileNames()) {
        auto p = loadDeviceProfile(name);
        if (!p) return fail(p.message());
        std::printf("%s: %s\n   source: %s\n", name.c_str(), p->device.c_str(), p->source.c_str());
        for (const auto& [key, note] : p->notes)
            std::printf("   %s: %s\n", key.c_str(), note.c_str());
    }
    return 0;
}

struct PeakArgs {
    bool peak = false, json = false;
    uint32_t mb = 512;
    std::string device;
};

// `bluevm devices --peak`: every shape of both ceilings on the device, then the native figures.
int printPeak(const PeakArgs& a) {
    DeviceOptions o;
    o.select = a.device;
    auto dev = Device::create(o);
    if (!dev) return fail(dev.message());
    PeakOptions po;
    po.read_bytes = uint64_t(a.mb) << 20;
    auto peak = measureDevicePeak(*dev.value(), po);
    if (!peak) return fail(peak.message());
    BandwidthResult bw = measureReadBandwidth(uint64_t(a.mb) << 20);
    FmaResult fma = measureNativeFma();
    const DevicePeak& p = peak.value();
    if (a.json) {
        nlohmann::json j;
        j["device"] = dev.value()->info().name;
        j["read_bytes"] = p.read_bytes;
        for (const PeakShape& s : p.read) j["read"].push_back({{"shape", s.what}, {"gb_per_s", s.value}});
        for (const PeakShape& s : p.fma) {
            j["fma"].push_back({{"shape", s.what}, {"gflops", s.value}, {"skipped", s.skipped}});
        }
        j["device_read_gb_per_s"] = p.readGBs();
        j["device_fma_gflops"] = p.fmaGFlops();
        j["native"] = {{"read_gb_per_s", bw.gb_per_s}, {"fma_gflops", fma.gflops}, {"threads", fma.threads}, {"isa", fma.isa}};
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    std::printf("%s: ceilings measured with Vulkan micro-kernels\n", dev.value()->info().name.c_str());
    std::printf("  streaming read of %.0f MiB:\n", mib(p.read_bytes));
    for (const PeakShape& s : p.read) std::printf("    %8.1f GB/s  %s\n", s.value, s.what.c_str());
    std::printf("  FP32 multiply-add:\n");
    for (const PeakShape& s : p.fma) {
        if (s.skipped.empty()) std::printf("    %8.1f GFLOP/s  %s\n", s.value, s.what.c_str());
        else std::printf("    %8s GFLOP/s  %s (skipped: %s)\n", "-", s.what.c_str(), s.skipped.c_str());
    }
    std::printf("  device ceilings: read %.1f GB/s (%s), FMA %.1f GFLOP/s (%s)\n", p.readGBs(),
                p.bestRead()->what.c_str(), p.fmaGFlops(), p.bestFma() ? p.bestFma()->what.c_str() : "none");
    std::printf("native code on this host (%u threads): read %.1f GB/s, FMA %.1f GFLOP/s (%s)\n", fma.threads,
                bw.gb_per_s, fma.gflops, fma.isa);
    return 0;
}

}  // namespace

void addDeviceLimitsOption(CLI::App* sub) {
    sub->add_option_function<std::string>(
        "--device-limits",
        [](const std::string& spec) { setenv("BLUE_DEVICE_LIMITS", spec.c_str(), 1); },
        "emulate another GPU's limits: a built-in profile (`bluevm devices --profiles`) or a "
        "profile file (sets BLUE_DEVICE_LIMITS)");
}

std::optional<uint64_t> parseByteSize(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || !(v >= 0)) return std::nullopt;
    std::string unit(end);
    for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
    if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();
    static const std::pair<const char*, double> kUnits[] = {
        {"", 1}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}, {"T", 1099511627776.0}};
    for (const auto& [name, scale] : kUnits) {
        if (unit == name && v * scale < 1.8e19) return uint64_t(v * scale);
    }
    return std::nullopt;
}

void addVramBudgetOption(CLI::App* sub, uint64_t* bytes, GpuOptions::HostWeights* mode, bool* expert_cache) {
    using HW = GpuOptions::HostWeights;
    sub->add_option_function<std::string>(
        "--host-weights",
        [mode](const std::string& v) {
            if (v == "read") *mode = HW::READ;
            else if (v == "stream") *mode = HW::STREAM;
            else if (v == "auto") *mode = HW::AUTO;
            else throw CLI::ValidationError("--host-weights", "'" + v + "': use read, stream or auto");
        },
        "with --vram-budget: read host-memory weights in place, or stream them into two "
        "device-local slots ahead of use (auto: stream on GPUs with their own memory)");
    sub->add_option_function<std::string>(
        "--expert-cache",
        [expert_cache](const std::string& v) {
            if (v == "on") *expert_cache = true;
            else if (v == "off") *expert_cache = false;
            else throw CLI::ValidationError("--expert-cache", "'" + v + "': use on or off");
        },
        "MoE models with --vram-budget: on (default) keeps the experts in host memory and caches "
        "the ones the GPU's routing picks in the device memory the budget leaves; off treats "
        "them as any other weight");
    sub->add_option_function<std::string>(
        "--vram-budget",
        [bytes](const std::string& text) {
            std::optional<uint64_t> v = parseByteSize(text);
            if (!v || *v == 0) {
                throw CLI::ValidationError("--vram-budget", "'" + text + "' is not a size such as 512M, 1.5G or 300000");
            }
            *bytes = *v;
        },
        "device memory to use at most (e.g. 512M, 1.5G; K, M, G are powers of 1024): weights "
        "beyond it stay in host memory, read by the GPU directly");
}

void addKvPageOptions(CLI::App* sub, uint32_t* page, uint32_t* pool, const char* pool_default) {
    sub->add_option("--kv-page", *page,
                    "paged KV: positions per page (8, 16 or 32); each layer's K and V rows live in pools all "
                    "instances share (default 0: per-instance caches)");
    sub->add_option("--kv-pool", *pool,
                    std::string("paged KV: positions in each layer's pool (default: ") + pool_default +
                        "); a request waits until the pool holds its worst case");
}

Command addDevicesCommand(CLI::App& app) {
    CLI::App* sub =
        app.add_subcommand("devices", "List Vulkan devices and what BlueVM uses of them");
    addDeviceLimitsOption(sub);
    auto profiles = std::make_shared<bool>(false);
    sub->add_flag("--profiles", *profiles,
                  "list the built-in device-limit profiles and their sources");
    auto peak = std::make_shared<PeakArgs>();
    sub->add_flag("--peak", peak->peak,
                  "measure the device's read bandwidth and FP32 FMA ceilings (every kernel shape) and "
                  "this host's native ones");
    sub->add_option("--peak-mb", peak->mb, "--peak: the buffer the read test streams, MiB (default 512)")
        ->check(CLI::Range(4u, 1u << 20));
    sub->add_option("--device", peak->device, "--peak: the Vulkan device (index or part of its name)");
    sub->add_flag("--json", peak->json, "--peak: one JSON object");
    return [profiles, peak] {
        if (*profiles) return printProfiles();
        if (peak->peak) return printPeak(*peak);
        auto list = listDevices();
        if (!list) return fail(list.message());
        for (const DeviceInfo& d : list.value()) printDevice(d);
        if (list->empty()) std::printf("no Vulkan devices\n");
        return 0;
    };
}

}  // namespace blue::cli
