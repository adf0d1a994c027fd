#version 450
#extension GL_GOOGLE_include_directive : require
// SAMPLE: one workgroup per instance picks the next token from its logits, following the rule
// of the reference (vm/tensor_ops_llm.cpp): repetition/presence/frequency penalties over the last
// N history tokens; entropy and log-probability of the penalized T = 1 distribution; greedy when
// T <= 0; else top-k, top-p and min-p thresholds, temperature, and one Philox draw walking the
// kept tokens in id order (common/sampling.glsl). Writes token, entropy and log-probability into
// the parameter block and advances its counter; with TOP_N, the most likely tokens too.
// SAMPLEQ (WRITE_PROBS): also writes the distribution it drew from (greedy: one-hot) into row
// local[sp + BLUE_SP_ROW] of a table, for speculative decoding's draft model.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/philox.glsl"
#include "vm/llm_abi.h"
#define SAMPLE_WG 256u
#include "common/sampling.glsl"

layout(local_size_x = SAMPLE_WG) in;

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

// The TOP_N most likely tokens (ties: lower id first) and their T = 1 log-probabilities as (id,
// lp) pairs at local[TOP_ADDR]: TOP_N argmax passes, each over the tokens below the last pick.
void writeTop(uint inst, uint sp, RowStats s) {
    uint n = min(min(localWord(inst, sp + BLUE_SP_TOP_N), BLUE_MAX_TOP_LOGPROBS), g_n);
    uint addr = localWord(inst, sp + BLUE_SP_TOP_ADDR), lw = ctl[BLUE_H_LOCAL_WORDS];
    if (n == 0u || addr > lw || 2u * n > lw - addr) return;
    float lz = log(s.z), prev = 0.0;
    uint prev_i = 0xFFFFFFFFu;
    uint dst = ctl[BLUE_O_LOCAL] + inst * lw + addr;
    for (uint k = 0u; k < n; ++k) {
        float best = -1.0 / 0.0;
        uint best_i = 0xFFFFFFFFu;
        for (uint i = gl_LocalInvocationID.x; i < g_n; i += SAMPLE_WG) {
            float v = logit(i);
            bool below = k == 0u || v < prev || (v == prev && i > prev_i);
            if (below && (best_i == 0xFFFFFFFFu || v > best)) {
                best = v;
                best_i = i;
            }
        }
        prev_i = workgroupArgmax(best, best_i);
        prev = logit(prev_i);
        if (gl_LocalInvocationID.x == 0u) {
            ctl[dst + 2u * k] = prev_i;
            ctl[dst + 2u * k + 1u] = floatBitsToUint(prev - s.m - lz);  // as the chosen token's
        }
    }
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

    RowStats s = rowStats();
    uint tok = s.tok;
    float temp = uintBitsToFloat(localWord(inst, sp + BLUE_SP_TEMP));
    float total = 1.0;
    if (temp > 0.0) {
        g_thr = keepThreshold(s.m, s.z, localWord(inst, sp + BLUE_SP_TOP_K),
                              uintBitsToFloat(localWord(inst, sp + BLUE_SP_TOP_P)),
                              uintBitsToFloat(localWord(inst, sp + BLUE_SP_MIN_P)));
        g_m = s.m;
        g_temp = temp;
        total = weightTotal(0u);
        float u = philoxUniform(localWord(inst, sp + BLUE_SP_SEED), localWord(inst, sp + BLUE_SP_COUNTER));
        tok = drawToken(0u, u, total, s.tok);
    }
#ifdef WRITE_PROBS
    TRef qt = tref(BLUE_PC_OPERANDS + 5u);
    uint row = localWord(inst, sp + BLUE_SP_ROW);
    if (row < qt.n / g_n) {
        uint q = sliceOffset(qt, item) / 4u + row * g_n;
        for (uint i = lid; i < g_n; i += SAMPLE_WG) {
            float v = temp > 0.0 ? weightAt(i, 0u) / total : (i == tok ? 1.0 : 0.0);
            page_f[qt.page].d[q + i] = v;
        }
    }
#endif
    writeTop(inst, sp, s);
    if (lid == 0u) {
        uint base = ctl[BLUE_O_LOCAL] + inst * ctl[BLUE_H_LOCAL_WORDS] + sp;
        ctl[base + BLUE_SP_OUT_TOKEN] = tok;
        ctl[base + BLUE_SP_OUT_ENTROPY] = floatBitsToUint(s.entropy);
        ctl[base + BLUE_SP_OUT_LOGPROB] = floatBitsToUint(logit(tok) - s.m - log(s.z));
        ctl[base + BLUE_SP_COUNTER] += 1u;
    }
}
