#version 450
#extension GL_GOOGLE_include_directive : require
// MATMUL: dst[n] = sum_k w[n][k] * x[k] for every item, weights in the GPU weight layout
// (common/wlayout.glsl), any type (WTYPE_*). Lanes over output rows: each invocation owns MM_R
// rows (n = base + r * WG) and MM_BT items, so the x it reads is the same for the whole workgroup
// (one vectorized load) and every weight texel serves MM_BT items. Built twice: MM_BT = 1 for one
// item (decode) and BLUE_MATMUL_TILE for batches; the plan enables one per cycle.
// Grid: x = ceil(items / MM_BT), y = ceil(N / (WG * MM_R)).
#include "common/tensor.glsl"
#include "common/wlayout.glsl"

#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
#define MM_R BLUE_MM_R_PLAIN
#elif defined(WTYPE_Q8_0) || defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
#define MM_R BLUE_MM_R_SMALLQ
#else
#define MM_R BLUE_MM_R_KQ
#endif

layout(local_size_x = BLUE_MATMUL_WG) in;

uint g_xt;  // texels in an x row (zero beyond)

vec4 xLoad(uint base, uint t) { return t < g_xt ? TEXELF(2, base + t) : vec4(0.0); }

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    uint K = x.n, N = dst.n;
    uint items = itemCount();
    uint first = gl_WorkGroupID.x * MM_BT;
    if (first >= items) return;
    uint count = min(items - first, MM_BT);
    g_xt = (K + 3u) / 4u;
    uint xb[MM_BT];
    for (uint c = 0u; c < MM_BT; ++c) xb[c] = sliceOffset(x, first + min(c, count - 1u)) / 16u;
    uint lid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.y * BLUE_MATMUL_WG * MM_R + lid;
    uint rows[MM_R];
    for (uint r = 0u; r < MM_R; ++r) rows[r] = min(row0 + r * BLUE_MATMUL_WG, N - 1u);
    float acc[MM_R][MM_BT];
    for (uint r = 0u; r < MM_R; ++r) for (uint c = 0u; c < MM_BT; ++c) acc[r][c] = 0.0;
    uint wbase = w.offset / 16u, bpr = (K + WL_E - 1u) / WL_E;

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
    for (uint r = 0u; r < MM_R; ++r) {
        uint row = row0 + r * BLUE_MATMUL_WG;
        if (row >= N) continue;
        for (uint c = 0u; c < count; ++c) {
            page_f[dst.page].d[sliceOffset(dst, first + c) / 4u + row] = acc[r][c];
        }
    }
}
