#version 450
#extension GL_GOOGLE_include_directive : require
// MOECOPY: copies the experts MOEROUTE listed (the expert cache's copy list, vm/abi.h BLUE_XC_*)
// from their matrices in host memory into their cache slots, a layer's matrices (gate, up,
// down) in one dispatch. One workgroup per (listed expert, chunk of BLUE_PC_COPY_CHUNK texels of
// one of the matrices): x = the list (MOEROUTE writes its length into this dispatch's items
// axis), y = the chunks of every matrix in turn. List words are checked against the tensors'
// bounds: the state is data like any other.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

// Whole texels: slices and offsets are multiples of 16 bytes (weight layouts are texel-based),
// and one 16-byte load per lane is what CPU-backed drivers copy fastest.
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageU4 {
    uvec4 d[];
} page_u4[BLUE_MAX_PAGES];

void main() {
    uint st = ctl[BLUE_O_EXPERT_CACHE] + pc.w[BLUE_PC_COPY_STATE] - 1u;
    uint per = max(pc.w[BLUE_PC_COPY_CHUNK], 1u);
    uint count = min(pc.w[BLUE_PC_COPY_COUNT], BLUE_COPY_MAX_MATRICES);
    uint c = gl_WorkGroupID.x;
    uint slots = ctl[st + BLUE_XC_SLOTS], experts = ctl[st + BLUE_XC_EXPERTS];
    if (c >= min(ctl[st + BLUE_XC_COPIES], slots)) return;
    uint list = st + BLUE_XC_HEAD + experts + 2u * slots;
    uint e = ctl[list + 2u * c], s = ctl[list + 2u * c + 1u];
    // Workgroup y is chunk y of the matrices' chunks, one matrix after another.
    uint y = gl_WorkGroupID.y;
    for (uint m = 0u; m < count; ++m) {
        TRef src = tref(BLUE_PC_COPY_PAIRS + 8u * m);
        TRef dst = tref(BLUE_PC_COPY_PAIRS + 8u * m + 4u);
        uint texels = src.stride / 16u;
        uint chunks = (texels + per - 1u) / per;
        if (y >= chunks) {
            y -= chunks;
            continue;
        }
        if (e >= src.n || s >= dst.n) return;
        uint from = src.offset / 16u + e * texels, to = dst.offset / 16u + s * texels;
        uint end = min(texels, (y + 1u) * per);
        for (uint i = y * per + gl_LocalInvocationID.x; i < end; i += BLUE_ITEM_WG) {
            page_u4[dst.page].d[to + i] = page_u4[src.page].d[from + i];
        }
        return;
    }
}
