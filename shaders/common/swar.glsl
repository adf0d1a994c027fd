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

// A block's integer sum from its products, each high half rounded past the low halves' cross
// terms. 4-bit levels (0..15): two high halves of 16 terms each (|w x| <= 15 * 127: under 2^15).
int swarSum4(ivec4 a) {
    const ivec2 h = ((a.xz + a.yw) + 32768) >> 16;
    return h.x + h.y;
}

#if defined(WTYPE_Q4_0)
// Q4_0's quant texel: byte j holds element j (low nibble) and j + 16 (high).
void swarPairs(uvec4 q, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) wv[i] = ivec4((uvec4(q[i]) >> uvec4(0u, 8u, 4u, 12u)) & 0x000F000Fu);
}
// A block's product with one item's x: its integer sum, less 8 times the sum of x's levels, times
// the block's scale d and x's step dx.
float swarDot(ivec4 wv[4], float d, ivec4 xp[4], float dx, int sx) {
    return (d * dx) * float(swarSum4(swarProducts(wv, xp)) - 8 * sx);
}
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// Block s of gblock g of a row whose header is h: its levels as pairs, its scale and its min
// (wGroup's, as integers). Q4_K: the nibbles at 4 (s & 1) of its two quant texels (elements
// 0..15, 16..31); Q5_K: the same with bit s of the high-bit texels h.t1, h.t2 above them (0..31).
void swarBlock(uint base, uint bpr, uint row, uint g, uint s, WHead h, out ivec4 wv[4], out float sc,
               out float mn) {
    const uvec2 sm = kScaleMin(h.t0, s);
    sc = halfOf(h.t0, 0u) * float(sm.x);
    mn = -halfOf(h.t0, 1u) * float(sm.y);
#if defined(WTYPE_Q4_K)
    const uint qt = 1u + 2u * (s >> 1);
#else
    const uint qt = 3u + 2u * (s >> 1);
#endif
    const uvec4 a = wTexel(base, bpr, row, g, qt), b = wTexel(base, bpr, row, g, qt + 1u);
    for (uint i = 0u; i < 4u; ++i) {
        uvec4 w = (uvec4(a[i], a[i], b[i], b[i]) >> (uvec4(0u, 8u, 0u, 8u) + 4u * (s & 1u))) & 0x000F000Fu;
#if defined(WTYPE_Q5_K)
        w |= ((uvec4(h.t1[i], h.t1[i], h.t2[i], h.t2[i]) >> (uvec4(0u, 8u, 0u, 8u) + s)) & 0x00010001u) << 4;
#endif
        wv[i] = ivec4(w);
    }
}
// A block's product with one item's x: its integer sum times the scale, plus the min times the
// sum of x's levels, times x's step dx. Q5_K's 5-bit levels (|w x| <= 31 * 127) leave room for 8
// terms a half only: the four components' high halves are rounded apart, then added.
float swarDot(ivec4 wv[4], float sc, float mn, ivec4 xp[4], float dx, int sx) {
    const ivec4 a = swarProducts(wv, xp);
#if defined(WTYPE_Q4_K)
    const int sum = swarSum4(a);
#else
    const ivec4 h = (a + 32768) >> 16;
    const int sum = (h.x + h.y) + (h.z + h.w);
#endif
    return dx * (sc * float(sum) + mn * float(sx));
}
#elif defined(WTYPE_Q6_K)
// Q6_K's group: q6Bytes' 6-bit levels of its halves qa (elements 0..15) and qb (16..31), less 32
// (-32..31), so four products a sum keep both halves exact (|w x| <= 32 * 127, 8 terms under 2^15).
void swarPairs(uvec4 qa, uvec4 qb, out ivec4 wv[4]) {
    for (uint i = 0u; i < 4u; ++i) {
        wv[i] = ivec4((uvec4(qa[i], qa[i], qb[i], qb[i]) >> uvec4(0u, 8u, 0u, 8u)) & 0x003F003Fu) - 0x00200020;
    }
}
// A group's product with one item's x: its halves' integer sums times their scales sc, times dx.
float swarDot(ivec4 wv[4], vec2 sc, ivec4 xp[4], float dx) {
    const ivec4 h = (swarProducts(wv, xp) + 32768) >> 16;
    return dx * (sc.x * float(h.x + h.y) + sc.y * float(h.z + h.w));
}
#endif
