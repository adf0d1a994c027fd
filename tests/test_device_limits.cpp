// Emulated device limits (host/device_profile.h, host/device_needs.h, host/kernel_info.h): the
// built-in profiles, clamping that never raises a limit, profile files as untrusted input
// (errors naming file and key, a mutation test), the needs reflected from the kernels, the
// refusal of a device that misses them, and, on the GPU, a device emulated with 4 KiB pages and
// no subgroup ballot running a program split over six pages as the reference machine does.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>

#include "compiler/asm.h"
#include "host/buffer.h"
#include "host/device_needs.h"
#include "host/device_profile.h"
#include "host/kernel_info.h"
#include "host/machine_plan.h"
#include "host/pipelines.h"
#include "shaders/embedded.h"
#include "tests/gpu_fixture.h"
#include "tests/scoped_env.h"
#include "tests/vm_programs.h"
#include "vm/interp.h"

namespace blue::test {
namespace {

// Every numeric limit of a DeviceInfo that a profile may lower (the alignment is separate: a
// profile may only raise it).
std::vector<uint64_t> lowerableLimits(const DeviceInfo& d) {
    std::vector<uint64_t> v = {d.device_local_bytes,        d.max_storage_buffer_range,
                               d.max_texel_buffer_elements, d.max_allocation,
                               d.max_workgroup_invocations, d.max_shared_memory,
                               d.max_stage_storage_buffers, d.max_stage_storage_images,
                               d.max_stage_resources,       d.max_set_storage_buffers,
                               d.max_set_storage_images,    d.max_bound_sets,
                               d.max_push_constants,        d.api_version};
    for (int i = 0; i < 3; ++i) {
        v.push_back(d.max_workgroup_count[i]);
        v.push_back(d.max_workgroup_size[i]);
    }
    return v;
}

std::vector<bool> features(const DeviceInfo& d) {
    return {d.dynamic_indexing,
            d.nonuniform_indexing,
            d.subgroup_ballot,
            d.timeline,
            d.int64,
            d.float16,
            d.int8,
            d.storage8};
}

// A device with every limit `value` (an alignment of 16) and every feature `on`.
DeviceInfo uniformDevice(uint32_t value, bool on) {
    DeviceInfo d;
    d.api_version = VK_MAKE_API_VERSION(0, 1, 3, 0);
    d.device_local_bytes = d.max_storage_buffer_range = d.max_texel_buffer_elements = value;
    d.max_allocation = value;
    d.max_workgroup_invocations = d.max_shared_memory = d.max_stage_storage_buffers = value;
    d.max_stage_storage_images = d.max_stage_resources = d.max_set_storage_buffers = value;
    d.max_set_storage_images = d.max_bound_sets = d.max_push_constants = value;
    for (int i = 0; i < 3; ++i) d.max_workgroup_count[i] = d.max_workgroup_size[i] = value;
    d.min_storage_offset_alignment = 16;
    d.dynamic_indexing = d.nonuniform_indexing = d.subgroup_ballot = d.timeline = on;
    d.int64 = d.float16 = d.int8 = d.storage8 = on;
    return d;
}

DeviceProfile builtin(const std::string& name) {
    Result<DeviceProfile> p = loadDeviceProfile(name);
    REQUIRE_MESSAGE(p.isOk(), p.message());
    return p.value();
}

std::string writeTemp(const std::string& name, const std::string& text) {
    std::string path = "/tmp/blue_test_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path) << text;
    return path;
}

TEST_CASE(
    "device limits: every built-in profile loads, is named like its file and cites a source") {
    std::vector<std::string> names = builtinProfileNames();
    CHECK(names.size() >= 6);
    for (const std::string& name : names) {
        INFO(name);
        DeviceProfile p = builtin(name);
        CHECK(p.name == name);
        CHECK(p.source.size() > 40);
        CHECK(!p.device.empty());
        CHECK(!p.limits.empty());
    }
    for (const char* vendor : {"nvidia", "amd", "intel", "mali", "adreno"}) {
        bool found = false;
        for (const std::string& name : names) found |= name.find(vendor) != std::string::npos;
        CHECK_MESSAGE(found, "no profile for ", vendor);
    }
}

TEST_CASE("device limits: a profile never raises a limit, loosens an alignment or adds a feature") {
    for (const std::string& name : builtinProfileNames()) {
        INFO(name);
        DeviceProfile p = builtin(name);
        for (uint32_t value : {1u, 100u, 65536u}) {
            DeviceInfo before = uniformDevice(value, false);
            DeviceInfo after = before;
            applyDeviceProfile(p, after);
            std::vector<uint64_t> b = lowerableLimits(before), a = lowerableLimits(after);
            for (size_t i = 0; i < b.size(); ++i) CHECK(a[i] <= b[i]);
            CHECK(after.min_storage_offset_alignment >= before.min_storage_offset_alignment);
            for (bool f : features(after)) CHECK_FALSE(f);
        }
        DeviceInfo big = uniformDevice(UINT32_MAX, true);
        applyDeviceProfile(p, big);
        CHECK(big.profile == name);
        for (const auto& [key, values] : p.limits) {
            if (key == "maxTexelBufferElements") CHECK(big.max_texel_buffer_elements == values[0]);
            if (key == "maxComputeSharedMemorySize") CHECK(big.max_shared_memory == values[0]);
            if (key == "maxComputeWorkGroupCount") CHECK(big.max_workgroup_count[0] == values[0]);
            if (key == "minStorageBufferOffsetAlignment") {
                CHECK(big.min_storage_offset_alignment == std::max<uint64_t>(16, values[0]));
            }
        }
        for (const auto& [key, on] : p.features) {
            if (key == "subgroupBallot") CHECK(big.subgroup_ballot == on);
        }
    }
}

TEST_CASE("device limits: clamped limits reach the Vulkan structures Device hands out") {
    DeviceInfo info = uniformDevice(UINT32_MAX, true);
    VkPhysicalDeviceProperties props{};
    props.apiVersion = info.api_version;
    props.limits.maxStorageBufferRange = UINT32_MAX;
    VkPhysicalDeviceMemoryProperties mem{};
    mem.memoryHeapCount = 2;
    mem.memoryHeaps[0] = {8ull << 30, VK_MEMORY_HEAP_DEVICE_LOCAL_BIT};
    mem.memoryHeaps[1] = {8ull << 30, 0};
    applyDeviceProfile(builtin("bluevm-minimum"), info);
    writeClampedLimits(info, props, mem);
    CHECK(props.limits.maxStorageBufferRange == 1u << 27);
    CHECK(props.limits.maxTexelBufferElements == 65536u);
    CHECK(props.limits.maxComputeWorkGroupInvocations == 256u);
    CHECK(props.limits.minStorageBufferOffsetAlignment == 256u);
    CHECK(props.apiVersion == VK_MAKE_API_VERSION(0, 1, 2, 0));
    CHECK(mem.memoryHeaps[0].size == 1ull << 30);
    CHECK(mem.memoryHeaps[1].size == 8ull << 30);  // host memory is not a device-local heap
}

constexpr const char* kGoodProfile = R"({
  "name": "test-profile",
  "device": "a test",
  "source": "tests/test_device_limits.cpp",
  "apiVersion": "1.2",
  "limits": {"maxStorageBufferRange": 1048576, "maxComputeWorkGroupCount": [65535, 65535, 65535],
             "minStorageBufferOffsetAlignment": 64},
  "features": {"subgroupBallot": false},
  "notes": {"maxStorageBufferRange": "made up"}
})";

// `good` with its first `from` replaced by `to`.
std::string edited(const std::string& from, const std::string& to) {
    std::string s = kGoodProfile;
    size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
}

TEST_CASE("device limits: profile files with errors are refused, naming the file and the key") {
    REQUIRE(parseDeviceProfile(kGoodProfile, "good.json").isOk());
    struct Case {
        std::string text, expect;
    };
    const Case cases[] = {
        {"{", "good.json: not valid JSON (byte "},
        {"[1, 2]", "expected a JSON object at the top level"},
        {edited("\"name\": \"test-profile\",", ""), "key 'name': missing"},
        {edited("\"source\": \"tests/test_device_limits.cpp\"", "\"source\": \"\""),
         "key 'source': missing, or not a non-empty string"},
        {edited("\"name\": \"test-profile\"", "\"name\": \"Test Profile\""),
         "key 'name': use lowercase"},
        {edited("\"apiVersion\": \"1.2\"", "\"apiVersion\": \"1.2x\""), "key 'apiVersion'"},
        {edited("\"apiVersion\": \"1.2\"", "\"apiVersion\": 1.2"), "key 'apiVersion'"},
        {edited("\"apiVersion\"", "\"apiversion\""), "key 'apiversion': not a profile key"},
        {edited("1048576", "\"1048576\""),
         "key 'limits.maxStorageBufferRange': expected an unsigned integer"},
        {edited("1048576", "-1"),
         "key 'limits.maxStorageBufferRange': expected an unsigned integer"},
        {edited("1048576", "1.5"),
         "key 'limits.maxStorageBufferRange': expected an unsigned integer"},
        {edited("1048576", "0"), "key 'limits.maxStorageBufferRange': 0 is out of range"},
        {edited("1048576", "4294967296"),
         "key 'limits.maxStorageBufferRange': 4294967296 is out of range"},
        {edited("maxStorageBufferRange\": 1048576", "maxStorageBuferRange\": 1048576"),
         "key 'limits.maxStorageBuferRange': not a limit BlueVM knows"},
        {edited("[65535, 65535, 65535]", "[65535, 65535]"),
         "key 'limits.maxComputeWorkGroupCount': expected an array of 3"},
        {edited("[65535, 65535, 65535]", "[65535, true, 65535]"),
         "key 'limits.maxComputeWorkGroupCount[1]': expected an unsigned integer"},
        {edited("\"minStorageBufferOffsetAlignment\": 64",
                "\"minStorageBufferOffsetAlignment\": 48"),
         "key 'limits.minStorageBufferOffsetAlignment': an alignment must be a power of two"},
        {edited("\"minStorageBufferOffsetAlignment\": 64",
                "\"minStorageBufferOffsetAlignment\": 512"),
         "key 'limits.minStorageBufferOffsetAlignment': 512 is out of range"},
        {edited("\"subgroupBallot\": false", "\"subgroupBallot\": 0"),
         "key 'features.subgroupBallot': expected true or false"},
        {edited("\"subgroupBallot\"", "\"float16\""), "key 'features.float16': not a feature"},
        {edited("\"notes\": {\"maxStorageBufferRange\"", "\"notes\": {\"vendor\""),
         "key 'notes.vendor': a note must name a limit or feature"},
        {edited("\"limits\": {", "\"limits\": [{"), "not valid JSON"},
        {edited("\"limits\": {\"maxStorageBufferRange\": 1048576, \"maxComputeWorkGroupCount\": "
                "[65535, 65535, 65535],\n             \"minStorageBufferOffsetAlignment\": 64}",
                "\"limits\": 7"),
         "key 'limits': expected an object"},
    };
    for (const Case& c : cases) {
        INFO(c.text);
        Result<DeviceProfile> p = parseDeviceProfile(c.text, "good.json");
        REQUIRE_FALSE(p.isOk());
        CHECK(p.message().rfind("good.json: ", 0) == 0);
        CHECK_MESSAGE(p.message().find(c.expect) != std::string::npos, p.message());
    }
}

TEST_CASE("device limits: mutated profiles never crash, and every error names the profile") {
    std::mt19937 rng(1234);
    const std::string alphabet = "{}[]\":,0123456789-.eE truefalsn\\x";
    uint32_t accepted = 0, refused = 0;
    std::vector<std::string> texts = {kGoodProfile};
    for (const std::string& name : builtinProfileNames()) {
        Result<std::string> text = builtinProfileText(name);
        REQUIRE(text.isOk());
        texts.push_back(text.value());
    }
    for (const std::string& base : texts) {
        for (int n = 0; n < 400; ++n) {
            std::string s = base;
            int edits = 1 + int(rng() % 3);
            for (int e = 0; e < edits && !s.empty(); ++e) {
                size_t at = rng() % s.size();
                switch (rng() % 4) {
                    case 0:
                        s.erase(at, 1 + rng() % 8);
                        break;
                    case 1:
                        s.insert(at, 1, alphabet[rng() % alphabet.size()]);
                        break;
                    case 2:
                        s[at] = alphabet[rng() % alphabet.size()];
                        break;
                    default:
                        s.resize(at);
                        break;
                }
            }
            Result<DeviceProfile> p = parseDeviceProfile(s, "mutant.json");
            if (p) {
                ++accepted;
                DeviceInfo d = uniformDevice(1000, true);
                applyDeviceProfile(p.value(), d);  // whatever parses applies without raising
                std::vector<uint64_t> limits = lowerableLimits(d);
                for (size_t i = 0; i < limits.size(); ++i) {
                    if (i != 13) CHECK(limits[i] <= 1000);  // [13] is the API version
                }
            } else {
                ++refused;
                CHECK(p.message().rfind("mutant.json: ", 0) == 0);
            }
        }
    }
    CHECK(refused > 1000);
    MESSAGE("mutated profiles: ", accepted, " parsed, ", refused, " refused");
}

TEST_CASE(
    "device limits: a profile is a built-in name or a file, from the option or the environment") {
    Result<DeviceProfile> unknown = loadDeviceProfile("gtx-9000");
    REQUIRE_FALSE(unknown.isOk());
    CHECK(unknown.message().find("no built-in device profile named 'gtx-9000'") !=
          std::string::npos);
    CHECK(unknown.message().find("mali-g610-panvk") != std::string::npos);  // the list
    Result<DeviceProfile> missing = loadDeviceProfile("/nonexistent/p.json");
    REQUIRE_FALSE(missing.isOk());
    CHECK(missing.message().rfind("cannot read device profile '/nonexistent/p.json'", 0) == 0);

    std::string path = writeTemp("profile.json", kGoodProfile);
    Result<DeviceProfile> file = loadDeviceProfile(path);
    REQUIRE_MESSAGE(file.isOk(), file.message());
    CHECK(file->limits.at("maxStorageBufferRange")[0] == 1048576u);
    std::string bad = writeTemp("bad.json", edited("1048576", "\"big\""));
    Result<DeviceProfile> broken = loadDeviceProfile(bad);
    REQUIRE_FALSE(broken.isOk());
    CHECK(broken.message().rfind("device profile '" + bad + "': key 'limits.maxStorageBufferRange'",
                                 0) == 0);

    {
        ScopedEnv env("BLUE_DEVICE_LIMITS", "adreno-740-turnip");
        CHECK(profileFromOptions("").value().name == "adreno-740-turnip");
        CHECK(profileFromOptions("mali-g610-panvk").value().name ==
              "mali-g610-panvk");  // option wins
        CHECK(profileFromOptions(path).value().name == "test-profile");
    }
    {
        ScopedEnv env("BLUE_DEVICE_LIMITS", "none");
        CHECK(profileFromOptions("").value().name.empty());
    }
    {
        ScopedEnv env("BLUE_DEVICE_LIMITS", nullptr);
        CHECK(profileFromOptions("").value().name.empty());
    }
    std::remove(path.c_str());
    std::remove(bad.c_str());
}

TEST_CASE("device limits: the kernels' needs are read from their SPIR-V") {
    const std::vector<KernelInfo>& kernels = embeddedKernels();
    size_t ceilings = 0;  // the peak_ micro-kernels are not BlueVM's needs (host/peak.cpp)
    for (size_t i = 0; i < kEmbeddedShaderCount; ++i) ceilings += std::string(kEmbeddedShaders[i].name).rfind("peak_", 0) == 0;
    CHECK(ceilings == 6);
    REQUIRE(kernels.size() == kEmbeddedShaderCount - ceilings);
    auto find = [&](const std::string& name) -> const KernelInfo& {
        for (const KernelInfo& k : kernels) {
            if (k.name == name) return k;
        }
        FAIL("no kernel ", name);
        return kernels[0];
    };
    CHECK(find("tadd").local_size[0] == BLUE_ELEM_WG);
    CHECK(find("sequencer").local_size[0] == BLUE_SEQ_WG);
    CHECK(find("tsum").shared_bytes == BLUE_ITEM_WG * 4u);  // float partial[BLUE_ITEM_WG]
    CHECK(find("tadd").shared_bytes == 0u);
    CHECK(find("rmsnorm_w").shared_bytes == 256u * 4u);  // reduce_f[RMS_WG]
    CHECK(find("rmsnorm").shared_bytes == 0u);           // a lane per item: no reduction
    // Arrays sized by the width specialization constant count at the built (widest) width. The
    // sampler (SAMPLE_WG): reduce_f, reduce_u, cand_count (256 words each), reduce_v (256 vec4), cand_v
    // (1,024 floats), radix_hist (256 words) and eight single words (the radix select's, the
    // draw's and the listed id's).
    CHECK(find("sample").shared_bytes == 256u * 4 * 3 + 256 * 16 + 1024 * 4 + 256 * 4 + 8 * 4);
    CHECK(find("sequencer").uses(SpvCap::kGroupNonUniformBallot));
    CHECK_FALSE(find("sequencer_noballot").uses(SpvCap::kGroupNonUniformBallot));
    for (const KernelInfo& k : kernels) {
        INFO(k.name);
        CHECK_FALSE(k.uses(SpvCap::kFloat16));  // `bluevm devices` reports these as unused
        CHECK_FALSE(k.uses(SpvCap::kInt8));
        CHECK_FALSE(k.uses(SpvCap::kInt64));
    }
    // The first instruction claims more words than the module has.
    const EmbeddedShader& s = kEmbeddedShaders[0];
    std::vector<uint32_t> cut_words(s.code, s.code + 6);
    cut_words[5] = (cut_words[5] & 0xFFFFu) | (100u << 16);
    Result<KernelInfo> cut = reflectKernel("cut", cut_words.data(), cut_words.size());
    REQUIRE_FALSE(cut.isOk());
    CHECK(cut.message().find("runs past the end") != std::string::npos);
    const uint32_t not_spirv[5] = {1, 2, 3, 4, 5};
    CHECK(reflectKernel("junk", not_spirv, 5).message() ==
          "kernel 'junk': not SPIR-V (no magic number in the first word)");
}

TEST_CASE("device limits: the sequencer variant follows subgroup ballot") {
    DeviceInfo d = uniformDevice(4096, true);
    d.max_shared_memory = 16384;  // Vulkan's minimum; SAMPLE's candidate list needs ~12 KiB
    CHECK(kernelVariant("sequencer", d) == "sequencer");
    CHECK(kernelChosen("sequencer", d));
    CHECK_FALSE(kernelChosen("sequencer_noballot", d));
    d.subgroup_ballot = false;
    CHECK(kernelVariant("sequencer", d) == "sequencer_noballot");
    CHECK(kernelVariantReason("sequencer", d).find("no subgroup ballot") == 0);
    CHECK_FALSE(kernelChosen("sequencer", d));
    CHECK(kernelVariant("tadd", d) == "tadd");
    CHECK(unmetNeeds(d).empty());  // without ballot the variant is used: nothing is missing
    // The int8 GEMMs run only where integer dot products are offered (KernelChoice::int8_matmul).
    d.int_dot = true;
    for (const char* k : {"matmul_q8_0_tq", "matmul_q4_0_iq", "matmul_q6_k_b1q", "matmul_q4_0_q", "packx"}) {
        CHECK(kernelChosen(k, d));
    }
    d.int_dot = false;
    for (const char* k : {"matmul_q8_0_tq", "matmul_q4_0_iq", "matmul_q6_k_b1q", "matmul_q4_0_q", "packx"}) {
        CHECK_FALSE(kernelChosen(k, d));
    }
    CHECK(kernelChosen("matmul_q4_0_i", d));
    CHECK(kernelChosen("matmul_q4_0_b1", d));
}

TEST_CASE("device limits: a device that misses a need is refused at start, naming each need") {
    DeviceInfo d = uniformDevice(4096, true);
    applyDeviceProfile(builtin("powervr-bxs-pvr"), d);
    std::string missing = unmetNeeds(d);
    for (const char* need :
         {"shaderStorageBufferArrayDynamicIndexing (kernels index the page array",
          "maxPerStageDescriptorStorageBuffers 4 < 26", "maxDescriptorSetStorageBuffers 12 < 26",
          "maxPerStageDescriptorStorageImages 4 < 6", "maxComputeWorkGroupInvocations 128 < 256",
          "maxComputeWorkGroupSize[0] 128 < 256"}) {
        CHECK_MESSAGE(missing.find(need) != std::string::npos, need, " not in: ", missing);
    }
    DeviceInfo old = uniformDevice(4096, true);
    old.api_version = VK_MAKE_API_VERSION(0, 1, 1, 0);
    old.max_push_constants = 64;
    old.max_shared_memory = 16;
    std::string shared_need;
    for (const DeviceNeed& n : deviceNeeds(old)) {
        if (n.what == "maxComputeSharedMemorySize") {
            CHECK(n.need >= BLUE_ITEM_WG * 4u);  // tsum's partial sums at least
            shared_need = strFormat("maxComputeSharedMemorySize 16 < %llu (%s)",
                                    (unsigned long long)n.need, n.why.c_str());
        }
    }
    CHECK(unmetNeeds(old) ==
          "Vulkan 1.2 (the device has 1.1); maxPushConstantsSize 64 < 128 (shaders/blue_config.h: "
          "BLUE_PUSH_WORDS); " +
              shared_need);

    DeviceOptions opt;
    opt.limits = "powervr-bxs-pvr";
    auto dev = Device::create(opt);
    REQUIRE_FALSE(dev.isOk());
    CHECK(dev.message().find("emulating powervr-bxs-pvr") != std::string::npos);
    CHECK(dev.message().find("maxPerStageDescriptorStorageBuffers 4 < 26") != std::string::npos);
    opt.limits = "bluevm-minimum";
    auto listed = listDevices(opt.limits);
    REQUIRE(listed.isOk());
    for (const DeviceInfo& info : listed.value()) CHECK_MESSAGE(info.missing.empty(), info.missing);
    opt.limits = "no-such-gpu";
    CHECK(Device::create(opt).message().find("no built-in device profile named 'no-such-gpu'") ==
          0);
}

TEST_CASE("device limits: the pages and the control buffer must fit the device-local heap") {
    PagePlan pages;
    pages.page_bytes = {3u << 20, 2u << 20};
    ControlLayout layout;
    layout.control_words = 1u << 18;  // 1 MiB
    CHECK(checkDeviceFit(pages, layout, 64, 6u << 20, 65535).isOk());
    Status s = checkDeviceFit(pages, layout, 64, 5u << 20, 65535);
    CHECK(s.message() ==
          "the module needs 6.0 MiB of device memory (2 tensor pages and the control buffer for 64 "
          "instances), the device has 5.0 MiB; --vram-budget keeps weights in host memory");
    // The sequencer runs BLUE_SEQ_WG instances per workgroup along x.
    CHECK(checkDeviceFit(pages, layout, 65535 * BLUE_SEQ_WG, 6u << 20, 65535).isOk());
    s = checkDeviceFit(pages, layout, 65535 * BLUE_SEQ_WG + 1, 6u << 20, 65535);
    CHECK(s.message().find("need 65536 sequencer workgroups of 64, the device allows 65535 "
                           "(maxComputeWorkGroupCount[0])") != std::string::npos);
}

// Three weights of 2 KiB, two row tensors and two instance tensors of 4 KiB (two rows or
// instances): one page on the real device; six of 4 KiB on a device whose texel views hold 256
// texels (A and B share one). Each instance prints every 37th
// element of A + B + C + id.
std::string pagesSource() {
    std::string s = ".layout regs=16 max_rows=2\n";
    for (int t = 0; t < 3; ++t) {
        s += strFormat(".tensor %c weight f32 [512] data f32", 'A' + t);
        for (int i = 0; i < 512; ++i) s += strFormat(" %d", (i * (t + 3)) % 101 - 50);
        s += "\n";
    }
    s += R"(.tensor y rows f32 [512]
.tensor z rows f32 [512]
.tensor x instance f32 [512]
.tensor out instance f32 [512]
.block sum args=0
    tadd y, A, B
    tadd z, y, C
    tadd out, z, x
.end
main:
    iid   r1
    itof  r4, r1
    li    r2, 0
    li    r3, 512
fill:
    tst   r4, r2, x
    addi  r2, r2, 1
    bltu  r2, r3, fill
    run   sum, r0
    li    r2, 0
show:
    tld   r4, r2, out
    outf  r4
    addi  r2, r2, 37
    bltu  r2, r3, show
    halt
)";
    return s;
}

TEST_CASE(
    "device limits: on an emulated device with 4 KiB pages and no ballot, a program split over six "
    "pages runs as on the reference") {
    std::unique_ptr<Device> made = emulatedDevice(R"({
  "name": "tiny-pages", "device": "test", "source": "tests/test_device_limits.cpp",
  "limits": {"maxTexelBufferElements": 256}, "features": {"subgroupBallot": false}})");
    Device& dev = *made;
    CHECK(dev.info().profile == "tiny-pages");
    CHECK(dev.maxPageBytes() == 4096u);
    CHECK(kernelVariant("sequencer", dev.info()) == "sequencer_noballot");
    CHECK(dev.props().limits.maxTexelBufferElements == 256u);
    auto pipelines = Pipelines::create(dev);
    REQUIRE(pipelines.isOk());

    Result<Module> m = assemble(pagesSource(), "pages");
    REQUIRE_MESSAGE(m.isOk(), m.message());
    Result<WeightSource> w = WeightSource::open(m.value(), "");
    REQUIRE(w.isOk());
    const uint32_t n = 2;
    Result<PagePlan> real = planPages(m.value(), n, gpu().device->maxPageBytes());
    Result<PagePlan> small = planPages(m.value(), n, dev.maxPageBytes());
    REQUIRE(real.isOk());
    REQUIRE(small.isOk());
    CHECK(real->page_bytes.size() == 1);
    CHECK(small->page_bytes.size() == 6);

    RefMachine ref(m.value(), w.value(), MachineOptions{n, 1000});
    ref.closeInput();
    RunReport want = ref.run();
    GpuOptions gopt;
    gopt.instances = n;
    gopt.max_cycles = 1000;
    auto machine = GpuMachine::create(dev, *pipelines.value(), m.value(), w.value(), gopt);
    REQUIRE_MESSAGE(machine.isOk(), machine.message());
    machine.value()->closeInput();
    auto got = machine.value()->run();
    REQUIRE_MESSAGE(got.isOk(), got.message());
    REQUIRE(want.output.size() == 2 * 14);
    CHECK(got->output.size() == want.output.size());
    for (uint32_t i = 0; i < n; ++i) {
        std::vector<OutputRecord> a = recordsOf(got->output, i), b = recordsOf(want.output, i);
        REQUIRE(a.size() == b.size());
        for (size_t k = 0; k < a.size(); ++k) CHECK(a[k].value == b[k].value);
    }
    CHECK(machine.value()->stats().cycles == want.cycles);

    // A tensor of 8 KiB does not fit a 4 KiB page: refused at load, naming it.
    std::string big_source = ".tensor D weight f32 [2048] data f32";
    for (int i = 0; i < 2048; ++i) big_source += " 1";
    big_source += "\nmain:\n    halt\n";
    Result<Module> big = assemble(big_source, "big");
    REQUIRE(big.isOk());
    Result<WeightSource> bw = WeightSource::open(big.value(), "");
    REQUIRE(bw.isOk());
    auto refused = GpuMachine::create(dev, *pipelines.value(), big.value(), bw.value(), gopt);
    REQUIRE_FALSE(refused.isOk());
    CHECK(refused.message().rfind("tensor 'D' needs ", 0) == 0);
    pipelines.value().reset();
    CHECK(dev.validationErrors() == 0u);
}

TEST_CASE("device limits: memory allocations past maxMemoryAllocationCount are refused with the numbers") {
    std::unique_ptr<Device> made = emulatedDevice(R"({
  "name": "few-allocations", "device": "test", "source": "tests/test_device_limits.cpp",
  "limits": {"maxMemoryAllocationCount": 2}})");
    Device& dev = *made;
    CHECK(dev.info().max_allocations == 2u);
    {
        std::vector<Buffer> held;
        for (int i = 0; i < 2; ++i) {
            auto b = createBuffer(dev, 256, 0, MemKind::DEVICE, "test");
            REQUIRE_MESSAGE(b.isOk(), b.message());
            held.push_back(b.value());
        }
        CHECK(dev.allocations() == 2u);
        auto third = createBuffer(dev, 256, 0, MemKind::DEVICE, "test");
        REQUIRE_FALSE(third.isOk());
        CHECK_MESSAGE(third.message().find("the device allows 2 memory allocations at once "
                                           "(maxMemoryAllocationCount) and 2 are in use") != std::string::npos,
                      third.message());
        destroyBuffer(dev, held.back());
        held.pop_back();
        auto again = createBuffer(dev, 256, 0, MemKind::DEVICE, "test");
        REQUIRE(again.isOk());
        held.push_back(again.value());
        for (Buffer& b : held) destroyBuffer(dev, b);
        CHECK(dev.allocations() == 0u);
    }
    // A machine needs three allocations even for this small program: refused at load,
    // and what it had allocated is freed.
    auto pipelines = Pipelines::create(dev);
    REQUIRE(pipelines.isOk());
    Result<Module> m = assemble(pagesSource(), "pages");
    REQUIRE(m.isOk());
    Result<WeightSource> w = WeightSource::open(m.value(), "");
    REQUIRE(w.isOk());
    GpuOptions gopt;
    gopt.instances = 2;
    auto refused = GpuMachine::create(dev, *pipelines.value(), m.value(), w.value(), gopt);
    REQUIRE_FALSE(refused.isOk());
    CHECK_MESSAGE(refused.message().find("(maxMemoryAllocationCount)") != std::string::npos, refused.message());
    CHECK(dev.allocations() == 0u);
    pipelines.value().reset();
    CHECK(dev.validationErrors() == 0u);
}

}  // namespace
}  // namespace blue::test
