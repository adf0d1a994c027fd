// Internal to vm/quant.cpp, vm/quant_k.cpp and vm/quant_iq4.cpp: rounding helpers shared by the
// encoders, and the per-block entry points of the K-quants and the IQ4 types. Not part of the
// public API (use vm/quant.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vm/half.h"
#include "vm/quant.h"

namespace blue::quant_internal {

// Nearest integer (ties to even) of v clamped to [lo, hi]; NaN maps to lo. Never undefined
// behaviour, whatever v is. Inline arithmetic: the quantizers call this in their inner loops.
inline int roundClamp(double v, int lo, int hi) {
    if (!(v > lo)) return lo;
    if (v >= hi) return hi;
    // Adding and removing 1.5 * 2^52 rounds a small double to an integer, ties to even (the IEEE
    // default mode; the build never enables -ffast-math, which would fold this away).
    constexpr double kRound = 6755399441055744.0;
    return int((v + kRound) - kRound);
}

// fp16 bits of a block scale, saturated to the finite fp16 range so that a block of huge values
// decodes to clamped finite numbers instead of inf.
inline uint16_t halfScale(double v) {
    return halfFromF32(float(std::clamp(v, -double(kHalfMax), double(kHalfMax))));
}

// Index of the element with the largest magnitude (the first of equals); 0 for an all-zero range.
inline int argMaxAbs(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
        if (std::fabs(x[i]) > std::fabs(x[best])) best = i;
    }
    return best;
}

// K-quant blocks: decode 256 floats / encode 256 floats. `search` selects the least-squares
// scale search (quantizeRow) or the plain min/max baseline (quantizeRowBaseline).
void decodeQ2_K(const BlockQ2_K& b, float* y);
void decodeQ3_K(const BlockQ3_K& b, float* y);
void decodeQ4_K(const BlockQ4_K& b, float* y);
void decodeQ5_K(const BlockQ5_K& b, float* y);
void decodeQ6_K(const BlockQ6_K& b, float* y);
void decodeQ8_K(const BlockQ8_K& b, float* y);
void encodeQ2_K(const float* x, BlockQ2_K& b, bool search);
void encodeQ3_K(const float* x, BlockQ3_K& b, bool search);
void encodeQ4_K(const float* x, BlockQ4_K& b, bool search);
void encodeQ5_K(const float* x, BlockQ5_K& b, bool search);
void encodeQ6_K(const float* x, BlockQ6_K& b, bool search);
void encodeQ8_K(const float* x, BlockQ8_K& b);

// Non-linear 4-bit blocks (quant_iq4.cpp): decode / encode 32 (IQ4_NL) or 256 (IQ4_XS) floats.
void decodeIQ4_NL(const BlockIQ4_NL& b, float* y);
void decodeIQ4_XS(const BlockIQ4_XS& b, float* y);
void encodeIQ4_NL(const float* x, BlockIQ4_NL& b, bool search);
void encodeIQ4_XS(const float* x, BlockIQ4_XS& b, bool search);

// Low-bit blocks (quant_low.cpp): ternary TQ1_0 / TQ2_0 (256 floats) and MXFP4 (32 floats).
void decodeTQ1_0(const BlockTQ1_0& b, float* y);
void decodeTQ2_0(const BlockTQ2_0& b, float* y);
void decodeMXFP4(const BlockMXFP4& b, float* y);
void encodeTQ1_0(const float* x, BlockTQ1_0& b, bool search);
void encodeTQ2_0(const float* x, BlockTQ2_0& b, bool search);
void encodeMXFP4(const float* x, BlockMXFP4& b, bool search);
// One byte of TQ1_0 holding the 5 trits t[0..4] (each 0..2), and trit n of a byte.
uint8_t packTrits(const uint8_t* t);
int tritOf(uint8_t byte, int n);

}  // namespace blue::quant_internal
