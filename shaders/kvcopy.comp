#version 450
#extension GL_GOOGLE_include_directive : require
// KVCOPY: copies rows [first, end) between the instance's KV cache and slot s of a session store
// (vm/tensor_ops_llm.cpp refKvcopy), one 32-bit word per invocation: the copy does not look at
// the values, so F16 caches (two halves a word) and F32 ones take the same path. The host puts
// a row's words and the context in push constants (BLUE_PC_KV_*).
// KVCOPYP (KV_PAGED): operand 0 is a pool [D, PS, NP] (GLOBAL: sliceOffset is its start), and
// each position's row is found through the instance's page table (common/bytes.glsl pageRow);
// unmapped positions are skipped. The context is the store's.
#include "common/tensor.glsl"
#include "common/bytes.glsl"

layout(local_size_x = BLUE_ELEM_WG) in;

void main() {
    TRef cache = tref(BLUE_PC_OPERANDS);
    TRef store = tref(BLUE_PC_OPERANDS + BLUE_TREF_WORDS);
    uint at = BLUE_PC_OPERANDS + 2u * BLUE_TREF_WORDS;
    uint dir = pc.w[at];
    uint item = gl_WorkGroupID.y;
    if (item >= itemCount()) return;
    uint inst = itemInstance(item);
    uint row_words = pc.w[BLUE_PC_KV_ROW_WORDS], ctx = pc.w[BLUE_PC_KV_CTX];
    uint slot_words = row_words * ctx;
    uint s = blockArg(inst, pc.w[at + 1u]);
    uint first = min(blockArg(inst, pc.w[at + 2u]), ctx), end = min(blockArg(inst, pc.w[at + 3u]), ctx);
    uint w = first * row_words + gl_GlobalInvocationID.x;
#ifdef KV_PAGED
    // Slots in the store: its elements over a slot's (the pool's row elements times ctx).
    uint row_elems = cache.n / (pc.w[BLUE_PC_KVP_PAGE] * pc.w[BLUE_PC_KVP_PAGES]);
    if (s >= store.n / (row_elems * ctx) || w >= end * row_words) return;
    uint pos = w / row_words;
    uint row = pageRow(inst, pc.w[at + 4u], pc.w[at + 5u], pos);
    if (row == KVP_UNMAPPED) return;
    uint c = sliceOffset(cache, item) / 4u + row * row_words + (w - pos * row_words);
#else
    if (s >= store.n / cache.n || w >= end * row_words) return;
    uint c = sliceOffset(cache, item) / 4u + w;
#endif
    uint t = store.offset / 4u + s * slot_words + w;
    if (dir == 0u) {
        page_u[cache.page].d[c] = page_u[store.page].d[t];
    } else {
        page_u[store.page].d[t] = page_u[cache.page].d[c];
    }
}
