#version 450
#extension GL_GOOGLE_include_directive : require
// ATTN: causal attention, one invocation per (query head, item): it walks the positions 0..pos
// with an online softmax (running max m, normaliser l, output o), reading K and V through texel
// views. No shared memory, no barriers, no cross-lane reductions: the fast shape on CPU-backed
// drivers, and plenty of parallelism on GPUs once many instances decode together. Built a second
// time (ATTN_SPLIT, below) with a workgroup per head whose lanes split the positions.
// Head size must be a multiple of 8 (F16 caches) or 4 (F32). CACHE_F16: caches hold halves.
// ATTNX (built with ATTN_EXT): positions start at the sliding window's first, and the scaled
// logits are soft-capped. ATTNP (ATTN_EXT and KV_PAGED): the caches are pools [kv_dim, PS, NP]
// (GLOBAL: sliceOffset is the pool's start), position t is read from its row through the
// instance's page table (common/bytes.glsl pageRow: one local-memory load a position), and an
// unmapped position is skipped, leaving (m, l, o) as they were; a head with no mapped position
// writes zeros. The arithmetic per position is ATTNX's, so the same rows give the same bits.
// Grid: x = ceil(heads / BLUE_ATTN_WG), y = items.
#include "common/tensor.glsl"
#include "common/bytes.glsl"

#ifdef ATTN_SPLIT
// `_split` (for GPUs, chosen by GpuOptions::attn_kernel): one workgroup per (query head, item),
// its lanes taking every BLUE_ATTN_SPLIT_WG-th position with an online softmax each; then the
// lanes' (m, l, o) merge in shared memory, ATTN_SPLIT_QUADS output quads at a time (8 KiB).
layout(local_size_x = BLUE_ATTN_SPLIT_WG) in;
#define ATTN_SPLIT_QUADS 16u
shared float s_m[BLUE_ATTN_SPLIT_WG], s_l[BLUE_ATTN_SPLIT_WG];
shared vec4 s_o[BLUE_ATTN_SPLIT_WG][ATTN_SPLIT_QUADS];
#else
layout(local_size_x = BLUE_ATTN_WG) in;
#endif

#define MAX_HEAD BLUE_ATTN_MAX_HEAD
// The head's quads, where the plan specializes the kernel ("#Q"): the loops over quads then have
// constant counts and o[] and qv[] constant indices, which lavapipe keeps in registers (3-5x
// faster at head 8 than indexing them with the head size read at run time); 0 reads it.
layout(constant_id = BLUE_SPEC_HEAD_QUADS) const uint HEAD_QUADS = 0u;
#ifdef CACHE_F16
#define PER_TEXEL 8u
#else
#define PER_TEXEL 4u
#endif

vec4 o[MAX_HEAD / 4u];
vec4 qv[MAX_HEAD / 4u];

// Elements 4j..4j+3 of a cache row starting at texel `base` (operand `op`).
#ifdef CACHE_F16
#define CACHE4(op, base, j) cacheHalf4(TEXEL(op, (base) + (j) / 2u), (j) & 1u)
vec4 cacheHalf4(uvec4 t, uint half_sel) {
    return half_sel == 0u ? vec4(unpackHalf2x16(t.x), unpackHalf2x16(t.y))
                          : vec4(unpackHalf2x16(t.z), unpackHalf2x16(t.w));
}
#else
#define CACHE4(op, base, j) TEXELF(op, (base) + (j))
#endif

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef kc = tref(BLUE_PC_OPERANDS + 4u);
    TRef vc = tref(BLUE_PC_OPERANDS + 8u);
    TRef q = tref(BLUE_PC_OPERANDS + 12u);
    uint n_head = pc.w[BLUE_PC_OPERANDS + 16u], n_kv = pc.w[BLUE_PC_OPERANDS + 17u];
    uint arg = pc.w[BLUE_PC_OPERANDS + 18u];
    float scale = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 19u]);
#ifdef ATTN_EXT
    uint window = pc.w[BLUE_PC_OPERANDS + 20u];
    float cap = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 21u]);
#endif
#ifdef ATTN_SPLIT
    uint h = gl_WorkGroupID.x, item = gl_WorkGroupID.y, lane = gl_LocalInvocationID.x;
#else
    uint h = gl_GlobalInvocationID.x, item = gl_WorkGroupID.y;
#endif
    if (h >= n_head || item >= itemCount()) return;
    uint head = dst.n / n_head, kv_dim = head * n_kv;
    uint quads = HEAD_QUADS != 0u ? HEAD_QUADS : head / 4u;
    uint kv_off = (h / (n_head / n_kv)) * head;
    uint inst = itemInstance(item);
#ifdef KV_PAGED
    uint tab = pc.w[BLUE_PC_OPERANDS + 22u], tab_n = pc.w[BLUE_PC_OPERANDS + 23u];
    uint ctx = tab_n * pc.w[BLUE_PC_KVP_PAGE];  // positions the table covers
    uint last = min(addPositions(blockArg(inst, arg), itemRowLocal(item)), ctx - 1u);
#else
    uint ctx = kc.n / kv_dim;
    uint last = min(blockArg(inst, arg) + itemRowLocal(item), ctx - 1u);
#endif
    uint qbase = sliceOffset(q, item) / 16u + h * quads;
    for (uint j = 0u; j < quads; ++j) {
        qv[j] = TEXELF(3, qbase + j) * scale;
        o[j] = vec4(0.0);
    }
    // Texel index of position t's head slice: (slice + (t * kv_dim + kv_off) * elem) / 16.
    uint row_texels = kv_dim / PER_TEXEL;
    uint kbase = sliceOffset(kc, item) / 16u + kv_off / PER_TEXEL;
    uint vbase = sliceOffset(vc, item) / 16u + kv_off / PER_TEXEL;
    float m = -1.0 / 0.0, l = 0.0;
    uint first = 0u;
#ifdef ATTN_EXT
    if (window != 0u && last + 1u > window) first = last + 1u - window;
#endif
#ifdef ATTN_SPLIT
    for (uint t = first + lane; t <= last; t += BLUE_ATTN_SPLIT_WG) {
#else
    for (uint t = first; t <= last; ++t) {
#endif
        // The head's quads four at a time, then the rest: lavapipe ends all loops of an
        // invocation after 65535 iterations in all (KernelChoice::loop_limit), so the loops per
        // position are kept few; attnLoops (host/machine_plan.cpp) counts them.
#ifdef KV_PAGED
        const uint row = pageRow(inst, tab, tab_n, t);
        if (row == KVP_UNMAPPED) continue;
#else
        const uint row = t;
#endif
        const uint kt = kbase + row * row_texels, vt = vbase + row * row_texels;
        float s = 0.0;
        uint j = 0u;
        for (; j + 4u <= quads; j += 4u) {
            s += dot(qv[j], CACHE4(1, kt, j)) + dot(qv[j + 1u], CACHE4(1, kt, j + 1u)) +
                 dot(qv[j + 2u], CACHE4(1, kt, j + 2u)) + dot(qv[j + 3u], CACHE4(1, kt, j + 3u));
        }
        for (; j < quads; ++j) s += dot(qv[j], CACHE4(1, kt, j));
#ifdef ATTN_EXT
        if (cap > 0.0) s = cap * (1.0 - 2.0 / (exp(2.0 * s / cap) + 1.0));
#endif
        float m_new = max(m, s);
        float corr = exp(m - m_new), p = exp(s - m_new);
        l = l * corr + p;
        for (j = 0u; j + 4u <= quads; j += 4u) {
            o[j] = o[j] * corr + p * CACHE4(2, vt, j);
            o[j + 1u] = o[j + 1u] * corr + p * CACHE4(2, vt, j + 1u);
            o[j + 2u] = o[j + 2u] * corr + p * CACHE4(2, vt, j + 2u);
            o[j + 3u] = o[j + 3u] * corr + p * CACHE4(2, vt, j + 3u);
        }
        for (; j < quads; ++j) o[j] = o[j] * corr + p * CACHE4(2, vt, j);
        m = m_new;
    }
    uint d = sliceOffset(dst, item) / 4u + h * head;
#ifdef ATTN_SPLIT
    // Merge: every lane's sums rescaled to the largest running max M (a lane with no position
    // has m = -inf and weighs 0).
    s_m[lane] = m;
    barrier();
    float mm = -1.0 / 0.0;
    for (uint i = 0u; i < BLUE_ATTN_SPLIT_WG; ++i) mm = max(mm, s_m[i]);
    float w = m == -1.0 / 0.0 ? 0.0 : exp(m - mm);
    s_l[lane] = l * w;
    barrier();
    float ll = 0.0;
    for (uint i = 0u; i < BLUE_ATTN_SPLIT_WG; ++i) ll += s_l[i];
#ifdef KV_PAGED
    if (ll == 0.0) ll = 1.0;  // no mapped position: o is zero, and so is the output
#endif
    for (uint c = 0u; c < quads; c += ATTN_SPLIT_QUADS) {
        for (uint j = 0u; j < ATTN_SPLIT_QUADS; ++j) s_o[lane][j] = c + j < quads ? o[c + j] * w : vec4(0.0);
        barrier();
        if (lane < ATTN_SPLIT_QUADS && c + lane < quads) {
            vec4 r = vec4(0.0);
            for (uint i = 0u; i < BLUE_ATTN_SPLIT_WG; ++i) r += s_o[i][lane];
            r /= ll;
            for (uint k = 0u; k < 4u; ++k) page_f[dst.page].d[d + 4u * (c + lane) + k] = r[k];
        }
        barrier();
    }
    return;
#endif
#ifdef KV_PAGED
    if (l == 0.0) l = 1.0;  // no mapped position: o is zero, and so is the output
#endif
    for (uint j = 0u; j < quads; ++j) {
        vec4 r = o[j] / l;
        for (uint c = 0u; c < 4u; ++c) page_f[dst.page].d[d + 4u * j + c] = r[c];
    }
}
