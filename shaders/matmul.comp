#version 450
#extension GL_GOOGLE_include_directive : require
// MATMUL for any weight type (WTYPE_*): dst[n] = sum_k w[n][k] * x[k] for each item. Each
// invocation owns one output row n and BLUE_MATMUL_TILE items, so every weight it dequantizes
// serves the whole tile. Grid: x = ceil(N / BLUE_MATMUL_ROWS), y = ceil(items / BLUE_MATMUL_TILE).
#include "common/tensor.glsl"
#include "common/dequant.glsl"

layout(local_size_x = BLUE_MATMUL_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    uint n = gl_GlobalInvocationID.x;
    uint K = x.n, N = dst.n;
    uint first = gl_WorkGroupID.y * BLUE_MATMUL_TILE;
    uint items = itemCount();
    if (n >= N || first >= items) return;
    uint count = min(items - first, BLUE_MATMUL_TILE);
    uint xo[BLUE_MATMUL_TILE];
    float acc[BLUE_MATMUL_TILE];
    for (uint t = 0u; t < BLUE_MATMUL_TILE; ++t) {
        xo[t] = sliceOffset(x, first + min(t, count - 1u)) / 4u;
        acc[t] = 0.0;
    }
    uint row = w.offset + n * wrowBytes(K);
    for (uint k = 0u; k < K; ++k) {
        float wv = dequantElement(w.page, row, k);
        for (uint t = 0u; t < BLUE_MATMUL_TILE; ++t) acc[t] += wv * page_f[x.page].d[xo[t] + k];
    }
    for (uint t = 0u; t < count; ++t) {
        page_f[dst.page].d[sliceOffset(dst, first + t) / 4u + n] = acc[t];
    }
}
