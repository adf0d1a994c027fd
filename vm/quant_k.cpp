// The K-quants (Q2_K..Q6_K, Q8_K): 256-element super-blocks whose sub-blocks of 16 or 32 elements
// carry their own scale (and min), themselves quantized against one fp16 super-block scale.
// Byte layouts: see the diagrams in quant.h.
//
// Encoding runs in two stages. Stage 1 fits each sub-block on its own: for the affine types
// (Q2_K, Q4_K, Q5_K: x ~ scale*q - min) and the symmetric types (Q3_K, Q6_K: x ~ scale*q) it tries
// a fan of candidate inverse scales around the min/max one, quantizes with each, solves the
// least-squares scale (and min) for that assignment, keeps the best, then alternates "requantize
// with the fitted scale / refit" while the error falls. Stage 2 quantizes the sub-block scales and
// mins against the super-block scale, tries each quantized scale and min one step up and down, and
// requantizes every element with the scale the decoder will actually see.
//
// The objective is the plain squared error. llama.cpp weights its fits by importance heuristics
// (|x|, rms+|x|, x^2); measured on Gaussian rows those raise the plain RMSE by 0.2..7%, and without
// activation statistics we have no better objective, so the fits are unweighted. Fit arithmetic
// is in double, so extreme finite inputs do not overflow the sums.
#include <cstring>
#include <limits>

#include "vm/quant_internal.h"

namespace blue::quant_internal {

namespace {

// Candidate inverse scales map the sub-block's extreme to level nmax + k*fanStep(nmax), |k| <= 10:
// a fan of +-1 level for narrow formats, +-12% of the range for wide ones (measured best on
// Gaussian data among fans of 6..20 steps; wider fans gain nothing more).
constexpr int kCandidates = 10;
constexpr int kRefineRounds = 4;

double fanStep(int nmax) {
    return 0.1 * std::max(1.0, nmax / 8.0);
}

// ---- stage 1: sub-block fits ----

struct Moments {
    double n = 0, q = 0, qq = 0, x = 0, qx = 0;  // sums of 1, q, q^2, x, q*x
};

Moments moments(const float* x, const int* q, int n) {
    Moments m;
    m.n = n;
    for (int i = 0; i < n; ++i) {
        const double qi = q[i], xi = x[i];
        m.q += qi;
        m.qq += qi * qi;
        m.x += xi;
        m.qx += qi * xi;
    }
    return m;
}

// x ~ scale*q + offset with scale >= 0 and offset <= 0. `err` is the squared error less the
// constant sum(x^2), so fits of the same sub-block compare directly.
struct AffineFit {
    double scale = 0, offset = 0, err = std::numeric_limits<double>::infinity();
};

// The best admissible (scale, offset) for a fixed q: the unconstrained least-squares solution
// when it is admissible, else the best on the boundary (offset = 0, or scale = 0).
AffineFit solveAffine(const Moments& m) {
    AffineFit best;
    auto consider = [&](double s, double b) {
        const double e = s * s * m.qq + 2 * s * b * m.q + b * b * m.n - 2 * s * m.qx - 2 * b * m.x;
        if (e < best.err) best = {s, b, e};
    };
    consider(0, std::min(0.0, m.x / m.n));
    if (m.qq > 0 && m.qx > 0) consider(m.qx / m.qq, 0);
    const double det = m.n * m.qq - m.q * m.q;
    if (det > 0) {
        const double s = (m.n * m.qx - m.q * m.x) / det;
        const double b = (m.qq * m.x - m.q * m.qx) / det;
        if (s >= 0 && b <= 0) consider(s, b);
    }
    return best;
}

// Fits x[0..n) ~ scale*q - min, q in [0, nmax], min >= 0 (n <= 32). Returns {scale, -min}.
AffineFit fitAffine(const float* x, int n, int nmax, bool search) {
    double lo = 0, hi = x[0];
    for (int i = 0; i < n; ++i) {
        lo = std::min(lo, double(x[i]));
        hi = std::max(hi, double(x[i]));
    }
    if (!search || hi == lo) return {(hi - lo) / nmax, lo, 0};
    int q[32];
    AffineFit best;
    for (int k = -kCandidates; k <= kCandidates; ++k) {
        const double iscale = (nmax + k * fanStep(nmax)) / (hi - lo);
        for (int i = 0; i < n; ++i) q[i] = roundClamp((x[i] - lo) * iscale, 0, nmax);
        const AffineFit f = solveAffine(moments(x, q, n));
        if (f.err < best.err) best = f;
    }
    for (int round = 0; round < kRefineRounds && best.scale > 0; ++round) {
        for (int i = 0; i < n; ++i) q[i] = roundClamp((x[i] - best.offset) / best.scale, 0, nmax);
        const AffineFit f = solveAffine(moments(x, q, n));
        if (!(f.err < best.err)) break;
        best = f;
    }
    return best;
}

// Fits x[0..n) ~ scale*q, q in [-nneg, nneg-1] (n <= 32); returns scale (its sign may be either).
double fitSymmetric(const float* x, int n, int nneg, bool search) {
    const double xm = x[argMaxAbs(x, n)];
    if (xm == 0) return 0;
    double best_scale = xm / -nneg;  // the min/max choice: xm maps to the level -nneg
    if (!search) return best_scale;
    double best_score = 0;  // a candidate must explain some of the energy to replace min/max
    int q[32];
    auto consider = [&]() {
        double xq = 0, qq = 0;
        for (int i = 0; i < n; ++i) {
            xq += double(x[i]) * q[i];
            qq += double(q[i]) * q[i];
        }
        // The error at the optimal scale xq/qq is sum(x^2) - xq^2/qq: maximise the latter.
        if (qq <= 0 || !(xq * xq / qq > best_score)) return false;
        best_score = xq * xq / qq;
        best_scale = xq / qq;
        return true;
    };
    for (int k = -kCandidates; k <= kCandidates; ++k) {
        // xm mapped near the negative end (one more level) or near the positive end.
        const double offset = k * fanStep(nneg);
        for (double level : {-(nneg + offset), nneg - 1 + offset}) {
            const double iscale = level / xm;
            for (int i = 0; i < n; ++i) q[i] = roundClamp(x[i] * iscale, -nneg, nneg - 1);
            consider();
        }
    }
    for (int round = 0; round < kRefineRounds; ++round) {
        for (int i = 0; i < n; ++i) q[i] = roundClamp(x[i] / best_scale, -nneg, nneg - 1);
        if (!consider()) break;
    }
    return best_scale;
}

// ---- stage 2: quantizing the sub-block scales ----

// Non-negative values v[0..n) -> v ~ d*c with c in [0, cmax]; d (fp16) maps max(v) to cmax.
void quantizeUnsigned(const double* v, int n, int cmax, uint16_t& d_out, int* c) {
    double vmax = 0;
    for (int i = 0; i < n; ++i) vmax = std::max(vmax, v[i]);
    d_out = halfScale(vmax / cmax);
    const double d = halfToF32(d_out);
    for (int i = 0; i < n; ++i) c[i] = d > 0 ? roundClamp(v[i] / d, 0, cmax) : 0;
}

// Signed values -> v ~ d*c with c in [-cneg, cneg-1]; d (fp16) maps the largest-magnitude value
// to -cneg (the end with one more level).
void quantizeSigned(const double* v, int n, int cneg, uint16_t& d_out, int* c) {
    double vm = 0;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(v[i]) > std::fabs(vm)) vm = v[i];
    }
    d_out = halfScale(vm / -cneg);
    const double d = halfToF32(d_out);
    for (int i = 0; i < n; ++i) c[i] = d != 0 ? roundClamp(v[i] / d, -cneg, cneg - 1) : 0;
}

// Requantizes x[0..n) for the decoded scale ds and min dm (y = ds*q - dm, q in [0, nmax]) into q;
// returns the squared error of the decoded values.
double requantAffine(const float* x, int n, float ds, float dm, int nmax, int* q) {
    double err = 0;
    for (int i = 0; i < n; ++i) {
        q[i] = ds > 0 ? roundClamp((x[i] + dm) / ds, 0, nmax) : 0;
        const double e = double(x[i]) - double(ds * float(q[i]) - dm);
        err += e * e;
    }
    return err;
}

// As requantAffine for y = ds*q, q in [-nneg, nneg-1].
double requantSymmetric(const float* x, int n, float ds, int nneg, int* q) {
    double err = 0;
    for (int i = 0; i < n; ++i) {
        q[i] = ds != 0 ? roundClamp(x[i] / ds, -nneg, nneg - 1) : 0;
        const double e = double(x[i]) - double(ds * float(q[i]));
        err += e * e;
    }
    return err;
}

// Affine types: fits every sub-block, quantizes scales and mins with `cmax` levels, and writes
// each element's final q (0..nmax) for the scale and min the decoder will see.
struct AffineParams {
    int sub;   // elements per sub-block
    int nmax;  // largest q
    int cmax;  // largest quantized scale/min
};

// Requantizes one sub-block for its quantized scale code sc and min code mn; with `search`, also
// tries each code one step up and down and keeps the pair with the least error.
void finishAffineSub(const float* x, const AffineParams& p, float d, float dmin, bool search,
                     int& sc, int& mn, int* q) {
    double best = requantAffine(x, p.sub, d * float(sc), dmin * float(mn), p.nmax, q);
    if (!search) return;
    const int sc0 = sc, mn0 = mn;
    int trial[32];
    for (int scv = std::max(sc0 - 1, 0); scv <= std::min(sc0 + 1, p.cmax); ++scv) {
        for (int mnv = std::max(mn0 - 1, 0); mnv <= std::min(mn0 + 1, p.cmax); ++mnv) {
            const double e =
                requantAffine(x, p.sub, d * float(scv), dmin * float(mnv), p.nmax, trial);
            if (!(e < best)) continue;
            best = e;
            sc = scv;
            mn = mnv;
            std::memcpy(q, trial, sizeof(int) * size_t(p.sub));
        }
    }
}

void encodeAffineK(const float* x, const AffineParams& p, bool search, uint16_t& d, uint16_t& dmin,
                   int* sc, int* mn, int* q) {
    const int nsub = kKBlock / p.sub;
    double scale[16] = {}, min[16] = {};
    for (int s = 0; s < nsub; ++s) {
        const AffineFit f = fitAffine(x + s * p.sub, p.sub, p.nmax, search);
        scale[s] = f.scale;
        min[s] = -f.offset;
    }
    quantizeUnsigned(scale, nsub, p.cmax, d, sc);
    quantizeUnsigned(min, nsub, p.cmax, dmin, mn);
    for (int s = 0; s < nsub; ++s) {
        finishAffineSub(x + s * p.sub, p, halfToF32(d), halfToF32(dmin), search, sc[s], mn[s],
                        q + s * p.sub);
    }
}

// Symmetric types (16-element sub-blocks): q in [-nneg, nneg-1], signed scales in [-cneg, cneg-1].
// Stage 2 as the affine types: each scale code is tried one step up and down.
void encodeSymmetricK(const float* x, int nneg, int cneg, bool search, uint16_t& d, int* sc,
                      int* q) {
    double scale[16] = {};
    for (int s = 0; s < 16; ++s) scale[s] = fitSymmetric(x + 16 * s, 16, nneg, search);
    quantizeSigned(scale, 16, cneg, d, sc);
    const float df = halfToF32(d);
    for (int s = 0; s < 16; ++s) {
        const float* xs = x + 16 * s;
        double best = requantSymmetric(xs, 16, df * float(sc[s]), nneg, q + 16 * s);
        if (!search) continue;
        const int sc0 = sc[s];
        int trial[16];
        for (int scv = std::max(sc0 - 1, -cneg); scv <= std::min(sc0 + 1, cneg - 1); ++scv) {
            const double e = requantSymmetric(xs, 16, df * float(scv), nneg, trial);
            if (!(e < best)) continue;
            best = e;
            sc[s] = scv;
            std::memcpy(q + 16 * s, trial, sizeof trial);
        }
    }
}

// ---- scale packing ----

// Q4_K/Q5_K: 8 six-bit scales and mins in 12 bytes (diagram in quant.h).
void unpackScaleMin(const uint8_t* b, int s, int& sc, int& mn) {
    if (s < 4) {
        sc = b[s] & 63;
        mn = b[s + 4] & 63;
    } else {
        sc = (b[s + 4] & 0xF) | (b[s - 4] >> 6) << 4;
        mn = (b[s + 4] >> 4) | (b[s] >> 6) << 4;
    }
}

void packScaleMin(const int* sc, const int* mn, uint8_t* b) {
    for (int s = 0; s < 4; ++s) {
        b[s] = uint8_t(sc[s] | (sc[s + 4] >> 4) << 6);
        b[s + 4] = uint8_t(mn[s] | (mn[s + 4] >> 4) << 6);
        b[s + 8] = uint8_t((sc[s + 4] & 0xF) | (mn[s + 4] & 0xF) << 4);
    }
}

// Q3_K: 16 signed six-bit scales in 12 bytes, stored biased by 32.
int unpackQ3Scale(const uint8_t* b, int s) {
    const int low = s < 8 ? b[s] & 0xF : b[s - 8] >> 4;
    const int high = (b[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (low | high << 4) - 32;
}

void packQ3Scales(const int* sc, uint8_t* b) {
    std::memset(b, 0, 12);
    for (int s = 0; s < 16; ++s) {
        const int u = sc[s] + 32;
        b[s % 8] |= uint8_t((u & 0xF) << (s < 8 ? 0 : 4));
        b[8 + s % 4] |= uint8_t((u >> 4) << (2 * (s / 4)));
    }
}

}  // namespace

// ---- decoders ----

void decodeQ2_K(const BlockQ2_K& b, float* y) {
    const float d = halfToF32(b.d), dmin = halfToF32(b.dmin);
    for (int i = 0; i < kKBlock; ++i) {
        const int h = i / 128, j = i % 128 / 32, l = i % 32, s = i / 16;
        const int q = (b.qs[32 * h + l] >> (2 * j)) & 3;
        y[i] = d * float(b.scales[s] & 0xF) * float(q) - dmin * float(b.scales[s] >> 4);
    }
}

void decodeQ3_K(const BlockQ3_K& b, float* y) {
    const float d = halfToF32(b.d);
    for (int i = 0; i < kKBlock; ++i) {
        const int h = i / 128, j = i % 128 / 32, l = i % 32;
        const int low = (b.qs[32 * h + l] >> (2 * j)) & 3;
        const int high = (b.hmask[l] >> (4 * h + j)) & 1;
        y[i] = d * float(unpackQ3Scale(b.scales, i / 16)) * float((low | high << 2) - 4);
    }
}

void decodeQ4_K(const BlockQ4_K& b, float* y) {
    const float d = halfToF32(b.d), dmin = halfToF32(b.dmin);
    for (int i = 0; i < kKBlock; ++i) {
        const int g = i / 64, k = i % 64 / 32, l = i % 32;
        int sc, mn;
        unpackScaleMin(b.scales, i / 32, sc, mn);
        const int q = (b.qs[32 * g + l] >> (4 * k)) & 0xF;
        y[i] = d * float(sc) * float(q) - dmin * float(mn);
    }
}

void decodeQ5_K(const BlockQ5_K& b, float* y) {
    const float d = halfToF32(b.d), dmin = halfToF32(b.dmin);
    for (int i = 0; i < kKBlock; ++i) {
        const int g = i / 64, k = i % 64 / 32, l = i % 32;
        int sc, mn;
        unpackScaleMin(b.scales, i / 32, sc, mn);
        const int q = ((b.qs[32 * g + l] >> (4 * k)) & 0xF) | ((b.qh[l] >> (i / 32)) & 1) << 4;
        y[i] = d * float(sc) * float(q) - dmin * float(mn);
    }
}

void decodeQ6_K(const BlockQ6_K& b, float* y) {
    const float d = halfToF32(b.d);
    for (int i = 0; i < kKBlock; ++i) {
        const int h = i / 128, k = i % 128 / 32, l = i % 32;
        const int low = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
        const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
        y[i] = d * float(b.scales[i / 16]) * float((low | high << 4) - 32);
    }
}

void decodeQ8_K(const BlockQ8_K& b, float* y) {
    const float d = b.d;
    for (int i = 0; i < kKBlock; ++i) y[i] = d * float(b.qs[i]);
}

// ---- encoders ----

void encodeQ2_K(const float* x, BlockQ2_K& b, bool search) {
    int sc[16], mn[16], q[kKBlock];
    encodeAffineK(x, {16, 3, 15}, search, b.d, b.dmin, sc, mn, q);
    for (int s = 0; s < 16; ++s) b.scales[s] = uint8_t(sc[s] | mn[s] << 4);
    std::memset(b.qs, 0, sizeof b.qs);
    for (int i = 0; i < kKBlock; ++i)
        b.qs[32 * (i / 128) + i % 32] |= uint8_t(q[i] << (2 * (i % 128 / 32)));
}

void encodeQ3_K(const float* x, BlockQ3_K& b, bool search) {
    int sc[16], q[kKBlock];
    encodeSymmetricK(x, 4, 32, search, b.d, sc, q);
    packQ3Scales(sc, b.scales);
    std::memset(b.qs, 0, sizeof b.qs);
    std::memset(b.hmask, 0, sizeof b.hmask);
    for (int i = 0; i < kKBlock; ++i) {
        const int u = q[i] + 4, h = i / 128, j = i % 128 / 32, l = i % 32;
        b.qs[32 * h + l] |= uint8_t((u & 3) << (2 * j));
        b.hmask[l] |= uint8_t((u >> 2) << (4 * h + j));
    }
}

void encodeQ4_K(const float* x, BlockQ4_K& b, bool search) {
    int sc[8], mn[8], q[kKBlock];
    encodeAffineK(x, {32, 15, 63}, search, b.d, b.dmin, sc, mn, q);
    packScaleMin(sc, mn, b.scales);
    for (int j = 0; j < 128; ++j) {
        const int g = j / 32, l = j % 32;
        b.qs[j] = uint8_t(q[64 * g + l] | q[64 * g + 32 + l] << 4);
    }
}

void encodeQ5_K(const float* x, BlockQ5_K& b, bool search) {
    int sc[8], mn[8], q[kKBlock];
    encodeAffineK(x, {32, 31, 63}, search, b.d, b.dmin, sc, mn, q);
    packScaleMin(sc, mn, b.scales);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int i = 0; i < kKBlock; ++i) b.qh[i % 32] |= uint8_t((q[i] >> 4) << (i / 32));
    for (int j = 0; j < 128; ++j) {
        const int g = j / 32, l = j % 32;
        b.qs[j] = uint8_t((q[64 * g + l] & 0xF) | (q[64 * g + 32 + l] & 0xF) << 4);
    }
}

void encodeQ6_K(const float* x, BlockQ6_K& b, bool search) {
    int sc[16], q[kKBlock];
    encodeSymmetricK(x, 32, 128, search, b.d, sc, q);
    for (int s = 0; s < 16; ++s) b.scales[s] = int8_t(sc[s]);
    std::memset(b.ql, 0, sizeof b.ql);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int i = 0; i < kKBlock; ++i) {
        const int u = q[i] + 32, h = i / 128, k = i % 128 / 32, l = i % 32;
        b.ql[64 * h + 32 * (k % 2) + l] |= uint8_t((u & 0xF) << (4 * (k / 2)));
        b.qh[32 * h + l] |= uint8_t((u >> 4) << (2 * k));
    }
}

void encodeQ8_K(const float* x, BlockQ8_K& b) {
    const float xm = x[argMaxAbs(x, kKBlock)];
    float d = xm / -127.0f;
    while (!std::isfinite(d * 127.0f))
        d = std::nextafter(d, 0.0f);  // |x| near FLT_MAX: keep d*q finite
    b.d = d;
    for (int i = 0; i < kKBlock; ++i)
        b.qs[i] = int8_t(d != 0 ? roundClamp(x[i] / d, -127, 127) : 0);
    for (int s = 0; s < 16; ++s) {
        int sum = 0;
        for (int i = 16 * s; i < 16 * s + 16; ++i) sum += b.qs[i];
        b.bsums[s] = int16_t(sum);
    }
}

}  // namespace blue::quant_internal
