// The common main of ELEM-grid ops: dst = ELEM_OP(a, b) over each item's slice. Define ELEM_OP
// (and ELEM_BINARY when operand 2 is a tensor, else operand 2 is a float scalar) before including.
// Grid: x covers the slice in BLUE_ELEM_WG-element chunks, y the items.
#include "common/tensor.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef a = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    uint i = gl_GlobalInvocationID.x;
    uint item = gl_WorkGroupID.y;
    if (i >= dst.n || item >= itemCount()) return;
    float x = page_f[a.page].d[sliceOffset(a, item) / 4u + i];
#ifdef ELEM_BINARY
    TRef bt = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    float y = page_f[bt.page].d[sliceOffset(bt, item) / 4u + i];
#else
    float y = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS]);
#endif
    page_f[dst.page].d[sliceOffset(dst, item) / 4u + i] = ELEM_OP(x, y);
}
