#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// MATMUL `_i`: the GEMM for CPU drivers (MATMULADD and MATMULGLU too: their epilogues), lanes over
// items. lavapipe runs 8 lanes as one vector and pays a gather (about 40 instructions) for every
// texel load, whether the 8 addresses differ or not. The lanes-over-rows kernels load the same x
// texel in every lane; a 4-bit weight texel holds 32 elements where an x texel holds 4, so there a
// row's x loads cost 8x its weight loads and are shared by only the lane's few rows. Here each
// lane owns MI_C items (first + c * MI_L + lane) and the workgroup MI_R rows: the lane loads its
// items' x once per block of 32 and reuses it for MI_R rows; every lane loads the same weight
// texel and decodes it once for its MI_C items. The rows loop is unrolled so the accumulators
// keep constant indices (a dynamically indexed array becomes per-lane memory on CPU drivers).
// Q4_0 and Q6_K decode in place (the masked decode of their other kernels), the other block types
// through wGroup: either way a row's products are summed in the order of the single-item and
// 4-item kernels (matmul.comp), so a token's logits do not depend on the batch it shares.
// Built once more for Q4_0, Q4_K, Q5_K and Q6_K with MI_INT8 (`_iq`): the int8 GEMM on CPU drivers, on
// x rounded to int8 once per input by PACKX (common/swar.glsl), summing a row as the one-item and
// 4-item int8 kernels (`_b1q`, `_q`) do.
// Grid: x = ceil(items / (MI_L * MI_C)), y = ceil(N / MI_R).
#include "common/tensor.glsl"
#include "common/wlayout.glsl"
#include "common/activations.glsl"
#ifdef MI_INT8
#include "common/swar.glsl"
#endif

#ifndef MI_C
#define MI_C BLUE_MATMUL_ITEMS_PER_LANE
#endif
#ifndef MI_R
#define MI_R BLUE_MATMUL_ITEMS_ROWS
#endif
#define MI_L BLUE_MATMUL_ITEMS_LANES
layout(local_size_x = MI_L) in;

void main() {
    const TRef dst = tref(BLUE_PC_OPERANDS);
    const TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    const TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    const uint K = x.n, N = dst.n, items = itemCount();
    const uint first = gl_WorkGroupID.x * (MI_L * MI_C);
    if (first >= items) return;
    const uint lid = gl_LocalInvocationID.x;
    uint xb[MI_C];  // items past the last read the last one's x and are never written
#ifdef MI_INT8
    const TRef xq = tref(BLUE_PC_MM_XQ);  // x packed by PACKX: the item's record
    [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
        xb[c] = (xq.offset + min(first + c * MI_L + lid, items - 1u) * xq.stride) / 16u;
    }
#else
    [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
        xb[c] = sliceOffset(x, min(first + c * MI_L + lid, items - 1u)) / 16u;
    }
#endif
    const uint row0 = gl_WorkGroupID.y * MI_R;
    uint rows[MI_R];  // rows past N read row N - 1 and are never written
    [[unroll]] for (uint r = 0u; r < MI_R; ++r) rows[r] = min(row0 + r, N - 1u);
    const uint wbase = w.offset / 16u, bpr = (K + WL_E - 1u) / WL_E, xtn = (K + 3u) / 4u;
    float acc[MI_R][MI_C];
    [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
        [[unroll]] for (uint c = 0u; c < MI_C; ++c) acc[r][c] = 0.0;
    }
#if defined(WTYPE_Q4_0) && !defined(MI_INT8)
    // Q4_0's masked decode: a quant word's nibbles stay in place, masked per byte, and x is
    // pre-scaled by each nibble's place value (exact powers of two).
    const uvec4 kNib = uvec4(0xFu, 0xF00u, 0xF0000u, 0xF000000u);
    const vec4 kPlace = vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
#endif

#if defined(WTYPE_Q4_0)
    for (uint g = 0u; g < bpr; ++g) {
        uvec4 head[MI_R];  // the gblock's 8 block scales, per row
        [[unroll]] for (uint r = 0u; r < MI_R; ++r) head[r] = wTexel(wbase, bpr, rows[r], g, 0u);
        for (uint s = 0u; s < 8u; ++s) {
            // Block s: elements 32s..32s+31 of the gblock, x texels xt..xt+7. Byte j of its 16
            // quant bytes holds element j (low nibble) and j + 16 (high): word j's low nibbles
            // meet x texel j, its high nibbles x texel j + 4.
            const uint xt = g * 64u + s * 8u;
            if (xt >= xtn) break;
#ifdef MI_INT8
            ivec4 xp[MI_C][4];
            float dx[MI_C];
            int sx[MI_C];
            [[unroll]] for (uint c = 0u; c < MI_C; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
#else
            vec4 xl[MI_C][8];
            float xsum[MI_C];
            [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                vec4 tot = vec4(0.0);
                [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                    const vec4 xv = TEXELF(2, xb[c] + xt + j);
                    xl[c][j] = xv * kPlace;
                    tot += xv;
                }
                xsum[c] = dot(tot, vec4(1.0));
            }
#endif
            [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                const uvec4 q = wTexel(wbase, bpr, rows[r], g, 1u + s);
                const float d = halfOf(head[r], s);
#ifdef MI_INT8
                ivec4 wv[4];
                swarPairs(q, wv);
                [[unroll]] for (uint c = 0u; c < MI_C; ++c) acc[r][c] += swarDot(wv, d, xp[c], dx[c], sx[c]);
#else
                vec4 lo[4], hi[4];
                [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                    lo[j] = vec4(ivec4(uvec4(q[j]) & kNib));  // under 2^28: the signed conversion is exact
                    hi[j] = vec4(ivec4(uvec4(q[j] >> 4u) & kNib));
                }
                [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                    float p = 0.0;
                    [[unroll]] for (uint j = 0u; j < 4u; ++j) p += dot(lo[j], xl[c][j]) + dot(hi[j], xl[c][j + 4u]);
                    acc[r][c] += d * (p - 8.0 * xsum[c]);
                }
#endif
            }
        }
    }
#elif defined(WTYPE_Q6_K)
    // Q6_K: the masked decode of its single-item kernel (matmul.comp), in its order: groups s =
    // 4hh + kb + 2kh, each quant word's 6-bit values put together in place and masked per byte
    // against x pre-scaled by the byte's place value.
    const uvec4 kByte = uvec4(0xFFu, 0xFF00u, 0xFF0000u, 0xFF000000u);
    const vec4 kPlace = vec4(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MI_R];
        [[unroll]] for (uint r = 0u; r < MI_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
        for (uint hh = 0u; hh < 2u; ++hh) {
            uvec4 ha[MI_R], hb[MI_R];
            [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                ha[r] = wTexel(wbase, bpr, rows[r], g, 8u + 2u * hh);
                hb[r] = wTexel(wbase, bpr, rows[r], g, 9u + 2u * hh);
            }
            for (uint kb = 0u; kb < 2u; ++kb) {
                uvec4 la[MI_R], lb[MI_R];
                [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                    la[r] = wTexel(wbase, bpr, rows[r], g, 4u * hh + 2u * kb);
                    lb[r] = wTexel(wbase, bpr, rows[r], g, 4u * hh + 2u * kb + 1u);
                }
                for (uint kh = 0u; kh < 2u; ++kh) {
                    const uint k = kb + 2u * kh, s = 4u * hh + k;
                    const uint xt = g * 64u + s * 8u;
                    if (xt >= xtn) continue;
#ifdef MI_INT8
                    // `_iq`, Q6_K: the group's halves (elements 0..15, scale sc.x; 16..31, sc.y).
                    ivec4 xp[MI_C][4];
                    float dx[MI_C];
                    int sx[MI_C];  // (Q6_K's levels are centred: unused)
                    [[unroll]] for (uint c = 0u; c < MI_C; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
                    [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                        const vec2 sc = q6Scales(head[r], hh, k);
                        ivec4 wv[4];
                        swarPairs(q6Bytes(la[r], ha[r], k), q6Bytes(lb[r], hb[r], k), wv);
                        [[unroll]] for (uint c = 0u; c < MI_C; ++c) acc[r][c] += swarDot(wv, sc, xp[c], dx[c]);
                    }
#else
                    vec4 xl[MI_C][8];
                    vec2 xsum[MI_C];
                    [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                        vec4 lo = vec4(0.0), hi = vec4(0.0);
                        [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                            const vec4 xv = TEXELF(2, xb[c] + xt + j);
                            xl[c][j] = xv * kPlace;
                            if (j < 4u) lo += xv; else hi += xv;
                        }
                        xsum[c] = vec2(dot(lo, vec4(1.0)), dot(hi, vec4(1.0)));
                    }
                    [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                        const vec2 sc = q6Scales(head[r], hh, k);
                        const uvec4 qa = q6Bytes(la[r], ha[r], k), qb = q6Bytes(lb[r], hb[r], k);
                        vec4 wa[4], wb[4];  // under 2^30: the signed conversion is exact
                        [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                            wa[j] = vec4(ivec4(uvec4(qa[j]) & kByte));
                            wb[j] = vec4(ivec4(uvec4(qb[j]) & kByte));
                        }
                        [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                            float p0 = 0.0, p1 = 0.0;
                            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                                p0 += dot(wa[j], xl[c][j]);
                                p1 += dot(wb[j], xl[c][j + 4u]);
                            }
                            acc[r][c] += sc.x * (p0 - 32.0 * xsum[c].x) + sc.y * (p1 - 32.0 * xsum[c].y);
                        }
                    }
#endif
                }
            }
        }
    }
#elif (defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)) && defined(MI_INT8)
    // `_iq`, Q4_K and Q5_K (common/swar.glsl swarBlock, swarDot).
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MI_R];
        [[unroll]] for (uint r = 0u; r < MI_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
        for (uint s = 0u; s < 8u; ++s) {
            const uint xt = g * 64u + s * 8u;
            if (xt >= xtn) break;
            ivec4 xp[MI_C][4];
            float dx[MI_C];
            int sx[MI_C];
            [[unroll]] for (uint c = 0u; c < MI_C; ++c) xqBlock(xb[c], g, s, xp[c], dx[c], sx[c]);
            [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                ivec4 wv[4];
                float sc, mn;
                swarBlock(wbase, bpr, rows[r], g, s, head[r], wv, sc, mn);
                [[unroll]] for (uint c = 0u; c < MI_C; ++c) acc[r][c] += swarDot(wv, sc, mn, xp[c], dx[c], sx[c]);
            }
        }
    }
#else
    // Other block types: each row's group of 32 decoded once (wGroup: raw quants, per-half scale
    // and offset) for the lane's MI_C items.
    for (uint g = 0u; g < bpr; ++g) {
        WHead head[MI_R];
        [[unroll]] for (uint r = 0u; r < MI_R; ++r) wHead(wbase, bpr, rows[r], g, head[r]);
        for (uint s = 0u; s < 8u; ++s) {
            const uint xt = g * 64u + s * 8u;
            if (xt >= xtn) break;
            vec4 xs[MI_C][8];
            vec2 xsum[MI_C];
            [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                [[unroll]] for (uint j = 0u; j < 8u; ++j) xs[c][j] = TEXELF(2, xb[c] + xt + j);
                const vec4 lo = (xs[c][0] + xs[c][1]) + (xs[c][2] + xs[c][3]);
                const vec4 hi = (xs[c][4] + xs[c][5]) + (xs[c][6] + xs[c][7]);
                xsum[c] = vec2(dot(lo, vec4(1.0)), dot(hi, vec4(1.0)));
            }
            [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
                vec4 q[8];
                vec2 sc, mn;
                wGroup(wbase, bpr, rows[r], g, s, head[r], q, sc, mn);
                [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
                    const float lo = dot(q[0], xs[c][0]) + dot(q[1], xs[c][1]) + dot(q[2], xs[c][2]) + dot(q[3], xs[c][3]);
                    const float hi = dot(q[4], xs[c][4]) + dot(q[5], xs[c][5]) + dot(q[6], xs[c][6]) + dot(q[7], xs[c][7]);
                    acc[r][c] += sc.x * lo + sc.y * hi + dot(mn, xsum[c]);
                }
            }
        }
    }
#endif

    const uint epilogue = pc.w[BLUE_PC_MM_EPILOGUE];
    [[unroll]] for (uint c = 0u; c < MI_C; ++c) {
        const uint item = first + c * MI_L + lid;
        if (item >= items) break;
        const uint out_at = sliceOffset(dst, item) / 4u;
        [[unroll]] for (uint r = 0u; r < MI_R; ++r) {
            const uint row = row0 + r;
            if (row >= N) break;
            float v = acc[r][c];
            if (epilogue != BLUE_MM_STORE) v = mmEpilogue(epilogue, v, page_f[dst.page].d[out_at + row]);
            page_f[dst.page].d[out_at + row] = v;
        }
    }
}
