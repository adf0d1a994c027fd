#version 450
#extension GL_GOOGLE_include_directive : require
// MATMUL: dst[n] = sum_k w[n][k] * x[k] for every item (MATMULADD: dst[n] += it; MATMULGLU:
// dst[n] = act(it) * dst[n]: common/activations.glsl), weights in the GPU weight layout
// (common/wlayout.glsl), any type (WTYPE_*). Lanes over output rows: each invocation owns MM_R
// rows (n = base + r * WG) and MM_BT items, so the x it reads is the same for the whole workgroup
// (one vectorized load) and every weight texel serves MM_BT items. Built twice: MM_BT = 1 for one
// item (decode) and BLUE_MATMUL_TILE for batches; the plain types a third time (`_g`, MM_GEMM,
// MM_BT and MM_R from blue_config.h's GEMM constants) for prompts and large batches on CPU drivers
// (block types have matmul_items.comp's `_i` there).
// The plan enables one per cycle by the item count. Built twice more with MM_MOE for MOEMM, the
// grouped expert matmul: the same loops over a tile of one expert's rows that the map lists.
// Grid: x = ceil(items / MM_BT) (MOEMM: the map's tiles), y = ceil(N / (WG * MM_R)).
#include "common/tensor.glsl"
#ifdef MM_MOE_CACHE
// `moemmc`: MOEMM under an expert cache. A tile whose expert MOEROUTE put in a cache slot this
// run reads its matrix from the cache (texel operand BLUE_MOE_CACHE_OPERAND), any other in place
// (operand 1, host memory). The choice is per workgroup, so the branch in wTexel is uniform.
#extension GL_EXT_control_flow_attributes : require
bool g_cached;
#endif
#include "common/wlayout.glsl"
#include "common/activations.glsl"
#ifdef MM_INT8
// `_b1q`, `_q`: the int8 kernels of CPU drivers for one item and 4-item tiles (Q4_0, Q4_K, Q5_K, Q6_K),
// on x packed by PACKX, summing a row as `_iq` does.
#include "common/swar.glsl"
#endif

#if defined(MM_R)  // set by the build (the GEMM variant)
#elif defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
#define MM_R BLUE_MM_R_PLAIN
#elif defined(MM_MOE)
#define MM_R BLUE_MM_R_MOE
#elif defined(WTYPE_Q8_0)
#define MM_R BLUE_MM_R_Q8
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1) || defined(WTYPE_IQ4_NL) || defined(WTYPE_MXFP4)
#define MM_R BLUE_MM_R_SMALLQ
#else
#define MM_R BLUE_MM_R_KQ
#endif

#ifdef MM_SPLITK
layout(local_size_x = BLUE_MATMUL_SPLIT_WG) in;
const uint MM_WG = BLUE_MATMUL_WG;  // (the lanes-over-rows code below is not reached)
#else
// Lanes over rows: BLUE_MATMUL_WG lanes, or fewer where the plan narrows a small matrix's
// workgroups (lavapipe runs every lane, so lanes past the last row cost as much as busy ones).
layout(local_size_x = BLUE_MATMUL_WG, local_size_x_id = BLUE_SPEC_WG) in;  // both: the default is the width
layout(constant_id = BLUE_SPEC_WG) const uint MM_WG = BLUE_MATMUL_WG;
#endif

uint g_xt;  // texels in an x row (zero beyond)

vec4 xLoad(uint base, uint t) { return t < g_xt ? TEXELF(2, base + t) : vec4(0.0); }

#ifdef MM_SPLITK
// Split K, for GPUs (blue_config.h): `_b1s` for one item, `_s` for a tile of MM_BT items.
// Workgroup y owns the 8 rows of one interleaved row group; lane l computes row (l & 7) over
// every (WG/8)-th unit of K (a texel of a plain type, a group of 32 elements of a block type), so
// the 8 lanes of a unit read 8 adjacent texels and a step of the workgroup one contiguous run of
// the row group's weights; each unit's weights are decoded once for the tile's items. The lanes
// of a row then add their sums in shared memory. Nothing here depends on the subgroup size.
shared float s_part[MM_BT][BLUE_MATMUL_SPLIT_WG];

void splitMatmul(uint K, uint N, uint xb[MM_BT], uint out_at[MM_BT], uint count, uint wbase,
                 uint dpage, uint epilogue) {
    const uint lid = gl_LocalInvocationID.x, lanes = BLUE_MATMUL_SPLIT_WG / BLUE_MATMUL_SPLIT_ROWS;
    const uint row = min(gl_WorkGroupID.y * BLUE_MATMUL_SPLIT_ROWS + (lid & 7u), N - 1u);
    const uint bpr = (K + WL_E - 1u) / WL_E;
    float acc[MM_BT];
    for (uint c = 0u; c < MM_BT; ++c) acc[c] = 0.0;
#ifdef WL_PLAIN
    for (uint g = lid >> 3u; g < bpr; g += lanes) {
        vec4 a, b;
        plainTexel(wTexel(wbase, bpr, row, g, 0u), a, b);
        for (uint c = 0u; c < MM_BT; ++c) {
            acc[c] += dot(a, xLoad(xb[c], g * (WL_E / 4u)));
            if (WL_E == 8u) acc[c] += dot(b, xLoad(xb[c], g * 2u + 1u));
        }
    }
#else
    const uint units = (K + 31u) / 32u;
    for (uint u = lid >> 3u; u < units; u += lanes) {
        const uint g = u >> 3u, s = u & 7u, xt = u * 8u;
        WHead head;
        wHead(wbase, bpr, row, g, head);
        vec4 q[8];
        vec2 sc, mn;
        wGroup(wbase, bpr, row, g, s, head, q, sc, mn);
        for (uint c = 0u; c < MM_BT; ++c) {
            vec4 x0 = xLoad(xb[c], xt), x1 = xLoad(xb[c], xt + 1u), x2 = xLoad(xb[c], xt + 2u), x3 = xLoad(xb[c], xt + 3u);
            vec4 x4 = xLoad(xb[c], xt + 4u), x5 = xLoad(xb[c], xt + 5u), x6 = xLoad(xb[c], xt + 6u), x7 = xLoad(xb[c], xt + 7u);
            float lo = dot(q[0], x0) + dot(q[1], x1) + dot(q[2], x2) + dot(q[3], x3);
            float hi = dot(q[4], x4) + dot(q[5], x5) + dot(q[6], x6) + dot(q[7], x7);
            vec2 xsum = vec2(dot((x0 + x1) + (x2 + x3), vec4(1.0)), dot((x4 + x5) + (x6 + x7), vec4(1.0)));
            acc[c] += sc.x * lo + sc.y * hi + dot(mn, xsum);
        }
    }
#endif
    for (uint c = 0u; c < MM_BT; ++c) s_part[c][lid] = acc[c];
    barrier();
    for (uint h = BLUE_MATMUL_SPLIT_WG / 2u; h >= BLUE_MATMUL_SPLIT_ROWS; h >>= 1u) {
        if (lid < h) {
            for (uint c = 0u; c < MM_BT; ++c) s_part[c][lid] += s_part[c][lid + h];
        }
        barrier();
    }
    const uint out_row = gl_WorkGroupID.y * BLUE_MATMUL_SPLIT_ROWS + lid;
    if (lid < BLUE_MATMUL_SPLIT_ROWS && out_row < N) {
        for (uint c = 0u; c < count; ++c) {
            float v = s_part[c][lid];
            if (epilogue != BLUE_MM_STORE) v = mmEpilogue(epilogue, v, page_f[dpage].d[out_at[c] + out_row]);
            page_f[dpage].d[out_at[c] + out_row] = v;
        }
    }
}
#endif

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    uint xb[MM_BT], out_at[MM_BT];  // per item: x texel, dst word
#ifdef MM_MOE
    // MOEMM: workgroup x is a tile of the map (vm/abi.h): up to MM_BT (row, slot) pairs of one
    // expert e, whose matrix is slice e of w. Map words are data: each is bounds-checked.
    TRef map = tref(BLUE_PC_OPERANDS + 3u * BLUE_TREF_WORDS);
    uint K = pc.w[BLUE_PC_MOE_SHAPE], N = pc.w[BLUE_PC_MOE_SHAPE + 1u];
    uint E = pc.w[BLUE_PC_MOE_SHAPE + 2u], kk = pc.w[BLUE_PC_MOE_SHAPE + 3u];
    uint mw = map.offset / 4u, pairs_max = ctl[BLUE_H_MAX_ROWS] * kk;
    uint list = mw + BLUE_MOE_H_WORDS + E + 1u;
    uint tile = gl_WorkGroupID.x;
    if (tile >= min(page_u[map.page].d[mw + BLUE_MOE_H_TILES], pairs_max + E)) return;
    uint tw = page_u[map.page].d[list + pairs_max + 2u * tile];
    uint e = tw & BLUE_MOE_TILE_EXPERT;
    uint first = page_u[map.page].d[list + pairs_max + 2u * tile + 1u];
    if (e >= E) return;
    uint end = min(page_u[map.page].d[mw + BLUE_MOE_H_WORDS + e + 1u], pairs_max);
    if (first >= end) return;
    uint count = min(end - first, MM_BT);
    bool per_slot = x.n != K;
    for (uint c = 0u; c < MM_BT; ++c) {
        uint pair = min(page_u[map.page].d[list + first + min(c, count - 1u)], pairs_max - 1u);
        uint row = pair / kk, slot = pair % kk;
        xb[c] = (x.offset + row * x.stride + (per_slot ? slot * K * 4u : 0u)) / 16u;
        out_at[c] = (dst.offset + row * dst.stride) / 4u + slot * N;
    }
#ifdef MM_MOE_CACHE
    TRef cache = tref(BLUE_PC_MOE_CACHE_REF);
    uint slot1 = tw >> BLUE_MOE_TILE_SLOT_SHIFT;  // slot + 1, 0: not cached
    g_cached = slot1 != 0u && slot1 <= cache.n;
    uint wbase = g_cached ? (cache.offset + (slot1 - 1u) * cache.stride) / 16u : (w.offset + e * w.stride) / 16u;
#else
    uint wbase = (w.offset + e * w.stride) / 16u;
#endif
#else
    uint K = x.n, N = dst.n;
    uint items = itemCount();
    uint first = gl_WorkGroupID.x * MM_BT;
    if (first >= items) return;
    uint count = min(items - first, MM_BT);
#ifdef MM_INT8
    const TRef xq = tref(BLUE_PC_MM_XQ);  // x packed by PACKX: the item's record
#endif
    for (uint c = 0u; c < MM_BT; ++c) {
#ifdef MM_INT8
        xb[c] = (xq.offset + (first + min(c, count - 1u)) * xq.stride) / 16u;
#else
        xb[c] = sliceOffset(x, first + min(c, count - 1u)) / 16u;
#endif
        out_at[c] = sliceOffset(dst, first + min(c, count - 1u)) / 4u;
    }
    uint wbase = w.offset / 16u;
#endif
    g_xt = (K + 3u) / 4u;
#ifdef MM_SPLITK
    splitMatmul(K, N, xb, out_at, count, wbase, dst.page, pc.w[BLUE_PC_MM_EPILOGUE]);
    return;
#endif
    uint lid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.y * MM_WG * MM_R + lid;
    uint rows[MM_R];
    for (uint r = 0u; r < MM_R; ++r) rows[r] = min(row0 + r * MM_WG, N - 1u);
    float acc[MM_R][MM_BT];
    for (uint r = 0u; r < MM_R; ++r) for (uint c = 0u; c < MM_BT; ++c) acc[r][c] = 0.0;
    uint bpr = (K + WL_E - 1u) / WL_E;

#ifdef WL_PLAIN
    for (uint g = 0u; g < bpr; ++g) {
        vec4 xa[MM_BT], xq[MM_BT];
        for (uint c = 0u; c < MM_BT; ++c) {
            xa[c] = xLoad(xb[c], g * (WL_E / 4u));
            xq[c] = WL_E == 8u ? xLoad(xb[c], g * 2u + 1u) : vec4(0.0);
        }
        for (uint r = 0u; r < MM_R; ++r) {
            vec4 a, b;
            plainTexel(wTexel(wbase, bpr, rows[r], g, 0u), a, b);
            for (uint c = 0u; c < MM_BT; ++c) acc[r][c] += dot(a, xa[c]) + dot(b, xq[c]);
        }
    }
#elif (defined(WTYPE_Q6_K) && (defined(MM_SINGLE) || !defined(MM_MOE))) || defined(WTYPE_Q4_0)
    // Masked decode (Q6_K and Q4_0: one item and the 4-item tile; MOEMM's Q6_K tile keeps the
    // generic decode): quants stay in place in their words and are masked per byte, and x
    // is pre-scaled by each byte's place value (exact powers of two), so no shifts per element.
    // Q6_K's groups are walked so that every texel of a block is fetched once per row.
    const uvec4 kNib = uvec4(0xFu, 0xF00u, 0xF0000u, 0xF000000u);
    const uvec4 kByte = uvec4(0xFFu, 0xFF00u, 0xFF0000u, 0xFF000000u);
    const vec4 kPlace = vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MM_R];
        for (uint r = 0u; r < MM_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
#if defined(WTYPE_Q6_K)
        for (uint hh = 0u; hh < 2u; ++hh) {
            uvec4 ha[MM_R], hb[MM_R];
            for (uint r = 0u; r < MM_R; ++r) {
                ha[r] = wTexel(wbase, bpr, rows[r], g, 8u + 2u * hh);
                hb[r] = wTexel(wbase, bpr, rows[r], g, 9u + 2u * hh);
            }
            for (uint kb = 0u; kb < 2u; ++kb) {
                uvec4 la[MM_R], lb[MM_R];
                for (uint r = 0u; r < MM_R; ++r) {
                    la[r] = wTexel(wbase, bpr, rows[r], g, 4u * hh + 2u * kb);
                    lb[r] = wTexel(wbase, bpr, rows[r], g, 4u * hh + 2u * kb + 1u);
                }
                for (uint kh = 0u; kh < 2u; ++kh) {
                    uint k = kb + 2u * kh, s = 4u * hh + k;
                    uint xt = g * 64u + s * 8u;
                    if (xt >= g_xt) continue;
#ifdef MM_INT8
                    ivec4 xp[MM_BT][4];
                    float dx[MM_BT];
                    int sx[MM_BT];  // (Q6_K's levels are centred: unused)
                    for (uint c = 0u; c < MM_BT; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
                    for (uint r = 0u; r < MM_R; ++r) {
                        const vec2 sc = q6Scales(head[r], hh, k);
                        ivec4 wv[4];
                        swarPairs(q6Bytes(la[r], ha[r], k), q6Bytes(lb[r], hb[r], k), wv);
                        for (uint c = 0u; c < MM_BT; ++c) acc[r][c] += swarDot(wv, sc, xp[c], dx[c]);
                    }
#else
                    // Each quant word's four 6-bit values are put together in place (q6Bytes)
                    // with scalar integer ops, so one masked dot per 4 elements serves both parts.
                    vec4 xl[MM_BT][8];
                    vec2 xsum[MM_BT];
                    for (uint c = 0u; c < MM_BT; ++c) {
                        vec4 lo = vec4(0.0), hi = vec4(0.0);
                        for (uint j = 0u; j < 8u; ++j) {
                            vec4 xv = xLoad(xb[c], xt + j);
                            xl[c][j] = xv * kPlace;
                            if (j < 4u) lo += xv; else hi += xv;
                        }
                        xsum[c] = vec2(dot(lo, vec4(1.0)), dot(hi, vec4(1.0)));
                    }
                    for (uint r = 0u; r < MM_R; ++r) {
                        vec2 sc = q6Scales(head[r], hh, k);
                        uvec4 qa = q6Bytes(la[r], ha[r], k), qb = q6Bytes(lb[r], hb[r], k);
                        for (uint c = 0u; c < MM_BT; ++c) {
                            float p0 = 0.0, p1 = 0.0;
                            for (uint j = 0u; j < 4u; ++j) {
                                p0 += dot(vec4(uvec4(qa[j]) & kByte), xl[c][j]);
                                p1 += dot(vec4(uvec4(qb[j]) & kByte), xl[c][j + 4u]);
                            }
                            acc[r][c] += sc.x * (p0 - 32.0 * xsum[c].x) + sc.y * (p1 - 32.0 * xsum[c].y);
                        }
                    }
#endif
                }
            }
        }
#elif defined(MM_INT8)  // Q4_0 on x packed by PACKX
        for (uint s = 0u; s < 8u; ++s) {
            uint xt = g * 64u + s * 8u;
            if (xt >= g_xt) break;
            ivec4 xp[MM_BT][4];
            float dx[MM_BT];
            int sx[MM_BT];
            for (uint c = 0u; c < MM_BT; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
            for (uint r = 0u; r < MM_R; ++r) {
                float d = halfOf(head[r].t0, s);
                ivec4 wv[4];
                swarPairs(wTexel(wbase, bpr, rows[r], g, 1u + s), wv);
                for (uint c = 0u; c < MM_BT; ++c) acc[r][c] += swarDot(wv, d, xp[c], dx[c], sx[c]);
            }
        }
#else  // Q4_0: byte j of the 16 quant bytes holds element j (low nibble) and j + 16 (high)
        for (uint s = 0u; s < 8u; ++s) {
            uint xt = g * 64u + s * 8u;
            if (xt >= g_xt) break;
            vec4 xl[MM_BT][8];
            float xsum[MM_BT];
            for (uint c = 0u; c < MM_BT; ++c) {
                vec4 tot = vec4(0.0);
                for (uint j = 0u; j < 8u; ++j) {
                    vec4 xv = xLoad(xb[c], xt + j);
                    xl[c][j] = xv * (j < 4u ? kPlace : kPlace / 16.0);
                    tot += xv;
                }
                xsum[c] = dot(tot, vec4(1.0));
            }
            for (uint r = 0u; r < MM_R; ++r) {
                uvec4 q = wTexel(wbase, bpr, rows[r], g, 1u + s);
                float d = halfOf(head[r].t0, s);
                for (uint c = 0u; c < MM_BT; ++c) {
                    float p = 0.0;
                    for (uint j = 0u; j < 4u; ++j) {
                        p += dot(vec4(uvec4(q[j]) & kNib), xl[c][j]) + dot(vec4(uvec4(q[j]) & (kNib << 4)), xl[c][j + 4u]);
                    }
                    acc[r][c] += d * (p - 8.0 * xsum[c]);
                }
            }
        }
#endif
    }
#elif (defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)) && defined(MM_INT8)
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MM_R];
        for (uint r = 0u; r < MM_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
        for (uint s = 0u; s < 8u; ++s) {
            uint xt = g * 64u + s * 8u;
            if (xt >= g_xt) break;
            ivec4 xp[MM_BT][4];
            float dx[MM_BT];
            int sx[MM_BT];
            for (uint c = 0u; c < MM_BT; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
            for (uint r = 0u; r < MM_R; ++r) {
                ivec4 wv[4];
                float sc, mn;
                swarBlock(wbase, bpr, rows[r], g, s, head[r], wv, sc, mn);
                for (uint c = 0u; c < MM_BT; ++c) acc[r][c] += swarDot(wv, sc, mn, xp[c], dx[c], sx[c]);
            }
        }
    }
#else
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MM_R];
        for (uint r = 0u; r < MM_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
        for (uint s = 0u; s < 8u; ++s) {
            uint xt = g * 64u + s * 8u;
            if (xt >= g_xt) break;
            vec4 xs[MM_BT][8];
            vec2 xsum[MM_BT];
            for (uint c = 0u; c < MM_BT; ++c) {
                for (uint j = 0u; j < 8u; ++j) xs[c][j] = xLoad(xb[c], xt + j);
                vec4 lo = (xs[c][0] + xs[c][1]) + (xs[c][2] + xs[c][3]);
                vec4 hi = (xs[c][4] + xs[c][5]) + (xs[c][6] + xs[c][7]);
                xsum[c] = vec2(dot(lo, vec4(1.0)), dot(hi, vec4(1.0)));
            }
            for (uint r = 0u; r < MM_R; ++r) {
                vec4 q[8];
                vec2 sc, mn;
                wGroup(wbase, bpr, rows[r], g, s, head[r], q, sc, mn);
                for (uint c = 0u; c < MM_BT; ++c) {
                    float lo = dot(q[0], xs[c][0]) + dot(q[1], xs[c][1]) + dot(q[2], xs[c][2]) + dot(q[3], xs[c][3]);
                    float hi = dot(q[4], xs[c][4]) + dot(q[5], xs[c][5]) + dot(q[6], xs[c][6]) + dot(q[7], xs[c][7]);
                    acc[r][c] += sc.x * lo + sc.y * hi + dot(mn, xsum[c]);
                }
            }
        }
    }
#endif
#ifdef MM_MOE
    const uint epilogue = BLUE_MM_STORE;
#else
    const uint epilogue = pc.w[BLUE_PC_MM_EPILOGUE];  // MATMULADD, MATMULGLU: what dst holds counts
#endif
    for (uint r = 0u; r < MM_R; ++r) {
        uint row = row0 + r * MM_WG;
        if (row >= N) continue;
        for (uint c = 0u; c < count; ++c) {
            float v = acc[r][c];
            if (epilogue != BLUE_MM_STORE) v = mmEpilogue(epilogue, v, page_f[dst.page].d[out_at[c] + row]);
            page_f[dst.page].d[out_at[c] + row] = v;
        }
    }
}
