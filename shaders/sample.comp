#version 450
#extension GL_GOOGLE_include_directive : require
// SAMPLE: one workgroup per instance picks the next token from its logits, following the rule
// of the reference (vm/tensor_ops_llm.cpp): repetition/presence/frequency penalties over the last
// N history tokens; entropy and log-probability of the penalized T = 1 distribution; greedy when
// T <= 0; else top-k, top-p and min-p thresholds (found by binary search over order-preserving
// keys, so no sort), temperature, and one Philox draw walking the kept tokens in id order.
// Writes token, entropy and log-probability into the parameter block and advances its counter.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/philox.glsl"
#include "vm/llm_abi.h"
#define SAMPLE_WG 256u
#define REDUCE_WG SAMPLE_WG
#include "common/reduce.glsl"

layout(local_size_x = SAMPLE_WG) in;

shared uint reduce_u[SAMPLE_WG];
shared uint sel_owner, sel_tok;
shared float sel_before, sel_u;

uint g_logits, g_page, g_n;

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

void applyPenalties(uint inst, uint sp) {
    float rep = uintBitsToFloat(localWord(inst, sp + BLUE_SP_REPEAT_PENALTY));
    float presence = uintBitsToFloat(localWord(inst, sp + BLUE_SP_PRESENCE));
    float frequency = uintBitsToFloat(localWord(inst, sp + BLUE_SP_FREQUENCY));
    if (rep == 1.0 && presence == 0.0 && frequency == 0.0) return;
    uint hist = localWord(inst, sp + BLUE_SP_HIST_ADDR), len = localWord(inst, sp + BLUE_SP_HIST_LEN);
    uint window = min(len, localWord(inst, sp + BLUE_SP_REPEAT_LAST_N));
    uint lw = ctl[BLUE_H_LOCAL_WORDS];
    if (hist > lw || len > lw - hist) return;
    uint start = len - window;
    for (uint i = gl_LocalInvocationID.x; i < window; i += SAMPLE_WG) {
        uint t = localWord(inst, hist + start + i);
        if (t >= g_n) continue;
        bool first = true;
        uint count = 0u;
        for (uint j = 0u; j < window; ++j) {
            uint u = localWord(inst, hist + start + j);
            if (u == t) {
                if (j < i) first = false;
                ++count;
            }
        }
        if (!first) continue;  // one invocation per distinct token
        float v = logit(t);
        if (rep != 1.0) v = v > 0.0 ? v / rep : v * rep;
        page_f[g_page].d[g_logits + t] = v - float(count) * frequency - presence;
    }
    barrier();
    memoryBarrierBuffer();
    barrier();
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

void main() {
    TRef lt = tref(BLUE_PC_OPERANDS);
    uint arg = pc.w[BLUE_PC_OPERANDS + 4u];
    uint item = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    if (item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint sp = blockArg(inst, arg);
    if (sp > ctl[BLUE_H_LOCAL_WORDS] || BLUE_SP_WORDS > ctl[BLUE_H_LOCAL_WORDS] - sp) return;
    g_page = lt.page;
    g_logits = sliceOffset(lt, item) / 4u;
    g_n = lt.n;
    applyPenalties(inst, sp);

    float best = -1.0 / 0.0;
    uint best_i = 0xFFFFFFFFu;
    for (uint i = lid; i < g_n; i += SAMPLE_WG) {
        float v = logit(i);
        if (v > best) {
            best = v;
            best_i = i;
        }
    }
    uint tok = workgroupArgmax(best, best_i);
    float m = logit(tok);
    float z = 0.0, zl = 0.0;
    for (uint i = lid; i < g_n; i += SAMPLE_WG) {
        float d = logit(i) - m, e = exp(d);
        z += e;
        zl += e * d;
    }
    z = workgroupSum(z);
    zl = workgroupSum(zl);
    float temp = uintBitsToFloat(localWord(inst, sp + BLUE_SP_TEMP));
    if (temp > 0.0) {
        uint top_k = localWord(inst, sp + BLUE_SP_TOP_K);
        float top_p = uintBitsToFloat(localWord(inst, sp + BLUE_SP_TOP_P));
        float min_p = uintBitsToFloat(localWord(inst, sp + BLUE_SP_MIN_P));
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
        // Per-invocation contiguous ranges, so the draw walks tokens in id order.
        uint per = (g_n + SAMPLE_WG - 1u) / SAMPLE_WG;
        uint lo = min(lid * per, g_n), hi = min(lo + per, g_n);
        float mine = 0.0;
        for (uint i = lo; i < hi; ++i) {
            if (orderKey(logit(i)) >= thr) mine += exp((logit(i) - m) / temp);
        }
        barrier();
        reduce_f[lid] = mine;
        barrier();
        if (lid == 0u) {
            float total = 0.0;
            for (uint t = 0u; t < SAMPLE_WG; ++t) total += reduce_f[t];
            float u = philoxUniform(localWord(inst, sp + BLUE_SP_SEED),
                                    localWord(inst, sp + BLUE_SP_COUNTER)) * total;
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
        }
        barrier();
        if (lid == sel_owner) {
            float acc = sel_before;
            uint chosen = tok;
            for (uint i = lo; i < hi; ++i) {
                if (orderKey(logit(i)) < thr) continue;
                chosen = i;
                acc += exp((logit(i) - m) / temp);
                if (acc > sel_u) break;
            }
            sel_tok = chosen;
        }
        barrier();
        tok = sel_tok;
    }
    if (lid == 0u) {
        uint base = ctl[BLUE_O_LOCAL] + inst * ctl[BLUE_H_LOCAL_WORDS] + sp;
        ctl[base + BLUE_SP_OUT_TOKEN] = tok;
        ctl[base + BLUE_SP_OUT_ENTROPY] = floatBitsToUint(log(z) - zl / z);
        ctl[base + BLUE_SP_OUT_LOGPROB] = floatBitsToUint(logit(tok) - m - log(z));
        ctl[base + BLUE_SP_COUNTER] += 1u;
    }
}
