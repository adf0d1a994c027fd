#version 450
#extension GL_GOOGLE_include_directive : require
// MATMUL with an F32 matrix: dst[n] = sum_k w[n][k] * x[k] for each item. Each invocation owns
// one output row n and BLUE_MATMUL_TILE items, so every weight it reads serves the whole tile.
// Grid: x = ceil(N / BLUE_MATMUL_ROWS), y = ceil(items / BLUE_MATMUL_TILE).
#include "common/tensor.glsl"

layout(local_size_x = BLUE_MATMUL_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef w = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    uint n = gl_GlobalInvocationID.x;
    uint K = x.n, N = dst.n;
    uint first = gl_WorkGroupID.y * BLUE_MATMUL_TILE;
    uint count = min(itemCount() - min(itemCount(), first), BLUE_MATMUL_TILE);
    if (n >= N || count == 0u) return;
    uint xo[BLUE_MATMUL_TILE];
    float acc[BLUE_MATMUL_TILE];
    for (uint t = 0u; t < BLUE_MATMUL_TILE; ++t) {
        xo[t] = sliceOffset(x, first + min(t, count - 1u)) / 4u;
        acc[t] = 0.0;
    }
    uint wo = w.offset / 4u + n * K;
    for (uint k = 0u; k < K; ++k) {
        float wv = page_f[w.page].d[wo + k];
        for (uint t = 0u; t < BLUE_MATMUL_TILE; ++t) acc[t] += wv * page_f[x.page].d[xo[t] + k];
    }
    for (uint t = 0u; t < count; ++t) {
        page_f[dst.page].d[sliceOffset(dst, first + t) / 4u + n] = acc[t];
    }
}
