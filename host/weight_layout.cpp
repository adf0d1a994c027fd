// Weight repacking for the GPU (see weight_layout.h).
#include "host/weight_layout.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace blue {

namespace {

constexpr uint64_t kTexel = 16;

// How a type's llama blocks map onto gblocks: for the 32-element types, the byte ranges of one
// llama block (scale d, min m, qh, quants) and where they go.
struct SmallQuant {
    uint32_t block_bytes;  // llama block size
    int m_at;              // byte offset of m in the block, -1 when none
    int qh_at;             // byte offset of qh (4 bytes), -1 when none
    uint32_t qs_at;        // byte offset of the quant bytes
    uint32_t qs_bytes;     // 16 or 32
};

bool smallQuant(DType t, SmallQuant* q) {
    switch (t) {
        case DType::Q8_0: *q = {34, -1, -1, 2, 32}; return true;
        case DType::Q4_0: *q = {18, -1, -1, 2, 16}; return true;
        case DType::IQ4_NL: *q = {18, -1, -1, 2, 16}; return true;
        case DType::Q4_1: *q = {20, 2, -1, 4, 16}; return true;
        case DType::Q5_0: *q = {22, -1, 2, 6, 16}; return true;
        case DType::Q5_1: *q = {24, 2, 4, 8, 16}; return true;
        default: return false;
    }
}

uint32_t smallQuantTexels(const SmallQuant& q) {
    return 1 + (q.m_at >= 0 ? 1 : 0) + (q.qh_at >= 0 ? 2 : 0) + 8 * (q.qs_bytes / 16);
}

// Pointer to texel t of gblock g of `row` in the GPU layout.
uint8_t* texelAt(uint8_t* dst, const WeightLayout& l, uint64_t row, uint64_t g, uint64_t t) {
    uint64_t index = (((row / 8) * l.blocks_per_row + g) * l.block_texels + t) * 8 + row % 8;
    return dst + index * kTexel;
}

void repackPlainRow(DType type, const uint8_t* src, uint64_t k, const WeightLayout& l, uint64_t row,
                    uint8_t* dst) {
    uint64_t elem = type == DType::F32 ? 4 : 2;
    uint64_t row_bytes = k * elem;
    const uint8_t* s = src + row * row_bytes;
    for (uint64_t g = 0; g < l.blocks_per_row; ++g) {
        uint64_t from = g * kTexel, n = std::min<uint64_t>(kTexel, row_bytes - from);
        std::memcpy(texelAt(dst, l, row, g, 0), s + from, n);
    }
}

void repackSmallQuantRow(const SmallQuant& q, const uint8_t* src, uint64_t k, const WeightLayout& l,
                         uint64_t row, uint8_t* dst) {
    uint64_t blocks = k / 32;
    const uint8_t* s = src + row * blocks * q.block_bytes;
    for (uint64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = s + b * q.block_bytes;
        uint64_t g = b / 8, i = b % 8;
        uint32_t t = 0;
        std::memcpy(texelAt(dst, l, row, g, t++) + 2 * i, blk, 2);  // d
        if (q.m_at >= 0) std::memcpy(texelAt(dst, l, row, g, t++) + 2 * i, blk + q.m_at, 2);
        if (q.qh_at >= 0) {
            std::memcpy(texelAt(dst, l, row, g, t + i / 4) + 4 * (i % 4), blk + q.qh_at, 4);
            t += 2;
        }
        uint32_t per = q.qs_bytes / 16;
        for (uint32_t p = 0; p < per; ++p) {
            std::memcpy(texelAt(dst, l, row, g, t + i * per + p), blk + q.qs_at + 16 * p, 16);
        }
    }
}

void repackKQuantRow(DType type, const uint8_t* src, uint64_t k, const WeightLayout& l, uint64_t row,
                     uint8_t* dst) {
    uint32_t bytes = dtypeInfo(type)->block_bytes;
    uint64_t blocks = k / 256;
    const uint8_t* s = src + row * blocks * bytes;
    for (uint64_t b = 0; b < blocks; ++b) {
        for (uint32_t t = 0; t * kTexel < bytes; ++t) {
            uint32_t n = std::min<uint32_t>(uint32_t(kTexel), bytes - t * uint32_t(kTexel));
            std::memcpy(texelAt(dst, l, row, b, t), s + b * bytes + t * kTexel, n);
        }
    }
}

// IQ4_XS: the 8-byte header (d, scales_h, scales_l) in texel 0, sub-block s's 16 quant bytes in
// texel 1 + s (in the file they start at byte 8 and straddle texels).
void repackIq4XsRow(const uint8_t* src, uint64_t k, const WeightLayout& l, uint64_t row,
                    uint8_t* dst) {
    constexpr uint32_t kBytes = 136, kHead = 8;
    uint64_t blocks = k / 256;
    const uint8_t* s = src + row * blocks * kBytes;
    for (uint64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = s + b * kBytes;
        std::memcpy(texelAt(dst, l, row, b, 0), blk, kHead);
        for (uint32_t t = 0; t < 8; ++t) {
            std::memcpy(texelAt(dst, l, row, b, 1 + t), blk + kHead + t * kTexel, kTexel);
        }
    }
}

// MXFP4: the 8 blocks' E8M0 scale bytes in bytes 0..7 of texel 0, block i's 16 quant bytes in
// texel 1 + i (Q4_0's shape with a byte scale).
void repackMxfp4Row(const uint8_t* src, uint64_t k, const WeightLayout& l, uint64_t row,
                    uint8_t* dst) {
    constexpr uint32_t kBytes = 17;
    uint64_t blocks = k / 32;
    const uint8_t* s = src + row * blocks * kBytes;
    for (uint64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = s + b * kBytes;
        uint64_t g = b / 8, i = b % 8;
        texelAt(dst, l, row, g, 0)[i] = blk[0];
        std::memcpy(texelAt(dst, l, row, g, 1 + i), blk + 1, kTexel);
    }
}

}  // namespace

bool weightLayout(DType type, uint64_t k, uint64_t n, WeightLayout* out) {
    WeightLayout l;
    SmallQuant q;
    switch (type) {
        case DType::F32: l.block_elems = 4; l.block_texels = 1; break;
        case DType::F16:
        case DType::BF16: l.block_elems = 8; l.block_texels = 1; break;
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::TQ1_0:
        case DType::TQ2_0:
            l.block_elems = 256;
            l.block_texels = (dtypeInfo(type)->block_bytes + 15) / 16;
            break;
        case DType::IQ4_XS:
        case DType::MXFP4: l.block_elems = 256; l.block_texels = 9; break;
        default:
            if (!smallQuant(type, &q)) return false;
            l.block_elems = 256;
            l.block_texels = smallQuantTexels(q);
    }
    l.blocks_per_row = (k + l.block_elems - 1) / l.block_elems;
    l.rows_padded = (n + 7) / 8 * 8;
    l.bytes = l.rows_padded * l.blocks_per_row * l.block_texels * kTexel;
    *out = l;
    return true;
}

void repackRows(DType type, const uint8_t* src, uint64_t k, uint64_t n, const WeightLayout& layout,
                uint64_t row_begin, uint64_t row_end, uint8_t* dst) {
    SmallQuant q;
    bool small = smallQuant(type, &q);
    for (uint64_t row = row_begin; row < std::min(row_end, n); ++row) {
        if (type == DType::F32 || type == DType::F16 || type == DType::BF16) {
            repackPlainRow(type, src, k, layout, row, dst);
        } else if (small) {
            repackSmallQuantRow(q, src, k, layout, row, dst);
        } else if (type == DType::IQ4_XS) {
            repackIq4XsRow(src, k, layout, row, dst);
        } else if (type == DType::MXFP4) {
            repackMxfp4Row(src, k, layout, row, dst);
        } else {
            repackKQuantRow(type, src, k, layout, row, dst);
        }
    }
}

void repackMatrix(DType type, const uint8_t* src, uint64_t k, uint64_t n, const WeightLayout& layout,
                  uint8_t* dst, unsigned threads) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    uint64_t octets = (n + 7) / 8;
    threads = unsigned(std::min<uint64_t>(threads, std::max<uint64_t>(1, octets / 64)));
    std::vector<std::thread> pool;
    uint64_t per = (octets + threads - 1) / threads;
    for (unsigned t = 0; t < threads; ++t) {
        uint64_t a = t * per * 8, b = std::min(n, (t + 1) * per * 8);
        if (a >= b) break;
        pool.emplace_back([=] { repackRows(type, src, k, n, layout, a, b, dst); });
    }
    for (std::thread& th : pool) th.join();
}

}  // namespace blue
