// The int8 kernels of CPU drivers (`_b1q` and `_q`: matmul.comp; `_iq`: matmul_items.comp) on x
// rounded to int8 and packed by PACKX (packx.comp; blue_config.h BLUE_XQ_GBLOCK_TEXELS). Integer
// SWAR: a word holding two weight levels in its halves (w_a + w_b << 16) times a word holding two
// x values crosswise (x_b + x_a << 16) gains w_a x_a + w_b x_b in its high half; lavapipe has no
// fast dot product, and this is two products per 32-bit multiply. Pair texel i of a block holds
// elements (4i+2, 4i), (4i+3, 4i+1), (4i+18, 4i+16), (4i+19, 4i+17) in its components, so a weight
// word whose bytes hold elements 4i..4i+3 gives the matching pairs at shifts 0 and 8.
// Every kernel sums a row's blocks with these functions in one order: batch-invariant.
// Include after common/tensor.glsl and common/wlayout.glsl (WTYPE_* defined).

// Block s of gblock g of the item whose packed record starts at texel `rec`: its four pair
// texels, its step (x = step * level) and the sum of its levels.
void xqBlock(uint rec, uint g, uint s, out ivec4 xp[4], out float dx, out int sx) {
    const uint xr = rec + g * BLUE_XQ_GBLOCK_TEXELS;
    for (uint i = 0u; i < 4u; ++i) xp[i] = ivec4(TEXEL(BLUE_MM_XQ_OPERAND, xr + s * 4u + i));
    const uvec4 st = TEXEL(BLUE_MM_XQ_OPERAND, xr + 32u + s / 2u);
    const uvec2 ds = (s & 1u) == 0u ? st.xy : st.zw;
    dx = uintBitsToFloat(ds.x);
    sx = int(ds.y);
}

// Per component, four products of the block's weight pairs and x pairs (eight terms).
ivec4 swarProducts(ivec4 wv[4], ivec4 xp[4]) {
    return wv[0] * xp[0] + wv[1] * xp[1] + wv[2] * xp[2] + wv[3] * xp[3];
}

// The block's integer sum from its products (swarSum; Q6_K: swarHalves), each high half rounded
// past the low halves' cross terms. 4-bit levels (0..15): two high halves of 16 terms each
// (|w x| <= 15 * 127: under 2^15).
int swarSum4(ivec4 a) {
    const ivec2 h = ((a.xz + a.yw) + 32768) >> 16;
    return h.x + h.y;
}

#if defined(WTYPE_Q4_0)
// Q4_0's quant texel: byte j holds element j (low nibble) and j + 16 (high).
void swarPairs(uvec4 q, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) wv[i] = ivec4((uvec4(q[i]) >> uvec4(0u, 8u, 4u, 12u)) & 0x000F000Fu);
}
int swarSum(ivec4 a) { return swarSum4(a); }
#elif defined(WTYPE_Q4_K)
// Q4_K's block: its 32 levels are the nibbles at `shift` of texels a (elements 0..15) and b (16..31).
void swarPairs(uvec4 a, uvec4 b, uint shift, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) {
        wv[i] = ivec4((uvec4(a[i], a[i], b[i], b[i]) >> (uvec4(0u, 8u, 0u, 8u) + shift)) & 0x000F000Fu);
    }
}
int swarSum(ivec4 a) { return swarSum4(a); }
#elif defined(WTYPE_Q5_K)
// Q5_K's block: Q4_K's nibbles with bit s of the high-bit texels h1 (elements 0..15) and h2
// (16..31) above them: levels 0..31.
void swarPairs(uvec4 a, uvec4 b, uvec4 h1, uvec4 h2, uint shift, uint s, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) {
        const uvec4 lo = (uvec4(a[i], a[i], b[i], b[i]) >> (uvec4(0u, 8u, 0u, 8u) + shift)) & 0x000F000Fu;
        const uvec4 hi = (uvec4(h1[i], h1[i], h2[i], h2[i]) >> (uvec4(0u, 8u, 0u, 8u) + s)) & 0x00010001u;
        wv[i] = ivec4(lo | (hi << 4));
    }
}
// 5-bit levels: |w x| <= 31 * 127, so the four components' high halves (8 terms each) are
// rounded apart and then added.
int swarSum(ivec4 a) {
    const ivec4 h = (a + 32768) >> 16;
    return (h.x + h.y) + (h.z + h.w);
}
#elif defined(WTYPE_Q6_K)
// Q6_K's group: q6Bytes' 6-bit levels of its halves qa (elements 0..15) and qb (16..31), less 32
// (-32..31), so four products a sum keep both halves exact (|w x| <= 32 * 127, 8 terms under 2^15).
void swarPairs(uvec4 qa, uvec4 qb, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) {
        wv[i] = ivec4((uvec4(qa[i], qa[i], qb[i], qb[i]) >> uvec4(0u, 8u, 0u, 8u)) & 0x003F003Fu) - 0x00200020;
    }
}
// The sums of the group's two halves (scales sc.x, sc.y).
ivec2 swarHalves(ivec4 a) {
    const ivec4 h = (a + 32768) >> 16;
    return ivec2(h.x + h.y, h.z + h.w);
}
#endif
