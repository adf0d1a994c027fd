// The sampling rule shared by SAMPLE, SAMPLEQ (sample.comp) and SPEC (spec.comp), one workgroup of
// SAMPLE_WG invocations per row of logits, following the reference (vm/tensor_ops_llm.cpp):
// statistics of the T = 1 distribution, the kept set of top-k / top-p / min-p as a threshold on
// order-preserving keys (binary search, no sort), and draws that walk tokens in id order.
// Define SAMPLE_WG and include common/tensor.glsl, common/bytes.glsl, common/philox.glsl first,
// with GL_EXT_control_flow_attributes enabled.
#define REDUCE_WG SAMPLE_WG
#include "common/reduce.glsl"

shared uint reduce_u[SAMPLE_WG];

// Every walk over a row reads ROW_UNROLL logits per lane per iteration, in the order of one at a
// time (strided: lane l takes l, l + WG, l + 2 WG, ...; contiguous: lo, lo + 1, ...), so the
// results are the same: lavapipe ends every loop of an invocation after 65,535 iterations in all
// (KernelChoice::loop_limit). One at a time, a 152,064-token row took 1,220 of them per walk, so
// SCORE over 55 rows of it, or SPEC's four drafts with top-p (about 20 walks a row), came out wrong.
#define ROW_UNROLL 8u

uint g_logits, g_page, g_n;  // the row of logits being read

// The candidate list (listCandidates): logits in id order, g_cand_n of them (~0u: none listed).
#define SAMPLE_CANDIDATES 1024u
shared float cand_v[SAMPLE_CANDIDATES];
shared uint cand_count[SAMPLE_WG];
uint g_cand_n;

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

// The largest key T >= floor such that the values with key >= T carry at least `mass` of
// exp(l - m) (top-p). Two bits a pass from the top (three candidate thresholds summed at once),
// over the predicate on max(T, floor), which is monotone in T. With `listed`, over the candidate
// list (below) instead of the whole row: the same answer whenever every key >= it is listed.
shared vec4 reduce_v[SAMPLE_WG];
uint searchThreshold(uint floor_key, float mass, float m, bool listed) {
    uint lid = gl_LocalInvocationID.x;
    uint t = 0u;
    uint n = listed ? g_cand_n : g_n;
    for (int shift = 30; shift >= 0; shift -= 2) {
        uvec3 lowest = max(uvec3(t) | (uvec3(1u, 2u, 3u) << uint(shift)), uvec3(floor_key));
        vec3 acc = vec3(0.0);
        for (uint i0 = lid; i0 < n; i0 += ROW_UNROLL * SAMPLE_WG) {
            [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                const uint i = i0 + k * SAMPLE_WG;
                if (i < n) {
                    float v = listed ? cand_v[i] : logit(i);
                    uint key = orderKey(v);
                    if (key >= lowest.x) acc += exp(v - m) * vec3(greaterThanEqual(uvec3(key), lowest));
                }
            }
        }
        barrier();
        reduce_v[lid] = vec4(acc, 0.0);
        barrier();
        for (uint s = SAMPLE_WG / 2u; s > 0u; s >>= 1) {
            if (lid < s) reduce_v[lid] += reduce_v[lid + s];
            barrier();
        }
        vec3 got = reduce_v[0].xyz;
        uint step = got.z >= mass ? 3u : got.y >= mass ? 2u : got.x >= mass ? 1u : 0u;
        t |= step << uint(shift);
    }
    return max(t, floor_key);
}

// The key of the k-th largest logit: the largest key T with at least k keys >= T, in four passes
// (a radix select, 8 bits a pass); over the row (1 <= k <= g_n) or, `listed`, over cand_v (1 <= k
// <= g_cand_n).
shared uint radix_hist[256];
shared uint radix_bin, radix_rest;
uint kthKey(uint k, bool listed) {
    uint lid = gl_LocalInvocationID.x;
    uint prefix = 0u, mask = 0u;
    uint n = listed ? g_cand_n : g_n;
    for (int shift = 24; shift >= 0; shift -= 8) {
        barrier();
        for (uint b = lid; b < 256u; b += SAMPLE_WG) radix_hist[b] = 0u;
        barrier();
        for (uint i0 = lid; i0 < n; i0 += ROW_UNROLL * SAMPLE_WG) {
            [[unroll]] for (uint u = 0u; u < ROW_UNROLL; ++u) {
                const uint i = i0 + u * SAMPLE_WG;
                if (i < n) {
                    uint key = orderKey(listed ? cand_v[i] : logit(i));
                    if ((key & mask) == prefix) atomicAdd(radix_hist[(key >> uint(shift)) & 255u], 1u);
                }
            }
        }
        barrier();
        if (lid == 0u) {
            uint b = 255u, above = 0u;
            while (b > 0u && above + radix_hist[b] < k) above += radix_hist[b--];
            radix_bin = b;
            radix_rest = k - above;
        }
        barrier();
        prefix |= radix_bin << uint(shift);
        mask |= 255u << uint(shift);
        k = radix_rest;
    }
    return prefix;
}

// The candidate list: the logits with key >= a threshold, in id order, when they number at least
// `least` and at most SAMPLE_CANDIDATES (g_cand_n; ~0u otherwise): cand_v. Each invocation lists
// its contiguous range of ids after those of the invocations before it (cand_count keeps where
// each range starts, listedId reads it back), so the order is fixed.
uint g_list_floor;
void listCandidates(uint thr, uint least) {
    uint lid = gl_LocalInvocationID.x;
    uint per = (g_n + SAMPLE_WG - 1u) / SAMPLE_WG;
    uint lo = min(lid * per, g_n), hi = min(lo + per, g_n);
    uint mine = 0u;
    for (uint i0 = lo; i0 < hi; i0 += ROW_UNROLL) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            if (i0 + k < hi) mine += orderKey(logit(i0 + k)) >= thr ? 1u : 0u;
        }
    }
    barrier();
    cand_count[lid] = mine;
    barrier();
    if (lid == 0u) {
        uint total = 0u;
        for (uint t = 0u; t < SAMPLE_WG; ++t) {
            uint c = cand_count[t];
            cand_count[t] = total;
            total += c;
        }
        radix_rest = total;
    }
    barrier();
    g_cand_n = radix_rest <= SAMPLE_CANDIDATES && radix_rest >= least ? radix_rest : 0xFFFFFFFFu;
    g_list_floor = thr;
    if (g_cand_n == 0xFFFFFFFFu) return;
    uint at = cand_count[lid];
    for (uint i0 = lo; i0 < hi; i0 += ROW_UNROLL) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            if (i0 + k < hi) {
                float v = logit(i0 + k);
                if (orderKey(v) >= thr) cand_v[at++] = v;
            }
        }
    }
    barrier();
}

// The id of the list's entry `c` (listCandidates), found by the invocation whose range holds it
// walking that range again; every invocation gets it. `fallback` for ~0u.
shared uint sel_id;
uint listedId(uint c, uint fallback) {
    uint lid = gl_LocalInvocationID.x;
    if (lid == 0u) sel_id = fallback;
    barrier();
    uint start = cand_count[lid], end = lid + 1u < SAMPLE_WG ? cand_count[lid + 1u] : g_cand_n;
    if (c != 0xFFFFFFFFu && c >= start && c < end) {
        uint per = (g_n + SAMPLE_WG - 1u) / SAMPLE_WG;
        uint lo = min(lid * per, g_n), hi = min(lo + per, g_n);
        uint left = c - start, id = fallback;
        bool found = false;
        for (uint i0 = lo; i0 < hi && !found; i0 += ROW_UNROLL) {
            [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                const uint i = i0 + k;
                if (!found && i < hi && orderKey(logit(i)) >= g_list_floor) {
                    if (left == 0u) {
                        id = i;
                        found = true;
                    } else {
                        --left;
                    }
                }
            }
        }
        sel_id = id;
    }
    barrier();
    return sel_id;
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
    for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            const uint i = i0 + k * SAMPLE_WG;
            if (i < g_n) {
                float v = logit(i);
                if (v > best) {
                    best = v;
                    best_i = i;
                }
            }
        }
    }
    RowStats s;
    s.tok = workgroupArgmax(best, best_i);
    s.m = logit(s.tok);
    float z = 0.0, zl = 0.0;
    for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            const uint i = i0 + k * SAMPLE_WG;
            if (i < g_n) {
                float d = logit(i) - s.m, e = exp(d);
                z += e;
                zl += e * d;
            }
        }
    }
    s.z = workgroupSum(z);
    zl = workgroupSum(zl);
    s.entropy = log(s.z) - zl / s.z;
    return s;
}

// The prefilter: a strided sample of at most SAMPLE_CANDIDATES logits (into cand_v) and the key
// ranked PREFILTER_RANK / stride in it: about PREFILTER_RANK of the row's keys are at or above it.
// A guess only; listCandidates counts exactly.
#define PREFILTER_RANK 512u
uint sampledFloor() {
    uint lid = gl_LocalInvocationID.x;
    uint stride = (g_n + SAMPLE_CANDIDATES - 1u) / SAMPLE_CANDIDATES;
    uint ns = (g_n + stride - 1u) / stride;
    barrier();
    for (uint i0 = lid; i0 < ns; i0 += ROW_UNROLL * SAMPLE_WG) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            const uint i = i0 + k * SAMPLE_WG;
            if (i < ns) cand_v[i] = logit(i * stride);
        }
    }
    g_cand_n = ns;
    return kthKey(clamp(PREFILTER_RANK / stride, 1u, ns), true);
}

// The key of the smallest kept logit (0: every token is kept). z: the sum of exp(l - m) over the
// whole row (rowStats). On a large row the kept tokens are first narrowed to a list (cand_v) of
// the few hundred largest logits (sampledFloor's guess, then one counting pass): top-k is a radix
// select over the list, top-p searches it, and the draw walks it. Where the guess misses (a flat
// row, many ties, a top-k past PREFILTER_MAX_K), top-k is a radix select over the row and top-p
// searches the list of the top-k tokens, or without top-k the list of the SAMPLE_CANDIDATES
// largest when they carry the mass it needs (else the whole row). Sets g_listed: every key >= the
// result is listed.
#define PREFILTER_MAX_K 256u
bool g_listed = false;
uint keepThreshold(float m, float z, uint top_k, float top_p, float min_p) {
    uint lid = gl_LocalInvocationID.x;
    uint thr = 0u, floor_key = 0u;
    bool top_k_on = top_k > 0u && top_k < g_n;
    bool listed = false;
    if (g_n > SAMPLE_CANDIDATES && (top_k_on ? top_k <= PREFILTER_MAX_K : top_p < 1.0)) {
        floor_key = sampledFloor();
        listCandidates(floor_key, top_k_on ? top_k : 1u);
        listed = g_cand_n != 0xFFFFFFFFu;
    }
    if (top_k_on) thr = kthKey(top_k, listed);
    if (top_p < 1.0) {
        if (!listed) {
            floor_key = thr;
            if (!top_k_on && g_n > SAMPLE_CANDIDATES) floor_key = kthKey(SAMPLE_CANDIDATES, false);
            listCandidates(floor_key, 1u);
            listed = g_cand_n != 0xFFFFFFFFu;
        }
        float kept = z;  // the mass top-p takes its share of: all, or the top-k's
        if (top_k_on && listed) {
            kept = 0.0;
            for (uint i0 = lid; i0 < g_cand_n; i0 += ROW_UNROLL * SAMPLE_WG) {
                [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                    const uint i = i0 + k * SAMPLE_WG;
                    if (i < g_cand_n && orderKey(cand_v[i]) >= thr) kept += exp(cand_v[i] - m);
                }
            }
            kept = workgroupSum(kept);
        } else if (top_k_on) {
            kept = 0.0;
            for (uint i0 = lid; i0 < g_n; i0 += ROW_UNROLL * SAMPLE_WG) {
                [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                    const uint i = i0 + k * SAMPLE_WG;
                    if (i < g_n && orderKey(logit(i)) >= thr) kept += exp(logit(i) - m);
                }
            }
            kept = workgroupSum(kept);
        }
        float target = top_p * kept;
        if (listed && !top_k_on) {
            // The listed tokens must carry the target mass for the answer to be among them.
            float in_list = 0.0;
            for (uint i0 = lid; i0 < g_cand_n; i0 += ROW_UNROLL * SAMPLE_WG) {
                [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                    const uint i = i0 + k * SAMPLE_WG;
                    if (i < g_cand_n) in_list += exp(cand_v[i] - m);
                }
            }
            listed = workgroupSum(in_list) >= target;
        }
        thr = searchThreshold(listed ? max(thr, floor_key) : thr, target, m, listed);
    }
    if (min_p > 0.0) thr = max(thr, orderKey(m + log(min_p)));
    g_listed = listed;  // thr >= the list's floor whenever it is listed
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

// A listed logit's mode-0 weight (the list holds every kept token when g_listed).
float listedWeight(uint i) {
    float v = cand_v[i];
    return orderKey(v) >= g_thr ? exp((v - g_m) / g_temp) : 0.0;
}

shared uint sel_owner, sel_tok;
shared float sel_before, sel_u, sel_total;

// Sum of the weights: per-invocation contiguous ranges (in id order) of the row, or of the list
// when it holds every kept token (mode 0, g_listed), added in invocation order by invocation 0, the
// order the draw walks. Every invocation gets it; reduce_f keeps the ranges' sums for drawToken.
float weightTotal(uint mode) {
    uint lid = gl_LocalInvocationID.x;
    bool listed = mode == 0u && g_listed;
    uint n = listed ? g_cand_n : g_n;
    uint per = (n + SAMPLE_WG - 1u) / SAMPLE_WG;
    uint lo = min(lid * per, n), hi = min(lo + per, n);
    float mine = 0.0;
    for (uint i0 = lo; i0 < hi; i0 += ROW_UNROLL) {
        [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
            if (i0 + k < hi) mine += listed ? listedWeight(i0 + k) : weightAt(i0 + k, mode);
        }
    }
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
// weightTotal(mode), which chose the row or the list. `fallback` when nothing is kept.
uint drawToken(uint mode, float u01, float total, uint fallback) {
    uint lid = gl_LocalInvocationID.x;
    bool listed = mode == 0u && g_listed;
    uint n = listed ? g_cand_n : g_n;
    uint per = (n + SAMPLE_WG - 1u) / SAMPLE_WG;
    uint lo = min(lid * per, n), hi = min(lo + per, n);
    uint none = listed ? 0xFFFFFFFFu : fallback;
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
        sel_tok = none;
    }
    barrier();
    if (lid == sel_owner) {
        float acc = sel_before;
        uint chosen = none;
        bool found = false;
        for (uint i0 = lo; i0 < hi && !found; i0 += ROW_UNROLL) {
            [[unroll]] for (uint k = 0u; k < ROW_UNROLL; ++k) {
                const uint i = i0 + k;
                if (!found && i < hi) {
                    float w = listed ? listedWeight(i) : weightAt(i, mode);
                    if (!(w <= 0.0)) {  // as `continue` on w <= 0: a NaN weight is walked
                        chosen = i;
                        acc += w;
                        found = acc > sel_u;
                    }
                }
            }
        }
        sel_tok = chosen;
    }
    barrier();
    uint tok = sel_tok;
    return listed ? listedId(tok, fallback) : tok;
}
