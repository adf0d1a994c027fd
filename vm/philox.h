// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11): a
// counter-based generator, so the n-th random number of a request depends only on (seed, n) and
// every device computes the same one. shaders/common/philox.glsl is the GPU twin of this file.
#pragma once

#include <array>
#include <cstdint>

namespace blue {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = uint64_t(kM0) * ctr[0];
        uint64_t p1 = uint64_t(kM1) * ctr[2];
        ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
               uint32_t(p0)};
        key[0] += kW0;
        key[1] += kW1;
    }
    return ctr;
}

// A uniform float in [0, 1) for draw `counter` of stream `seed`: 24 random bits.
inline float philoxUniform(uint32_t seed, uint32_t counter) {
    std::array<uint32_t, 4> r = philox4x32({counter, 0, 0, 0}, {seed, 0x426C7565u /* "Blue" */});
    return float(r[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace blue
