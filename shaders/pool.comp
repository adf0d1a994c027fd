#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// POOL: one workgroup per instance pools its rows of a (this run's) into its slice of dst, as
// the reference does (vm/tensor_ops_llm.cpp refPool): the mean so far, the first row, or the
// last. Lanes take every BLUE_ITEM_WG-th element and walk the rows in order.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "vm/llm_abi.h"

layout(local_size_x = BLUE_ITEM_WG) in;

void main() {
    TRef dt = tref(BLUE_PC_OPERANDS);
    TRef at = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    uint mode = pc.w[BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS];
    uint arg = pc.w[BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS + 1u];
    uint item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
    uint n_list = ctl[BLUE_H_NINST];
    uint first = ctl[listBase() + n_list + item], rows = ctl[listBase() + 2u * n_list + item];
    uint p = blockArg(itemInstance(item), arg);
    if (mode == BLUE_POOL_FIRST && p != 0u) return;
    uint d = sliceOffset(dt, item) / 4u;
    for (uint i = gl_LocalInvocationID.x; i < dt.n; i += BLUE_ITEM_WG) {
        if (mode != BLUE_POOL_MEAN) {
            uint r = mode == BLUE_POOL_FIRST ? first : first + rows - 1u;
            page_f[dt.page].d[d + i] = page_f[at.page].d[(at.offset + r * at.stride) / 4u + i];
            continue;
        }
        // Eight rows an iteration, added in row order: one a time, n_embd 8192 over 512 rows
        // passed lavapipe's loop limit (65,535 iterations an invocation).
        float sum = p != 0u ? page_f[dt.page].d[d + i] * float(p) : 0.0;
        for (uint r0 = 0u; r0 < rows; r0 += 8u) {
            [[unroll]] for (uint k = 0u; k < 8u; ++k) {
                if (r0 + k < rows) sum += page_f[at.page].d[(at.offset + (first + r0 + k) * at.stride) / 4u + i];
            }
        }
        page_f[dt.page].d[d + i] = sum / float(p + rows);
    }
}
