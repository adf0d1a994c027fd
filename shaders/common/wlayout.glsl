// Reading weight matrices in the GPU weight layout (host/weight_layout.h documents it): rows
// interleaved by 8, each row cut into gblocks of WL_E elements stored in WL_T texels. Define one
// WTYPE_* (and WL_OPERAND, the weight's operand position, default 1) before including. Provides
//   wTexel(base, bpr, row, g, t)        texel t of gblock g of `row`
//   wGroup(base, bpr, row, g, s, w)     elements 32s..32s+31 of gblock g (256-element types)
//   wElement(base, bpr, row, i)         one element (slow; for EMBED)
// base: the tensor's first texel; bpr: gblocks per row = ceil(K / WL_E).
#ifndef WL_OPERAND
#define WL_OPERAND 1
#endif

#if defined(WTYPE_F32)
#define WL_E 4u
#define WL_T 1u
#define WL_PLAIN
#elif defined(WTYPE_F16) || defined(WTYPE_BF16)
#define WL_E 8u
#define WL_T 1u
#define WL_PLAIN
#elif defined(WTYPE_Q8_0)
#define WL_E 256u
#define WL_T 17u
#elif defined(WTYPE_Q4_0)
#define WL_E 256u
#define WL_T 9u
#elif defined(WTYPE_Q4_1)
#define WL_E 256u
#define WL_T 10u
#elif defined(WTYPE_Q5_0)
#define WL_E 256u
#define WL_T 11u
#elif defined(WTYPE_Q5_1)
#define WL_E 256u
#define WL_T 12u
#elif defined(WTYPE_Q2_K)
#define WL_E 256u
#define WL_T 6u
#elif defined(WTYPE_Q3_K)
#define WL_E 256u
#define WL_T 7u
#elif defined(WTYPE_Q4_K)
#define WL_E 256u
#define WL_T 9u
#elif defined(WTYPE_Q5_K)
#define WL_E 256u
#define WL_T 11u
#elif defined(WTYPE_Q6_K)
#define WL_E 256u
#define WL_T 14u
#elif defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
#define WL_E 256u
#define WL_T 9u
#define WL_IQ4
#elif defined(WTYPE_TQ1_0)
#define WL_E 256u
#define WL_T 4u
#elif defined(WTYPE_TQ2_0)
#define WL_E 256u
#define WL_T 5u
#elif defined(WTYPE_MXFP4)
#define WL_E 256u
#define WL_T 9u
#else
#error "define a WTYPE_* for common/wlayout.glsl"
#endif

uint wIndex(uint base, uint bpr, uint row, uint g, uint t) {
    return base + (((row >> 3) * bpr + g) * WL_T + t) * 8u + (row & 7u);
}
uvec4 wTexel(uint base, uint bpr, uint row, uint g, uint t) {
#ifdef MM_MOE_CACHE
    [[dont_flatten]] if (g_cached) return TEXEL(BLUE_MOE_CACHE_OPERAND, wIndex(base, bpr, row, g, t));
#endif
    return TEXEL(WL_OPERAND, wIndex(base, bpr, row, g, t));
}

// The elements of a plain-type texel, as two vec4 (F16/BF16) or one (F32, second unused).
void plainTexel(uvec4 q, out vec4 a, out vec4 b) {
#if defined(WTYPE_F32)
    a = uintBitsToFloat(q);
    b = vec4(0.0);
#elif defined(WTYPE_F16)
    a = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
    b = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#else  // BF16
    a = uintBitsToFloat(uvec4(q.x << 16, q.x & 0xFFFF0000u, q.y << 16, q.y & 0xFFFF0000u));
    b = uintBitsToFloat(uvec4(q.z << 16, q.z & 0xFFFF0000u, q.w << 16, q.w & 0xFFFF0000u));
#endif
}

uint byteOf(uvec4 t, uint i) { return (t[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }
float halfOf(uvec4 t, uint i) { return unpackHalf2x16(t[i >> 1] >> ((i & 1u) * 16u)).x; }
vec4 bytes4(uint word) { return vec4((uvec4(word) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu); }
vec4 sbytes4(uint word) { return vec4(ivec4(uvec4(word) << uvec4(24u, 16u, 8u, 0u)) >> 24); }

#ifndef WL_PLAIN
// Quantized types decode a 32-element group s (0..7) of gblock g as raw quant values q[8] (vec4s)
// plus, per 16-element half, a scale and an offset: the group's dot product with x is
//   sc.x * dot(q[0..3], x[0..3]) + mn.x * sum(x[0..3]) + sc.y * dot(q[4..7], x[4..7]) + mn.y * sum(x[4..7]).
// The per-gblock header (scales, mins, high bits) is loaded once by wHead and reused for all 8
// groups; each group then loads only its own quant texels.
struct WHead {
    uvec4 t0, t1, t2, t3;
};

vec4 nib4(uint word, uint shift) { return vec4((uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 15u); }
vec4 crumb4(uint word, uint shift) { return vec4((uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 3u); }
#ifdef WL_IQ4
// IQ4_NL/IQ4_XS: the level of each 4-bit code c (vm/quant.h, kIq4Values), plus 127 (0..240), in
// byte c % 4 of word c / 4. Selected with ALU ops: indexing a constant array by a dynamic index
// becomes per-invocation memory on CPU drivers (measured 6x slower decode on lavapipe).
const uvec4 kIq4Packed = uvec4(0x3e2c1700u, 0x75695c4eu, 0xa5988c80u, 0xf0d8c4b4u);
vec4 iq4Nib4(uint word, uint shift) {
    uvec4 c = (uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 15u;
    bvec4 odd = notEqual(c & 4u, uvec4(0u)), high = greaterThanEqual(c, uvec4(8u));
    uvec4 lo = mix(uvec4(kIq4Packed.x), uvec4(kIq4Packed.y), odd);
    uvec4 hi = mix(uvec4(kIq4Packed.z), uvec4(kIq4Packed.w), odd);
    return vec4((mix(lo, hi, high) >> ((c & 3u) * 8u)) & 0xFFu) - 127.0;
}
#endif
#ifdef WTYPE_MXFP4
// MXFP4: the doubled FP4 level of each 4-bit code (vm/quant.h kMxfp4Values): magnitude
// 0, 1, 2, 3, 4, 6, 8, 12 for codes 0..7 (m < 4: m; else (2 + (m & 1)) << ((m >> 1) - 1)), bit 3
// the sign. ALU only, as iq4Nib4.
vec4 mxfp4Nib4(uint word, uint shift) {
    uvec4 c = (uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 15u;
    uvec4 m = c & 7u;
    uvec4 big = (2u + (m & 1u)) << ((m >> 1) - min(m >> 1, uvec4(1u)));
    vec4 mag = vec4(mix(m, big, greaterThanEqual(m, uvec4(4u))));
    return mix(mag, -mag, greaterThanEqual(c, uvec4(8u)));
}
// 2^(e - 128) for the E8M0 byte e, built from its bits (e < 2: a denormal).
float mxfp4Scale(uint e) {
    return e >= 2u ? uintBitsToFloat((e - 1u) << 23) : uintBitsToFloat(0x00200000u << e);
}
#endif
#ifdef WTYPE_TQ1_0
// TQ1_0: trit n (0..4) of each byte of `word`, as 0..2 (vm/quant.h: (((b * 3^n) mod 256) * 3) >> 8).
vec4 trit4(uint word, uint n) {
    uint p = n == 0u ? 1u : n == 1u ? 3u : n == 2u ? 9u : n == 3u ? 27u : 81u;
    uvec4 b = (uvec4(word) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu;
    return vec4((((b * p) & 0xFFu) * 3u) >> 8);
}
#endif
uint bitsOf(uint word, uint shift) {  // bit `shift` of each byte, packed 0..3
    uvec4 b = (uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 1u;
    return b.x | (b.y << 1) | (b.z << 2) | (b.w << 3);
}

void wHead(uint base, uint bpr, uint row, uint g, out WHead h) {
#if defined(WTYPE_Q8_0) || defined(WTYPE_Q4_0) || defined(WTYPE_Q4_K) || defined(WL_IQ4) || defined(WTYPE_MXFP4)
    h.t0 = wTexel(base, bpr, row, g, 0u);
#elif defined(WTYPE_TQ2_0)
    h.t0 = wTexel(base, bpr, row, g, 4u);  // d: bytes 64..65
#elif defined(WTYPE_TQ1_0)
    h.t0 = wTexel(base, bpr, row, g, 2u);  // qs[32..47]
    h.t1 = wTexel(base, bpr, row, g, 3u);  // qh[0..3], d at bytes 52..53
#elif defined(WTYPE_Q4_1)
    h.t0 = wTexel(base, bpr, row, g, 0u);
    h.t1 = wTexel(base, bpr, row, g, 1u);
#elif defined(WTYPE_Q5_0)
    h.t0 = wTexel(base, bpr, row, g, 0u);
    h.t1 = wTexel(base, bpr, row, g, 1u);
    h.t2 = wTexel(base, bpr, row, g, 2u);
#elif defined(WTYPE_Q5_1)
    h.t0 = wTexel(base, bpr, row, g, 0u);
    h.t1 = wTexel(base, bpr, row, g, 1u);
    h.t2 = wTexel(base, bpr, row, g, 2u);
    h.t3 = wTexel(base, bpr, row, g, 3u);
#elif defined(WTYPE_Q5_K)
    h.t0 = wTexel(base, bpr, row, g, 0u);
    h.t1 = wTexel(base, bpr, row, g, 1u);
    h.t2 = wTexel(base, bpr, row, g, 2u);
#elif defined(WTYPE_Q6_K)
    h.t0 = wTexel(base, bpr, row, g, 12u);  // scales
    h.t1 = wTexel(base, bpr, row, g, 13u);  // d
#elif defined(WTYPE_Q2_K)
    h.t0 = wTexel(base, bpr, row, g, 0u);  // scales
    h.t1 = wTexel(base, bpr, row, g, 5u);  // d, dmin
#elif defined(WTYPE_Q3_K)
    h.t0 = wTexel(base, bpr, row, g, 0u);  // hmask
    h.t1 = wTexel(base, bpr, row, g, 1u);
    h.t2 = wTexel(base, bpr, row, g, 6u);  // scales, d
#endif
}

#ifdef WL_IQ4
// IQ4 scale of group s (its 16 quant bytes are texel 1 + s): IQ4_NL's is half s of t0; IQ4_XS's
// is d * (code - 32), d half 0 of t0, the code's high 2 bits in scales_h (half 1), its low 4 in
// scales_l (bytes 4..7).
float iq4Scale(uvec4 t0, uint s) {
#if defined(WTYPE_IQ4_NL)
    return halfOf(t0, s);
#else
    uint code = ((byteOf(t0, 4u + (s >> 1)) >> (4u * (s & 1u))) & 15u) | (((t0.x >> (16u + 2u * s)) & 3u) << 4);
    return halfOf(t0, 0u) * float(int(code) - 32);
#endif
}
#endif

// Q4_K/Q5_K 6-bit scale and min of sub-block s, from the 12 scale bytes at bytes 4..15 of t0.
uvec2 kScaleMin(uvec4 t0, uint s) {
    uint b0 = byteOf(t0, 4u + s), b4 = byteOf(t0, 8u + s);
    if (s < 4u) return uvec2(b0 & 63u, b4 & 63u);
    uint bm4 = byteOf(t0, s), b8 = byteOf(t0, 8u + s);
    return uvec2((b8 & 15u) | ((bm4 >> 6) << 4), (b8 >> 4) | ((byteOf(t0, 4u + s) >> 6) << 4));
}

#ifdef WTYPE_Q6_K
// Q6_K: the scales of the two 16-element halves of group 4hh + k (k 0..3): d times their int8s.
vec2 q6Scales(WHead h, uint hh, uint k) {
    uint si = 8u * hh + 2u * k;
    return halfOf(h.t1, 0u) * vec2(float(int(byteOf(h.t0, si) << 24) >> 24), float(int(byteOf(h.t0, si + 1u) << 24) >> 24));
}
// Q6_K's masked form of group k (0..3): each byte's 6-bit value put together in place, the nibbles
// of ql texel l (at shift 4 * (k >> 1)) with the crumbs of qh texel h (at 2k) moved above them.
uvec4 q6Bytes(uvec4 l, uvec4 h, uint k) {
    return ((l >> (4u * (k >> 1))) & 0x0F0F0F0Fu) | (((h >> (2u * k)) & 0x03030303u) << 4);
}
#endif

void wGroup(uint base, uint bpr, uint row, uint g, uint s, WHead h, out vec4 q[8], out vec2 sc, out vec2 mn) {
#if defined(WTYPE_Q8_0)
    float d = halfOf(h.t0, s);
    uvec4 a = wTexel(base, bpr, row, g, 1u + 2u * s), b = wTexel(base, bpr, row, g, 2u + 2u * s);
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = sbytes4(a[j]);
        q[j + 4u] = sbytes4(b[j]);
    }
    sc = vec2(d);
    mn = vec2(0.0);
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
    float d = halfOf(h.t0, s);
#if defined(WTYPE_Q4_0)
    uvec4 t = wTexel(base, bpr, row, g, 1u + s);
    float m = -8.0 * d;
#elif defined(WTYPE_Q4_1)
    uvec4 t = wTexel(base, bpr, row, g, 2u + s);
    float m = halfOf(h.t1, s);
#elif defined(WTYPE_Q5_0)
    uvec4 t = wTexel(base, bpr, row, g, 3u + s);
    uint qh = s < 4u ? h.t1[s] : h.t2[s - 4u];
    float m = -16.0 * d;
#else
    uvec4 t = wTexel(base, bpr, row, g, 4u + s);
    uint qh = s < 4u ? h.t2[s] : h.t3[s - 4u];
    float m = halfOf(h.t1, s);
#endif
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = nib4(t[j], 0u);
        q[j + 4u] = nib4(t[j], 4u);
#if defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
        q[j] += 16.0 * vec4((uvec4(qh) >> (uvec4(0u, 1u, 2u, 3u) + 4u * j)) & 1u);
        q[j + 4u] += 16.0 * vec4((uvec4(qh) >> (uvec4(16u, 17u, 18u, 19u) + 4u * j)) & 1u);
#endif
    }
    sc = vec2(d);
    mn = vec2(m);
#elif defined(WL_IQ4) || defined(WTYPE_MXFP4)
    // A table of 16 levels indexed by nibbles in Q4_0's order, one scale per group.
#ifdef WL_IQ4
    float d = iq4Scale(h.t0, s);
#define WL_LEVELS4 iq4Nib4
#else
    float d = mxfp4Scale(byteOf(h.t0, s));
#define WL_LEVELS4 mxfp4Nib4
#endif
    uvec4 t = wTexel(base, bpr, row, g, 1u + s);
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = WL_LEVELS4(t[j], 0u);
        q[j + 4u] = WL_LEVELS4(t[j], 4u);
    }
    sc = vec2(d);
    mn = vec2(0.0);
#elif defined(WTYPE_TQ2_0)
    // Group s: elements 128h + 32l + m, h = s / 4, l = s % 4: bits 2l of qs[32h + m].
    uint hh = s >> 2, l = s & 3u;
    uvec4 a = wTexel(base, bpr, row, g, 2u * hh), b = wTexel(base, bpr, row, g, 2u * hh + 1u);
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = crumb4(a[j], 2u * l);
        q[j + 4u] = crumb4(b[j], 2u * l);
    }
    float d = halfOf(h.t0, 0u);
    sc = vec2(d);
    mn = vec2(-d);
#elif defined(WTYPE_TQ1_0)
    // Groups 0..4: trit s of qs[0..31]; 5, 6: trits 2(s-5) and 2(s-5)+1 of qs[32..47]; 7: trit 4
    // of qs[32..47], then trits 0..3 of qh[0..3] (element 240 + 4n + j).
    if (s < 5u) {
        uvec4 a = wTexel(base, bpr, row, g, 0u), b = wTexel(base, bpr, row, g, 1u);
        for (uint j = 0u; j < 4u; ++j) {
            q[j] = trit4(a[j], s);
            q[j + 4u] = trit4(b[j], s);
        }
    } else {
        uint n0 = s == 7u ? 4u : 2u * (s - 5u);
        for (uint j = 0u; j < 4u; ++j) {
            q[j] = trit4(h.t0[j], n0);
            q[j + 4u] = s == 7u ? trit4(h.t1.x, j) : trit4(h.t0[j], n0 + 1u);
        }
    }
    float d = halfOf(h.t1, 2u);
    sc = vec2(d);
    mn = vec2(-d);
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    float d = halfOf(h.t0, 0u), dmin = halfOf(h.t0, 1u);
    uvec2 sm = kScaleMin(h.t0, s);
#if defined(WTYPE_Q4_K)
    const uint qt = 1u;
#else
    const uint qt = 3u;
#endif
    uvec4 a = wTexel(base, bpr, row, g, qt + 2u * (s >> 1)), b = wTexel(base, bpr, row, g, qt + 1u + 2u * (s >> 1));
    uint shift = 4u * (s & 1u);
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = nib4(a[j], shift);
        q[j + 4u] = nib4(b[j], shift);
#if defined(WTYPE_Q5_K)
        // bit s of qh bytes 0..31 (t1: bytes 0..15, t2: 16..31)
        q[j] += 16.0 * vec4((uvec4(h.t1[j]) >> (uvec4(0u, 8u, 16u, 24u) + s)) & 1u);
        q[j + 4u] += 16.0 * vec4((uvec4(h.t2[j]) >> (uvec4(0u, 8u, 16u, 24u) + s)) & 1u);
#endif
    }
    sc = vec2(d * float(sm.x));
    mn = vec2(-dmin * float(sm.y));
#elif defined(WTYPE_Q6_K)
    uint hh = s >> 2, k = s & 3u;
    uvec4 la = wTexel(base, bpr, row, g, 4u * hh + 2u * (k & 1u));
    uvec4 lb = wTexel(base, bpr, row, g, 4u * hh + 2u * (k & 1u) + 1u);
    uvec4 ha = wTexel(base, bpr, row, g, 8u + 2u * hh), hb = wTexel(base, bpr, row, g, 9u + 2u * hh);
    uint lshift = 4u * (k >> 1), hshift = 2u * k;
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = nib4(la[j], lshift) + 16.0 * crumb4(ha[j], hshift);
        q[j + 4u] = nib4(lb[j], lshift) + 16.0 * crumb4(hb[j], hshift);
    }
    vec2 scale = q6Scales(h, hh, k);  // d: byte 208 = texel 13, half 0
    sc = scale;
    mn = -32.0 * scale;
#elif defined(WTYPE_Q2_K)
    uint hh = s >> 2, j2 = s & 3u;
    uvec4 a = wTexel(base, bpr, row, g, 1u + 2u * hh), b = wTexel(base, bpr, row, g, 2u + 2u * hh);
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = crumb4(a[j], 2u * j2);
        q[j + 4u] = crumb4(b[j], 2u * j2);
    }
    float d = halfOf(h.t1, 0u), dmin = halfOf(h.t1, 1u);  // bytes 80, 82 = texel 5, halves 0, 1
    uint si = 8u * hh + 2u * j2;
    uint s0 = byteOf(h.t0, si), s1 = byteOf(h.t0, si + 1u);
    sc = d * vec2(float(s0 & 15u), float(s1 & 15u));
    mn = -dmin * vec2(float(s0 >> 4), float(s1 >> 4));
#elif defined(WTYPE_Q3_K)
    uint hh = s >> 2, j2 = s & 3u;
    uvec4 a = wTexel(base, bpr, row, g, 2u + 2u * hh), b = wTexel(base, bpr, row, g, 3u + 2u * hh);
    uint hbit = 4u * hh + j2;
    for (uint j = 0u; j < 4u; ++j) {
        q[j] = crumb4(a[j], 2u * j2) + 4.0 * vec4((uvec4(h.t0[j]) >> (uvec4(0u, 8u, 16u, 24u) + hbit)) & 1u);
        q[j + 4u] = crumb4(b[j], 2u * j2) + 4.0 * vec4((uvec4(h.t1[j]) >> (uvec4(0u, 8u, 16u, 24u) + hbit)) & 1u);
    }
    float d = halfOf(h.t2, 6u);  // byte 108 = texel 6 byte 12
    uint si = 8u * hh + 2u * j2;
    vec2 scv;
    for (uint c = 0u; c < 2u; ++c) {
        uint idx = si + c;
        uint low = idx < 8u ? (byteOf(h.t2, idx) & 15u) : (byteOf(h.t2, idx - 8u) >> 4);
        uint high = (byteOf(h.t2, 8u + (idx & 3u)) >> (2u * (idx >> 2))) & 3u;
        scv[c] = d * float(int(low | (high << 4)) - 32);
    }
    sc = scv;
    mn = -4.0 * scv;
#endif
}
#endif

// One element of `row` (element i), for EMBED.
float wElement(uint base, uint bpr, uint row, uint i) {
#ifdef WL_PLAIN
    vec4 a, b;
    plainTexel(wTexel(base, bpr, row, i / WL_E, 0u), a, b);
    uint j = i % WL_E;
    return j < 4u ? a[j] : b[j - 4u];
#else
    WHead h;
    wHead(base, bpr, row, i / WL_E, h);
    vec4 q[8];
    vec2 sc, mn;
    wGroup(base, bpr, row, i / WL_E, (i % WL_E) / 32u, h, q, sc, mn);
    uint j = i % 32u;
    uint half_index = j / 16u;
    return sc[half_index] * q[j >> 2][j & 3u] + mn[half_index];
#endif
}
