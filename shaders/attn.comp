#version 450
#extension GL_GOOGLE_include_directive : require
// ATTN: causal attention of one query head over a KV cache, one workgroup per (head, item).
// Positions are taken in chunks: scores of a chunk go to shared memory, then the running max,
// normaliser and output are rescaled and the chunk's values accumulated (the online softmax), so
// any context length works in fixed shared memory. Each invocation owns output dims lid,
// lid + WG, ... (head size at most 4 * WG). CACHE_F16: caches hold halves.
#include "common/tensor.glsl"
#include "common/bytes.glsl"
#define REDUCE_WG BLUE_ITEM_WG
#include "common/reduce.glsl"

layout(local_size_x = BLUE_ITEM_WG) in;

const uint kChunk = 256u;
shared float scores[kChunk];
shared float q_shared[256];

float cacheAt(TRef c, uint base_word, uint index) {
#ifdef CACHE_F16
    uint w = page_u[c.page].d[base_word + index / 2u];
    return unpackHalf2x16(w)[index & 1u];
#else
    return page_f[c.page].d[base_word + index];
#endif
}

void main() {
    TRef dst = tref(BLUE_PC_OPERANDS);
    TRef kc = tref(BLUE_PC_OPERANDS + 4u);
    TRef vc = tref(BLUE_PC_OPERANDS + 8u);
    TRef q = tref(BLUE_PC_OPERANDS + 12u);
    uint n_head = pc.w[BLUE_PC_OPERANDS + 16u], n_kv = pc.w[BLUE_PC_OPERANDS + 17u];
    uint arg = pc.w[BLUE_PC_OPERANDS + 18u];
    float scale = uintBitsToFloat(pc.w[BLUE_PC_OPERANDS + 19u]);
    uint h = gl_WorkGroupID.x, item = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    if (item >= itemCount()) return;
    uint head = dst.n / n_head, kv_dim = head * n_kv, ctx = kc.n / kv_dim;
    uint kv_off = (h / (n_head / n_kv)) * head;
    uint last = min(blockArg(itemInstance(item), arg) + itemRowLocal(item), ctx - 1u);
    uint qo = sliceOffset(q, item) / 4u + h * head;
    for (uint i = lid; i < head; i += BLUE_ITEM_WG) q_shared[i] = page_f[q.page].d[qo + i];
    barrier();
    uint kbase = sliceOffset(kc, item) / 4u, vbase = sliceOffset(vc, item) / 4u;
    float m = -1.0 / 0.0, l = 0.0;
    float o[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint c0 = 0u; c0 <= last; c0 += kChunk) {
        uint len = min(kChunk, last + 1u - c0);
        float local_max = -1.0 / 0.0;
        for (uint t = lid; t < len; t += BLUE_ITEM_WG) {
            uint row = (c0 + t) * kv_dim + kv_off;
            float dot = 0.0;
            for (uint i = 0u; i < head; ++i) dot += q_shared[i] * cacheAt(kc, kbase, row + i);
            scores[t] = dot * scale;
            local_max = max(local_max, dot * scale);
        }
        float new_m = max(m, workgroupMax(local_max));
        float rescale = exp(m - new_m);
        float local_sum = 0.0;
        for (uint t = lid; t < len; t += BLUE_ITEM_WG) {
            float p = exp(scores[t] - new_m);
            scores[t] = p;
            local_sum += p;
        }
        l = l * rescale + workgroupSum(local_sum);  // the barrier inside publishes scores[]
        m = new_m;
        for (uint r = 0u; r < 4u; ++r) {
            uint i = lid + r * BLUE_ITEM_WG;
            if (i >= head) break;
            float acc = o[r] * rescale;
            for (uint t = 0u; t < len; ++t) acc += scores[t] * cacheAt(vc, vbase, (c0 + t) * kv_dim + kv_off + i);
            o[r] = acc;
        }
        barrier();
    }
    uint d = sliceOffset(dst, item) / 4u + h * head;
    for (uint r = 0u; r < 4u; ++r) {
        uint i = lid + r * BLUE_ITEM_WG;
        if (i < head) page_f[dst.page].d[d + i] = o[r] / l;
    }
}
