// Internal helpers shared by the tensor-op files: operand checks for the verifier and item
// addressing for the reference implementations.
#pragma once

#include <cstring>
#include <functional>
#include <cmath>
#include <string>
#include <vector>

#include "vm/abi.h"
#include "vm/tensor_ops.h"

namespace blue {

const char* tensorClassName(uint32_t cls);

// ---- checks ------------------------------------------------------------------------------------

struct Checker {
    const Module& m;
    const TensorInstr& ti;

    const TensorDecl& t(size_t i) const { return m.tensors[ti.args[i]]; }

    Status fail(size_t i, const std::string& msg) const {
        return BLUE_ERROR("operand %zu (tensor '%s'): %s", i, t(i).name.c_str(), msg.c_str());
    }
    // The destination must be a per-row or per-instance activation.
    Status dst(size_t i) const {
        if (t(i).cls != BLUE_TC_ROWS && t(i).cls != BLUE_TC_INSTANCE) {
            return fail(i, strFormat("destination must be ROWS or INSTANCE, not %s",
                                     tensorClassName(t(i).cls)));
        }
        return Status::ok();
    }
    Status dtype(size_t i, DType want) const {
        if (t(i).dtype != want) {
            return fail(i, strFormat("type %s, expected %s", std::string(dtypeName(t(i).dtype)).c_str(),
                                     std::string(dtypeName(want)).c_str()));
        }
        return Status::ok();
    }
    Status elements(size_t i, uint64_t want) const {
        if (t(i).elements() != want) {
            return fail(i, strFormat("has %llu elements per item, expected %llu",
                                     (unsigned long long)t(i).elements(), (unsigned long long)want));
        }
        return Status::ok();
    }
    Status notWeightDst(size_t i) const {
        if (t(i).cls == BLUE_TC_WEIGHT) return fail(i, "a WEIGHT tensor is read-only");
        return Status::ok();
    }
};

// ---- reference execution -------------------------------------------------------------------

struct Items {
    const TensorOpEnv& env;
    bool rows_mode;  // iterate rows (dst is ROWS) or instances (dst is INSTANCE)

    uint32_t count() const {
        return uint32_t(rows_mode ? env.run->row_inst.size() : env.run->insts.size());
    }
    uint32_t instanceOf(uint32_t item) const {
        return rows_mode ? env.run->row_inst[item] : env.run->insts[item];
    }
    uint32_t rowOf(uint32_t item) const {
        return rows_mode ? item : env.run->inst_base[item] + env.run->inst_rows[item] - 1;
    }
    uint8_t* slice(uint32_t tensor, uint32_t item) const {
        const TensorDecl& t = env.module->tensors[tensor];
        uint8_t* base = env.tensors->data[tensor].data();
        uint64_t bytes = env.tensors->slice_bytes[tensor];
        switch (t.cls) {
            case BLUE_TC_ROWS: return base + uint64_t(rowOf(item)) * bytes;
            case BLUE_TC_INSTANCE: return base + uint64_t(instanceOf(item)) * bytes;
            default: return base;
        }
    }
    float* f32(uint32_t tensor, uint32_t item) const {
        return reinterpret_cast<float*>(slice(tensor, item));
    }
    // Instance items: the instance's first row in this block run, and its number of rows.
    uint32_t firstRow(uint32_t item) const { return env.run->inst_base[item]; }
    uint32_t rowCount(uint32_t item) const { return env.run->inst_rows[item]; }
    // Row `row` (of the block run) of a ROWS tensor.
    float* rowF32(uint32_t tensor, uint32_t row) const {
        return reinterpret_cast<float*>(env.tensors->data[tensor].data() + uint64_t(row) * env.tensors->slice_bytes[tensor]);
    }
    // Index of the item's row among its instance's rows (0 for instance items).
    uint32_t rowLocal(uint32_t item) const { return rows_mode ? env.run->row_local[item] : 0; }
    // Block argument k of the item's instance.
    uint32_t arg(uint32_t item, uint32_t k) const {
        return env.block_args[size_t(instanceOf(item)) * BLUE_MAX_BLOCK_ARGS + k];
    }
    // A word of the item's instance's local memory; nullptr when out of range.
    uint32_t* local(uint32_t item, uint64_t addr) const {
        uint64_t words = env.module->layout.local_words;
        if (addr >= words) return nullptr;
        return &env.local[size_t(instanceOf(item)) * words + addr];
    }
    const TensorDecl& decl(uint32_t tensor) const { return env.module->tensors[tensor]; }
};

float bitsToFloat(uint32_t u);

// Per-op checks and reference implementations of the LLM ops (tensor_ops_llm.cpp).
Status checkLlmOp(const Checker& c);
bool runLlmOpRef(const Items& it, const TensorInstr& ti);
// ... and of the paged-KV ops KVSTOREP, ATTNP, PGCOPY, KVCOPYP (tensor_ops_kvpages.cpp).
Status checkKvPagesOp(const Checker& c);
bool runKvPagesOpRef(const Items& it, const TensorInstr& ti);

// ---- KV rows and attention, shared by the cached (tensor_ops_llm.cpp) and paged ops -----------

// Operand i is a ROWS F32 tensor.
Status rowsDst(const Checker& c, size_t i);
// Block argument k exists.
Status argSlot(uint32_t k);
// ATTN, ATTNX and ATTNP's query side: dst (0) ROWS F32, q (3) as long, heads (4) and KV heads (5)
// that divide it, and (ATTNX, ATTNP) a soft cap (9) of 0 or more. *kv_row: the K/V row length.
Status checkAttnQuery(const Checker& c, uint64_t* kv_row);
// Element `index` of KV data of type t (F32 or F16) as a float, and the store of one.
float cacheRead(const TensorDecl& t, const uint8_t* data, uint64_t index);
void cacheWrite(const TensorDecl& t, uint8_t* data, uint64_t index, float v);
// The row of K/V data (operands 1 and 2, as it.slice gives them) that holds position t of the
// item's instance, or kNoKvRow where the position has none.
constexpr uint64_t kNoKvRow = ~uint64_t(0);
using KvRowOf = std::function<uint64_t(uint32_t item, uint64_t t)>;
// Attention (ATTN; ATTNX and ATTNP with window and soft cap) of every item over positions
// 0..min(arg + row index, positions - 1), position t read from row row_of(item, t); positions
// without a row take no part, and an item with none gets zeros. ATTN's cache is row_of = t, so a
// paged table that maps positions to rows holding the same values gives the same bits.
void attnRows(const Items& it, const TensorInstr& ti, uint64_t positions, const KvRowOf& row_of);
// KVSTORE and KVSTOREP: each item's K and V rows (operands 0 and 2) into row row_of(item, p) of
// operands 1 and 3, p = arg (operand 4) + row index; nothing where it has no row.
void kvStoreRows(const Items& it, const TensorInstr& ti, const KvRowOf& row_of);
// KVCOPY and KVCOPYP: positions [first, end) (block arguments of operands 4 and 5, clamped to the
// store's context) between row row_of(item, pos) of operand 0 and slot s (operand 3's argument;
// none past the store's slots) of the store, operand 1; direction operand 2 (0: store to rows).
void kvCopyRows(const Items& it, const TensorInstr& ti, const KvRowOf& row_of);
// ... and of the mixture-of-experts ops (tensor_ops_moe.cpp).
Status checkMoeOp(const Checker& c);
bool runMoeOpRef(const Items& it, const TensorInstr& ti);

// ---- the sampling rule, shared by SAMPLE, SAMPLEQ and SPEC (tensor_ops_llm.cpp) ---------------

struct SampleParams {
    float temp, top_p, min_p, repeat, presence, frequency;
    uint32_t top_k, last_n, seed, counter;
};
SampleParams sampleParams(const uint32_t* sampling_block);

// The distribution a draw is made from: weights over the kept tokens at the temperature (greedy:
// one-hot at the argmax, the lowest index of the largest logit), and the T = 1 statistics.
struct Distribution {
    std::vector<double> w;  // unnormalised; 0 for dropped tokens
    double total = 0;       // sum of w
    double m = 0, z = 0;    // largest logit, sum of exp(l - m)
    uint32_t argmax = 0;
    float entropy = 0;      // of the T = 1 distribution, nats
};
Distribution samplingDistribution(const std::vector<float>& logits, const SampleParams& p);
// The token whose cumulative weight (in id order) first exceeds uniform * total.
uint32_t drawFrom(const std::vector<double>& w, double total, float uniform, uint32_t fallback);
// log p(tok) under the T = 1 distribution.
float logProbability(const std::vector<float>& logits, const Distribution& d, uint32_t tok);
// One draw (counter p.counter) or the argmax when greedy; `dist` (optional) gets the distribution.
uint32_t sampleToken(const std::vector<float>& logits, const SampleParams& p, float* entropy,
                     float* logprob, Distribution* dist = nullptr);

// SAMPLEQ and SPEC (tensor_ops_spec.cpp).
Status checkSpecOp(const Checker& c);
void refSpec(const Items& it, const TensorInstr& ti);
void refScore(const Items& it, const TensorInstr& ti);

// The GLU activations times the up projection, in double, as SWIGLU, GEGLU and MATMULGLU compute
// them (shaders/common/activations.glsl). gelu is the tanh form written as x / (1 + exp(-2y)),
// y = sqrt(2/pi)(x + 0.044715x^3): no tanh overflow for large |x|.
inline float siluTimes(float g, float u) { return float(g / (1.0 + std::exp(-double(g))) * u); }
inline float geluTimes(float g, float u) {
    const double x = g, y = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return float(x / (1.0 + std::exp(-2.0 * y)) * u);
}

}  // namespace blue
