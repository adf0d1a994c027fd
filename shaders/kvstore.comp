#version 450
#extension GL_GOOGLE_include_directive : require
// KVSTORE: writes row k into kcache and row v into vcache at position arg + row index (ignored
// past the cache's context). CACHE_F16: caches hold halves, two per word.
// KVSTOREP (KV_PAGED): the caches are pools [D, PS, NP] (GLOBAL: sliceOffset is the pool's start)
// and the position goes to its row through the instance's page table (common/bytes.glsl
// pageRow); dropped where unmapped.
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

// Words [w0, w1) of the item's row of src into the cache's words from `at` (F16: two halves a word).
void storeWords(TRef src, TRef cache, uint item, uint at, uint w0, uint w1) {
    uint s = sliceOffset(src, item) / 4u;
    for (uint w = w0; w < w1; ++w) {
#ifdef CACHE_F16
        page_u[cache.page].d[at + w] = packHalf2x16(vec2(page_f[src.page].d[s + 2u * w], page_f[src.page].d[s + 2u * w + 1u]));
#else
        page_f[cache.page].d[at + w] = page_f[src.page].d[s + w];
#endif
    }
}

void main() {
    TRef k = tref(BLUE_PC_OPERANDS);
    TRef kc = tref(BLUE_PC_OPERANDS + 4u);
    TRef v = tref(BLUE_PC_OPERANDS + 8u);
    TRef vc = tref(BLUE_PC_OPERANDS + 12u);
    uint arg = pc.w[BLUE_PC_OPERANDS + 16u];
    uint i = elemIndex(), item = elemItem();
#ifdef CACHE_F16
    uint count = k.n / 2u;
#else
    uint count = k.n;
#endif
    // BLUE_KV_WORDS words per invocation: the position's lookups are made once for them.
    uint w0 = i * BLUE_KV_WORDS;
    if (w0 >= count || item >= itemCount()) return;
    uint w1 = min(w0 + BLUE_KV_WORDS, count);
    uint inst = itemInstance(item);
#ifdef KV_PAGED
    uint p = addPositions(blockArg(inst, arg), itemRowLocal(item));
    uint pos = pageRow(inst, pc.w[BLUE_PC_OPERANDS + 17u], pc.w[BLUE_PC_OPERANDS + 18u], p);
    if (pos == KVP_UNMAPPED) return;
#else
    uint pos = blockArg(inst, arg) + itemRowLocal(item);
    if (pos >= kc.n / k.n) return;
#endif
    storeWords(k, kc, item, sliceOffset(kc, item) / 4u + pos * count, w0, w1);
    storeWords(v, vc, item, sliceOffset(vc, item) / 4u + pos * count, w0, w1);
}
