// Row-level entry points of the quantized formats (see quant.h): dispatch on the element type, the
// plain types (F32/F16/BF16/integers), the 32-element formats Q4_0..Q8_1, the dot product and the
// storability rules. The K-quants live in quant_k.cpp, IQ4_NL and IQ4_XS in quant_iq4.cpp, TQ1_0,
// TQ2_0 and MXFP4 in quant_low.cpp.
#include "vm/quant.h"

#include <cassert>
#include <cstring>

#include "vm/half.h"
#include "vm/quant_internal.h"

namespace blue {

namespace {
using namespace quant_internal;

// The table in dtype.h is the one source of block geometry; the structs must match it.
constexpr DTypeInfo tableEntry(DType t) {
    switch (t) {
#define BLUE_DTYPE_CASE(name, id, be, bb, sup) \
    case DType::name:                          \
        return {DType::name, #name, be, bb, sup};
        BLUE_DTYPES(BLUE_DTYPE_CASE)
#undef BLUE_DTYPE_CASE
    }
    return {};
}
template <class Block>
constexpr bool matchesTable(DType t, uint32_t elems) {
    return sizeof(Block) == tableEntry(t).block_bytes && elems == tableEntry(t).block_elems;
}
static_assert(matchesTable<BlockQ4_0>(DType::Q4_0, kQBlock));
static_assert(matchesTable<BlockQ4_1>(DType::Q4_1, kQBlock));
static_assert(matchesTable<BlockQ5_0>(DType::Q5_0, kQBlock));
static_assert(matchesTable<BlockQ5_1>(DType::Q5_1, kQBlock));
static_assert(matchesTable<BlockQ8_0>(DType::Q8_0, kQBlock));
static_assert(matchesTable<BlockQ8_1>(DType::Q8_1, kQBlock));
static_assert(matchesTable<BlockQ2_K>(DType::Q2_K, kKBlock));
static_assert(matchesTable<BlockQ3_K>(DType::Q3_K, kKBlock));
static_assert(matchesTable<BlockQ4_K>(DType::Q4_K, kKBlock));
static_assert(matchesTable<BlockQ5_K>(DType::Q5_K, kKBlock));
static_assert(matchesTable<BlockQ6_K>(DType::Q6_K, kKBlock));
static_assert(matchesTable<BlockQ8_K>(DType::Q8_K, kKBlock));
static_assert(matchesTable<BlockIQ4_NL>(DType::IQ4_NL, kQBlock));
static_assert(matchesTable<BlockIQ4_XS>(DType::IQ4_XS, kKBlock));
static_assert(matchesTable<BlockTQ1_0>(DType::TQ1_0, kKBlock));
static_assert(matchesTable<BlockTQ2_0>(DType::TQ2_0, kKBlock));
static_assert(matchesTable<BlockMXFP4>(DType::MXFP4, kQBlock));

// ---- 32-element formats: decode ----

void decodeQ4_0(const BlockQ4_0& b, float* y) {
    const float d = halfToF32(b.d);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(int(b.qs[j] & 0xF) - 8) * d;
        y[j + 16] = float(int(b.qs[j] >> 4) - 8) * d;
    }
}

void decodeQ4_1(const BlockQ4_1& b, float* y) {
    const float d = halfToF32(b.d);
    const float m = halfToF32(b.m);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(b.qs[j] & 0xF) * d + m;
        y[j + 16] = float(b.qs[j] >> 4) * d + m;
    }
}

// The 5-bit values of a Q5_0/Q5_1 block, 0..31.
void unpack5(const uint8_t qh[4], const uint8_t qs[16], int* q) {
    const uint32_t h =
        uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
    for (int j = 0; j < 16; ++j) {
        q[j] = int(qs[j] & 0xF) | int((h >> j) & 1u) << 4;
        q[j + 16] = int(qs[j] >> 4) | int((h >> (j + 16)) & 1u) << 4;
    }
}

void pack5(const int* q, uint8_t qh[4], uint8_t qs[16]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        h |= uint32_t(q[j] >> 4) << j | uint32_t(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; ++k) qh[k] = uint8_t(h >> (8 * k));
}

void decodeQ5_0(const BlockQ5_0& b, float* y) {
    const float d = halfToF32(b.d);
    int q[32];
    unpack5(b.qh, b.qs, q);
    for (int j = 0; j < 32; ++j) y[j] = float(q[j] - 16) * d;
}

void decodeQ5_1(const BlockQ5_1& b, float* y) {
    const float d = halfToF32(b.d);
    const float m = halfToF32(b.m);
    int q[32];
    unpack5(b.qh, b.qs, q);
    for (int j = 0; j < 32; ++j) y[j] = float(q[j]) * d + m;
}

void decodeQ8_0(const BlockQ8_0& b, float* y) {
    const float d = halfToF32(b.d);
    for (int j = 0; j < 32; ++j) y[j] = float(b.qs[j]) * d;
}

void decodeQ8_1(const BlockQ8_1& b, float* y) {
    const float d = halfToF32(b.d);
    for (int j = 0; j < 32; ++j) y[j] = float(b.qs[j]) * d;
}

// ---- 32-element formats: encode (the standard reference rules) ----

// 1 / d for a decoded fp16 scale (|1/d| <= 2^24, finite), 0 for d = 0.
float inverse(float d) {
    return d != 0.0f ? 1.0f / d : 0.0f;
}

// Symmetric formats: the largest-magnitude element maps to -2^(bits-1) (the end with one more
// level), its sign kept; q = round(x/d) + offset.
void encodeSymmetric(const float* x, int bits, uint16_t& d_out, int* q) {
    const int offset = 1 << (bits - 1);
    const float xm = x[argMaxAbs(x, kQBlock)];
    d_out = halfScale(double(xm) / -offset);
    const float id = inverse(halfToF32(d_out));
    for (int j = 0; j < kQBlock; ++j)
        q[j] = roundClamp(x[j] * id + float(offset), 0, 2 * offset - 1);
}

// Affine formats: x = q*d + m with m = min(x), d = (max - min) / (2^bits - 1).
void encodeAffine(const float* x, int bits, uint16_t& d_out, uint16_t& m_out, int* q) {
    const int nmax = (1 << bits) - 1;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQBlock; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
    }
    d_out = halfScale((double(hi) - double(lo)) / nmax);
    m_out = halfScale(lo);
    const float id = inverse(halfToF32(d_out));
    const float m = halfToF32(m_out);
    for (int j = 0; j < kQBlock; ++j) q[j] = roundClamp((x[j] - m) * id, 0, nmax);
}

void pack4(const int* q, uint8_t qs[16]) {
    for (int j = 0; j < 16; ++j) qs[j] = uint8_t(q[j] | q[j + 16] << 4);
}

void encodeQ4_0(const float* x, BlockQ4_0& b) {
    int q[32];
    encodeSymmetric(x, 4, b.d, q);
    pack4(q, b.qs);
}

void encodeQ4_1(const float* x, BlockQ4_1& b) {
    int q[32];
    encodeAffine(x, 4, b.d, b.m, q);
    pack4(q, b.qs);
}

void encodeQ5_0(const float* x, BlockQ5_0& b) {
    int q[32];
    encodeSymmetric(x, 5, b.d, q);
    pack5(q, b.qh, b.qs);
}

void encodeQ5_1(const float* x, BlockQ5_1& b) {
    int q[32];
    encodeAffine(x, 5, b.d, b.m, q);
    pack5(q, b.qh, b.qs);
}

// d = max|x| / 127, q = round(x / d); returns sum(q).
int encode8(const float* x, uint16_t& d_out, int8_t* qs) {
    const float amax = std::fabs(x[argMaxAbs(x, kQBlock)]);
    d_out = halfScale(double(amax) / 127.0);
    const float id = inverse(halfToF32(d_out));
    int sum = 0;
    for (int j = 0; j < kQBlock; ++j) {
        qs[j] = int8_t(roundClamp(x[j] * id, -128, 127));
        sum += qs[j];
    }
    return sum;
}

void encodeQ8_0(const float* x, BlockQ8_0& b) {
    encode8(x, b.d, b.qs);
}

void encodeQ8_1(const float* x, BlockQ8_1& b) {
    const int sum = encode8(x, b.d, b.qs);
    b.s = halfScale(double(halfToF32(b.d)) * sum);
}

// ---- row loops ----

template <class Block>
void decodeBlocks(const void* src, float* dst, int64_t n, int elems,
                  void (*decode)(const Block&, float*)) {
    const auto* blocks = static_cast<const Block*>(src);  // packed structs: any alignment is fine
    for (int64_t i = 0; i < n / elems; ++i) decode(blocks[i], dst + i * elems);
}

template <class Block, class Encode>
void encodeBlocks(const float* src, void* dst, int64_t n, int elems, Encode encode) {
    auto* blocks = static_cast<Block*>(dst);
    for (int64_t i = 0; i < n / elems; ++i) encode(src + i * elems, blocks[i]);
}

template <class T>
void decodePlain(const void* src, float* dst, int64_t n, float (*convert)(T)) {
    const auto* bytes = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, bytes + i * int64_t(sizeof(T)), sizeof(T));
        dst[i] = convert(v);
    }
}

template <class T>
void encodePlain(const float* src, void* dst, int64_t n, T (*convert)(float)) {
    auto* bytes = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
        const T v = convert(src[i]);
        std::memcpy(bytes + i * int64_t(sizeof(T)), &v, sizeof(T));
    }
}

float identity(float v) {
    return v;
}
template <class T>
float intToF32(T v) {
    return float(v);
}

void assertRow(DType t, [[maybe_unused]] int64_t n) {
    [[maybe_unused]] const auto info = dtypeInfo(t);
    assert(info && info->supported && "type has no CPU reference");
    assert(n >= 0 && n % info->block_elems == 0 && "row is not a whole number of blocks");
}

void encodeRow(DType t, const float* src, void* dst, int64_t n, bool search) {
    assert(quantCanEncode(t) && "quantizeRow: type cannot be encoded");
    assertRow(t, n);
    switch (t) {
        case DType::F32:
            std::memcpy(dst, src, size_t(n) * sizeof(float));
            return;
        case DType::F16:
            encodePlain<uint16_t>(src, dst, n, halfFromF32);
            return;
        case DType::BF16:
            encodePlain<uint16_t>(src, dst, n, bf16FromF32);
            return;
        case DType::Q4_0:
            encodeBlocks<BlockQ4_0>(src, dst, n, kQBlock, encodeQ4_0);
            return;
        case DType::Q4_1:
            encodeBlocks<BlockQ4_1>(src, dst, n, kQBlock, encodeQ4_1);
            return;
        case DType::Q5_0:
            encodeBlocks<BlockQ5_0>(src, dst, n, kQBlock, encodeQ5_0);
            return;
        case DType::Q5_1:
            encodeBlocks<BlockQ5_1>(src, dst, n, kQBlock, encodeQ5_1);
            return;
        case DType::Q8_0:
            encodeBlocks<BlockQ8_0>(src, dst, n, kQBlock, encodeQ8_0);
            return;
        case DType::Q8_1:
            encodeBlocks<BlockQ8_1>(src, dst, n, kQBlock, encodeQ8_1);
            return;
        case DType::Q8_K:
            encodeBlocks<BlockQ8_K>(src, dst, n, kKBlock, encodeQ8_K);
            return;
        default:
            break;
    }
    auto k = [search](auto encode) {
        return [=](const float* x, auto& b) { encode(x, b, search); };
    };
    switch (t) {
        case DType::Q2_K:
            encodeBlocks<BlockQ2_K>(src, dst, n, kKBlock, k(encodeQ2_K));
            return;
        case DType::Q3_K:
            encodeBlocks<BlockQ3_K>(src, dst, n, kKBlock, k(encodeQ3_K));
            return;
        case DType::Q4_K:
            encodeBlocks<BlockQ4_K>(src, dst, n, kKBlock, k(encodeQ4_K));
            return;
        case DType::Q5_K:
            encodeBlocks<BlockQ5_K>(src, dst, n, kKBlock, k(encodeQ5_K));
            return;
        case DType::Q6_K:
            encodeBlocks<BlockQ6_K>(src, dst, n, kKBlock, k(encodeQ6_K));
            return;
        case DType::IQ4_NL:
            encodeBlocks<BlockIQ4_NL>(src, dst, n, kQBlock, k(encodeIQ4_NL));
            return;
        case DType::IQ4_XS:
            encodeBlocks<BlockIQ4_XS>(src, dst, n, kKBlock, k(encodeIQ4_XS));
            return;
        case DType::TQ1_0:
            encodeBlocks<BlockTQ1_0>(src, dst, n, kKBlock, k(encodeTQ1_0));
            return;
        case DType::TQ2_0:
            encodeBlocks<BlockTQ2_0>(src, dst, n, kKBlock, k(encodeTQ2_0));
            return;
        case DType::MXFP4:
            encodeBlocks<BlockMXFP4>(src, dst, n, kQBlock, k(encodeMXFP4));
            return;
        default:
            assert(false && "unreachable: quantCanEncode covers the cases above");
    }
}

}  // namespace

bool quantCanDecode(DType t) {
    const auto info = dtypeInfo(t);
    return info && info->supported;
}

bool quantCanEncode(DType t) {
    switch (t) {
        case DType::I8:
        case DType::I16:
        case DType::I32:
            return false;
        default:
            return quantCanDecode(t);
    }
}

void dequantizeRow(DType t, const void* src, float* dst, int64_t n) {
    assertRow(t, n);
    switch (t) {
        case DType::F32:
            decodePlain<float>(src, dst, n, identity);
            return;
        case DType::F16:
            decodePlain<uint16_t>(src, dst, n, halfToF32);
            return;
        case DType::BF16:
            decodePlain<uint16_t>(src, dst, n, bf16ToF32);
            return;
        case DType::I8:
            decodePlain<int8_t>(src, dst, n, intToF32<int8_t>);
            return;
        case DType::I16:
            decodePlain<int16_t>(src, dst, n, intToF32<int16_t>);
            return;
        case DType::I32:
            decodePlain<int32_t>(src, dst, n, intToF32<int32_t>);
            return;
        case DType::Q4_0:
            decodeBlocks<BlockQ4_0>(src, dst, n, kQBlock, decodeQ4_0);
            return;
        case DType::Q4_1:
            decodeBlocks<BlockQ4_1>(src, dst, n, kQBlock, decodeQ4_1);
            return;
        case DType::Q5_0:
            decodeBlocks<BlockQ5_0>(src, dst, n, kQBlock, decodeQ5_0);
            return;
        case DType::Q5_1:
            decodeBlocks<BlockQ5_1>(src, dst, n, kQBlock, decodeQ5_1);
            return;
        case DType::Q8_0:
            decodeBlocks<BlockQ8_0>(src, dst, n, kQBlock, decodeQ8_0);
            return;
        case DType::Q8_1:
            decodeBlocks<BlockQ8_1>(src, dst, n, kQBlock, decodeQ8_1);
            return;
        case DType::Q2_K:
            decodeBlocks<BlockQ2_K>(src, dst, n, kKBlock, decodeQ2_K);
            return;
        case DType::Q3_K:
            decodeBlocks<BlockQ3_K>(src, dst, n, kKBlock, decodeQ3_K);
            return;
        case DType::Q4_K:
            decodeBlocks<BlockQ4_K>(src, dst, n, kKBlock, decodeQ4_K);
            return;
        case DType::Q5_K:
            decodeBlocks<BlockQ5_K>(src, dst, n, kKBlock, decodeQ5_K);
            return;
        case DType::Q6_K:
            decodeBlocks<BlockQ6_K>(src, dst, n, kKBlock, decodeQ6_K);
            return;
        case DType::Q8_K:
            decodeBlocks<BlockQ8_K>(src, dst, n, kKBlock, decodeQ8_K);
            return;
        case DType::IQ4_NL:
            decodeBlocks<BlockIQ4_NL>(src, dst, n, kQBlock, decodeIQ4_NL);
            return;
        case DType::IQ4_XS:
            decodeBlocks<BlockIQ4_XS>(src, dst, n, kKBlock, decodeIQ4_XS);
            return;
        case DType::TQ1_0:
            decodeBlocks<BlockTQ1_0>(src, dst, n, kKBlock, decodeTQ1_0);
            return;
        case DType::TQ2_0:
            decodeBlocks<BlockTQ2_0>(src, dst, n, kKBlock, decodeTQ2_0);
            return;
        case DType::MXFP4:
            decodeBlocks<BlockMXFP4>(src, dst, n, kQBlock, decodeMXFP4);
            return;
        default:
            assert(false && "unreachable: assertRow admits only supported types");
    }
}

void quantizeRow(DType t, const float* src, void* dst, int64_t n) {
    encodeRow(t, src, dst, n, true);
}

void quantizeRowBaseline(DType t, const float* src, void* dst, int64_t n) {
    encodeRow(t, src, dst, n, false);
}

float dotRow(DType t, const void* row, const float* x, int64_t n) {
    assertRow(t, n);
    const DTypeInfo info = *dtypeInfo(t);
    // Whole blocks at a time; plain types in chunks of kKBlock elements.
    const int64_t chunk = info.block_elems > 1 ? info.block_elems : kKBlock;
    const auto* bytes = static_cast<const uint8_t*>(row);
    float buf[kKBlock];
    double acc = 0.0;
    for (int64_t off = 0; off < n; off += chunk) {
        const int64_t m = std::min(chunk, n - off);
        dequantizeRow(t, bytes + off / info.block_elems * info.block_bytes, buf, m);
        for (int64_t i = 0; i < m; ++i) acc += double(buf[i]) * double(x[off + i]);
    }
    return float(acc);
}

Status checkQuantizable(DType t, int64_t row_len) {
    const std::string name(dtypeName(t));
    if (!quantCanEncode(t)) {
        return BLUE_ERROR("cannot store weights as %s: BlueVM does not quantize to this type",
                          name.c_str());
    }
    const uint32_t block = dtypeInfo(t)->block_elems;
    if (row_len <= 0) {
        return BLUE_ERROR("cannot store rows of %lld elements as %s: row length must be positive",
                          static_cast<long long>(row_len), name.c_str());
    }
    if (row_len % block != 0) {
        return BLUE_ERROR(
            "cannot store rows of %lld elements as %s: row length must be a multiple of its block "
            "of %u",
            static_cast<long long>(row_len), name.c_str(), block);
    }
    return Status::ok();
}

DType quantFallback(DType wanted, int64_t row_len) {
    assert(quantCanEncode(wanted) && row_len > 0);
    if (row_len % dtypeInfo(wanted)->block_elems == 0) return wanted;
    DType alt = DType::F16;
    switch (wanted) {
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::IQ4_XS:
            alt = DType::IQ4_NL;
            break;
        case DType::Q4_K:
            alt = DType::Q5_0;
            break;
        case DType::Q5_K:
            alt = DType::Q5_1;
            break;
        case DType::Q6_K:
        case DType::Q8_K:
            alt = DType::Q8_0;
            break;
        case DType::TQ1_0:
        case DType::TQ2_0:
            alt = DType::Q4_0;
            break;
        default:
            break;
    }
    return row_len % dtypeInfo(alt)->block_elems == 0 ? alt : DType::F16;
}

}  // namespace blue
