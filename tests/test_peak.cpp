// Device ceilings (host/peak.h) and the native ones (host/bench.h): every kernel shape runs, reads
// every word of its buffer (the kernels' XOR of what they read equals the host's), and reports a
// positive speed; `bluevm devices --peak` prints them. Speeds themselves are benchmarks, not
// tested.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "host/bench.h"
#include "host/peak.h"
#include "tests/child.h"
#include "tests/gpu_fixture.h"

namespace blue::test {
namespace {

TEST_CASE("peak: every read and FMA shape runs on the device, reads all of its buffer and gives a speed") {
    PeakOptions o;
    o.read_bytes = 16u << 20;
    o.reps = 1;
    o.fma_ms = 2;
    auto p = measureDevicePeak(*gpu().device, o);
    REQUIRE_MESSAGE(p, p.message());
    CHECK(p->read_bytes > 0);  // 16 MiB, or what the device's texel buffers reach
    CHECK(p->read_bytes <= 16u << 20);
    CHECK(p->read.size() >= 9);  // 3 sources x (1 lane, the workgroup or subgroup, all lanes)
    for (const PeakShape& s : p->read) {
        INFO(s.what);
        CHECK(s.skipped.empty());
        CHECK(s.value > 0);
    }
    REQUIRE(p->fma.size() == 6);
    for (const PeakShape& s : p->fma) {
        INFO(s.what);
        CHECK((s.value > 0) == s.skipped.empty());
    }
    REQUIRE(p->bestRead() != nullptr);
    REQUIRE(p->bestFma() != nullptr);
    CHECK(p->readGBs() == p->bestRead()->value);
    CHECK(p->fmaGFlops() >= p->fma[0].value);
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("peak: native read bandwidth and FMA throughput are measured on every core") {
    BandwidthResult bw = measureReadBandwidth(16u << 20, 0, 1);
    CHECK(bw.gb_per_s > 0);
    FmaResult f = measureNativeFma(0, 1);
    CHECK(f.gflops > 0);
    CHECK(f.threads >= 1);
    CHECK(std::string(f.isa).size() > 0);
}

TEST_CASE("peak: bluevm devices --peak --json") {
    Child c({std::string(BLUE_BINARY_DIR) + "/host/bluevm", "devices", "--peak", "--peak-mb", "8", "--json"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    auto j = nlohmann::json::parse(c.out_text);
    CHECK(j["read_bytes"].get<uint64_t>() > 0);
    CHECK(j["read_bytes"].get<uint64_t>() <= 8u << 20);
    CHECK(j["device_read_gb_per_s"].get<double>() > 0);
    CHECK(j["device_fma_gflops"].get<double>() > 0);
    CHECK(j["native"]["fma_gflops"].get<double>() > 0);
    CHECK(j["read"].size() >= 9);
    Child bad({std::string(BLUE_BINARY_DIR) + "/host/bluevm", "devices", "--peak", "--peak-mb", "0"});
    CHECK(bad.wait() != 0);
}

}  // namespace
}  // namespace blue::test
