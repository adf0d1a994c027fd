#version 450
#extension GL_GOOGLE_include_directive : require
// ROPE: rotates each pair of dims of every head by position * scale * base^(-2i/n_rot) / ff[i].
// Mode 0 pairs (2i, 2i+1), mode 2 (neox) pairs (i, i + n_rot/2); dims past n_rot are copied.
// One invocation per pair, so dst may be the source. ROPEQK (ROPE_QK): operands 0 and 1 are q
// and k, each rotated in place; invocations over q's pairs, then k's.
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

// Pair p of the item's row of src, rotated into dst.
void rotatePair(TRef dst, TRef src, uint p, uint item) {
    TRef ff = tref(BLUE_PC_OPERANDS + 8u);
    uint arg = pc.w[BLUE_PC_OPERANDS + 12u], head = pc.w[BLUE_PC_OPERANDS + 13u];
    uint n_rot = pc.w[BLUE_PC_OPERANDS + 14u], mode = pc.w[BLUE_PC_OPERANDS + 15u];
    float base = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 16u]);
    float scale = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 17u]);
    uint h = p / (head / 2u), j = p % (head / 2u);
    uint half_rot = n_rot / 2u;
    uint i0, i1;
    bool rotate = j < half_rot;
    if (mode == 0u || !rotate) {
        uint first = rotate ? 2u * j : (mode == 0u ? 2u * j : n_rot + 2u * (j - half_rot));
        i0 = h * head + first;
        i1 = i0 + 1u;
    } else {
        i0 = h * head + j;
        i1 = i0 + half_rot;
    }
    uint so = sliceOffset(src, item) / 4u, d = sliceOffset(dst, item) / 4u;
    float x0 = page_f[src.page].d[so + i0], x1 = page_f[src.page].d[so + i1];
    if (rotate) {
        uint inst = itemInstance(item);
        float pos = float(blockArg(inst, arg) + itemRowLocal(item));
        float theta = pos * scale * pow(base, -2.0 * float(j) / float(n_rot));
        if (ff.page != 0xFFFFu) theta /= page_f[ff.page].d[sliceOffset(ff, item) / 4u + j];
        float c = cos(theta), s = sin(theta);
        float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        x0 = y0;
        x1 = y1;
    }
    page_f[dst.page].d[d + i0] = x0;
    page_f[dst.page].d[d + i1] = x1;
}

void main() {
    TRef a = tref(BLUE_PC_OPERANDS);
    TRef b = tref(BLUE_PC_OPERANDS + 4u);
    uint p = gl_GlobalInvocationID.x, item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
#ifdef ROPE_QK
    // One call for either tensor (a call per branch ran both copies on lavapipe, masked: 2x).
    const bool is_k = p >= a.n / 2u;
    const TRef t = is_k ? b : a;
    const uint pair = is_k ? p - a.n / 2u : p;
    if (pair < t.n / 2u) rotatePair(t, t, pair, item);
#else
    if (p < a.n / 2u) rotatePair(a, b, p, item);
#endif
}
