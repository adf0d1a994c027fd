// Quantized block formats: the CPU reference that defines what every GPU dequantize/matmul kernel
// must compute, and the quantizer behind `bluevm quantize`.
//
// Byte layouts are exactly llama.cpp's (GGUF files interoperate both ways); element counts and
// block sizes come from the type table in vm/dtype.h. All multi-byte fields are little-endian;
// `half` fields are IEEE fp16 bits (vm/half.h). In the diagrams, element i is the i-th value of the
// block after dequantization, "lo(b)" is b & 0xF and "hi(b)" is b >> 4.
//
// Rows are whole numbers of blocks; a tensor whose row length is not a multiple of its type's
// block cannot be stored in that type (see checkQuantizable / quantFallback).
#pragma once

#include <cstdint>

#include "vm/dtype.h"
#include "vm/status.h"

namespace blue {

constexpr int kQBlock = 32;   // elements per block of Q4_0..Q8_1
constexpr int kKBlock = 256;  // elements per super-block of the K-quants

#pragma pack(push, 1)

// Q4_0, 18 bytes:  [d:half][qs:16]
//   element i <  16: lo(qs[i])      element i >= 16: hi(qs[i-16])
//   x = (q - 8) * d
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[16];
};

// Q4_1, 20 bytes:  [d:half][m:half][qs:16]   nibbles as Q4_0;  x = q * d + m
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
};

// Q5_0, 22 bytes:  [d:half][qh:4][qs:16]
//   h = little-endian uint32 of qh;  element i: q = nibble as Q4_0 | (bit i of h) << 4
//   x = (q - 16) * d
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};

// Q5_1, 24 bytes:  [d:half][m:half][qh:4][qs:16]   q as Q5_0;  x = q * d + m
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};

// Q8_0, 34 bytes:  [d:half][qs:32 x int8]   x = qs[i] * d
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};

// Q8_1, 36 bytes:  [d:half][s:half][qs:32 x int8]   x = qs[i] * d;  s = d * sum(qs) (metadata for
// dot products, not used to dequantize).
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[32];
};

// Q2_K, 84 bytes:  [scales:16][qs:64][d:half][dmin:half]
//   16 sub-blocks of 16; element i = 128*h + 32*j + l  (h 0..1, j 0..3, l 0..31)
//   q  = (qs[32*h + l] >> 2*j) & 3                      (2 bits)
//   sub-block s = 8*h + 2*j + l/16 (= i/16):  sc = lo(scales[s]), mn = hi(scales[s])
//   x = d*sc*q - dmin*mn
struct BlockQ2_K {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d;
    uint16_t dmin;
};

// Q3_K, 110 bytes: [hmask:32][qs:64][scales:12][d:half]
//   element i = 128*h + 32*j + l as Q2_K;  low 2 bits (qs[32*h + l] >> 2*j) & 3,
//   high bit: bit (4*h + j) of hmask[l];  q = low | high << 2, value q - 4 (-4..3)
//   16 signed 6-bit scales, sub-block s = i/16:
//     low 4 bits:  s < 8 ? lo(scales[s]) : hi(scales[s - 8])
//     high 2 bits: (scales[8 + s%4] >> 2*(s/4)) & 3;    sc = (low | high << 4) - 32
//   x = d * sc * (q - 4)
struct BlockQ3_K {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
};

// Q4_K, 144 bytes: [d:half][dmin:half][scales:12][qs:128]
//   8 sub-blocks of 32; element i = 64*g + 32*k + l  (g 0..3, k 0..1, l 0..31)
//   q = k ? hi(qs[32*g + l]) : lo(qs[32*g + l]);   sub-block s = 2*g + k (= i/32)
//   6-bit scale sc and min mn of sub-block s (b = scales):
//     s < 4:  sc = b[s] & 63                          mn = b[s+4] & 63
//     s >= 4: sc = lo(b[s+4]) | (b[s-4] >> 6) << 4    mn = hi(b[s+4]) | (b[s] >> 6) << 4
//   x = d*sc*q - dmin*mn
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};

// Q5_K, 176 bytes: [d:half][dmin:half][scales:12][qh:32][qs:128]
//   as Q4_K, plus a 5th bit: bit (2*g + k) of qh[l] (= bit i/32 of qh[i%32]), q = nibble | bit << 4
//   x = d*sc*q - dmin*mn
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};

// Q6_K, 210 bytes: [ql:128][qh:64][scales:16 x int8][d:half]
//   element i = 128*h + 32*k + l  (h 0..1, k 0..3, l 0..31)
//   low 4 bits from byte ql[64*h + 32*(k%2) + l], its low nibble for k < 2, its high one for k >= 2
//     (k 0: lo(ql[64h+l]), 1: lo(ql[64h+32+l]), 2: hi(ql[64h+l]), 3: hi(ql[64h+32+l]))
//   high 2 bits: (qh[32*h + l] >> 2*k) & 3;   q = low | high << 4, value q - 32 (-32..31)
//   sub-block s = i/16 (= 8*h + 2*k + l/16);  x = d * scales[s] * (q - 32)
struct BlockQ6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};

// Q8_K, 292 bytes: [d:f32][qs:256 x int8][bsums:16 x int16]
//   x = d * qs[i];  bsums[s] = sum of qs[16*s .. 16*s+15] (metadata for dot products).
struct BlockQ8_K {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};

// The 16 levels of the non-linear 4-bit formats (llama.cpp's kvalues_iq4nl): a 4-bit code c
// stands for kIq4Values[c]. Denser near zero, where most weights are; asymmetric (-127..113).
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_NL, 18 bytes: [d:half][qs:16]   nibbles as Q4_0;  x = d * kIq4Values[nibble]
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};

// IQ4_XS, 136 bytes: [d:half][scales_h:2][scales_l:4][qs:128]
//   8 sub-blocks of 32; sub-block s = i/32 keeps its elements in qs[16*s .. 16*s+15], nibbles as
//   Q4_0 (element 32s + j, j < 16: lo(qs[16s + j]); j >= 16: hi(qs[16s + j - 16])).
//   6-bit scale of sub-block s (h = little-endian uint16 of scales_h):
//     ls = (scales_l[s/2] >> 4*(s%2)) & 0xF | ((h >> 2*s) & 3) << 4;   signed scale ls - 32
//   x = d * (ls - 32) * kIq4Values[nibble]
struct BlockIQ4_XS {
    uint16_t d;
    uint8_t scales_h[2];
    uint8_t scales_l[4];
    uint8_t qs[128];
};

// TQ2_0, 66 bytes: [qs:64][d:half]   ternary, 2 bits per element (BitNet b1.58 weights)
//   element 128h + 32l + m (h < 2, l < 4, m < 32) is bits 2l..2l+1 of qs[32h + m], code c in
//   0..2; x = d * (c - 1)
struct BlockTQ2_0 {
    uint8_t qs[64];
    uint16_t d;
};

// TQ1_0, 54 bytes: [qs:48][qh:4][d:half]   ternary, 1.6875 bits per element
//   each byte holds trits t0..t4 (t0 most significant) as the fixed-point fraction
//   ceil(256 * (t0 3^4 + t1 3^3 + t2 3^2 + t3 3 + t4) / 243); trit n of byte b is
//   (((b * 3^n) mod 256) * 3) >> 8. Elements: 32n + m from trit n of qs[m] (m < 32, n < 5), then
//   160 + 16n + m from trit n of qs[32 + m] (m < 16), then 240 + 4n + j from trit n of qh[j]
//   (j < 4, n < 4; qh bytes hold 4 trits and a 0). x = d * (trit - 1)
struct BlockTQ1_0 {
    uint8_t qs[48];
    uint8_t qh[4];
    uint16_t d;
};

// The 16 levels of MXFP4's FP4 (E2M1) codes, doubled to integers as llama.cpp keeps them
// (kvalues_mxfp4): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2, bit 3 the sign.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// MXFP4, 17 bytes: [e:u8][qs:16]   OCP microscaling FP4: nibbles as Q4_0; shared scale E8M0
//   x = 2^(e - 128) * kMxfp4Values[nibble]   (2^(e - 127) times the undoubled FP4 value)
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[16];
};

#pragma pack(pop)

// True for the types dequantizeRow and dotRow accept: every `supported` type of the table
// (F32, F16, BF16, the quantized formats above, and the integer types I8/I16/I32).
bool quantCanDecode(DType t);

// True for the types quantizeRow accepts: F32, F16, BF16 and the quantized formats above.
bool quantCanEncode(DType t);

// Decodes `n` elements from `src` (dtypeRowBytes(t, n) bytes) into `dst` (n floats).
// Precondition (asserted): quantCanDecode(t) and n a whole number of blocks; callers holding
// untrusted sizes check them with dtypeRowBytes first. Integer types convert to the nearest float.
void dequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Encodes `n` floats into `dst` (dtypeRowBytes(t, n) bytes). Precondition (asserted):
// quantCanEncode(t) and n a whole number of blocks. Deterministic: same input, same bytes.
// Finite input never yields NaN or inf on decode: block scales that would exceed the fp16 range
// saturate at 65504 and the values they cannot reach are clamped. Non-finite input is the
// caller's error; it causes no undefined behaviour but the block contents are unspecified.
// The K-quants search each sub-block's scale (and min) by least squares (see quant_k.cpp); IQ4_NL
// and IQ4_XS search each 32-element block's scale against the non-linear levels (quant_iq4.cpp),
// TQ1_0/TQ2_0 the ternary threshold and MXFP4 the shared exponent (quant_low.cpp).
void quantizeRow(DType t, const float* src, void* dst, int64_t n);

// As quantizeRow, but the K-quants and IQ4 types take each (sub-)block's scale (and min) from its
// plain min/max range, without the search. Exists only to measure what the search gains; other
// types encode exactly as quantizeRow.
void quantizeRowBaseline(DType t, const float* src, void* dst, int64_t n);

// Dot product of an encoded row (n elements of type t) with `x` (n floats): each block is
// dequantized to f32, each product is formed and summed in double in element order, and the sum
// is rounded to float once. Same preconditions as dequantizeRow.
float dotRow(DType t, const void* row, const float* x, int64_t n);

// Whether rows of `row_len` elements can be stored as `t`: fails (message names the type, the row
// length and the block size) for types quantizeRow cannot produce, for row_len <= 0, and for row
// lengths that are not a multiple of the type's block. The caller prefixes the tensor name.
Status checkQuantizable(DType t, int64_t row_len);

// The type to store a tensor with rows of `row_len` (> 0) elements when `wanted` was asked for
// (quantCanEncode(wanted) asserted):
//   - `wanted` itself when row_len is a multiple of its block;
//   - else, for a 256-element format, the 32-element format of similar size when row_len is a
//     multiple of 32 (llama.cpp's rule in llama_tensor_get_type):
//     Q2_K, Q3_K, IQ4_XS -> IQ4_NL;  Q4_K -> Q5_0;  Q5_K -> Q5_1;  Q6_K, Q8_K -> Q8_0;
//     TQ1_0, TQ2_0 -> Q4_0;
//   - else F16 (e.g. stories260K's ffn_down, rows of 172).
DType quantFallback(DType wanted, int64_t row_len);

}  // namespace blue
