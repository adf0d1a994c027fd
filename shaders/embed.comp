#version 450
#extension GL_GOOGLE_include_directive : require
// EMBED: dst = row `token` of table [dim, vocab] (GPU weight layout, WTYPE_*), token =
// local[arg + row index]; out-of-range tokens give zeros. A table split by rows over pages runs
// one dispatch per piece (BLUE_PC_EMBED_BASE: its first row); each writes the tokens in its rows,
// the last also the zeros.
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
    uint rows = table.n / dst.n, first = pc.w[BLUE_PC_EMBED_BASE];
    if (token < first) return;  // an earlier piece's
    token -= first;
    if (token >= rows && pc.w[BLUE_PC_EMBED_LAST] == 0u) return;  // a later piece's
    float v = 0.0;
    if (token < rows) v = wElement(table.offset / 16u, (dst.n + WL_E - 1u) / WL_E, token, i);
    page_f[dst.page].d[sliceOffset(dst, item) / 4u + i] = v;
}
