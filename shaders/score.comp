#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// SCORE: one workgroup per instance sums the log-likelihood of given tokens, following the
// reference (vm/tensor_ops_spec.cpp): over the instance's rows r but the last, log softmax of
// row r's logits (T = 1) at the token of row r+1. Out-of-range tokens score nothing.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#include "common/philox.glsl"
#include "vm/llm_abi.h"
#define SAMPLE_WG 256u
#include "common/sampling.glsl"

layout(local_size_x = SAMPLE_WG) in;

void main() {
    TRef dt = tref(BLUE_PC_OPERANDS);
    TRef lt = tref(BLUE_PC_OPERANDS + 4u);
    uint item = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    if (item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint lw = ctl[BLUE_H_LOCAL_WORDS];
    uint n_list = ctl[BLUE_H_NINST];
    uint first = ctl[listBase() + n_list + item], rows = ctl[listBase() + 2u * n_list + item];
    uint tokens = blockArg(inst, BLUE_FA_TOKENS);
    g_n = lt.n;
    g_page = lt.page;
    float sum = 0.0;
    for (uint r = 0u; r + 1u < rows; ++r) {
        if (tokens + r + 1u >= lw) break;
        uint next = localWord(inst, tokens + r + 1u);
        if (next >= g_n) continue;
        g_logits = (lt.offset + (first + r) * lt.stride) / 4u;
        RowStats s = rowStats();
        sum += logit(next) - s.m - log(s.z);
    }
    if (lid == 0u) page_f[dt.page].d[sliceOffset(dt, item) / 4u] = sum;
}
