#version 450
#extension GL_GOOGLE_include_directive : require
// KVSTORE: writes row k into kcache and row v into vcache at position arg + row index (ignored
// past the cache's context). CACHE_F16: caches hold halves, two per word, one word per invocation.
// KVSTOREP (KV_PAGED): the caches are pools [D, PS, NP] (GLOBAL: sliceOffset is the pool's start)
// and the position goes to its row through the instance's page table (common/bytes.glsl
// pageRow); dropped where unmapped.
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void storeRow(TRef src, TRef cache, uint item, uint pos, uint i) {
    uint dim = src.n;
    uint s = sliceOffset(src, item) / 4u;
#ifdef CACHE_F16
    uint word = sliceOffset(cache, item) / 4u + (pos * dim) / 2u + i;
    page_u[cache.page].d[word] = packHalf2x16(vec2(page_f[src.page].d[s + 2u * i], page_f[src.page].d[s + 2u * i + 1u]));
#else
    page_f[cache.page].d[sliceOffset(cache, item) / 4u + pos * dim + i] = page_f[src.page].d[s + i];
#endif
}

void main() {
    TRef k = tref(BLUE_PC_OPERANDS);
    TRef kc = tref(BLUE_PC_OPERANDS + 4u);
    TRef v = tref(BLUE_PC_OPERANDS + 8u);
    TRef vc = tref(BLUE_PC_OPERANDS + 12u);
    uint arg = pc.w[BLUE_PC_OPERANDS + 16u];
    uint i = gl_GlobalInvocationID.x, item = gl_WorkGroupID.y;
#ifdef CACHE_F16
    uint count = k.n / 2u;
#else
    uint count = k.n;
#endif
    if (i >= count || item >= itemCount()) return;
    uint inst = itemInstance(item);
#ifdef KV_PAGED
    uint p = addPositions(blockArg(inst, arg), itemRowLocal(item));
    uint pos = pageRow(inst, pc.w[BLUE_PC_OPERANDS + 17u], pc.w[BLUE_PC_OPERANDS + 18u], p);
    if (pos == KVP_UNMAPPED) return;
#else
    uint pos = blockArg(inst, arg) + itemRowLocal(item);
    if (pos >= kc.n / k.n) return;
#endif
    storeRow(k, kc, item, pos, i);
    storeRow(v, vc, item, pos, i);
}
