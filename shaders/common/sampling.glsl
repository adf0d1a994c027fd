// The sampling rule shared by SAMPLE, SAMPLEQ (sample.comp) and SPEC (spec.comp), one workgroup of
// SAMPLE_WG invocations per row of logits, following the reference (vm/tensor_ops_llm.cpp):
// statistics of the T = 1 distribution, the kept set of top-k / top-p / min-p as a threshold on
// order-preserving keys (binary search, no sort), and draws that walk tokens in id order.
// Define SAMPLE_WG and include common/tensor.glsl, common/bytes.glsl, common/philox.glsl first.
#define REDUCE_WG SAMPLE_WG
#include "common/reduce.glsl"

shared uint reduce_u[SAMPLE_WG];

uint g_logits, g_page, g_n;  // the row of logits being read

float logit(uint i) { return page_f[g_page].d[g_logits + i]; }

// Maps floats to uints with the same order.
uint orderKey(float f) {
    uint b = floatBitsToUint(f);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

uint workgroupCount(uint v) {
    uint lid = gl_LocalInvocationID.x;
    barrier();
    reduce_u[lid] = v;
    barrier();
    for (uint s = SAMPLE_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) reduce_u[lid] += reduce_u[lid + s];
        barrier();
    }
    return reduce_u[0];
}

// Lowest index of the maximum.
uint workgroupArgmax(float best, uint best_i) {
    uint lid = gl_LocalInvocationID.x;
    barrier();
    reduce_f[lid] = best;
    reduce_u[lid] = best_i;
    barrier();
    for (uint s = SAMPLE_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) {
            float o = reduce_f[lid + s];
            uint oi = reduce_u[lid + s];
            if (o > reduce_f[lid] || (o == reduce_f[lid] && oi < reduce_u[lid])) {
                reduce_f[lid] = o;
                reduce_u[lid] = oi;
            }
        }
        barrier();
    }
    return reduce_u[0];
}

// The largest key T >= floor such that the values with key >= T number at least `k` (top-k), or
// carry at least `mass` of exp(l - m) (top-p). Bit by bit from the top, over the predicate on
// max(T, floor), which is monotone in T.
uint searchThreshold(uint floor_key, bool by_mass, uint k, float mass, float m) {
    uint t = 0u;
    for (int bit = 31; bit >= 0; --bit) {
        uint cand = t | (1u << uint(bit));
        uint lowest = max(cand, floor_key);
        uint cnt = 0u;
        float acc = 0.0;
        for (uint i = gl_LocalInvocationID.x; i < g_n; i += SAMPLE_WG) {
            float v = logit(i);
            if (orderKey(v) >= lowest) {
                cnt += 1u;
                acc += exp(v - m);
            }
        }
        bool ok = by_mass ? workgroupSum(acc) >= mass : workgroupCount(cnt) >= k;
        if (ok) t = cand;
    }
    return max(t, floor_key);
}

// Argmax (lowest index of the largest logit), its logit, and the T = 1 entropy.
struct RowStats {
    uint tok;
    float m;
    float z;
    float entropy;
};

RowStats rowStats() {
    uint lid = gl_LocalInvocationID.x;
    float best = -1.0 / 0.0;
    uint best_i = 0xFFFFFFFFu;
    for (uint i = lid; i < g_n; i += SAMPLE_WG) {
        float v = logit(i);
        if (v > best) {
            best = v;
            best_i = i;
        }
    }
    RowStats s;
    s.tok = workgroupArgmax(best, best_i);
    s.m = logit(s.tok);
    float z = 0.0, zl = 0.0;
    for (uint i = lid; i < g_n; i += SAMPLE_WG) {
        float d = logit(i) - s.m, e = exp(d);
        z += e;
        zl += e * d;
    }
    s.z = workgroupSum(z);
    zl = workgroupSum(zl);
    s.entropy = log(s.z) - zl / s.z;
    return s;
}

// The key of the smallest kept logit (0: every token is kept).
uint keepThreshold(float m, uint top_k, float top_p, float min_p) {
    uint lid = gl_LocalInvocationID.x;
    uint thr = 0u;
    if (top_k > 0u && top_k < g_n) thr = searchThreshold(0u, false, top_k, 0.0, m);
    if (top_p < 1.0) {
        float kept = 0.0;
        for (uint i = lid; i < g_n; i += SAMPLE_WG) {
            if (orderKey(logit(i)) >= thr) kept += exp(logit(i) - m);
        }
        thr = searchThreshold(thr, true, 0u, top_p * workgroupSum(kept), m);
    }
    if (min_p > 0.0) thr = max(thr, orderKey(m + log(min_p)));
    return thr;
}

// The weights a draw walks. Mode 0: the kept tokens at the temperature. Mode 1: the residual
// max(0, p - q) of speculative decoding, p the mode-0 weights normalised (g_total), q the draft's
// distribution at word g_qoff of page g_qpage.
uint g_thr;
float g_m, g_temp, g_total;
uint g_qpage, g_qoff;

float weightAt(uint i, uint mode) {
    float w = orderKey(logit(i)) >= g_thr ? exp((logit(i) - g_m) / g_temp) : 0.0;
    if (mode == 0u) return w;
    return max(0.0, w / g_total - page_f[g_qpage].d[g_qoff + i]);
}

shared uint sel_owner, sel_tok;
shared float sel_before, sel_u, sel_total;

// Sum of the weights: per-invocation contiguous ranges (in id order), added in invocation order
// by invocation 0, the order the draw walks. Every invocation gets it; reduce_f keeps the ranges'
// sums for drawToken.
float weightTotal(uint mode) {
    uint lid = gl_LocalInvocationID.x;
    uint per = (g_n + SAMPLE_WG - 1u) / SAMPLE_WG;
    uint lo = min(lid * per, g_n), hi = min(lo + per, g_n);
    float mine = 0.0;
    for (uint i = lo; i < hi; ++i) mine += weightAt(i, mode);
    barrier();
    reduce_f[lid] = mine;
    barrier();
    if (lid == 0u) {
        float total = 0.0;
        for (uint t = 0u; t < SAMPLE_WG; ++t) total += reduce_f[t];
        sel_total = total;
    }
    barrier();
    return sel_total;
}

// The token where the cumulative weight (in id order) first exceeds u01 * total; call right after
// weightTotal(mode). `fallback` when nothing is kept.
uint drawToken(uint mode, float u01, float total, uint fallback) {
    uint lid = gl_LocalInvocationID.x;
    uint per = (g_n + SAMPLE_WG - 1u) / SAMPLE_WG;
    uint lo = min(lid * per, g_n), hi = min(lo + per, g_n);
    if (lid == 0u) {
        float u = u01 * total;
        float acc = 0.0;
        uint owner = 0xFFFFFFFFu, last_owner = 0u;
        for (uint t = 0u; t < SAMPLE_WG && owner == 0xFFFFFFFFu; ++t) {
            if (reduce_f[t] <= 0.0) continue;
            last_owner = t;
            if (acc + reduce_f[t] > u) owner = t; else acc += reduce_f[t];
        }
        sel_owner = owner == 0xFFFFFFFFu ? last_owner : owner;
        sel_before = owner == 0xFFFFFFFFu ? acc - reduce_f[last_owner] : acc;
        sel_u = u;
        sel_tok = fallback;
    }
    barrier();
    if (lid == sel_owner) {
        float acc = sel_before;
        uint chosen = fallback;
        for (uint i = lo; i < hi; ++i) {
            float w = weightAt(i, mode);
            if (w <= 0.0) continue;
            chosen = i;
            acc += w;
            if (acc > sel_u) break;
        }
        sel_tok = chosen;
    }
    barrier();
    return sel_tok;
}
