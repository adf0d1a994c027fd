#version 450
#extension GL_GOOGLE_include_directive : require
// ROPE: rotates each pair of dims of every head by position * scale * base^(-2i/n_rot) / ff[i].
// Mode 0 pairs (2i, 2i+1), mode 2 (neox) pairs (i, i + n_rot/2); dims past n_rot are copied.
// Each pair is read and written by one invocation only, so dst may be the source. ROPEQK
// (ROPE_QK): operands 0 and 1 are q and k, each rotated in place.
// `ropekv_*` (ROPE_KV, with ROPE_QK): ROPEQK and the KVSTORE after it in one dispatch, which the
// plan makes of the two (host/machine_plan.cpp): k's rotated pairs also go into the K cache at the
// row's position (dropped past the context, as KVSTORE does), and invocations after the rotations'
// copy v's row into the V cache. Its push words after ROPEQK's: the K cache's reference at
// BLUE_PC_ROPEKV_KC, the V cache's at BLUE_PC_ROPEKV_VC, and v's page | class and offset at
// BLUE_PC_ROPEKV_V (its stride and elements are k's). CACHE_F16: an adjacent pair is one cache
// word; with neox pairs an invocation owns two frequencies (rotateStorePairs).
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

// Frequency j of heads [h0, h1) of the item's row of src, rotated into dst (the angle computed by
// the caller once for all of them).
void rotateHeads(TRef dst, TRef src, uint item, uint h0, uint h1, uint i0, uint i1, bool rotate, float c, float s) {
    uint head = pc.w[BLUE_PC_OPERANDS + 13u];
    uint so = sliceOffset(src, item) / 4u, d = sliceOffset(dst, item) / 4u;
    for (uint h = h0; h < h1; ++h) {
        uint at = h * head;
        float x0 = page_f[src.page].d[so + at + i0], x1 = page_f[src.page].d[so + at + i1];
        if (rotate) {
            float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
            x0 = y0;
            x1 = y1;
        }
        page_f[dst.page].d[d + at + i0] = x0;
        page_f[dst.page].d[d + at + i1] = x1;
    }
}

#ifdef ROPE_KV
// The row's position in the caches, or ~0u past their context.
uint cacheRow(TRef k, TRef kc, uint item, uint arg) {
    const uint pos = blockArg(itemInstance(item), arg) + itemRowLocal(item);
    return pos < kc.n / k.n ? pos : ~0u;
}

// As rotateHeads on k in place, each rotated (or copied) pair also written into the K cache's row.
void rotateStoreHeads(TRef k, TRef kc, uint item, uint row, uint h0, uint h1, uint i0, uint i1, bool rotate, float c, float s) {
    uint head = pc.w[BLUE_PC_OPERANDS + 13u];
    uint so = sliceOffset(k, item) / 4u;
#ifdef CACHE_F16
    uint co = sliceOffset(kc, item) / 4u + row * (k.n / 2u);
#else
    uint co = sliceOffset(kc, item) / 4u + row * k.n;
#endif
    for (uint h = h0; h < h1; ++h) {
        uint at = h * head;
        float x0 = page_f[k.page].d[so + at + i0], x1 = page_f[k.page].d[so + at + i1];
        if (rotate) {
            float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
            x0 = y0;
            x1 = y1;
        }
        page_f[k.page].d[so + at + i0] = x0;
        page_f[k.page].d[so + at + i1] = x1;
        if (row == ~0u) continue;
#ifdef CACHE_F16
        page_u[kc.page].d[co + (at + i0) / 2u] = packHalf2x16(vec2(x0, x1));  // i1 = i0 + 1, i0 even
#else
        page_f[kc.page].d[co + at + i0] = x0;
        page_f[kc.page].d[co + at + i1] = x1;
#endif
    }
}

#ifdef CACHE_F16
// Neox pairs into an F16 cache: the invocation owns frequencies j and j + 1 (pairs a and b), so
// both halves of every cache word it writes are its own: rotated pairs (j, j + n_rot/2) and
// (j + 1, j + 1 + n_rot/2) make the words of dims j, j + 1 and of their partners; copied pairs
// are adjacent, a word each.
void rotateStorePairs(TRef k, TRef kc, uint item, uint row, uint h0, uint h1, uvec4 dims, bool rotate, vec4 cs) {
    uint head = pc.w[BLUE_PC_OPERANDS + 13u];
    uint so = sliceOffset(k, item) / 4u, co = sliceOffset(kc, item) / 4u + row * (k.n / 2u);
    for (uint h = h0; h < h1; ++h) {
        uint at = h * head;
        vec4 x = vec4(page_f[k.page].d[so + at + dims.x], page_f[k.page].d[so + at + dims.y],
                      page_f[k.page].d[so + at + dims.z], page_f[k.page].d[so + at + dims.w]);
        if (rotate) {
            x = vec4(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x, x.z * cs.z - x.w * cs.w, x.z * cs.w + x.w * cs.z);
        }
        page_f[k.page].d[so + at + dims.x] = x.x;
        page_f[k.page].d[so + at + dims.y] = x.y;
        page_f[k.page].d[so + at + dims.z] = x.z;
        page_f[k.page].d[so + at + dims.w] = x.w;
        if (row == ~0u) continue;
        if (rotate) {  // a's and b's first dims share a word, as do their partners
            page_u[kc.page].d[co + (at + dims.x) / 2u] = packHalf2x16(x.xz);
            page_u[kc.page].d[co + (at + dims.y) / 2u] = packHalf2x16(x.yw);
        } else {
            page_u[kc.page].d[co + (at + dims.x) / 2u] = packHalf2x16(x.xy);
            page_u[kc.page].d[co + (at + dims.z) / 2u] = packHalf2x16(x.zw);
        }
    }
}
#endif

// Invocation x past the rotations': BLUE_KV_WORDS words of v's row into the V cache (as KVSTORE).
void storeV(TRef k, TRef vc, uint item, uint row, uint x) {
    TRef v = k;
    v.page = pc.w[BLUE_PC_ROPEKV_V] & 0xFFFFu;
    v.cls = pc.w[BLUE_PC_ROPEKV_V] >> 16;
    v.offset = pc.w[BLUE_PC_ROPEKV_V + 1u];
#ifdef CACHE_F16
    const uint count = k.n / 2u;
#else
    const uint count = k.n;
#endif
    const uint w0 = x * BLUE_KV_WORDS;
    if (w0 >= count || row == ~0u) return;
    const uint w1 = min(w0 + BLUE_KV_WORDS, count);
    const uint s = sliceOffset(v, item) / 4u, at = sliceOffset(vc, item) / 4u + row * count;
    for (uint w = w0; w < w1; ++w) {
#ifdef CACHE_F16
        page_u[vc.page].d[at + w] = packHalf2x16(vec2(page_f[v.page].d[s + 2u * w], page_f[v.page].d[s + 2u * w + 1u]));
#else
        page_f[vc.page].d[at + w] = page_f[v.page].d[s + w];
#endif
    }
}
#endif

// Frequency j's dims within a head: mode 0 (2j, 2j+1), neox (j, j + n_rot/2); past n_rot, copied
// pairs (2j, 2j+1) and (n_rot + 2(j - n_rot/2), +1).
void pairDims(uint j, uint mode, uint n_rot, out uint i0, out uint i1) {
    const uint half_rot = n_rot / 2u;
    if (mode == 0u || j >= half_rot) {
        i0 = j < half_rot || mode == 0u ? 2u * j : n_rot + 2u * (j - half_rot);
        i1 = i0 + 1u;
    } else {
        i0 = j;
        i1 = j + half_rot;
    }
}

// Frequency j's rotation at the item's position: cos and sin of pos * scale * base^(-2j/n_rot) / ff[j].
void angle(uint j, uint item, uint arg, uint n_rot, float base, float scale, TRef ff, out float c, out float s) {
    float pos = float(blockArg(itemInstance(item), arg) + itemRowLocal(item));
    float theta = pos * scale * pow(base, -2.0 * float(j) / float(n_rot));
    if (ff.page != 0xFFFFu) theta /= page_f[ff.page].d[sliceOffset(ff, item) / 4u + j];
    c = cos(theta);
    s = sin(theta);
}

// Invocation x of an item: frequency j = x % (head / 2) of the x / (head / 2)-th chunk of
// BLUE_ROPE_HEADS heads (ROPEQK: q's heads, then k's). The angle's pow, cos and sin are computed
// once for the chunk: they depend on the position and j only.
void main() {
    TRef a = tref(BLUE_PC_OPERANDS);
    TRef b = tref(BLUE_PC_OPERANDS + 4u);
    uint item = elemItem();
    if (item >= itemCount()) return;
    TRef ff = tref(BLUE_PC_OPERANDS + 8u);
    uint arg = pc.w[BLUE_PC_OPERANDS + 12u], head = pc.w[BLUE_PC_OPERANDS + 13u];
    uint n_rot = pc.w[BLUE_PC_OPERANDS + 14u], mode = pc.w[BLUE_PC_OPERANDS + 15u];
    float base = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 16u]);
    float scale = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 17u]);
    uint half_head = head / 2u, half_rot = n_rot / 2u;
#if defined(ROPE_KV) && defined(CACHE_F16)
    // Neox pairs into an F16 cache: two frequencies an invocation (rotateStorePairs).
    const bool paired = mode != 0u;
#else
    const bool paired = false;
#endif
    const uint per_chunk = paired ? half_head / 2u : half_head;
    uint j = elemIndex() % per_chunk * (paired ? 2u : 1u);
    uint h0 = elemIndex() / per_chunk * BLUE_ROPE_HEADS;
    uint qh = a.n / head;
#ifdef ROPE_QK
    uint heads = qh + b.n / head;
#else
    uint heads = qh;
#endif
#ifdef ROPE_KV
    const TRef kc = tref(BLUE_PC_ROPEKV_KC), vc = tref(BLUE_PC_ROPEKV_VC);
    const uint row = cacheRow(b, kc, item, arg);
    const uint rotations = per_chunk * ((heads + BLUE_ROPE_HEADS - 1u) / BLUE_ROPE_HEADS);
    if (elemIndex() >= rotations) {
        storeV(b, vc, item, row, elemIndex() - rotations);
        return;
    }
#endif
    if (h0 >= heads) return;
    uint h1 = min(h0 + BLUE_ROPE_HEADS, heads);
    // The pair's dims within a head: mode 0 (2j, 2j+1), neox (j, j + n_rot/2); past n_rot copied.
    bool rotate = j < half_rot;
    uint i0, i1;
    pairDims(j, mode, n_rot, i0, i1);
    float c = 1.0, s = 0.0;
    if (rotate) angle(j, item, arg, n_rot, base, scale, ff, c, s);
#if defined(ROPE_KV) && defined(CACHE_F16)
    if (paired) {  // and frequency j + 1, on the same side of n_rot / 2 (the plan: n_rot % 4 == 0)
        uint i2, i3;
        pairDims(j + 1u, mode, n_rot, i2, i3);
        float c1 = 1.0, s1 = 0.0;
        if (rotate) angle(j + 1u, item, arg, n_rot, base, scale, ff, c1, s1);
        rotateHeads(a, a, item, h0, min(h1, qh), i0, i1, rotate, c, s);
        rotateHeads(a, a, item, h0, min(h1, qh), i2, i3, rotate, c1, s1);
        rotateStorePairs(b, kc, item, row, max(h0, qh) - qh, max(h1, qh) - qh, uvec4(i0, i1, i2, i3), rotate,
                         vec4(c, s, c1, s1));
        return;
    }
#endif
#ifdef ROPE_QK
    // q's heads, then k's: two loops, so each reads one tensor (its page uniform in the call).
    rotateHeads(a, a, item, h0, min(h1, qh), i0, i1, rotate, c, s);
#ifdef ROPE_KV
    rotateStoreHeads(b, kc, item, row, max(h0, qh) - qh, max(h1, qh) - qh, i0, i1, rotate, c, s);
#else
    rotateHeads(b, b, item, max(h0, qh) - qh, max(h1, qh) - qh, i0, i1, rotate, c, s);
#endif
#else
    rotateHeads(a, b, item, h0, h1, i0, i1, rotate, c, s);
#endif
}
