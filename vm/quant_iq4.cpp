// The non-linear 4-bit formats IQ4_NL and IQ4_XS: each 4-bit code indexes the fixed table of 16
// levels kIq4Values (quant.h), times one scale per 32 elements. IQ4_NL stores that scale as fp16
// per block of 32; IQ4_XS stores a signed 6-bit code per 32 and one fp16 scale per 256, which
// saves 8 bits per 32 elements (4.25 bits per weight against 4.5). Byte layouts: quant.h.
//
// Encoding a group of 32 searches its scale. Each candidate maps the group's largest-magnitude
// element to a level near one end of the table (-127 or 113, moved by up to kCandidates = 7 table
// units, i.e. +-5.5% of the range), gives every element its nearest level, and solves the
// least-squares scale for that assignment (sum x*v / sum v*v); the candidate with the least squared
// error wins, then "reassign with the fitted scale / refit" repeats while the error falls. The
// scale is then rounded to what the decoder will see (fp16; for IQ4_XS the 6-bit code times the
// fp16 super-block scale, each code also tried one step up and down), and every element takes the
// level nearest x / scale, which is exact minimisation for that scale.
//
// llama.cpp searches the same way (its quantize_row_iq4_nl_impl tries 15 scales around the -127
// end) but weights the errors by x^2 when it has no importance matrix. As in quant_k.cpp we
// minimise the plain squared error: without activation statistics we have no better objective.
// Measured on Gaussian rows (tests/test_quant.cpp): relative RMSE 0.0736 (IQ4_NL) and 0.0743
// (IQ4_XS) against 0.080 for the min/max scale and 0.0857 for Q4_0. Trying the +113 end as well
// gains 1.6% over the -127 end alone; a fan of +-10 units gains 0.15% more at 1.2x the time, +-4
// loses 0.4%. 3-5 MB/s of f32 input per core, Q4_K's order.
#include <array>
#include <cstring>

#include "vm/quant_internal.h"

namespace blue::quant_internal {

namespace {

constexpr int kCandidates = 7;  // table units either side of each end
constexpr int kRefineRounds = 4;
constexpr int kGroup = 32;

// The code whose level is nearest v (ties to the lower level; NaN gives code 0): the number of
// midpoints between adjacent levels that v exceeds, found by a 4-step binary search whose steps
// compile to conditional moves (these lookups are most of the encoder's time).
constexpr std::array<double, 15> kMidpoints = [] {
    std::array<double, 15> m{};
    for (int i = 0; i < 15; ++i) m[size_t(i)] = (kIq4Values[i] + kIq4Values[i + 1]) / 2.0;
    return m;
}();

int nearestLevel(double v) {
    int code = 0;
    code += v > kMidpoints[size_t(code + 7)] ? 8 : 0;
    code += v > kMidpoints[size_t(code + 3)] ? 4 : 0;
    code += v > kMidpoints[size_t(code + 1)] ? 2 : 0;
    code += v > kMidpoints[size_t(code)] ? 1 : 0;
    return code;
}

// The scale of one group of 32 (its sign may be either; 0 for an all-zero group).
double fitGroup(const float* x, bool search) {
    const double xm = x[argMaxAbs(x, kGroup)];
    if (xm == 0) return 0;
    double best_scale = xm / kIq4Values[0];  // the min/max choice: xm maps to level -127
    if (!search) return best_scale;
    // The error at the least-squares scale xv/vv is sum(x^2) - xv^2/vv: maximise the latter.
    double best_score = 0;
    auto consider = [&](double iscale) {
        double xv = 0, vv = 0;
        for (int i = 0; i < kGroup; ++i) {
            const double v = kIq4Values[nearestLevel(x[i] * iscale)];
            xv += double(x[i]) * v;
            vv += v * v;
        }
        if (!(xv * xv / vv > best_score)) return false;  // vv >= 32: no level is 0
        best_score = xv * xv / vv;
        best_scale = xv / vv;
        return true;
    };
    for (int k = -kCandidates; k <= kCandidates; ++k) {
        consider((kIq4Values[0] + k) / xm);
        consider((kIq4Values[15] + k) / xm);
    }
    for (int round = 0; round < kRefineRounds && best_scale != 0; ++round) {
        if (!consider(1.0 / best_scale)) break;
    }
    return best_scale;
}

// Codes of x[0..32) for the decoded scale d; returns the squared error of the decoded values.
double assignGroup(const float* x, float d, uint8_t* q) {
    double err = 0;
    for (int i = 0; i < kGroup; ++i) {
        q[i] = uint8_t(nearestLevel(d != 0 ? double(x[i]) / double(d) : 0.0));
        const double e = double(x[i]) - double(d * float(kIq4Values[q[i]]));
        err += e * e;
    }
    return err;
}

// 32 codes into 16 bytes: element j in the low nibble of byte j, element j + 16 in its high one.
void packGroup(const uint8_t* q, uint8_t* qs) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(q[j] | q[j + 16] << 4);
}

void decodeGroup(const uint8_t* qs, float d, float* y) {
    for (int j = 0; j < 16; ++j) {
        y[j] = d * float(kIq4Values[qs[j] & 0xF]);
        y[j + 16] = d * float(kIq4Values[qs[j] >> 4]);
    }
}

// The signed scale code (-32..31) of IQ4_XS sub-block s.
int xsScaleCode(const BlockIQ4_XS& b, int s) {
    const int h = b.scales_h[0] | b.scales_h[1] << 8;
    const int low = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
    return (low | ((h >> (2 * s)) & 3) << 4) - 32;
}

}  // namespace

void decodeIQ4_NL(const BlockIQ4_NL& b, float* y) {
    decodeGroup(b.qs, halfToF32(b.d), y);
}

void decodeIQ4_XS(const BlockIQ4_XS& b, float* y) {
    const float d = halfToF32(b.d);
    for (int s = 0; s < 8; ++s)
        decodeGroup(b.qs + 16 * s, d * float(xsScaleCode(b, s)), y + 32 * s);
}

void encodeIQ4_NL(const float* x, BlockIQ4_NL& b, bool search) {
    b.d = halfScale(fitGroup(x, search));
    uint8_t q[kGroup];
    assignGroup(x, halfToF32(b.d), q);
    packGroup(q, b.qs);
}

void encodeIQ4_XS(const float* x, BlockIQ4_XS& b, bool search) {
    double scale[8], largest = 0;
    for (int s = 0; s < 8; ++s) {
        scale[s] = fitGroup(x + kGroup * s, search);
        if (std::fabs(scale[s]) > std::fabs(largest)) largest = scale[s];
    }
    // The largest-magnitude sub-block scale maps to code -32, the end with one more level.
    b.d = halfScale(largest / -32.0);
    const float d = halfToF32(b.d);
    uint32_t high = 0;
    std::memset(b.scales_l, 0, sizeof b.scales_l);
    for (int s = 0; s < 8; ++s) {
        const float* xs = x + kGroup * s;
        int code = d != 0 ? roundClamp(scale[s] / d, -32, 31) : 0;
        uint8_t q[kGroup], trial[kGroup];
        double best = assignGroup(xs, d * float(code), q);
        if (search) {
            const int code0 = code;
            for (int c = std::max(code0 - 1, -32); c <= std::min(code0 + 1, 31); ++c) {
                const double e = assignGroup(xs, d * float(c), trial);
                if (!(e < best)) continue;
                best = e;
                code = c;
                std::memcpy(q, trial, sizeof q);
            }
        }
        const uint32_t u = uint32_t(code + 32);
        b.scales_l[s / 2] |= uint8_t((u & 0xF) << (4 * (s % 2)));
        high |= (u >> 4) << (2 * s);
        packGroup(q, b.qs + 16 * s);
    }
    b.scales_h[0] = uint8_t(high);
    b.scales_h[1] = uint8_t(high >> 8);
}

}  // namespace blue::quant_internal
