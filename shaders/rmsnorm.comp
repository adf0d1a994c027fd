#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNORM: dst = a / sqrt(mean(a^2) + eps) * w over groups of G elements (G = 0: the whole row).
// Built twice. `rmsnorm` (CPU drivers): a lane per item, BLUE_RMS_ITEMS items a workgroup, with no
// barrier and no reduction across lanes (lavapipe runs a workgroup's lanes 8 at a time, so a
// workgroup per row paid a barrier tree and every idle lane: 955 against 246-393 us a dispatch
// over 64 rows of 768). `_w` (RMS_WIDE, GPU shapes: GpuOptions::decode_kernel): a workgroup of
// 256 lanes per item reading vec4 where the group and every slice are 16-byte aligned, so a
// 2048-element row is two loads per lane rather than 32 in a chain (20 us per dispatch on an
// NVIDIA H100 that way).
#include "common/tensor.glsl"
#ifndef RMS_WIDE
// A row whose group and slices are 16-byte aligned is read as texels (one gather per 4 elements
// for 8 lanes), any other one float at a time.
layout(local_size_x = BLUE_RMS_ITEMS) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef a = tref(BLUE_PC_OPERANDS + 4u);
    TRef w = tref(BLUE_PC_OPERANDS + 8u);
    float eps = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 12u]);
    uint group = pc.w[BLUE_PC_OPERANDS + 13u];
    uint item = gl_WorkGroupID.y * BLUE_RMS_ITEMS + gl_LocalInvocationID.x;
    if (item >= itemCount()) return;
    uint n = dst.n;
    if (group == 0u) group = n;
    uint src = sliceOffset(a, item) / 4u, out_at = sliceOffset(dst, item) / 4u;
    uint wo = sliceOffset(w, item) / 4u;  // a ROWS or INSTANCE weight is read per item
    bool texels = ((group | src | wo) & 3u) == 0u;
    for (uint g = 0u; g < n; g += group) {
        float ss = 0.0;
        if (texels) {
            vec4 s4 = vec4(0.0);
            for (uint i = 0u; i < group / 4u; ++i) {
                vec4 v = TEXELF(1, (src + g) / 4u + i);
                s4 += v * v;
            }
            ss = dot(s4, vec4(1.0));
        } else {
            for (uint i = 0u; i < group; ++i) {
                float v = page_f[a.page].d[src + g + i];
                ss += v * v;
            }
        }
        float scale = inversesqrt(ss / float(group) + eps);
        if (texels) {
            for (uint i = 0u; i < group / 4u; ++i) {
                vec4 v = TEXELF(1, (src + g) / 4u + i) * scale * TEXELF(2, wo / 4u + i);
                for (uint e = 0u; e < 4u; ++e) page_f[dst.page].d[out_at + g + 4u * i + e] = v[e];
            }
        } else {
            for (uint i = 0u; i < group; ++i) {
                page_f[dst.page].d[out_at + g + i] = page_f[a.page].d[src + g + i] * scale * page_f[w.page].d[wo + i];
            }
        }
    }
}
#else
#define RMS_WG 256u
layout(local_size_x = RMS_WG) in;
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
#endif
