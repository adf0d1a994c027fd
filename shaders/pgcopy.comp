#version 450
#extension GL_GOOGLE_include_directive : require
// PGCOPY: copies rows [0, min(rows, PS)) of page src of a KV pool [D, PS, NP] to page dst
// (vm/tensor_ops_kvpages.cpp refPgcopy), one 32-bit word per invocation (F16 rows are whole
// words); nothing when either page is >= NP or they are the same. One item per instance. The host
// puts a row's words, PS and NP in push constants (BLUE_PC_KV_ROW_WORDS, BLUE_PC_KVP_*).
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void main() {
    TRef pool = tref(BLUE_PC_OPERANDS);
    uint at = BLUE_PC_OPERANDS + BLUE_TREF_WORDS;
    uint item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint row_words = pc.w[BLUE_PC_KV_ROW_WORDS];
    uint ps = pc.w[BLUE_PC_KVP_PAGE], np = pc.w[BLUE_PC_KVP_PAGES];
    uint src = blockArg(inst, pc.w[at]), dst = blockArg(inst, pc.w[at + 1u]);
    uint rows = min(blockArg(inst, pc.w[at + 2u]), ps);
    uint w = gl_GlobalInvocationID.x;
    if (src >= np || dst >= np || src == dst || w >= rows * row_words) return;
    uint base = sliceOffset(pool, item) / 4u, page_words = ps * row_words;
    page_u[pool.page].d[base + dst * page_words + w] = page_u[pool.page].d[base + src * page_words + w];
}
