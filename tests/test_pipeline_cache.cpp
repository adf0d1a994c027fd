// The on-disk pipeline cache: a damaged file is ignored rather than handed to the driver, and
// processes saving at once never leave a torn file. (Six test processes on one NVIDIA H200 once
// shared a fixed temporary name: a torn cache gave broken kernels and wrong tokens.)
#include <doctest/doctest.h>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>
#include <vector>

#include "host/pipelines.h"
#include "tests/gpu_fixture.h"
#include "tests/scoped_env.h"
#include "tests/temp_dir.h"

namespace blue::test {

namespace {

std::vector<char> blobOf(uint32_t seed, size_t size) {
    std::vector<char> b(size);
    uint32_t x = seed * 2654435761u + 1;
    for (char& c : b) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        c = char(x);
    }
    return b;
}

std::vector<char> fileBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("pipeline cache: a file decodes to its blob; every truncation and every changed byte is refused") {
    const std::vector<char> blob = blobOf(7, 300);
    const std::vector<char> file = encodePipelineCache(blob);
    REQUIRE(decodePipelineCache(file) == blob);
    CHECK(decodePipelineCache(encodePipelineCache({})) == std::vector<char>{});
    for (size_t n = 0; n < file.size(); ++n) {
        CAPTURE(n);
        CHECK_FALSE(decodePipelineCache(std::vector<char>(file.begin(), file.begin() + long(n))));
    }
    for (size_t i = 0; i < file.size(); ++i) {
        for (int bit : {0, 7}) {
            std::vector<char> bad = file;
            bad[i] = char(bad[i] ^ (1 << bit));
            CAPTURE(i);
            CHECK_FALSE(decodePipelineCache(bad));
        }
    }
    // A driver blob saved by an older BlueVM (no header) is not taken for one.
    CHECK_FALSE(decodePipelineCache(blob));
}

TEST_CASE("pipeline cache: writers saving at once leave one whole file, and no temporary ones") {
    TempDir dir("blue_pcache");
    const std::string path = dir.path + "/pipelines.bin";
    constexpr int kWriters = 6, kRounds = 40;
    std::vector<std::vector<char>> blobs;
    for (int w = 0; w < kWriters; ++w) blobs.push_back(blobOf(uint32_t(w + 1), 64 * 1024 + size_t(w) * 4099));
    std::atomic<bool> done{false};
    std::atomic<int> torn{0}, whole{0}, failed{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
        threads.emplace_back([&, w] {
            for (int r = 0; r < kRounds; ++r) failed += !writePipelineCacheFile(path, blobs[size_t(w)]);
        });
    }
    std::thread reader([&] {
        while (!done) {
            const std::vector<char> file = fileBytes(path);
            if (file.empty()) continue;  // not written yet
            const auto blob = decodePipelineCache(file);
            bool known = false;
            for (const auto& b : blobs) known |= blob && *blob == b;
            ++(known ? whole : torn);
        }
    });
    for (std::thread& t : threads) t.join();
    done = true;
    reader.join();
    CHECK(failed == 0);
    CHECK(torn == 0);
    CHECK(whole > 0);
    const std::vector<char> last = readPipelineCacheFile(path);
    CHECK(std::find(blobs.begin(), blobs.end(), last) != blobs.end());
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
        CAPTURE(e.path().string());
        CHECK(e.path().filename() == "pipelines.bin");
        ++files;
    }
    CHECK(files == 1);
}

TEST_CASE("pipeline cache: pipelines are saved in the checked format, and a damaged cache is ignored") {
    TempDir dir("blue_pcache_gpu");
    ScopedEnv cache_home("XDG_CACHE_HOME", dir.path.c_str());
    ScopedEnv cache_on("BLUE_NO_PIPELINE_CACHE", nullptr);
    Device& dev = *gpu().device;
    std::string file;
    {
        Result<std::unique_ptr<Pipelines>> p = Pipelines::create(dev);
        REQUIRE(p);
        REQUIRE(p.value()->get("swiglu"));
        p.value()->saveCache();
    }
    // (The driver may keep caches of its own under XDG_CACHE_HOME too: lavapipe does when the
    // device is first made in this scope.)
    for (const auto& e : std::filesystem::directory_iterator(dir.path + "/bluevm")) {
        const std::string name = e.path().filename().string();
        if (name.rfind("pipelines-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin") {
            file = e.path().string();
        }
    }
    REQUIRE(!file.empty());
    std::vector<char> bytes = fileBytes(file);
    CHECK(decodePipelineCache(bytes).has_value());
    // Damage the driver's part: the next process starts from an empty cache and still builds.
    bytes.back() = char(bytes.back() ^ 0x5a);
    std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
    CHECK(readPipelineCacheFile(file).empty());
    {
        Result<std::unique_ptr<Pipelines>> p = Pipelines::create(dev);
        REQUIRE(p);
        CHECK(p.value()->get("swiglu"));
        p.value()->saveCache();
    }
    CHECK(decodePipelineCache(fileBytes(file)).has_value());
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace blue::test
