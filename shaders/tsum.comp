#version 450
#extension GL_GOOGLE_include_directive : require
// TSUM: dst[0] = sum of a's slice. One workgroup per item; a tree reduction in shared memory.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

shared float partial[BLUE_ITEM_WG];

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef a = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    uint item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
    uint lid = gl_LocalInvocationID.x;
    uint base = sliceOffset(a, item) / 4u;
    float acc = 0.0;
    for (uint i = lid; i < a.n; i += BLUE_ITEM_WG) acc += page_f[a.page].d[base + i];
    partial[lid] = acc;
    barrier();
    for (uint s = BLUE_ITEM_WG / 2u; s > 0u; s >>= 1) {
        if (lid < s) partial[lid] += partial[lid + s];
        barrier();
    }
    if (lid == 0u) page_f[dst.page].d[sliceOffset(dst, item) / 4u] = partial[0];
}
