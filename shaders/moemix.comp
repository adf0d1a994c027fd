#version 450
#extension GL_GOOGLE_include_directive : require
// MOEMIX: dst = a + sum_j weight_j * src[slot j] (+ shared * sigmoid(gate)), per element, slots in
// order (vm/tensor_ops_moe.cpp). Grid: x covers the row in BLUE_ELEM_WG chunks, y the rows.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef a = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    TRef src = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    TRef sel = tref(BLUE_PC_OPERANDS + 3u * BLUE_TREF_WORDS);
    uint shared_page = pc.w[BLUE_PC_OPERANDS + 4u * BLUE_TREF_WORDS] & 0xFFFFu;
    uint gate_page = pc.w[BLUE_PC_OPERANDS + 5u * BLUE_TREF_WORDS] & 0xFFFFu;
    uint i = gl_GlobalInvocationID.x;
    uint item = gl_WorkGroupID.y;
    uint n = dst.n;
    if (i >= n || item >= itemCount()) return;
    uint k = sel.n / 2u;
    uint so = sliceOffset(sel, item) / 4u, src_at = sliceOffset(src, item) / 4u;
    float acc = page_f[a.page].d[sliceOffset(a, item) / 4u + i];
    for (uint j = 0u; j < k; ++j) {
        acc += page_f[sel.page].d[so + k + j] * page_f[src.page].d[src_at + j * n + i];
    }
    if (shared_page != 0xFFFFu) {
        TRef sh = tref(BLUE_PC_OPERANDS + 4u * BLUE_TREF_WORDS);
        float gate = 1.0;
        if (gate_page != 0xFFFFu) {
            TRef g = tref(BLUE_PC_OPERANDS + 5u * BLUE_TREF_WORDS);
            gate = 1.0 / (1.0 + exp(-page_f[g.page].d[sliceOffset(g, item) / 4u]));
        }
        acc += page_f[sh.page].d[sliceOffset(sh, item) / 4u + i] * gate;
    }
    page_f[dst.page].d[sliceOffset(dst, item) / 4u + i] = acc;
}
