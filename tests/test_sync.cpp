// Synchronization: the barrier tracker's rules (host/sync.h), and proof that the validation
// layer's synchronization checks are on and catch a missing barrier (so the suite's zero
// hazards mean something).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "host/buffer.h"
#include "host/sync.h"
#include "host/vk_check.h"
#include "tests/gpu_fixture.h"
#include "tests/temp_dir.h"

namespace blue::test {
namespace {

constexpr VkPipelineStageFlags kCs = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
constexpr VkPipelineStageFlags kXfer = VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr VkAccessFlags kRead = VK_ACCESS_SHADER_READ_BIT;
constexpr VkAccessFlags kWrite = VK_ACCESS_SHADER_WRITE_BIT;

TEST_CASE("sync: read after write gets a barrier from the write to the read, once") {
    SyncTracker t(2);
    CHECK(t.use(nullptr, {{0, kCs, kWrite}}).empty());  // nothing earlier
    SyncBarrier b = t.use(nullptr, {{0, kCs, kRead}});
    CHECK(b.src_stage == kCs);
    CHECK(b.src_access == kWrite);
    CHECK(b.dst_stage == kCs);
    CHECK(b.dst_access == kRead);
    CHECK(t.use(nullptr, {{0, kCs, kRead}}).empty());  // already visible to compute reads
    // A transfer read of the same write still needs its own visibility.
    b = t.use(nullptr, {{0, kXfer, VK_ACCESS_TRANSFER_READ_BIT}});
    CHECK(b.src_stage == kCs);
    CHECK(b.dst_access == VK_ACCESS_TRANSFER_READ_BIT);
    CHECK(t.barriers() == 2);
}

TEST_CASE("sync: write after write and write after read") {
    SyncTracker t(1);
    t.use(nullptr, {{0, kXfer, VK_ACCESS_TRANSFER_WRITE_BIT}});
    SyncBarrier waw = t.use(nullptr, {{0, kCs, kWrite}});
    CHECK(waw.src_access == VK_ACCESS_TRANSFER_WRITE_BIT);
    CHECK(waw.dst_access == kWrite);  // the destination scope includes the new write

    SyncTracker r(1);
    r.use(nullptr, {{0, kXfer, VK_ACCESS_TRANSFER_READ_BIT}});  // a read with no earlier write
    SyncBarrier war = r.use(nullptr, {{0, kCs, kWrite}});
    CHECK(war.src_stage == kXfer);  // execution dependency only
    CHECK(war.src_access == 0);
    CHECK(war.dst_stage == kCs);
    CHECK(r.use(nullptr, {{0, kCs, kRead}}).empty() == false);  // read after that write
}

TEST_CASE("sync: reads after reads need nothing; a global barrier covers other resources") {
    SyncTracker t(2);
    t.use(nullptr, {{0, kCs, kWrite}, {1, kCs, kWrite}});
    SyncBarrier b = t.use(nullptr, {{0, kCs, kRead}});
    CHECK_FALSE(b.empty());
    // The global barrier made resource 1's compute write visible to compute reads too.
    CHECK(t.use(nullptr, {{1, kCs, kRead}}).empty());
    CHECK(t.use(nullptr, {{0, kCs, kRead}, {1, kCs, kRead}}).empty());
}

TEST_CASE("sync: host reads are made visible but never order later GPU work") {
    SyncTracker t(1);
    t.use(nullptr, {{0, kCs, kWrite}});
    SyncBarrier b = t.use(nullptr, {{0, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT}});
    CHECK(b.dst_stage == VK_PIPELINE_STAGE_HOST_BIT);
    CHECK(syncStageNames(b.src_stage | b.dst_stage) == "COMPUTE_SHADER|HOST");
    CHECK(syncAccessNames(b.src_access | b.dst_access) == "SHADER_WRITE|HOST_READ");
    // A later compute write conflicts with the earlier compute write, not with the host read.
    SyncBarrier w = t.use(nullptr, {{0, kCs, kWrite}});
    CHECK(w.src_stage == kCs);
}

TEST_CASE("sync: a replayed sequence starts with the barrier its own end state asks for") {
    // The chain shape: stage-in copy, compute, snapshot copy, host read. Recorded after a dry
    // run of itself, its first command must wait for the previous replay's compute writes.
    const SyncUse in[] = {{1, kXfer, VK_ACCESS_TRANSFER_READ_BIT},
                          {0, kXfer, VK_ACCESS_TRANSFER_WRITE_BIT}};
    const SyncUse cs[] = {{0, kCs, kRead | kWrite}, {1, kCs, kRead | kWrite}};
    const SyncUse out[] = {{0, kXfer, VK_ACCESS_TRANSFER_READ_BIT},
                           {1, kXfer, VK_ACCESS_TRANSFER_WRITE_BIT}};
    SyncTracker t(2);
    auto chain = [&] {
        std::vector<SyncBarrier> bs = {t.use(nullptr, in), t.use(nullptr, cs), t.use(nullptr, out)};
        return bs;
    };
    std::vector<SyncBarrier> first = chain();
    CHECK(first[0].empty());  // nothing before the very first chain
    std::vector<SyncBarrier> replay = chain();
    REQUIRE_FALSE(replay[0].empty());
    // The stage-in copy reads what the previous chain's snapshot wrote (1) and writes what it
    // read (0). The previous compute write to 0 is already ordered: the barrier before the
    // snapshot made it visible to transfer writes, for every resource.
    CHECK(replay[0].src_stage == kXfer);
    CHECK(replay[0].src_access == VK_ACCESS_TRANSFER_WRITE_BIT);
    CHECK(replay[0].dst_stage == kXfer);
    CHECK(replay[0].dst_access == VK_ACCESS_TRANSFER_READ_BIT);
    CHECK((replay[2].dst_access & VK_ACCESS_TRANSFER_WRITE_BIT) != 0);
    std::vector<SyncBarrier> again = chain();
    for (size_t i = 0; i < again.size(); ++i) {
        CHECK(again[i].src_stage == replay[i].src_stage);
        CHECK(again[i].dst_access == replay[i].dst_access);
    }
}

// A device of its own: this test provokes a validation error on purpose.
// Records two copies, the second reading what the first wrote with no barrier between, on a
// device of its own; returns false when synchronization validation is off.
bool provokeHazard(Device& d) {
    if (d.validationChecks().find("synchronization") == std::string::npos) {
        MESSAGE("synchronization validation is off (BLUE_VALIDATION=" << d.validationChecks() << ")");
        return false;
    }
    auto a = createBuffer(d, 256, 0, MemKind::DEVICE, "a");
    auto b = createBuffer(d, 256, 0, MemKind::DEVICE, "b");
    REQUIRE(a.isOk());
    REQUIRE(b.isOk());
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = d.queueFamily();
    VkCommandPool pool;
    REQUIRE(vkCreateCommandPool(d.device(), &pi, nullptr, &pool) == VK_SUCCESS);
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb;
    REQUIRE(vkAllocateCommandBuffers(d.device(), &ai, &cb) == VK_SUCCESS);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cb, &bi);
    VkBufferCopy region{0, 0, 256};
    vkCmdCopyBuffer(cb, a->buffer, b->buffer, 1, &region);
    vkCmdCopyBuffer(cb, b->buffer, a->buffer, 1, &region);  // reads b before the write is visible
    vkEndCommandBuffer(cb);
    vkDestroyCommandPool(d.device(), pool, nullptr);
    destroyBuffer(d, a.value());
    destroyBuffer(d, b.value());
    return true;
}

std::string readAll(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_CASE("sync: synchronization validation is on and reports a missing barrier") {
    DeviceOptions o;
    o.validation = true;
    o.report_validation = false;  // provoked on purpose: counted, not reported
    auto dev = Device::create(o);
    REQUIRE_MESSAGE(dev.isOk(), dev.message());
    Device& d = *dev.value();
    const uint32_t before = d.validationErrors();
    if (!provokeHazard(d)) return;
    CHECK(d.validationErrors() > before);
    CHECK(d.lastValidationMessage().find("SYNC-HAZARD") != std::string::npos);
}

// The test binary fails on a validation message from any device, thread or child process through
// BLUE_VALIDATION_LOG (tests/main.cpp): a reporting device appends each message to that file.
// Here the variable points at a file of this test's for the duration (no other device runs), and
// stderr at /dev/null, so the suite's log shows no message that is not a finding.
TEST_CASE("sync: a reporting device appends its validation messages to BLUE_VALIDATION_LOG") {
    TempDir dir;
    const std::string log = dir.path + "/validation.log";
    std::fflush(stderr);
    const int saved_stderr = dup(2);
    const int devnull = open("/dev/null", O_WRONLY);
    REQUIRE(saved_stderr >= 0);
    REQUIRE(devnull >= 0);
    dup2(devnull, 2);
    close(devnull);
    const char* was = std::getenv("BLUE_VALIDATION_LOG");
    const std::string saved = was ? was : "";
    setenv("BLUE_VALIDATION_LOG", log.c_str(), 1);
    {
        DeviceOptions o;
        o.validation = true;
        auto dev = Device::create(o);
        REQUIRE_MESSAGE(dev.isOk(), dev.message());
        if (provokeHazard(*dev.value())) {
            std::string text = readAll(log);
            CHECK(text.find("[validation error]") != std::string::npos);
            CHECK(text.find("SYNC-HAZARD") != std::string::npos);
            CHECK(text.find("[pid " + std::to_string(getpid()) + "]") != std::string::npos);
        }
    }
    if (was) setenv("BLUE_VALIDATION_LOG", saved.c_str(), 1); else unsetenv("BLUE_VALIDATION_LOG");
    std::fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
}

}  // namespace
}  // namespace blue::test
