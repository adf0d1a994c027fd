#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// MATMUL `_t`: the tiled GEMM for GPUs (MATMULADD and MATMULGLU too: their epilogues), any weight type
// (WTYPE_*). The plan gives it a cycle's items when there are at least BLUE_MATMUL_GEMM_TILE of
// them (a prompt, a large batch) and the machine uses GPU shapes (GpuOptions::decode_kernel).
// A workgroup owns a tile of 64 rows x 64 items of dst. For every 32 elements of K, lanes 0-63
// decode one row's 32 weights each (wGroup: one unit of a block type, or plain texels) into
// shared memory and the lanes load the items' x; then each lane accumulates MT_TR rows x MT_TC
// items from shared memory: 4 x 4 on 256 lanes, two vec4 reads per 16 multiply-adds. (8 x 8 on
// 64 lanes, four reads per 64, measured 6.6x slower on an NVIDIA H100: 1,309 against 197 ms of a
// 722-token prompt on the tinyllama shape.) 16 KiB of shared memory, Vulkan's minimum, so every
// device that runs BlueVM can run it.
// Grid: x = ceil(items / BLUE_MATMUL_TILED_ITEMS), y = ceil(N / BLUE_MATMUL_TILED_ROWS).
//
// Built again with MT_INT8 as `_tq` for the block types, where the device has integer dot
// products (VK_KHR_shader_integer_dot_product; KernelChoice::int8_matmul): the quants of a unit
// stay integers (every type's wGroup levels are integers in -128..127) and the items' x is
// quantized to int8 per 32 elements of K (scale max |x| / 127, rounded to nearest even) as it is
// loaded, so a lane's 4 rows x 4 items take 8 packed 4 x 8-bit dot products each per unit (OpSDot)
// and one float multiply-add per half unit: x * w = dx * (sc * sum qx qw + mn * sum qx). The
// offsets (mn) multiply the quantized x too, so the products are those of the real weights with
// the rounded x: each x is off by at most dx / 2, and a row's sum by at most sum over units
// (max |x| / 254) * sum |w| (tests/test_ops_gpu.cpp states the bound it checks). (With exact sums
// of x instead, the error is that of the levels d * q, not of w = d * q + m: twice as large for
// Q4_0 in the op tests.)
#ifdef MT_INT8
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product) on two words of four signed bytes; the literal 0 is
// PackedVectorFormat4x8Bit. Capabilities DotProduct (6019), DotProductInput4x8BitPacked (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);
#endif
#include "common/tensor.glsl"
#include "common/wlayout.glsl"
#include "common/activations.glsl"

#ifndef MT_TR
#define MT_TR 4u  // rows per lane (a multiple of 4)
#endif
#ifndef MT_TC
#define MT_TC 4u  // items per lane (a multiple of 4)
#endif
#define T_M BLUE_MATMUL_TILED_ROWS   // 64 rows
#define T_N BLUE_MATMUL_TILED_ITEMS  // 64 items
#define T_K 32u                      // elements of K per step
#define LANES ((T_M / MT_TR) * (T_N / MT_TC))
#define XSTEP (LANES / 64u)          // lanes per item when loading x
layout(local_size_x = LANES) in;

#ifdef MT_INT8
// Per unit of 32 elements (a lane's tile: MT_TR = MT_TC = 4, the defaults): s_wq[j][r] word j (elements 4j..4j+3) of rows 4r..4r+3 as packed
// int8, s_wsc/s_wmn[h][r] their half units' scales and offsets (wGroup's sc, mn); s_xq[j][c] and
// s_xd[c] items 4c..4c+3's int8 x and scales, s_xs[h][c] their half units' sums of rounded x (dx * sum qx).
shared uvec4 s_wq[8][T_M / 4u];
shared vec4 s_wsc[2][T_M / 4u], s_wmn[2][T_M / 4u];
shared uvec4 s_xq[8][T_N / 4u];
shared vec4 s_xd[T_N / 4u], s_xs[2][T_N / 4u];

// Four integer-valued floats in -128..127 as four signed bytes.
uint packInt8(vec4 v) {
    const uvec4 b = uvec4(ivec4(v)) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}
#else
// s_w[k][r] holds rows 4r..4r+3 at element k of the step, s_x[k][c] items 4c..4c+3.
shared vec4 s_w[T_K][T_M / 4u];
shared vec4 s_x[T_K][T_N / 4u];
#endif

void main() {
    const TRef dst = tref(BLUE_PC_OPERANDS);
    const TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    const TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    const uint K = x.n, N = dst.n, items = itemCount();
    const uint first = gl_WorkGroupID.x * T_N;
    if (first >= items) return;  // the whole workgroup: no barrier is skipped by some lanes only
    const uint count = min(items - first, T_N);
    const uint lid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.y * T_M;
    const uint wbase = w.offset / 16u, bpr = (K + WL_E - 1u) / WL_E, xtn = (K + 3u) / 4u;

    // Loading roles: lane l loads x texels of item l % 64 and, if l < 64 (plain types: every
    // lane), weights of row l % 64; rows past N read row N - 1 and are never written.
    const uint li = lid & 63u, lq = lid >> 6u;
    const uint xbase = sliceOffset(x, first + min(li, count - 1u)) / 16u;
    const uint wrow = min(row0 + li, N - 1u);
    // Computing roles: rows MT_TR tr .. + MT_TR - 1 and items MT_TC tc .. + MT_TC - 1 of the tile.
    const uint tr = lid % (T_M / MT_TR), tc = lid / (T_M / MT_TR);
    vec4 acc[MT_TC][MT_TR / 4u];  // acc[c][v]: rows 4v..4v+3 of the lane's rows, item c
    [[unroll]] for (uint c = 0u; c < MT_TC; ++c) {
        [[unroll]] for (uint v = 0u; v < MT_TR / 4u; ++v) acc[c][v] = vec4(0.0);
    }

#ifdef MT_INT8
    for (uint u = 0u; u * 32u < K; ++u) {
        if (lq == 0u) {
            // Lanes 0-63: row li's unit u, its levels packed as int8.
            WHead head;
            wHead(wbase, bpr, wrow, u >> 3u, head);
            vec4 q[8];
            vec2 sc, mn;
            wGroup(wbase, bpr, wrow, u >> 3u, u & 7u, head, q, sc, mn);
            for (uint j = 0u; j < 8u; ++j) s_wq[j][li >> 2u][li & 3u] = packInt8(q[j]);
            for (uint h = 0u; h < 2u; ++h) {
                s_wsc[h][li >> 2u][li & 3u] = sc[h];
                s_wmn[h][li >> 2u][li & 3u] = mn[h];
            }
        } else if (lq == 1u) {
            // Lanes 64-127: item li's 32 elements of x, quantized to int8 with one scale.
            vec4 xv[8];
            vec4 amax = vec4(0.0);
            for (uint t = 0u; t < 8u; ++t) {
                const uint xt = u * 8u + t;
                xv[t] = xt < xtn ? TEXELF(2, xbase + xt) : vec4(0.0);
                amax = max(amax, abs(xv[t]));
            }
            const float m = max(max(amax.x, amax.y), max(amax.z, amax.w));
            const float inv = m > 0.0 ? 127.0 / m : 0.0;
            vec4 qsum[2] = vec4[2](vec4(0.0), vec4(0.0));
            for (uint t = 0u; t < 8u; ++t) {
                const vec4 qx = clamp(roundEven(xv[t] * inv), -127.0, 127.0);
                s_xq[t][li >> 2u][li & 3u] = packInt8(qx);
                qsum[t >> 2u] += qx;
            }
            const float dx = m / 127.0;
            s_xd[li >> 2u][li & 3u] = dx;
            s_xs[0][li >> 2u][li & 3u] = dx * dot(qsum[0], vec4(1.0));
            s_xs[1][li >> 2u][li & 3u] = dx * dot(qsum[1], vec4(1.0));
        }
        barrier();
        ivec4 lo[MT_TC], hi[MT_TC];  // lo[c][r]: sum of qx qw over the half unit, item c, row r
        [[unroll]] for (uint c = 0u; c < MT_TC; ++c) lo[c] = hi[c] = ivec4(0);
        [[unroll]] for (uint j = 0u; j < 8u; ++j) {
            const uvec4 wq = s_wq[j][tr], xq = s_xq[j][tc];
            [[unroll]] for (uint c = 0u; c < MT_TC; ++c) {
                const ivec4 d = ivec4(sdot4x8(wq.x, xq[c], 0), sdot4x8(wq.y, xq[c], 0), sdot4x8(wq.z, xq[c], 0),
                                      sdot4x8(wq.w, xq[c], 0));
                if (j < 4u) lo[c] += d; else hi[c] += d;
            }
        }
        const vec4 sc0 = s_wsc[0][tr], sc1 = s_wsc[1][tr], mn0 = s_wmn[0][tr], mn1 = s_wmn[1][tr];
        const vec4 xd = s_xd[tc], xs0 = s_xs[0][tc], xs1 = s_xs[1][tc];
        [[unroll]] for (uint c = 0u; c < MT_TC; ++c) {
            acc[c][0] += xd[c] * (sc0 * vec4(lo[c]) + sc1 * vec4(hi[c])) + (mn0 * xs0[c] + mn1 * xs1[c]);
        }
        barrier();
    }
#else
    for (uint k0 = 0u; k0 < K; k0 += T_K) {
        // x: 8 texels per item per step, 8 / XSTEP per lane (texels lq, lq + XSTEP, ...).
        for (uint t = lq; t < 8u; t += XSTEP) {
            const uint xt = k0 / 4u + t;
            const vec4 v = xt < xtn ? TEXELF(2, xbase + xt) : vec4(0.0);
            for (uint e = 0u; e < 4u; ++e) s_x[4u * t + e][li >> 2u][li & 3u] = v[e];
        }
#ifdef WL_PLAIN
        // Plain weights: T_K / WL_E groups of WL_E elements per row, spread over the lanes.
        for (uint i = lq; i < T_K / WL_E; i += XSTEP) {
            const uint g = k0 / WL_E + i;
            vec4 a = vec4(0.0), b = vec4(0.0);
            if (g < bpr) plainTexel(wTexel(wbase, bpr, wrow, g, 0u), a, b);
            for (uint e = 0u; e < 4u; ++e) {
                s_w[i * WL_E + e][li >> 2u][li & 3u] = a[e];
                if (WL_E == 8u) s_w[i * WL_E + 4u + e][li >> 2u][li & 3u] = b[e];
            }
        }
#else
        if (lid < 64u) {
            // One unit of 32 elements (k0 is a multiple of 32): group g = u / 8, unit s = u % 8.
            const uint u = k0 / 32u;
            vec4 q[8];
            vec2 sc = vec2(0.0), mn = vec2(0.0);
            for (uint j = 0u; j < 8u; ++j) q[j] = vec4(0.0);
            if (u * 32u < K) {
                WHead head;
                wHead(wbase, bpr, wrow, u >> 3u, head);
                wGroup(wbase, bpr, wrow, u >> 3u, u & 7u, head, q, sc, mn);
            }
            for (uint j = 0u; j < 8u; ++j) {
                const vec4 v = q[j] * sc[j >> 2u] + mn[j >> 2u];
                for (uint e = 0u; e < 4u; ++e) s_w[4u * j + e][li >> 2u][li & 3u] = v[e];
            }
        }
#endif
        barrier();
        // Unrolled: lavapipe counts a loop's iterations against its per-invocation limit
        // (KernelChoice::loop_limit), and GPUs schedule the shared reads better unrolled.
        [[unroll]] for (uint k = 0u; k < T_K; ++k) {
            vec4 wv[MT_TR / 4u], xv[MT_TC / 4u];
            for (uint v = 0u; v < MT_TR / 4u; ++v) wv[v] = s_w[k][tr * (MT_TR / 4u) + v];
            for (uint u = 0u; u < MT_TC / 4u; ++u) xv[u] = s_x[k][tc * (MT_TC / 4u) + u];
            for (uint c = 0u; c < MT_TC; ++c) {
                const float xc = xv[c / 4u][c & 3u];
                for (uint v = 0u; v < MT_TR / 4u; ++v) acc[c][v] += wv[v] * xc;
            }
        }
        barrier();
    }
#endif

    // Unrolled, with conditions in place of breaks: acc's indices must be constants, or a GPU's
    // compiler may keep acc in local memory for the whole kernel. Since MATMULGLU's epilogue call
    // sat in these loops, `_t` had run at a quarter of its speed on an H200 (819 us per dispatch,
    // 204 unrolled; the SPIR-V differed in the epilogue alone).
    const uint epilogue = pc.w[BLUE_PC_MM_EPILOGUE];
    [[unroll]] for (uint c = 0u; c < MT_TC; ++c) {
        const uint item = MT_TC * tc + c;
        const uint out_at = sliceOffset(dst, first + min(item, count - 1u)) / 4u;
        [[unroll]] for (uint r = 0u; r < MT_TR; ++r) {
            const uint row = row0 + MT_TR * tr + r;
            if (item < count && row < N) {
                float v = acc[c][r / 4u][r & 3u];
                if (epilogue != BLUE_MM_STORE) v = mmEpilogue(epilogue, v, page_f[dst.page].d[out_at + row]);
                page_f[dst.page].d[out_at + row] = v;
            }
        }
    }
}
