#version 450
#extension GL_GOOGLE_include_directive : require
// MOECOPY: copies the experts MOEROUTE listed (the expert cache's copy list, vm/abi.h BLUE_XC_*)
// from their matrix in host memory into their cache slots. One workgroup per (listed expert,
// chunk of BLUE_PC_COPY_CHUNK words of its matrix): x = the list (MOEROUTE writes its length
// into this dispatch's items axis), y = chunks. List words are checked against the tensors'
// bounds: the state is data like any other.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

// Whole texels: slices and offsets are multiples of 16 bytes (weight layouts are texel-based),
// and one 16-byte load per lane is what CPU-backed drivers copy fastest.
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageU4 {
    uvec4 d[];
} page_u4[BLUE_MAX_PAGES];

void main() {
    TRef src = tref(BLUE_PC_COPY_SRC);
    TRef dst = tref(BLUE_PC_COPY_DST);
    uint st = ctl[BLUE_O_EXPERT_CACHE] + pc.w[BLUE_PC_COPY_STATE] - 1u;
    uint chunk = pc.w[BLUE_PC_COPY_CHUNK];
    uint c = gl_WorkGroupID.x;
    uint slots = ctl[st + BLUE_XC_SLOTS], experts = ctl[st + BLUE_XC_EXPERTS];
    if (c >= min(ctl[st + BLUE_XC_COPIES], slots)) return;
    uint list = st + BLUE_XC_HEAD + experts + 2u * slots;
    uint e = ctl[list + 2u * c], s = ctl[list + 2u * c + 1u];
    if (e >= src.n || s >= dst.n) return;
    uint texels = src.stride / 16u, per = chunk / 4u;
    uint from = src.offset / 16u + e * texels, to = dst.offset / 16u + s * texels;
    uint end = min(texels, (gl_WorkGroupID.y + 1u) * per);
    for (uint i = gl_WorkGroupID.y * per + gl_LocalInvocationID.x; i < end; i += BLUE_ITEM_WG) {
        page_u4[dst.page].d[to + i] = page_u4[src.page].d[from + i];
    }
}
