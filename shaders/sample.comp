#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// SAMPLE: one workgroup per instance picks the next token from its logits, following the rule
// of the reference (vm/tensor_ops_llm.cpp): repetition/presence/frequency penalties over the last
// N history tokens; entropy and log-probability of the penalized T = 1 distribution; greedy when
// T <= 0; else top-k, top-p and min-p thresholds, temperature, and one Philox draw walking the
// kept tokens in id order (common/sampling.glsl). Writes token, entropy and log-probability into
// the parameter block and advances its counter; with TOP_N, the most likely tokens too.
// SAMPLEG (GRAMMAR): first, the token the program emitted since the last sample (if any)
// advances the instance's grammar automaton; then tokens the automaton cannot take get -1e30
// (the rules of vm/grammar_walk.cpp, every read bounds-checked).
// SAMPLEQ (WRITE_PROBS): also writes the distribution it drew from (greedy: one-hot) into row
// local[sp + BLUE_SP_ROW] of a table, for speculative decoding's draft model.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/philox.glsl"
#include "vm/llm_abi.h"
// 256 lanes, or fewer where the plan narrows it for a small vocabulary on a CPU driver
// (BLUE_SPEC_WG; host/machine_plan.cpp sampleWidth).
layout(local_size_x = 256, local_size_x_id = BLUE_SPEC_WG) in;  // both: the default is the width
layout(constant_id = BLUE_SPEC_WG) const uint SAMPLE_WG = 256u;
#include "common/sampling.glsl"

#ifdef GRAMMAR
// ---- the grammar (vm/llm_abi.h BLUE_GR_*, BLUE_TB_*) ----------------------------------------
// Both tables are read through the operands' texel views (lavapipe vectorizes image loads; its
// storage-buffer loads go one lane at a time). Most tokens are decided by their first byte, so
// the byte classes and the current state's row of next states are staged in shared memory:
// a token that dies at its first byte costs two texel loads and two shared reads.
#define GR_OP 2
#define TB_OP 3
uint gr_texel, gr_words;  // the instance's automaton: first texel, words
uint tb_texel, tb_words;  // the model's token bytes
uint gr_states, gr_classes, gr_table;
shared uint s_allowed;
shared uint s_class[64];   // the byte classes, 4 per word
shared uint s_row[256];    // the current state's next state per class

uint grWord(uint i) { return i < gr_words ? TEXEL(GR_OP, gr_texel + i / 4u)[i % 4u] : 0u; }
uint tbWord(uint i) { return i < tb_words ? TEXEL(TB_OP, tb_texel + i / 4u)[i % 4u] : 0u; }
uint tbByte(uint at) { return (tbWord(g_n + at / 4u) >> (8u * (at % 4u))) & 0xFFu; }
uint grClass(uint b) { return (s_class[b / 4u] >> (8u * (b % 4u))) & 0xFFu; }

bool grammarActive() {
    if (gr_words < BLUE_GR_HEADER_WORDS || tb_words < g_n) return false;
    gr_states = grWord(BLUE_GR_STATES);
    gr_classes = grWord(BLUE_GR_CLASSES);
    if (gr_states == 0u || gr_states >= BLUE_GR_DEAD || gr_classes == 0u || gr_classes > 256u) return false;
    if (grWord(BLUE_GR_STATE) >= gr_states) return false;
    gr_table = BLUE_GR_ACCEPT + (gr_states + 31u) / 32u;
    return gr_table + (gr_states * gr_classes + 1u) / 2u <= gr_words;
}

bool grAccepting(uint state) { return ((grWord(BLUE_GR_ACCEPT + state / 32u) >> (state % 32u)) & 1u) != 0u; }
uint tbKind(uint t) { return (tbWord(t) >> 8) & 3u; }

uint grStep(uint state, uint c) {
    if (c >= gr_classes) return BLUE_GR_DEAD;
    uint e = state * gr_classes + c;
    uint next = (grWord(gr_table + e / 2u) >> (16u * (e % 2u))) & 0xFFFFu;
    return next != BLUE_GR_DEAD && next >= gr_states ? BLUE_GR_DEAD : next;
}

// The state after token t's bytes from `state`, BLUE_GR_DEAD when one is not allowed; byte-less
// kinds keep it.
uint grNext(uint state, uint t) {
    uint info = tbWord(t), len = info & 0xFFu, off = info >> 10;
    if (((info >> 8) & 3u) != BLUE_TB_TEXT) return state;
    for (uint j = 0u; j < len && state != BLUE_GR_DEAD; ++j) state = grStep(state, grClass(tbByte(off + j)));
    return state;
}

// Whether a token with info word `info` may be drawn in the staged state.
bool grAllowsInfo(uint state, uint info) {
    uint kind = (info >> 8) & 3u, len = info & 0xFFu, off = info >> 10;
    if (kind != BLUE_TB_TEXT) return kind == BLUE_TB_END && grAccepting(state);
    if (len == 0u) return false;
    uint c = grClass(tbByte(off));
    uint s = c < gr_classes ? s_row[c] : BLUE_GR_DEAD;
    for (uint j = 1u; j < len && s != BLUE_GR_DEAD; ++j) s = grStep(s, grClass(tbByte(off + j)));
    return s != BLUE_GR_DEAD;
}

// The byte classes into shared memory (grClass reads them): before any walk.
void stageClasses() {
    uint lid = gl_LocalInvocationID.x;
    for (uint i = lid; i < 64u; i += SAMPLE_WG) s_class[i] = grWord(BLUE_GR_CLASS_MAP + i);
    barrier();
}

void maskGrammar(uint state) {
    uint lid = gl_LocalInvocationID.x;
    if (lid == 0u) s_allowed = 0u;
    for (uint c = lid; c < gr_classes; c += SAMPLE_WG) s_row[c] = grStep(state, c);
    barrier();
    // Four tokens per invocation: one texel of info words, one vec4 of logits when aligned.
    uint allowed = 0u;
    bool vec = (g_logits % 4u) == 0u;
    for (uint q = lid; 4u * q < g_n; q += SAMPLE_WG) {
        uvec4 info = 4u * q + 3u < tb_words ? TEXEL(TB_OP, tb_texel + q) : uvec4(tbWord(4u * q), tbWord(4u * q + 1u),
                                                                               tbWord(4u * q + 2u), tbWord(4u * q + 3u));
        bvec4 ok = bvec4(grAllowsInfo(state, info.x), grAllowsInfo(state, info.y),
                         grAllowsInfo(state, info.z), grAllowsInfo(state, info.w));
        uint n = min(4u, g_n - 4u * q);
        for (uint k = 0u; k < 4u; ++k) {
            if (k < n && ok[k]) ++allowed;
        }
        if (vec && n == 4u) {
            if (!all(ok)) {
                vec4 v = page_v4[g_page].d[g_logits / 4u + q];
                page_v4[g_page].d[g_logits / 4u + q] = mix(vec4(BLUE_GR_MASKED), v, ok);
            }
        } else {
            for (uint k = 0u; k < n; ++k) {
                if (!ok[k]) page_f[g_page].d[g_logits + 4u * q + k] = BLUE_GR_MASKED;
            }
        }
    }
    if (allowed > 0u) atomicAdd(s_allowed, allowed);
    barrier();
    memoryBarrierBuffer();
    barrier();
    if (s_allowed != 0u) return;
    // Nothing can continue the text: end it (end-of-generation tokens, else token 0). Every lane
    // looks at its share of the vocabulary (one lane walking it all would pass lavapipe's loop
    // limit at 65,536 tokens).
    uint ends = 0u;
    for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            const uint i = i0 + k * SAMPLE_WG;
            if (i < g_n && tbKind(i) == BLUE_TB_END) ++ends;
        }
    }
    bool any_end = workgroupCount(ends) != 0u;
    for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            const uint i = i0 + k * SAMPLE_WG;
            if (i < g_n && (any_end ? tbKind(i) == BLUE_TB_END : i == 0u)) page_f[g_page].d[g_logits + i] = 0.0;
        }
    }
    barrier();
    memoryBarrierBuffer();
    barrier();
}
#endif

// The window's tokens are compared with each other (each distinct token is penalized once, by the
// invocation of its first occurrence, with its count): PENALTY_UNROLL words an iteration, and an
// invocation stops once it finds its token earlier in the window. Its worst case, a window of
// distinct tokens, is ceil(W / SAMPLE_WG) * (ceil(W / PENALTY_UNROLL) + 1) loop iterations; the
// host refuses windows past lavapipe's loop limit (maxPenaltyWindow in host/machine_plan.cpp, the same count).
#define PENALTY_UNROLL 16u
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
        for (uint j0 = 0u; j0 < window && first; j0 += PENALTY_UNROLL) {
            [[unroll]] for (uint k = 0u; k < PENALTY_UNROLL; ++k) {
                const uint j = j0 + k;
                if (j < window && localWord(inst, hist + start + j) == t) {
                    if (j < i) first = false;
                    ++count;
                }
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
        for (uint i0 = gl_LocalInvocationID.x; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
            [[unroll]] for (uint u = 0u; u < ROW_UNROLL; ++u) {
                const uint i = i0 + u * SAMPLE_WG;
                if (i < g_n) {
                    float v = logit(i);
                    bool below = k == 0u || v < prev || (v == prev && i > prev_i);
                    if (below && (best_i == 0xFFFFFFFFu || v > best)) {
                        best = v;
                        best_i = i;
                    }
                }
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
#ifdef GRAMMAR
    TRef gt = tref(BLUE_PC_OPERANDS + 5u), bt = tref(BLUE_PC_OPERANDS + 9u);
    gr_texel = sliceOffset(gt, item) / 16u;
    gr_words = gt.n;
    tb_texel = sliceOffset(bt, item) / 16u;
    tb_words = bt.n;
    bool grammar = grammarActive();
    uint gr_state = 0u, gr_pending = 0u;
    if (grammar) {
        // The token the program emitted since the last sample advances the state first.
        stageClasses();
        gr_state = grWord(BLUE_GR_STATE);
        gr_pending = grWord(BLUE_GR_PENDING);
        if (gr_pending != 0u) {
            uint next = grNext(gr_state, gr_pending - 1u);
            if (next != BLUE_GR_DEAD) gr_state = next;
        }
        maskGrammar(gr_state);
    }
#endif
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
        for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
            [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                const uint i = i0 + k * SAMPLE_WG;
                if (i < g_n) page_f[qt.page].d[q + i] = temp > 0.0 ? weightAt(i, 0u) / total : (i == tok ? 1.0 : 0.0);
            }
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
#ifdef GRAMMAR
        if (grammar && gr_pending != 0u) {
            page_u[gt.page].d[sliceOffset(gt, item) / 4u + BLUE_GR_STATE] = gr_state;
            page_u[gt.page].d[sliceOffset(gt, item) / 4u + BLUE_GR_PENDING] = 0u;
        }
#endif
    }
}
