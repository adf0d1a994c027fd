#version 450
#extension GL_GOOGLE_include_directive : require
// EMBED: dst = row `token` of table [dim, vocab] (GPU weight layout, WTYPE_*), token =
// local[arg + row index]; out-of-range tokens give zeros.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/wlayout.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef table = tref(BLUE_PC_OPERANDS + 4u);
    uint arg = pc.w[BLUE_PC_OPERANDS + 8u];
    uint i = gl_GlobalInvocationID.x, item = gl_WorkGroupID.y;
    if (i >= dst.n || item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint addr = blockArg(inst, arg) + itemRowLocal(item);
    uint token = addr < ctl[BLUE_H_LOCAL_WORDS] ? localWord(inst, addr) : 0xFFFFFFFFu;
    uint vocab = table.n / dst.n;
    float v = 0.0;
    if (token < vocab) v = wElement(table.offset / 16u, (dst.n + WL_E - 1u) / WL_E, token, i);
    page_f[dst.page].d[sliceOffset(dst, item) / 4u + i] = v;
}
