// IEEE binary16 (fp16) and bfloat16 <-> binary32 conversions, bit-exact and portable (no F16C, no
// _Float16), so the CPU reference gives the same bits on every host.
//
// fp16: round-to-nearest-even, overflow to infinity, subnormals kept (both ways), NaN stays NaN
// (its top 10 payload bits survive, so every fp16 NaN round-trips exactly through f32).
// bf16: rounding exactly like llama.cpp's ggml_compute_fp32_to_bf16 — round-to-nearest-even by
// adding a bias, no flush of subnormals, NaN forced quiet (payload bit 6 set).
#pragma once

#include <bit>
#include <cstdint>

namespace blue {

constexpr float kHalfMax = 65504.0f;  // largest finite fp16

// fp16 bits -> f32, exact.
constexpr float halfToF32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float mag = float(mant) * 0x1p-24f;
    return sign ? -mag : mag;
}

// f32 -> fp16 bits, round-to-nearest-even.
constexpr uint16_t halfFromF32(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, never let it become inf
        uint16_t payload = uint16_t((abs >> 13) & 0x3ffu);
        return uint16_t(sign | 0x7c00u | (payload ? payload : 0x200u));
    }
    if (abs >= 0x477ff000u)
        return uint16_t(sign | 0x7c00u);         // >= 65520 rounds to inf (ties to even)
    if (abs >= 0x38800000u) {                    // normal fp16 (>= 2^-14)
        uint32_t h = (abs - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
        const uint32_t rem = abs & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            ++h;  // a carry into the exponent is right
        return uint16_t(sign | h);
    }
    // fp16 subnormal or zero: result = round(|f| * 2^24) = round(m * 2^(e - 126)).
    const uint32_t e = abs >> 23;
    if (e < 102) return sign;  // |f| < 2^-25: rounds to zero (2^-25 exactly is a tie -> even 0)
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // 0x400 = smallest normal, encoded right
    return uint16_t(sign | q);
}

// bf16 bits -> f32, exact.
constexpr float bf16ToF32(uint16_t b) {
    return std::bit_cast<float>(uint32_t(b) << 16);
}

// f32 -> bf16 bits, as ggml_compute_fp32_to_bf16.
constexpr uint16_t bf16FromF32(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
    return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace blue
