// The low-bit formats llama.cpp reads beside the K-quants: the ternary TQ2_0 (2 bits per weight)
// and TQ1_0 (five trits per byte, 1.6875 bits) of BitNet b1.58 models, and MXFP4 (the OCP
// microscaling FP4: E2M1 codes under a power-of-two scale per 32). Byte layouts: quant.h.
//
// Ternary encoding searches the block's one scale d: with the elements sorted by magnitude, making
// the j largest nonzero (sign kept) has least-squares scale S_j / j (S_j their magnitude sum) and
// removes S_j^2 / j of the squared error, so the j with the largest S_j^2 / j wins; every element
// then takes the code nearest x / d for the fp16 d the decoder will see. The baseline (no search)
// is llama.cpp's plain rule, d = max |x|. MXFP4 tries the smallest exponent whose largest level
// (6, stored doubled as 12) covers max |x| and the one below it (finer, clipping the largest),
// each element to its nearest level, and keeps the one with less squared error.
#include <array>
#include <cmath>
#include <cstring>
#include <functional>

#include "vm/quant_internal.h"

namespace blue::quant_internal {

namespace {

constexpr int kTernary = 256;
constexpr uint8_t kPow3[6] = {1, 3, 9, 27, 81, 243};

// The scale of a ternary block (>= 0).
double ternaryScale(const float* x, bool search) {
    std::array<double, kTernary> mag{};
    double amax = 0;
    for (int i = 0; i < kTernary; ++i) {
        mag[size_t(i)] = std::fabs(double(x[i]));
        amax = std::max(amax, mag[size_t(i)]);
    }
    if (!search || amax == 0) return amax;
    std::sort(mag.begin(), mag.end(), std::greater<double>());
    double sum = 0, best = 0, scale = amax;
    for (int j = 1; j <= kTernary; ++j) {
        sum += mag[size_t(j - 1)];
        if (sum * sum / j > best) {
            best = sum * sum / j;
            scale = sum / j;
        }
    }
    return scale;
}

// Codes 0..2 (value - 1) of a ternary block for the stored scale; the scale's fp16 bits.
uint16_t ternaryCodes(const float* x, bool search, uint8_t* codes) {
    const uint16_t d = halfScale(ternaryScale(x, search));
    const double stored = halfToF32(d);
    for (int i = 0; i < kTernary; ++i) {
        codes[i] = uint8_t(stored > 0 ? roundClamp(x[i] / stored, -1, 1) + 1 : 1);
    }
    return d;
}

// 2^(e - 128): the scale of an MXFP4 block (half the E8M0 value, as the levels are doubled).
float mxfp4Scale(uint8_t e) {
    return std::ldexp(1.0f, int(e) - 128);
}

// The code whose level is nearest v (ties to the smaller magnitude), among the levels that decode
// to a finite float at scale d (12 * 2^125 would not).
int mxfp4Code(double v, float d) {
    int best = 0;
    double err = std::fabs(v);
    for (int c = 1; c < 16; ++c) {
        if (!std::isfinite(float(kMxfp4Values[c]) * d)) continue;
        const double e = std::fabs(v - kMxfp4Values[c]);
        if (e < err) {
            err = e;
            best = c;
        }
    }
    return best;
}

}  // namespace

uint8_t packTrits(const uint8_t* t) {
    int v = 0;
    for (int n = 0; n < 5; ++n) v = v * 3 + t[n];
    return uint8_t((v * 256 + 242) / 243);  // ceil(256 v / 243): the decoder's fraction
}

int tritOf(uint8_t byte, int n) {
    const uint8_t q = uint8_t(byte * kPow3[n]);
    return (int(q) * 3) >> 8;
}

void decodeTQ2_0(const BlockTQ2_0& b, float* y) {
    const float d = halfToF32(b.d);
    for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 4; ++l) {
            for (int m = 0; m < 32; ++m) {
                const int c = (b.qs[32 * h + m] >> (2 * l)) & 3;
                y[128 * h + 32 * l + m] = float(c - 1) * d;
            }
        }
    }
}

void encodeTQ2_0(const float* x, BlockTQ2_0& b, bool search) {
    uint8_t codes[kTernary];
    b.d = ternaryCodes(x, search, codes);
    std::memset(b.qs, 0, sizeof(b.qs));
    for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 4; ++l) {
            for (int m = 0; m < 32; ++m) {
                b.qs[32 * h + m] = uint8_t(b.qs[32 * h + m] | codes[128 * h + 32 * l + m] << (2 * l));
            }
        }
    }
}

void decodeTQ1_0(const BlockTQ1_0& b, float* y) {
    const float d = halfToF32(b.d);
    for (int n = 0; n < 5; ++n) {
        for (int m = 0; m < 32; ++m) y[32 * n + m] = float(tritOf(b.qs[m], n) - 1) * d;
    }
    for (int n = 0; n < 5; ++n) {
        for (int m = 0; m < 16; ++m) y[160 + 16 * n + m] = float(tritOf(b.qs[32 + m], n) - 1) * d;
    }
    for (int n = 0; n < 4; ++n) {
        for (int j = 0; j < 4; ++j) y[240 + 4 * n + j] = float(tritOf(b.qh[j], n) - 1) * d;
    }
}

void encodeTQ1_0(const float* x, BlockTQ1_0& b, bool search) {
    uint8_t codes[kTernary];
    b.d = ternaryCodes(x, search, codes);
    uint8_t t[5];
    for (int m = 0; m < 32; ++m) {
        for (int n = 0; n < 5; ++n) t[n] = codes[32 * n + m];
        b.qs[m] = packTrits(t);
    }
    for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 5; ++n) t[n] = codes[160 + 16 * n + m];
        b.qs[32 + m] = packTrits(t);
    }
    for (int j = 0; j < 4; ++j) {
        for (int n = 0; n < 4; ++n) t[n] = codes[240 + 4 * n + j];
        t[4] = 0;
        b.qh[j] = packTrits(t);
    }
}

void decodeMXFP4(const BlockMXFP4& b, float* y) {
    const float d = mxfp4Scale(b.e);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(kMxfp4Values[b.qs[j] & 0xF]) * d;
        y[j + 16] = float(kMxfp4Values[b.qs[j] >> 4]) * d;
    }
}

void encodeMXFP4(const float* x, BlockMXFP4& b, bool search) {
    const double amax = std::fabs(double(x[argMaxAbs(x, 32)]));
    int e0 = 0;
    if (amax > 0 && std::isfinite(amax)) {
        // Smallest e with 12 * 2^(e - 128) >= amax.
        e0 = std::clamp(int(std::ceil(std::log2(amax / 12.0))) + 128, 0, 254);
        while (e0 < 254 && 12.0 * mxfp4Scale(uint8_t(e0)) < amax) ++e0;
        while (e0 > 0 && 12.0 * mxfp4Scale(uint8_t(e0 - 1)) >= amax) --e0;
    }
    double best_err = INFINITY;
    for (int e = search ? std::max(0, e0 - 1) : e0; e <= e0; ++e) {
        const float d = mxfp4Scale(uint8_t(e));
        BlockMXFP4 c{};
        c.e = uint8_t(e);
        double err = 0;
        for (int j = 0; j < 32; ++j) {
            const int code = mxfp4Code(x[j] / double(d), d);
            const double diff = x[j] - kMxfp4Values[code] * double(d);
            err += diff * diff;
            c.qs[j % 16] = uint8_t(c.qs[j % 16] | code << (j < 16 ? 0 : 4));
        }
        if (err < best_err || (e == e0 && !(best_err < INFINITY))) {
            best_err = err;
            b = c;
        }
    }
}

}  // namespace blue::quant_internal
