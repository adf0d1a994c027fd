#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNORM: dst = a / sqrt(mean(a^2) + eps) * w over groups of G elements (G = 0: the whole row).
// One workgroup per item. Built twice: BLUE_ITEM_WG lanes (or fewer) reading floats (lavapipe's shape), and
// `_w` (RMS_WIDE, GPU shapes: GpuOptions::decode_kernel) with 256 lanes reading vec4 where the
// group and every slice are 16-byte aligned, so a 2048-element row is two loads per lane rather
// than 32 in a chain (20 us per dispatch on an NVIDIA H100 that way).
#include "common/tensor.glsl"
#ifdef RMS_WIDE
#define RMS_WG 256u
layout(local_size_x = RMS_WG) in;
#else
// BLUE_ITEM_WG lanes, or as few as the plan asks for a short row (BLUE_SPEC_WG).
layout(local_size_x = BLUE_ITEM_WG, local_size_x_id = BLUE_SPEC_WG) in;  // both: the default is the width
layout(constant_id = BLUE_SPEC_WG) const uint RMS_WG = BLUE_ITEM_WG;
#endif
#define REDUCE_WG RMS_WG
#include "common/reduce.glsl"

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
#ifdef RMS_WIDE
    if (((group | src | out_at | wo) & 3u) == 0u) {
        const uint g4 = group / 4u;
        for (uint g = 0u; g < n; g += group) {
            const uint s4 = (src + g) / 4u, o4 = (out_at + g) / 4u, w4 = wo / 4u;
            float ss = 0.0;
            for (uint i = lid; i < g4; i += RMS_WG) {
                const vec4 v = page_v4[a.page].d[s4 + i];
                ss += dot(v, v);
            }
            const float scale = inversesqrt(workgroupSum(ss) / float(group) + eps);
            for (uint i = lid; i < g4; i += RMS_WG) {
                page_v4[dst.page].d[o4 + i] = page_v4[a.page].d[s4 + i] * scale * page_v4[w.page].d[w4 + i];
            }
        }
        return;
    }
#endif
    for (uint g = 0u; g < n; g += group) {
        float ss = 0.0;
        for (uint i = lid; i < group; i += RMS_WG) {
            float v = page_f[a.page].d[src + g + i];
            ss += v * v;
        }
        float scale = inversesqrt(workgroupSum(ss) / float(group) + eps);
        for (uint i = lid; i < group; i += RMS_WG) {
            page_f[dst.page].d[out_at + g + i] = page_f[a.page].d[src + g + i] * scale * page_f[w.page].d[wo + i];
        }
    }
}
