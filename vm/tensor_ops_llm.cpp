// Reference semantics of the LLM tensor ops: RMSNORM, EMBED, ROPE, KVSTORE, ATTN (and ATTNX, its
// sliding-window, soft-capped form), SWIGLU, GEGLU, SAMPLE, POOL and KVCOPY. Written for clarity,
// accumulating in double; the GPU kernels match them within the tolerances tests/test_ops_gpu.cpp
// states. attnRows (attention over rows a function picks) is shared with the paged ops
// (tensor_ops_kvpages.cpp).
#include <algorithm>
#include <cstring>
#include <cmath>
#include <map>
#include <vector>

#include "vm/half.h"
#include "vm/grammar_walk.h"
#include "vm/llm_abi.h"
#include "vm/philox.h"
#include "vm/quant.h"
#include "vm/tensor_ops_internal.h"

namespace blue {

Status rowsDst(const Checker& c, size_t i) {
    if (c.t(i).cls != BLUE_TC_ROWS) return c.fail(i, "must be a ROWS tensor (one row per token)");
    return c.dtype(i, DType::F32);
}

Status argSlot(uint32_t k) {
    if (k >= BLUE_MAX_BLOCK_ARGS) return BLUE_ERROR("block argument %u does not exist", k);
    return Status::ok();
}

Status checkAttnQuery(const Checker& c, uint64_t* kv_row) {
    BLUE_TRY(rowsDst(c, 0));
    BLUE_TRY(c.dtype(3, DType::F32));
    BLUE_TRY(c.elements(3, c.t(0).elements()));
    uint32_t n_head = c.ti.args[4], n_kv = c.ti.args[5];
    uint64_t n = c.t(0).elements();
    if (n_head == 0 || n_kv == 0 || n_head % n_kv || n % n_head) {
        return BLUE_ERROR("%u query heads and %u KV heads do not fit a row of %llu", n_head, n_kv, (unsigned long long)n);
    }
    if (c.ti.op != Op::ATTN) {
        float cap = bitsToFloat(c.ti.args[9]);
        if (!(cap >= 0.0f) || !std::isfinite(cap)) return BLUE_ERROR("soft cap %g must be 0 (none) or positive", cap);
    }
    *kv_row = n / n_head * n_kv;
    return Status::ok();
}

float cacheRead(const TensorDecl& t, const uint8_t* data, uint64_t index) {
    if (t.dtype == DType::F16) return halfToF32(reinterpret_cast<const uint16_t*>(data)[index]);
    return reinterpret_cast<const float*>(data)[index];
}

void cacheWrite(const TensorDecl& t, uint8_t* data, uint64_t index, float v) {
    if (t.dtype == DType::F16) {
        reinterpret_cast<uint16_t*>(data)[index] = halfFromF32(v);
    } else {
        reinterpret_cast<float*>(data)[index] = v;
    }
}

// Three passes in double per head: scores (and their max), exponentials (and their sum), outputs.
void attnRows(const Items& it, const TensorInstr& ti, uint64_t positions, const KvRowOf& row_of) {
    const auto& a = ti.args;
    const TensorDecl& kc = it.decl(a[1]);
    const TensorDecl& vc = it.decl(a[2]);
    uint32_t n_head = a[4], n_kv = a[5];
    float scale = bitsToFloat(a[7]);
    const bool ext = ti.op != Op::ATTN;
    const uint64_t window = ext ? a[8] : 0;
    const double cap = ext ? bitsToFloat(a[9]) : 0.0;
    uint64_t n = it.decl(a[0]).elements(), head = n / n_head, kv_dim = kc.ne[0];
    for (uint32_t item = 0; item < it.count(); ++item) {
        uint64_t last = std::min<uint64_t>(uint64_t(it.arg(item, a[6])) + it.rowLocal(item), positions - 1);
        uint64_t first = window && last + 1 > window ? last + 1 - window : 0;
        const float* q = it.f32(a[3], item);
        const uint8_t* k = it.slice(a[1], item);
        const uint8_t* v = it.slice(a[2], item);
        float* dst = it.f32(a[0], item);
        std::vector<double> score(last + 1);
        std::vector<uint64_t> row(last + 1);
        for (uint64_t t = first; t <= last; ++t) row[t] = row_of(item, t);
        for (uint32_t h = 0; h < n_head; ++h) {
            uint64_t kv_off = uint64_t(h / (n_head / n_kv)) * head;
            double m = -INFINITY, z = 0;
            for (uint64_t t = first; t <= last; ++t) {
                if (row[t] == kNoKvRow) continue;
                double dot = 0;
                for (uint64_t i = 0; i < head; ++i) dot += double(q[h * head + i]) * cacheRead(kc, k, row[t] * kv_dim + kv_off + i);
                score[t] = dot * scale;
                if (cap > 0) score[t] = cap * std::tanh(score[t] / cap);
                m = std::max(m, score[t]);
            }
            for (uint64_t t = first; t <= last; ++t) {
                if (row[t] != kNoKvRow) z += (score[t] = std::exp(score[t] - m));
            }
            for (uint64_t i = 0; i < head; ++i) {
                double acc = 0;
                for (uint64_t t = first; t <= last; ++t) {
                    if (row[t] != kNoKvRow) acc += score[t] * cacheRead(vc, v, row[t] * kv_dim + kv_off + i);
                }
                dst[h * head + i] = z > 0 ? float(acc / z) : 0.0f;
            }
        }
    }
}

void kvStoreRows(const Items& it, const TensorInstr& ti, const KvRowOf& row_of) {
    const auto& a = ti.args;
    const uint64_t dim = it.decl(a[1]).ne[0];
    for (uint32_t item = 0; item < it.count(); ++item) {
        const uint64_t row = row_of(item, uint64_t(it.arg(item, a[4])) + it.rowLocal(item));
        if (row == kNoKvRow) continue;
        for (int which = 0; which < 2; ++which) {
            const float* src = it.f32(a[which * 2], item);
            uint8_t* rows = it.slice(a[which * 2 + 1], item);
            const TensorDecl& t = it.decl(a[which * 2 + 1]);
            for (uint64_t i = 0; i < dim; ++i) cacheWrite(t, rows, row * dim + i, src[i]);
        }
    }
}

void kvCopyRows(const Items& it, const TensorInstr& ti, const KvRowOf& row_of) {
    const auto& a = ti.args;
    const TensorDecl& kv = it.decl(a[0]);
    const TensorDecl& store = it.decl(a[1]);
    const uint64_t ctx = store.ne[1];
    const uint64_t row_bytes = *dtypeRowBytes(kv.dtype, kv.ne[0]), slot_bytes = row_bytes * ctx;
    for (uint32_t item = 0; item < it.count(); ++item) {
        const uint64_t s = it.arg(item, a[3]);
        const uint64_t first = std::min<uint64_t>(it.arg(item, a[4]), ctx);
        const uint64_t end = std::min<uint64_t>(it.arg(item, a[5]), ctx);
        if (s >= store.ne[2]) continue;
        uint8_t* rows = it.slice(a[0], item);
        uint8_t* st = it.slice(a[1], item) + s * slot_bytes;
        for (uint64_t pos = first; pos < end; ++pos) {
            const uint64_t row = row_of(item, pos);
            if (row == kNoKvRow) continue;
            if (a[2] == 0) {
                std::memcpy(rows + row * row_bytes, st + pos * row_bytes, row_bytes);
            } else {
                std::memcpy(st + pos * row_bytes, rows + row * row_bytes, row_bytes);
            }
        }
    }
}

namespace {

constexpr uint32_t kNone = 0xFFFFFFFFu;

// ---- checks ------------------------------------------------------------------------------------

Status cacheTensor(const Checker& c, size_t i, uint64_t row_elems) {
    const TensorDecl& t = c.t(i);
    if (t.cls != BLUE_TC_INSTANCE) return c.fail(i, "a KV cache must be an INSTANCE tensor");
    if (t.dtype != DType::F32 && t.dtype != DType::F16) return c.fail(i, "a KV cache must be F32 or F16");
    if (t.ndim != 2 || t.ne[0] != row_elems) {
        return c.fail(i, strFormat("must be [%llu, ctx]", (unsigned long long)row_elems));
    }
    return Status::ok();
}

// The kernels are built per cache type (of the K cache) and take the context length from the K
// cache, so the V cache must match it in both.
Status sameCaches(const Checker& c, size_t k, size_t v) {
    if (c.t(k).ne[1] != c.t(v).ne[1]) return c.fail(v, "K and V caches differ in context length");
    if (c.t(k).dtype != c.t(v).dtype) return c.fail(v, "K and V caches differ in type");
    return Status::ok();
}

Status checkRmsnorm(const Checker& c) {
    BLUE_TRY(c.dst(0));
    BLUE_TRY(c.dtype(0, DType::F32));
    BLUE_TRY(c.dtype(1, DType::F32));
    BLUE_TRY(c.elements(1, c.t(0).elements()));
    uint64_t n = c.t(0).elements(), group = c.ti.args[4] ? c.ti.args[4] : n;
    if (n % group) return BLUE_ERROR("group size %llu does not divide the row (%llu)", (unsigned long long)group, (unsigned long long)n);
    BLUE_TRY(c.dtype(2, DType::F32));
    return c.elements(2, group);
}

Status checkEmbed(const Checker& c) {
    BLUE_TRY(rowsDst(c, 0));
    const TensorDecl& table = c.t(1);
    if (table.cls != BLUE_TC_WEIGHT || table.ndim != 2) return c.fail(1, "must be a 2-D WEIGHT [dim, vocab]");
    if (!quantCanDecode(table.dtype) || table.dtype == DType::Q8_K) return c.fail(1, "type cannot be read");
    BLUE_TRY(c.elements(0, table.ne[0]));
    return argSlot(c.ti.args[2]);
}

// ROPE rotates src (1) into dst (0); ROPEQK rotates q (0) and k (1) in place, each a ROWS F32
// tensor whose row the head size divides.
Status checkRope(const Checker& c, const Module& m) {
    BLUE_TRY(rowsDst(c, 0));
    BLUE_TRY(c.dtype(1, DType::F32));
    if (c.ti.op == Op::ROPEQK) {
        BLUE_TRY(rowsDst(c, 1));
        if (c.ti.args[0] == c.ti.args[1]) return c.fail(1, "k must not be q");
    } else {
        BLUE_TRY(c.elements(1, c.t(0).elements()));
    }
    const auto& a = c.ti.args;
    uint32_t head = a[4], n_rot = a[5], mode = a[6];
    BLUE_TRY(argSlot(a[3]));
    if (head == 0 || c.t(0).elements() % head) return BLUE_ERROR("head size %u does not divide the row", head);
    if (c.ti.op == Op::ROPEQK && c.t(1).elements() % head) {
        return BLUE_ERROR("head size %u does not divide k's row", head);
    }
    if (n_rot == 0 || n_rot > head || n_rot % 2) return BLUE_ERROR("rotated dims %u must be even and at most the head size", n_rot);
    if (mode != 0 && mode != 2) return BLUE_ERROR("rope mode %u is neither 0 (adjacent pairs) nor 2 (neox)", mode);
    if (a[2] != kNone) {
        if (a[2] >= m.tensors.size()) return BLUE_ERROR("frequency-factor tensor %u does not exist", a[2]);
        BLUE_TRY(c.dtype(2, DType::F32));
        BLUE_TRY(c.elements(2, n_rot / 2));
    }
    return Status::ok();
}

Status checkKvstore(const Checker& c) {
    BLUE_TRY(rowsDst(c, 0));
    BLUE_TRY(c.dtype(2, DType::F32));
    if (c.t(2).cls != BLUE_TC_ROWS) return c.fail(2, "must be a ROWS tensor");
    BLUE_TRY(c.elements(2, c.t(0).elements()));
    BLUE_TRY(cacheTensor(c, 1, c.t(0).elements()));
    BLUE_TRY(cacheTensor(c, 3, c.t(0).elements()));
    BLUE_TRY(sameCaches(c, 1, 3));
    return argSlot(c.ti.args[4]);
}

// KVCOPY: an instance's KV cache and a slot of a session store of the same row width, context and type.
Status checkKvcopy(const Checker& c) {
    BLUE_TRY(cacheTensor(c, 0, c.t(0).ne[0]));
    const TensorDecl& s = c.t(1);
    if (s.cls != BLUE_TC_GLOBAL || s.ndim != 3) return c.fail(1, "the store must be a GLOBAL tensor [D, ctx, slots]");
    if (s.ne[0] != c.t(0).ne[0] || s.ne[1] != c.t(0).ne[1]) return c.fail(1, "the store's rows and context differ from the cache's");
    BLUE_TRY(c.dtype(1, c.t(0).dtype));
    if (c.ti.args[2] > 1) return BLUE_ERROR("copy direction %u is not 0 (store to cache) or 1 (cache to store)", c.ti.args[2]);
    for (size_t k : {3, 4, 5}) BLUE_TRY(argSlot(c.ti.args[k]));
    return Status::ok();
}

Status checkAttn(const Checker& c) {
    uint64_t kv_row = 0;
    BLUE_TRY(checkAttnQuery(c, &kv_row));
    BLUE_TRY(cacheTensor(c, 1, kv_row));
    BLUE_TRY(cacheTensor(c, 2, kv_row));
    BLUE_TRY(sameCaches(c, 1, 2));
    return argSlot(c.ti.args[6]);
}

Status checkGated(const Checker& c) {
    BLUE_TRY(rowsDst(c, 0));
    for (size_t i = 1; i <= 2; ++i) {
        BLUE_TRY(c.dtype(i, DType::F32));
        BLUE_TRY(c.elements(i, c.t(0).elements()));
    }
    return Status::ok();
}

Status checkSample(const Checker& c) {
    if (c.t(0).cls != BLUE_TC_INSTANCE) return c.fail(0, "logits must be an INSTANCE tensor");
    BLUE_TRY(c.dtype(0, DType::F32));
    if (c.ti.op == Op::SAMPLEG) {
        if (c.t(2).cls != BLUE_TC_INSTANCE) return c.fail(2, "the grammar must be an INSTANCE tensor");
        BLUE_TRY(c.dtype(2, DType::I32));
        if (c.t(2).elements() < BLUE_GR_HEADER_WORDS) {
            return c.fail(2, strFormat("the grammar needs at least %u words", BLUE_GR_HEADER_WORDS));
        }
        if (c.t(3).cls == BLUE_TC_ROWS || c.t(3).cls == BLUE_TC_INSTANCE) {
            return c.fail(3, "the token bytes must be a WEIGHT or GLOBAL tensor");
        }
        BLUE_TRY(c.dtype(3, DType::I32));
        if (c.t(3).elements() < c.t(0).elements()) {
            return c.fail(3, "the token bytes need a word per token of the logits");
        }
    }
    return argSlot(c.ti.args[1]);
}

// ---- reference implementations ---------------------------------------------------------------

void refRmsnorm(const Items& it, const TensorInstr& ti) {
    uint64_t n = it.decl(ti.args[0]).elements();
    uint64_t group = ti.args[4] ? ti.args[4] : n;
    float eps = bitsToFloat(ti.args[3]);
    for (uint32_t item = 0; item < it.count(); ++item) {
        const float* a = it.f32(ti.args[1], item);
        const float* w = it.f32(ti.args[2], item);
        float* dst = it.f32(ti.args[0], item);
        for (uint64_t g = 0; g < n; g += group) {
            double ss = 0;
            for (uint64_t i = 0; i < group; ++i) ss += double(a[g + i]) * a[g + i];
            double scale = 1.0 / std::sqrt(ss / double(group) + eps);
            for (uint64_t i = 0; i < group; ++i) dst[g + i] = float(a[g + i] * scale * w[i]);
        }
    }
}

void refEmbed(const Items& it, const TensorInstr& ti) {
    const TensorDecl& table = it.decl(ti.args[1]);
    uint64_t dim = table.ne[0], vocab = table.ne[1], row_bytes = *dtypeRowBytes(table.dtype, dim);
    const uint8_t* data = it.slice(ti.args[1], 0);
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const uint32_t* tok = it.local(item, uint64_t(it.arg(item, ti.args[2])) + it.rowLocal(item));
        if (!tok || *tok >= vocab) {
            std::fill(dst, dst + dim, 0.0f);
        } else {
            dequantizeRow(table.dtype, data + *tok * row_bytes, dst, int64_t(dim));
        }
    }
}

// ROPE's rotation of tensor `src` into `dst` (operand indices; the same for in place), with the
// instruction's factors, position and shape operands.
void ropeRows(const Items& it, const TensorInstr& ti, uint32_t dst_at, uint32_t src_at) {
    const auto& a = ti.args;
    uint64_t n = it.decl(a[dst_at]).elements();
    uint32_t head = a[4], n_rot = a[5], mode = a[6];
    double base = bitsToFloat(a[7]), scale = bitsToFloat(a[8]);
    for (uint32_t item = 0; item < it.count(); ++item) {
        const float* src = it.f32(a[src_at], item);
        float* dst = it.f32(a[dst_at], item);
        const float* ff = a[2] != kNone ? it.f32(a[2], item) : nullptr;
        double pos = double(it.arg(item, a[3]) + it.rowLocal(item));
        std::vector<float> out(src, src + n);
        for (uint64_t h = 0; h < n; h += head) {
            for (uint32_t i = 0; i < n_rot / 2; ++i) {
                double theta = pos * scale * std::pow(base, -2.0 * i / n_rot) / (ff ? ff[i] : 1.0f);
                double c = std::cos(theta), s = std::sin(theta);
                uint64_t i0 = mode == 0 ? h + 2 * i : h + i;
                uint64_t i1 = mode == 0 ? i0 + 1 : i0 + n_rot / 2;
                out[i0] = float(src[i0] * c - src[i1] * s);
                out[i1] = float(src[i0] * s + src[i1] * c);
            }
        }
        std::copy(out.begin(), out.end(), dst);
    }
}

void refRope(const Items& it, const TensorInstr& ti) {
    if (ti.op == Op::ROPEQK) {
        ropeRows(it, ti, 0, 0);
        ropeRows(it, ti, 1, 1);
    } else {
        ropeRows(it, ti, 0, 1);
    }
}

void refKvstore(const Items& it, const TensorInstr& ti) {
    const uint64_t ctx = it.decl(ti.args[1]).ne[1];
    kvStoreRows(it, ti, [ctx](uint32_t, uint64_t pos) { return pos < ctx ? pos : kNoKvRow; });
}

void refKvcopy(const Items& it, const TensorInstr& ti) {
    kvCopyRows(it, ti, [](uint32_t, uint64_t pos) { return pos; });  // clamped to the context
}

void refAttn(const Items& it, const TensorInstr& ti) {
    attnRows(it, ti, it.decl(ti.args[1]).ne[1], [](uint32_t, uint64_t t) { return t; });
}

void refSwiglu(const Items& it, const TensorInstr& ti) {
    uint64_t n = it.decl(ti.args[0]).elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        const float* g = it.f32(ti.args[1], item);
        const float* u = it.f32(ti.args[2], item);
        float* dst = it.f32(ti.args[0], item);
        for (uint64_t i = 0; i < n; ++i) dst[i] = siluTimes(g[i], u[i]);
    }
}

void refGeglu(const Items& it, const TensorInstr& ti) {
    uint64_t n = it.decl(ti.args[0]).elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        const float* g = it.f32(ti.args[1], item);
        const float* u = it.f32(ti.args[2], item);
        float* dst = it.f32(ti.args[0], item);
        for (uint64_t i = 0; i < n; ++i) dst[i] = geluTimes(g[i], u[i]);
    }
}

// The sampling rule (vm/llm_abi.h's parameter block): penalties (written back into the logits
// tensor, as the GPU kernel penalises in place), then top-k, top-p and min-p
// filters on the temperature-1 distribution, then temperature, then one draw walking the kept
// tokens in id order. Entropy and log-probability describe the penalized T = 1 distribution.

void applyPenalties(std::vector<float>& l, const SampleParams& p, const uint32_t* hist, uint32_t len) {
    if (p.repeat == 1.0f && p.presence == 0.0f && p.frequency == 0.0f) return;
    std::map<uint32_t, uint32_t> counts;
    for (uint32_t i = len - std::min(len, p.last_n); i < len; ++i) {
        if (hist[i] < l.size()) ++counts[hist[i]];
    }
    for (auto [tok, count] : counts) {
        float& v = l[tok];
        if (p.repeat != 1.0f) v = v > 0 ? v / p.repeat : v * p.repeat;
        v -= float(count) * p.frequency + p.presence;
    }
}

// Largest value t among `keys` (descending) such that at least `k` values are >= t.
float kthLargest(std::vector<float> keys, uint32_t k) {
    std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<float>());
    return keys[k - 1];
}

}  // namespace

// The smallest logit the top-k, top-p and min-p filters keep (m: the largest logit).
float keepThreshold(const std::vector<float>& l, const SampleParams& p, double m) {
    const size_t n = l.size();
    float thr = -INFINITY;
    if (p.top_k > 0 && p.top_k < n) thr = kthLargest(l, p.top_k);
    if (p.top_p < 1.0f) {
        std::vector<float> kept;
        for (float v : l) if (v >= thr) kept.push_back(v);
        std::sort(kept.begin(), kept.end(), std::greater<float>());
        double zk = 0, acc = 0;
        for (float v : kept) zk += std::exp(v - m);
        for (float v : kept) {
            acc += std::exp(v - m);
            if (acc >= double(p.top_p) * zk) {
                thr = std::max(thr, v);
                break;
            }
        }
    }
    if (p.min_p > 0.0f) thr = std::max(thr, float(m + std::log(double(p.min_p))));
    return thr;
}

Distribution samplingDistribution(const std::vector<float>& l, const SampleParams& p) {
    Distribution d;
    const size_t n = l.size();
    d.argmax = uint32_t(std::max_element(l.begin(), l.end()) - l.begin());
    d.m = l[d.argmax];
    double zl = 0;
    for (float v : l) {
        double e = std::exp(v - d.m);
        d.z += e;
        zl += e * (v - d.m);
    }
    d.entropy = float(std::log(d.z) - zl / d.z);
    d.w.assign(n, 0.0);
    if (p.temp <= 0.0f) {
        d.w[d.argmax] = 1.0;
        d.total = 1.0;
        return d;
    }
    float thr = keepThreshold(l, p, d.m);
    for (size_t i = 0; i < n; ++i) {
        if (l[i] >= thr) d.total += (d.w[i] = std::exp((l[i] - d.m) / p.temp));
    }
    return d;
}

uint32_t drawFrom(const std::vector<double>& w, double total, float uniform, uint32_t fallback) {
    double u = double(uniform) * total, acc = 0;
    uint32_t tok = fallback;
    for (size_t i = 0; i < w.size(); ++i) {
        if (w[i] == 0) continue;
        tok = uint32_t(i);
        acc += w[i];
        if (acc > u) break;
    }
    return tok;
}

float logProbability(const std::vector<float>& l, const Distribution& d, uint32_t tok) {
    return float(l[tok] - d.m - std::log(d.z));
}

uint32_t sampleToken(const std::vector<float>& l, const SampleParams& p, float* entropy, float* logprob,
                     Distribution* dist) {
    Distribution d = samplingDistribution(l, p);
    *entropy = d.entropy;
    uint32_t tok = d.argmax;
    if (p.temp > 0.0f) tok = drawFrom(d.w, d.total, philoxUniform(p.seed, p.counter), d.argmax);
    *logprob = logProbability(l, d, tok);
    if (dist) *dist = std::move(d);
    return tok;
}

SampleParams sampleParams(const uint32_t* sp) {
    return SampleParams{bitsToFloat(sp[BLUE_SP_TEMP]),     bitsToFloat(sp[BLUE_SP_TOP_P]),
                        bitsToFloat(sp[BLUE_SP_MIN_P]),    bitsToFloat(sp[BLUE_SP_REPEAT_PENALTY]),
                        bitsToFloat(sp[BLUE_SP_PRESENCE]), bitsToFloat(sp[BLUE_SP_FREQUENCY]),
                        sp[BLUE_SP_TOP_K], sp[BLUE_SP_REPEAT_LAST_N], sp[BLUE_SP_SEED], sp[BLUE_SP_COUNTER]};
}

namespace {

// The `count` most likely tokens of the T = 1 distribution of `l` (ties: lower id first) as
// (id, f32 log-probability) pairs into out[0 .. 2 * count).
void writeTopLogprobs(const std::vector<float>& l, uint32_t count, uint32_t* out) {
    count = std::min<uint32_t>(count, uint32_t(l.size()));
    double m = *std::max_element(l.begin(), l.end()), z = 0;
    for (float v : l) z += std::exp(v - m);
    std::vector<uint32_t> ids(l.size());
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
    std::partial_sort(ids.begin(), ids.begin() + count, ids.end(),
                      [&](uint32_t a, uint32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (uint32_t i = 0; i < count; ++i) {
        out[2 * i] = ids[i];
        float lp = float(l[ids[i]] - m - std::log(z));
        std::memcpy(&out[2 * i + 1], &lp, 4);
    }
}

// Tokens the grammar does not allow get kGrammarMasked. When it allows none (the vocabulary
// cannot continue the text), the end-of-generation tokens are made likely, or else token 0.
void maskGrammar(const GrammarWalk& w, std::vector<float>& l) {
    const uint32_t state = w.state();
    bool any = false;
    for (uint32_t t = 0; t < l.size(); ++t) {
        if (w.allows(state, t)) any = true; else l[t] = kGrammarMasked;
    }
    if (any) return;
    for (uint32_t t = 0; t < l.size(); ++t) {
        if (w.kind(t) == BLUE_TB_END) l[t] = 0, any = true;
    }
    if (!any && !l.empty()) l[0] = 0;
}

// POOL: the instance's rows of a in this run into dst (mean so far, first, or last row).
Status checkPool(const Checker& c) {
    if (c.t(0).cls != BLUE_TC_INSTANCE) return c.fail(0, "the pooled vector must be an INSTANCE tensor");
    BLUE_TRY(c.dtype(0, DType::F32));
    BLUE_TRY(rowsDst(c, 1));
    BLUE_TRY(c.elements(1, c.t(0).elements()));
    if (c.ti.args[2] > BLUE_POOL_LAST) return BLUE_ERROR("pooling mode %u is not 0 (mean), 1 (first) or 2 (last)", c.ti.args[2]);
    return argSlot(c.ti.args[3]);
}

void refPool(const Items& it, const TensorInstr& ti) {
    const uint64_t n = it.decl(ti.args[0]).elements();
    const uint32_t mode = ti.args[2];
    for (uint32_t item = 0; item < it.count(); ++item) {
        float* dst = it.f32(ti.args[0], item);
        const uint32_t first = it.firstRow(item), rows = it.rowCount(item), p = it.arg(item, ti.args[3]);
        if (mode == BLUE_POOL_FIRST && p != 0) continue;
        if (mode != BLUE_POOL_MEAN) {
            const float* row = it.rowF32(ti.args[1], mode == BLUE_POOL_FIRST ? first : first + rows - 1);
            std::copy(row, row + n, dst);
            continue;
        }
        for (uint64_t i = 0; i < n; ++i) {
            double sum = p ? double(dst[i]) * p : 0.0;
            for (uint32_t r = 0; r < rows; ++r) sum += it.rowF32(ti.args[1], first + r)[i];
            dst[i] = float(sum / (double(p) + rows));
        }
    }
}

// SAMPLEG's grammar step for one item, before the penalties: the token the program emitted
// since the last sample (BLUE_GR_PENDING) advances the instance's automaton, then the tokens it
// does not allow are masked in `l`. Nothing without an automaton.
void applyGrammar(const Items& it, const TensorInstr& ti, uint32_t item, std::vector<float>& l) {
    uint32_t* g = reinterpret_cast<uint32_t*>(it.slice(ti.args[2], item));
    GrammarWalk w;
    w.g = {g, it.decl(ti.args[2]).elements()};
    w.tb = {reinterpret_cast<const uint32_t*>(it.slice(ti.args[3], item)), it.decl(ti.args[3]).elements()};
    w.vocab = uint32_t(l.size());
    if (!w.active()) return;
    if (g[BLUE_GR_PENDING] != 0) {
        uint32_t next = w.next(g[BLUE_GR_STATE], g[BLUE_GR_PENDING] - 1);
        if (next != BLUE_GR_DEAD) g[BLUE_GR_STATE] = next;
        g[BLUE_GR_PENDING] = 0;
    }
    maskGrammar(w, l);
}

// SAMPLE, and SAMPLEQ (which also writes the distribution it drew from into a table row), and
// SAMPLEG (constrained by the instance's grammar).
void refSample(const Items& it, const TensorInstr& ti, bool with_table, bool with_grammar = false) {
    uint64_t n = it.decl(ti.args[0]).elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        uint32_t base = it.arg(item, ti.args[1]);
        uint32_t* sp = it.local(item, uint64_t(base) + BLUE_SP_WORDS - 1) ? it.local(item, base) : nullptr;
        if (!sp) continue;  // parameter block out of range: nothing to do
        SampleParams p = sampleParams(sp);
        float* logits = it.f32(ti.args[0], item);
        std::vector<float> l(logits, logits + n);
        if (with_grammar) applyGrammar(it, ti, item, l);
        uint32_t hist_addr = sp[BLUE_SP_HIST_ADDR], hist_len = sp[BLUE_SP_HIST_LEN];
        const uint32_t* hist = it.local(item, uint64_t(hist_addr) + hist_len - 1) && hist_len ? it.local(item, hist_addr) : nullptr;
        if (hist) applyPenalties(l, p, hist, hist_len);
        std::copy(l.begin(), l.end(), logits);  // the penalties apply to the logits in place
        float entropy = 0, logprob = 0;
        Distribution d;
        sp[BLUE_SP_OUT_TOKEN] = sampleToken(l, p, &entropy, &logprob, with_table ? &d : nullptr);
        std::memcpy(&sp[BLUE_SP_OUT_ENTROPY], &entropy, 4);
        std::memcpy(&sp[BLUE_SP_OUT_LOGPROB], &logprob, 4);
        sp[BLUE_SP_COUNTER] += 1;
        uint32_t top_n = std::min<uint32_t>(sp[BLUE_SP_TOP_N], BLUE_MAX_TOP_LOGPROBS);
        if (top_n && it.local(item, uint64_t(sp[BLUE_SP_TOP_ADDR]) + 2 * top_n - 1)) {
            writeTopLogprobs(l, top_n, it.local(item, sp[BLUE_SP_TOP_ADDR]));
        }
        if (with_table) {
            const TensorDecl& table = it.decl(ti.args[2]);
            uint32_t row = sp[BLUE_SP_ROW];
            if (row < table.ne[1]) {
                float* q = it.f32(ti.args[2], item) + uint64_t(row) * n;
                for (uint64_t i = 0; i < n; ++i) q[i] = float(d.w[i] / d.total);
            }
        }
    }
}

}  // namespace

Status checkLlmOp(const Checker& c) {
    switch (c.ti.op) {
        case Op::RMSNORM: return checkRmsnorm(c);
        case Op::EMBED: return checkEmbed(c);
        case Op::ROPE:
        case Op::ROPEQK: return checkRope(c, c.m);
        case Op::KVSTORE: return checkKvstore(c);
        case Op::KVCOPY: return checkKvcopy(c);
        case Op::ATTN:
        case Op::ATTNX: return checkAttn(c);
        case Op::SWIGLU:
        case Op::GEGLU: return checkGated(c);
        case Op::SAMPLE:
        case Op::SAMPLEG: return checkSample(c);
        case Op::POOL: return checkPool(c);
        case Op::SAMPLEQ:
        case Op::SCORE:
        case Op::SPEC: return checkSpecOp(c);
        default: break;
    }
    return BLUE_ERROR("no rules for tensor op 0x%02x", uint32_t(c.ti.op));
}

bool runLlmOpRef(const Items& it, const TensorInstr& ti) {
    switch (ti.op) {
        case Op::RMSNORM: refRmsnorm(it, ti); return true;
        case Op::EMBED: refEmbed(it, ti); return true;
        case Op::ROPE:
        case Op::ROPEQK: refRope(it, ti); return true;
        case Op::KVSTORE: refKvstore(it, ti); return true;
        case Op::KVCOPY: refKvcopy(it, ti); return true;
        case Op::ATTN:
        case Op::ATTNX: refAttn(it, ti); return true;
        case Op::SWIGLU: refSwiglu(it, ti); return true;
        case Op::GEGLU: refGeglu(it, ti); return true;
        case Op::SAMPLE: refSample(it, ti, false); return true;
        case Op::SAMPLEQ: refSample(it, ti, true); return true;
        case Op::SAMPLEG: refSample(it, ti, false, true); return true;
        case Op::SPEC: refSpec(it, ti); return true;
        case Op::SCORE: refScore(it, ti); return true;
        case Op::POOL: refPool(it, ti); return true;
        default: return false;
    }
}

}  // namespace blue
