// Mixture-of-experts tensor ops (vm/opcodes.def: MOEROUTE, MOEMM, MOEMIX): their shape rules and
// reference implementations. The map that MOEROUTE writes and MOEMM reads is laid out in
// vm/abi.h (BLUE_MOE_*). The map's size ties the two together: both instructions require exactly
// BLUE_MOE_MAP_WORDS(E, max_rows * k) words for their own E and k, so a MOEMM can only read a map
// made for its expert count and slot count. Map contents are still data (control code may TST a
// GLOBAL tensor), so every word read from it is bounds-checked here and in the kernels.
#include <cmath>

#include "vm/abi.h"
#include "vm/quant.h"
#include "vm/tensor_ops_internal.h"

namespace blue {

namespace {

uint64_t mapWords(const Module& m, uint64_t experts, uint64_t slots) {
    return BLUE_MOE_MAP_WORDS(experts, uint64_t(m.layout.max_rows) * slots);
}

Status checkMap(const Checker& c, size_t i, uint64_t experts, uint64_t slots) {
    if (c.t(i).cls != BLUE_TC_GLOBAL) return c.fail(i, "the expert map must be a GLOBAL tensor");
    BLUE_TRY(c.dtype(i, DType::I32));
    uint64_t want = mapWords(c.m, experts, slots);
    if (c.t(i).elements() != want) {
        return c.fail(i, strFormat("an expert map for %llu experts, %llu slots and %u rows has %llu words, not %llu",
                                   (unsigned long long)experts, (unsigned long long)slots, c.m.layout.max_rows,
                                   (unsigned long long)want, (unsigned long long)c.t(i).elements()));
    }
    return Status::ok();
}

Status rowsF32(const Checker& c, size_t i) {
    if (c.t(i).cls != BLUE_TC_ROWS) {
        return c.fail(i, strFormat("must be a ROWS tensor, not %s", tensorClassName(c.t(i).cls)));
    }
    return c.dtype(i, DType::F32);
}

Status checkRoute(const Checker& c) {
    BLUE_TRY(rowsF32(c, 0));
    BLUE_TRY(rowsF32(c, 1));
    const uint64_t experts = c.t(1).elements(), k = c.ti.args[3];
    if (experts < 1 || experts > BLUE_MOE_MAX_EXPERTS) {
        return c.fail(1, strFormat("%llu experts; 1 to %u are supported", (unsigned long long)experts,
                                   BLUE_MOE_MAX_EXPERTS));
    }
    if (k < 1 || k > BLUE_MOE_MAX_SLOTS || k > experts) {
        return BLUE_ERROR("operand 3: %llu experts per row; 1 to min(%u, experts = %llu) are supported",
                          (unsigned long long)k, BLUE_MOE_MAX_SLOTS, (unsigned long long)experts);
    }
    if (c.ti.args[4] > 1) return BLUE_ERROR("operand 4: gating rule %u is not 0 or 1", c.ti.args[4]);
    BLUE_TRY(c.elements(0, 2 * k));
    return checkMap(c, 2, experts, k);
}

Status checkMatmulExperts(const Checker& c) {
    BLUE_TRY(rowsF32(c, 0));
    const TensorDecl& w = c.t(1);
    if (w.cls != BLUE_TC_WEIGHT) return c.fail(1, "expert matrices must be a WEIGHT tensor");
    if (w.ndim != 3) return c.fail(1, "expert matrices must be 3-D [K, N, experts]");
    if (!quantCanDecode(w.dtype) || w.dtype == DType::Q8_K) {
        return c.fail(1, strFormat("matrix type %s cannot be multiplied", std::string(dtypeName(w.dtype)).c_str()));
    }
    const uint64_t K = w.ne[0], N = w.ne[1], experts = w.ne[2];
    if (experts < 1 || experts > BLUE_MOE_MAX_EXPERTS) {
        return c.fail(1, strFormat("%llu experts; 1 to %u are supported", (unsigned long long)experts,
                                   BLUE_MOE_MAX_EXPERTS));
    }
    const uint64_t out = c.t(0).elements();
    if (out % N || out / N < 1 || out / N > BLUE_MOE_MAX_SLOTS) {
        return c.fail(0, strFormat("has %llu elements per row; expected k * %llu for 1 to %u slots",
                                   (unsigned long long)out, (unsigned long long)N, BLUE_MOE_MAX_SLOTS));
    }
    const uint64_t k = out / N;
    BLUE_TRY(rowsF32(c, 2));
    const uint64_t xn = c.t(2).elements();
    if (xn != K && xn != k * K) {
        return c.fail(2, strFormat("has %llu elements per row; expected %llu (shared by the slots) or %llu (one "
                                   "part per slot)",
                                   (unsigned long long)xn, (unsigned long long)K, (unsigned long long)(k * K)));
    }
    return checkMap(c, 3, experts, k);
}

Status checkMix(const Checker& c) {
    BLUE_TRY(rowsF32(c, 0));
    BLUE_TRY(rowsF32(c, 1));
    BLUE_TRY(c.elements(1, c.t(0).elements()));
    BLUE_TRY(rowsF32(c, 3));
    const uint64_t n = c.t(0).elements(), k2 = c.t(3).elements();
    if (k2 < 2 || k2 % 2 || k2 / 2 > BLUE_MOE_MAX_SLOTS) {
        return c.fail(3, strFormat("has %llu elements per row; a routing row holds 2k for 1 to %u slots",
                                   (unsigned long long)k2, BLUE_MOE_MAX_SLOTS));
    }
    BLUE_TRY(rowsF32(c, 2));
    BLUE_TRY(c.elements(2, n * (k2 / 2)));
    if (c.ti.args[4] != 0xFFFFFFFFu) {
        BLUE_TRY(rowsF32(c, 4));
        BLUE_TRY(c.elements(4, n));
    }
    if (c.ti.args[5] != 0xFFFFFFFFu) {
        if (c.ti.args[4] == 0xFFFFFFFFu) return BLUE_ERROR("operand 5: a shared-expert gate without a shared expert");
        BLUE_TRY(rowsF32(c, 5));
        BLUE_TRY(c.elements(5, 1));
    }
    return Status::ok();
}

// The k largest of `logits` (ties: the lower index), and their weights by `gating`.
void routeRow(const float* logits, uint32_t experts, uint32_t k, uint32_t gating, float* sel) {
    uint32_t chosen[BLUE_MOE_MAX_SLOTS] = {};
    for (uint32_t j = 0; j < k; ++j) {
        uint32_t best = 0xFFFFFFFFu;
        for (uint32_t e = 0; e < experts; ++e) {
            bool taken = false;
            for (uint32_t i = 0; i < j; ++i) taken |= chosen[i] == e;
            if (!taken && (best == 0xFFFFFFFFu || logits[e] > logits[best])) best = e;
        }
        chosen[j] = best;
    }
    const float top = logits[chosen[0]];
    float total = 0.0f;
    if (gating == 0) {
        for (uint32_t j = 0; j < k; ++j) total += std::exp(logits[chosen[j]] - top);
    } else {
        for (uint32_t e = 0; e < experts; ++e) total += std::exp(logits[e] - top);
    }
    for (uint32_t j = 0; j < k; ++j) {
        sel[j] = float(chosen[j]);
        sel[k + j] = std::exp(logits[chosen[j]] - top) / total;
    }
}

void refRoute(const Items& it, const TensorInstr& ti) {
    const uint32_t experts = uint32_t(it.decl(ti.args[1]).elements()), k = ti.args[3];
    const uint32_t rows = it.count();
    for (uint32_t r = 0; r < rows; ++r) {
        routeRow(it.f32(ti.args[1], r), experts, k, ti.args[4], it.f32(ti.args[0], r));
    }
    // The map: pairs grouped by expert, rows in run order, then tiles.
    uint32_t* map = reinterpret_cast<uint32_t*>(it.slice(ti.args[2], 0));
    const uint64_t pairs_max = uint64_t(it.env.module->layout.max_rows) * k;
    uint32_t* offsets = map + BLUE_MOE_H_WORDS;
    uint32_t* list = offsets + experts + 1;
    uint32_t* tiles = list + pairs_max;
    const uint32_t tile = rows == 1 ? 1 : BLUE_MOE_TILE_ROWS;
    uint32_t at = 0, ntiles = 0;
    for (uint32_t e = 0; e < experts; ++e) {
        offsets[e] = at;
        for (uint32_t r = 0; r < rows; ++r) {
            const float* sel = it.f32(ti.args[0], r);
            for (uint32_t j = 0; j < k; ++j) {
                if (uint32_t(sel[j]) == e) list[at++] = r * k + j;
            }
        }
        for (uint32_t first = offsets[e]; first < at; first += tile) {
            tiles[2 * ntiles] = e;
            tiles[2 * ntiles + 1] = first;
            ++ntiles;
        }
    }
    offsets[experts] = at;
    map[BLUE_MOE_H_TILES] = ntiles;
    map[BLUE_MOE_H_TILE] = tile;
    map[BLUE_MOE_H_SLOTS] = k;
    map[BLUE_MOE_H_EXPERTS] = experts;
}

void refMatmulExperts(const Items& it, const TensorInstr& ti) {
    const TensorDecl& w = it.decl(ti.args[1]);
    const uint64_t K = w.ne[0], N = w.ne[1], experts = w.ne[2];
    const uint64_t k = it.decl(ti.args[0]).elements() / N;
    const bool per_slot = it.decl(ti.args[2]).elements() != K;
    const uint64_t row_bytes = *dtypeRowBytes(w.dtype, K);
    const uint8_t* wd = it.slice(ti.args[1], 0);
    const uint32_t* map = reinterpret_cast<const uint32_t*>(it.slice(ti.args[3], 0));
    const uint64_t pairs_max = uint64_t(it.env.module->layout.max_rows) * k;
    const uint32_t* offsets = map + BLUE_MOE_H_WORDS;
    const uint32_t* list = offsets + experts + 1;
    // Every pair the map lists, expert by expert; words out of range are skipped, as the kernel does.
    for (uint64_t e = 0; e < experts; ++e) {
        const uint64_t lo = offsets[e], hi = std::min<uint64_t>(offsets[e + 1], pairs_max);
        for (uint64_t p = lo; p < hi; ++p) {
            const uint32_t pair = list[p];
            if (pair >= pairs_max) continue;
            const uint32_t row = uint32_t(pair / k), slot = uint32_t(pair % k);
            const float* x = it.rowF32(ti.args[2], row) + (per_slot ? slot * K : 0);
            float* dst = it.rowF32(ti.args[0], row) + slot * N;
            const uint8_t* we = wd + e * N * row_bytes;
            for (uint64_t n = 0; n < N; ++n) dst[n] = dotRow(w.dtype, we + n * row_bytes, x, int64_t(K));
        }
    }
}

void refMix(const Items& it, const TensorInstr& ti) {
    const uint64_t n = it.decl(ti.args[0]).elements();
    const uint32_t k = uint32_t(it.decl(ti.args[3]).elements() / 2);
    const bool shared = ti.args[4] != 0xFFFFFFFFu, gated = ti.args[5] != 0xFFFFFFFFu;
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const float* a = it.f32(ti.args[1], item);
        const float* src = it.f32(ti.args[2], item);
        const float* sel = it.f32(ti.args[3], item);
        const float* sh = shared ? it.f32(ti.args[4], item) : nullptr;
        const float gate = gated ? 1.0f / (1.0f + std::exp(-it.f32(ti.args[5], item)[0])) : 1.0f;
        for (uint64_t i = 0; i < n; ++i) {
            float acc = a[i];
            for (uint32_t j = 0; j < k; ++j) acc += sel[k + j] * src[j * n + i];
            if (sh) acc += sh[i] * gate;
            dst[i] = acc;
        }
    }
}

}  // namespace

Status checkMoeOp(const Checker& c) {
    switch (c.ti.op) {
        case Op::MOEROUTE: return checkRoute(c);
        case Op::MOEMM: return checkMatmulExperts(c);
        case Op::MOEMIX: return checkMix(c);
        default: return BLUE_ERROR("no rules for tensor op 0x%02x", uint32_t(c.ti.op));
    }
}

bool runMoeOpRef(const Items& it, const TensorInstr& ti) {
    switch (ti.op) {
        case Op::MOEROUTE: refRoute(it, ti); return true;
        case Op::MOEMM: refMatmulExperts(it, ti); return true;
        case Op::MOEMIX: refMix(it, ti); return true;
        default: return false;
    }
}

}  // namespace blue
