#version 450
#extension GL_GOOGLE_include_directive : require
// MOECOPY: copies the experts MOEROUTE listed (the expert cache's copy list, vm/abi.h BLUE_XC_*)
// from their matrix in host memory into their cache slots. One workgroup per (listed expert,
// chunk of BLUE_PC_COPY_CHUNK words of its matrix): x = the list (MOEROUTE writes its length
// into this dispatch's items axis), y = chunks. List words are checked against the tensors'
// bounds: the state is data like any other.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

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
    uint words = src.stride / 4u;
    uint from = src.offset / 4u + e * words, to = dst.offset / 4u + s * words;
    uint end = min(words, (gl_WorkGroupID.y + 1u) * chunk);
    for (uint i = gl_WorkGroupID.y * chunk + gl_LocalInvocationID.x; i < end; i += BLUE_ITEM_WG) {
        page_u[dst.page].d[to + i] = page_u[src.page].d[from + i];
    }
}
