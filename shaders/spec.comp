#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// SPEC: speculative verification, one workgroup per instance, following the reference
// (vm/tensor_ops_spec.cpp). The instance ran K+1 rows through the target (its last accepted token,
// then the draft's d1..dK); row i's logits give the target's distribution p for d_(i+1). Accept
// d with probability min(1, p(d)/q(d)) (q: the draft's distribution, row i of the table SAMPLEQ
// wrote), greedy: while d is p's argmax; at the first rejection draw from max(0, p - q)
// normalised (greedy: p's argmax); after K acceptances draw a bonus token from p. Results go to
// the speculation block (vm/llm_abi.h); Philox draws advance the sampling block's counter. In
// prefill mode only the token after the last row is drawn, like SAMPLE.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/philox.glsl"
#include "vm/llm_abi.h"
#define SAMPLE_WG 256u
#include "common/sampling.glsl"

layout(local_size_x = SAMPLE_WG) in;

shared uint s_accept;

void main() {
    TRef qt = tref(BLUE_PC_OPERANDS);
    TRef lt = tref(BLUE_PC_OPERANDS + 4u);
    uint sp_arg = pc.w[BLUE_PC_OPERANDS + 8u], sb_arg = pc.w[BLUE_PC_OPERANDS + 9u];
    uint item = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    if (item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint lw = ctl[BLUE_H_LOCAL_WORDS];
    uint sp = blockArg(inst, sp_arg), sb = blockArg(inst, sb_arg);
    if (sp > lw || BLUE_SP_WORDS > lw - sp || sb > lw || BLUE_SPEC_WORDS > lw - sb) return;
    g_n = lt.n;
    g_page = lt.page;
    uint n_list = ctl[BLUE_H_NINST];
    uint first = ctl[listBase() + n_list + item], rows = ctl[listBase() + 2u * n_list + item];
    uint k = min(min(rows - 1u, qt.n / g_n), BLUE_SPEC_MAX_DRAFT);
    uint tokens = blockArg(inst, BLUE_FA_TOKENS);
    if (tokens > lw || k + 1u > lw - tokens) k = 0u;
    if (localWord(inst, sb + BLUE_SPEC_MODE) == 1u) {  // prefill: only the last row's next token
        first += rows - 1u;
        k = 0u;
    }
    float temp = uintBitsToFloat(localWord(inst, sp + BLUE_SP_TEMP));
    uint top_k = localWord(inst, sp + BLUE_SP_TOP_K);
    float top_p = uintBitsToFloat(localWord(inst, sp + BLUE_SP_TOP_P));
    float min_p = uintBitsToFloat(localWord(inst, sp + BLUE_SP_MIN_P));
    uint seed = localWord(inst, sp + BLUE_SP_SEED), counter = localWord(inst, sp + BLUE_SP_COUNTER);
    uint qbase = sliceOffset(qt, item) / 4u;
    uint base = ctl[BLUE_O_LOCAL] + inst * lw;
    g_qpage = qt.page;
    uint accepted = 0u, out_tok = 0u;
    for (uint i = 0u; i <= k; ++i) {
        g_logits = (lt.offset + (first + i) * lt.stride) / 4u;
        RowStats s = rowStats();
        bool is_draft = i < k;
        uint d = is_draft ? localWord(inst, tokens + i + 1u) : 0u;
        g_thr = 0u;
        g_m = s.m;
        g_temp = temp;
        g_total = 1.0;
        if (temp > 0.0) {
            g_thr = keepThreshold(s.m, s.z, top_k, top_p, min_p);
            g_total = weightTotal(0u);
        }
        if (is_draft) {
            if (lid == 0u) {
                bool accept;
                if (temp <= 0.0) {
                    accept = d == s.tok;
                } else {
                    float pd = d < g_n ? weightAt(d, 0u) / g_total : 0.0;
                    float qd = d < g_n ? page_f[qt.page].d[qbase + i * g_n + d] : 0.0;
                    float u = philoxUniform(seed, counter);
                    accept = qd > 0.0 && u * qd < pd;
                }
                s_accept = accept ? 1u : 0u;
            }
            barrier();
            bool accept = s_accept != 0u;
            if (temp > 0.0) counter += 1u;
            if (accept) {
                if (lid == 0u) {
                    ctl[base + sb + BLUE_SPEC_ENTROPY + i] = floatBitsToUint(s.entropy);
                    ctl[base + sb + BLUE_SPEC_LOGPROB + i] = floatBitsToUint(logit(d) - s.m - log(s.z));
                }
                accepted += 1u;
                continue;
            }
            if (temp <= 0.0) {
                out_tok = s.tok;
            } else {
                g_qoff = qbase + i * g_n;
                float u = philoxUniform(seed, counter);
                counter += 1u;
                float residual = weightTotal(1u);
                if (residual > 0.0) {
                    out_tok = drawToken(1u, u, residual, s.tok);
                } else {
                    out_tok = drawToken(0u, u, weightTotal(0u), s.tok);
                }
            }
        } else if (temp <= 0.0) {
            out_tok = s.tok;
        } else {
            float u = philoxUniform(seed, counter);
            counter += 1u;
            out_tok = drawToken(0u, u, g_total, s.tok);
        }
        if (lid == 0u) {
            ctl[base + sb + BLUE_SPEC_ENTROPY + i] = floatBitsToUint(s.entropy);
            ctl[base + sb + BLUE_SPEC_LOGPROB + i] = floatBitsToUint(logit(out_tok) - s.m - log(s.z));
        }
        break;
    }
    barrier();
    if (lid == 0u) {
        ctl[base + sb + BLUE_SPEC_ACCEPTED] = accepted;
        ctl[base + sb + BLUE_SPEC_TOKEN] = out_tok;
        ctl[base + sp + BLUE_SP_COUNTER] = counter;
    }
}
