#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNORM: dst = a / sqrt(mean(a^2) + eps) * w over groups of G elements (G = 0: the whole row).
// One workgroup per item.
#include "common/tensor.glsl"
#define REDUCE_WG BLUE_ITEM_WG
#include "common/reduce.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef a = tref(BLUE_PC_OPERANDS + 4u);
    TRef w = tref(BLUE_PC_OPERANDS + 8u);
    float eps = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 12u]);
    uint group = pc.w[BLUE_PC_OPERANDS + 13u];
    uint item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
    uint n = dst.n;
    if (group == 0u) group = n;
    uint lid = gl_LocalInvocationID.x;
    uint src = sliceOffset(a, item) / 4u, out_at = sliceOffset(dst, item) / 4u;
    uint wo = sliceOffset(w, item) / 4u;  // a ROWS or INSTANCE weight is read per item
    for (uint g = 0u; g < n; g += group) {
        float ss = 0.0;
        for (uint i = lid; i < group; i += BLUE_ITEM_WG) {
            float v = page_f[a.page].d[src + g + i];
            ss += v * v;
        }
        float scale = inversesqrt(workgroupSum(ss) / float(group) + eps);
        for (uint i = lid; i < group; i += BLUE_ITEM_WG) {
            page_f[dst.page].d[out_at + g + i] = page_f[a.page].d[src + g + i] * scale * page_f[w.page].d[wo + i];
        }
    }
}
