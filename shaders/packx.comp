#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// PACKX: rounds a matmul's x to int8 once per input for the int8 kernels of CPU drivers (Q4_0,
// Q4_K, Q5_K, Q6_K: `_b1q` and `_q` in matmul.comp, `_iq` in matmul_items.comp), where `_iq` had
// rounded it again in every workgroup of rows (measured on lavapipe: half of that kernel's time
// went to gathering and rounding x). The plan records it before the first MATMUL over an x, with the same
// block and mode (host/machine_plan.cpp); it is not a Blue-IR instruction: the MATMUL's result is
// the program's, this only carries it.
// Each block of 32 is rounded as `_tq` rounds it (step max |x| / 127, round to nearest even) and
// written as the SWAR products read it (common/swar.glsl; blue_config.h BLUE_XQ_GBLOCK_TEXELS):
// texel i (i < 4) holds elements 4i..4i+3 and 4i+16..4i+19 as crosswise pairs (x_b + x_a << 16:
// (4i+2, 4i), (4i+3, 4i+1), then the same for 4i+16..), then the step's bits and the block's
// integer sum.
// Operands as the MATMUL's: x at operand 2; the packed record at BLUE_PC_MM_XQ.
// Grid: x = items; lane s takes block s of every gblock of 256 elements.
#include "common/tensor.glsl"

layout(local_size_x = 8) in;

// Whole texels where a lane writes them (the pairs): a store is one per lane on CPU drivers.
layout(set = 0, binding = BLUE_BIND_PAGES, std430) buffer PageU4 {
    uvec4 d[];
} page_u4[BLUE_MAX_PAGES];

void main() {
    const TRef x = tref(BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS);
    const TRef xq = tref(BLUE_PC_MM_XQ);
    const uint item = gl_WorkGroupID.x, items = itemCount();
    if (item >= items) return;
    const uint s = gl_LocalInvocationID.x;
    const uint xb0 = sliceOffset(x, item) / 16u;
    const uint rec0 = (xq.offset + item * xq.stride) / 16u;
    for (uint g = 0u; g * 256u < x.n; ++g) {
        const uint xt = g * 64u + s * 8u;  // the block's first x texel
        if (xt * 4u >= x.n) break;
        const uint xb = xb0 + xt;
        vec4 xv[8];
        vec4 m4 = vec4(0.0);
        [[unroll]] for (uint j = 0u; j < 8u; ++j) {
            xv[j] = TEXELF(2, xb + j);
            m4 = max(m4, abs(xv[j]));
        }
        const float m = max(max(m4.x, m4.y), max(m4.z, m4.w));
        const float inv = m > 0.0 ? 127.0 / m : 0.0;
        ivec4 q[8];
        ivec4 t = ivec4(0);
        [[unroll]] for (uint j = 0u; j < 8u; ++j) {
            q[j] = ivec4(roundEven(xv[j] * inv));
            t += q[j];
        }
        const uint rec = rec0 + g * BLUE_XQ_GBLOCK_TEXELS;
        [[unroll]] for (uint i = 0u; i < 4u; ++i) {
            page_u4[xq.page].d[rec + s * 4u + i] = uvec4(ivec4(q[i].zw, q[i + 4u].zw) + (ivec4(q[i].xy, q[i + 4u].xy) << 16));
        }
        const uint sw = (rec + 32u) * 4u + s * 2u;  // two lanes' (step, sum) share a texel
        page_u[xq.page].d[sw] = floatBitsToUint(m / 127.0);
        page_u[xq.page].d[sw + 1u] = uint((t.x + t.y) + (t.z + t.w));
    }
}
