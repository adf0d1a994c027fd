#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// MOEROUTE: one workgroup routes every row of the run (its k experts and their weights, as
// vm/tensor_ops_moe.cpp defines), then groups the (row, slot) pairs by expert into the map
// (vm/abi.h BLUE_MOE_*) and writes the number of tiles into the items axis of the MOEMM
// dispatches that read it (push words BLUE_PC_MOE_PATCH..): the router's counts size the expert
// GEMMs, and no host reads them. Rows are few hundred at most and experts a few hundred, so one
// workgroup walks them; it also adds the chosen experts' bytes to the control counters. Its walks
// take MR_UNROLL elements an iteration, in the order of one at a time: lavapipe ends every loop
// of an invocation after 65,535 iterations in all, which one at a time 256 experts reached at
// about 450 rows.
#define MR_UNROLL 8u
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

// The rows' choices are written and read back by other invocations of this workgroup.
layout(set = 0, binding = BLUE_BIND_PAGES, std430) coherent buffer PageC {
    float d[];
} page_c[BLUE_MAX_PAGES];

shared uint s_count[BLUE_MOE_MAX_EXPERTS];
shared uint s_first[BLUE_MOE_MAX_EXPERTS];  // first pair of each expert
shared uint s_tile0[BLUE_MOE_MAX_EXPERTS];  // first tile of each expert
shared uint s_slot[BLUE_MOE_MAX_EXPERTS];   // expert cache: each expert's slot + 1 this run (0: none)

// The expert cache (vm/abi.h BLUE_XC_*, host/machine_plan.h ExpertCache), one invocation: the
// experts this run needs that are cached keep their slots; each other takes the slot used least
// recently, by no expert of this run, and goes on the copy list that the MOECOPY dispatches
// after this one carry out; with no such slot left it is read in place. Returns the copies.
uint updateCache(uint st, uint E) {
    uint C = min(ctl[st + BLUE_XC_SLOTS], BLUE_MOE_MAX_EXPERTS);
    E = min(E, ctl[st + BLUE_XC_EXPERTS]);
    uint clock = ctl[st + BLUE_XC_CLOCK] + 1u;
    ctl[st + BLUE_XC_CLOCK] = clock;
    uint slot_of = st + BLUE_XC_HEAD, expert_of = slot_of + ctl[st + BLUE_XC_EXPERTS];
    uint used = expert_of + ctl[st + BLUE_XC_SLOTS], list = used + ctl[st + BLUE_XC_SLOTS];
    uint hits = 0u, copies = 0u, inplace = 0u;
    for (uint e = 0u; e < E; ++e) {
        uint s1 = ctl[slot_of + e];
        if (s_count[e] == 0u || s1 == 0u || s1 > C) continue;
        ctl[used + s1 - 1u] = clock;
        s_slot[e] = s1;
        hits += 1u;
    }
    for (uint e = 0u; e < E; ++e) {
        if (s_count[e] == 0u || s_slot[e] != 0u) continue;
        uint v = C, oldest = clock;
        for (uint s0 = 0u; s0 < C; s0 += MR_UNROLL) {
            [[unroll]] for (uint u = 0u; u < MR_UNROLL; ++u) {
                const uint s = s0 + u;
                if (s < C && ctl[used + s] < oldest) {
                    oldest = ctl[used + s];
                    v = s;
                }
            }
        }
        if (v == C) {
            inplace += 1u;
            continue;
        }
        uint prev = ctl[expert_of + v];
        if (prev != 0u && prev <= E) ctl[slot_of + prev - 1u] = 0u;
        ctl[expert_of + v] = e + 1u;
        ctl[slot_of + e] = v + 1u;
        ctl[used + v] = clock;
        ctl[list + 2u * copies] = e;
        ctl[list + 2u * copies + 1u] = v;
        copies += 1u;
        s_slot[e] = v + 1u;
    }
    ctl[st + BLUE_XC_COPIES] = copies;
    ctl[BLUE_C_XC_HITS] += hits;
    ctl[BLUE_C_XC_MISSES] += copies;
    ctl[BLUE_C_XC_INPLACE] += inplace;
    uint add = copies * ctl[st + BLUE_XC_TEXELS];
    uint lo = ctl[BLUE_C_XC_TEXELS_LO] + add;
    if (lo < add) ctl[BLUE_C_XC_TEXELS_HI] += 1u;
    ctl[BLUE_C_XC_TEXELS_LO] = lo;
    return copies;
}

// The expert of pair q: row q / k's choice in slot q % k (the pairs in row order).
uint pairExpert(TRef sel, uint q, uint k) { return uint(page_c[sel.page].d[sliceOffset(sel, q / k) / 4u + q % k]); }

void main() {
    TRef sel = tref(BLUE_PC_OPERANDS);
    TRef lg = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef map = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    uint k = pc.w[BLUE_PC_OPERANDS + 3u * BLUE_TREF_WORDS];
    uint gating = pc.w[BLUE_PC_OPERANDS + 3u * BLUE_TREF_WORDS + 1u];
    uint E = lg.n;
    uint rows = itemCount();
    uint lid = gl_LocalInvocationID.x;

    // 1. Each invocation routes rows lid, lid + WG, ...
    for (uint r = lid; r < rows; r += BLUE_ITEM_WG) {
        uint lo = sliceOffset(lg, r) / 4u, so = sliceOffset(sel, r) / 4u;
        uint chosen[BLUE_MOE_MAX_SLOTS];
        uint taken[BLUE_MOE_MAX_EXPERTS / 32u];  // a bit per expert already chosen
        [[unroll]] for (uint w = 0u; w < BLUE_MOE_MAX_EXPERTS / 32u; ++w) taken[w] = 0u;
        for (uint j = 0u; j < k; ++j) {
            uint best = 0xFFFFFFFFu;
            float bv = 0.0;
            for (uint e0 = 0u; e0 < E; e0 += MR_UNROLL) {
                [[unroll]] for (uint u = 0u; u < MR_UNROLL; ++u) {
                    const uint e = e0 + u;
                    if (e < E && (taken[e / 32u] & (1u << (e % 32u))) == 0u) {
                        float v = page_f[lg.page].d[lo + e];
                        if (best == 0xFFFFFFFFu || v > bv) {
                            best = e;
                            bv = v;
                        }
                    }
                }
            }
            chosen[j] = best;
            if (best < E) taken[best / 32u] |= 1u << (best % 32u);
        }
        float top = page_f[lg.page].d[lo + chosen[0]];
        float total = 0.0;
        if (gating == 0u) {
            for (uint j = 0u; j < k; ++j) total += exp(page_f[lg.page].d[lo + chosen[j]] - top);
        } else {
            for (uint e0 = 0u; e0 < E; e0 += MR_UNROLL) {
                [[unroll]] for (uint u = 0u; u < MR_UNROLL; ++u) {
                    if (e0 + u < E) total += exp(page_f[lg.page].d[lo + e0 + u] - top);
                }
            }
        }
        for (uint j = 0u; j < k; ++j) {
            page_c[sel.page].d[so + j] = float(chosen[j]);
            page_c[sel.page].d[so + k + j] = exp(page_f[lg.page].d[lo + chosen[j]] - top) / total;
        }
    }
    memoryBarrierBuffer();
    barrier();

    // 2. Pairs per expert.
    for (uint e = lid; e < E; e += BLUE_ITEM_WG) {
        uint n = 0u;
        s_slot[e] = 0u;
        for (uint q0 = 0u; q0 < rows * k; q0 += MR_UNROLL) {
            [[unroll]] for (uint u = 0u; u < MR_UNROLL; ++u) {
                const uint q = q0 + u;
                if (q < rows * k && pairExpert(sel, q, k) == e) n += 1u;
            }
        }
        s_count[e] = n;
    }
    barrier();

    // 3. Offsets, tiles, the header, the MOEMM dispatches' sizes and the byte counter.
    uint mw = map.offset / 4u;
    uint pairs_max = ctl[BLUE_H_MAX_ROWS] * k;
    uint tile = rows == 1u ? 1u : BLUE_MOE_TILE_ROWS;
    if (lid == 0u) {
        uint copies = 0u;
        if (pc.w[BLUE_PC_MOE_CACHE] != 0u) {
            copies = updateCache(ctl[BLUE_O_EXPERT_CACHE] + pc.w[BLUE_PC_MOE_CACHE] - 1u, E);
        }
        uint at = 0u, tiles = 0u, used = 0u;
        for (uint e = 0u; e < E; ++e) {
            s_first[e] = at;
            s_tile0[e] = tiles;
            page_u[map.page].d[mw + BLUE_MOE_H_WORDS + e] = at;
            at += s_count[e];
            tiles += (s_count[e] + tile - 1u) / tile;
            used += s_count[e] > 0u ? 1u : 0u;
        }
        page_u[map.page].d[mw + BLUE_MOE_H_WORDS + E] = at;
        page_u[map.page].d[mw + BLUE_MOE_H_TILES] = tiles;
        page_u[map.page].d[mw + BLUE_MOE_H_TILE] = tile;
        page_u[map.page].d[mw + BLUE_MOE_H_SLOTS] = k;
        page_u[map.page].d[mw + BLUE_MOE_H_EXPERTS] = E;
        uint patches = min(pc.w[BLUE_PC_MOE_PATCH], BLUE_MOE_MAX_PATCH);
        for (uint i = 0u; i < patches; ++i) {
            uint word = pc.w[BLUE_PC_MOE_PATCH + 1u + i];
            uint at3 = ctl[BLUE_O_INDIRECT] + (word & ~BLUE_MOE_PATCH_COPY) * 3u;
            // The plan enabled this variant for this run: its size is the tiles (MOEMM) or the
            // experts to copy (MOECOPY).
            if (ctl[at3] != 0u) ctl[at3] = (word & BLUE_MOE_PATCH_COPY) != 0u ? copies : tiles;
        }
        uint add = used * pc.w[BLUE_PC_MOE_TEXELS];
        uint lo = ctl[BLUE_C_MOE_TEXELS_LO] + add;
        if (lo < add) ctl[BLUE_C_MOE_TEXELS_HI] += 1u;
        ctl[BLUE_C_MOE_TEXELS_LO] = lo;
    }
    barrier();

    // 4. Each expert's pairs in row order, and its tiles.
    uint list = mw + BLUE_MOE_H_WORDS + E + 1u, tiles_at = list + pairs_max;
    for (uint e = lid; e < E; e += BLUE_ITEM_WG) {
        uint at = s_first[e];
        for (uint q0 = 0u; q0 < rows * k; q0 += MR_UNROLL) {
            [[unroll]] for (uint u = 0u; u < MR_UNROLL; ++u) {
                const uint q = q0 + u;
                if (q < rows * k && pairExpert(sel, q, k) == e) {
                    page_u[map.page].d[list + at] = q;
                    at += 1u;
                }
            }
        }
        uint t = s_tile0[e];
        for (uint f = s_first[e]; f < s_first[e] + s_count[e]; f += tile) {
            page_u[map.page].d[tiles_at + 2u * t] = e | s_slot[e] << BLUE_MOE_TILE_SLOT_SHIFT;
            page_u[map.page].d[tiles_at + 2u * t + 1u] = f;
            t += 1u;
        }
    }
}
