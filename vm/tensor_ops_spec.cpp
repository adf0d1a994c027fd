// Reference semantics of the speculative-decoding ops: SAMPLEQ (SAMPLE that also records the
// distribution it drew from, for the draft model) and SPEC (the target's verification of K draft
// tokens in one forward pass: the standard lossless rule — accept d with probability
// min(1, p(d)/q(d)), on the first rejection draw from the normalised max(0, p - q), after K
// acceptances draw a bonus token from p; greedy: accept while d is the target's argmax). In
// prefill mode SPEC only draws the token after the last row, like SAMPLE.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "vm/llm_abi.h"
#include "vm/philox.h"
#include "vm/tensor_ops_internal.h"

namespace blue {

Status checkSpecOp(const Checker& c) {
    if (c.ti.op == Op::SCORE) {
        if (c.t(0).cls != BLUE_TC_INSTANCE) return c.fail(0, "the result must be an INSTANCE tensor");
        BLUE_TRY(c.dtype(0, DType::F32));
        if (c.t(1).cls != BLUE_TC_ROWS) return c.fail(1, "logits must be a ROWS tensor (one row per position)");
        return c.dtype(1, DType::F32);
    }
    if (c.ti.op == Op::SAMPLEQ) {
        if (c.t(0).cls != BLUE_TC_INSTANCE) return c.fail(0, "logits must be an INSTANCE tensor");
        BLUE_TRY(c.dtype(0, DType::F32));
        if (c.ti.args[1] >= BLUE_MAX_BLOCK_ARGS) return BLUE_ERROR("block argument %u does not exist", c.ti.args[1]);
        if (c.t(2).cls != BLUE_TC_INSTANCE || c.t(2).ndim != 2) return c.fail(2, "the table must be a 2-D INSTANCE tensor [vocab, rows]");
        BLUE_TRY(c.dtype(2, DType::F32));
        if (c.t(2).ne[0] != c.t(0).elements()) return c.fail(2, "table rows must be as long as the logits");
        return Status::ok();
    }
    if (c.t(0).cls != BLUE_TC_INSTANCE || c.t(0).ndim != 2) return c.fail(0, "the table must be a 2-D INSTANCE tensor [vocab, rows]");
    BLUE_TRY(c.dtype(0, DType::F32));
    if (c.t(1).cls != BLUE_TC_ROWS) return c.fail(1, "logits must be a ROWS tensor (one row per position)");
    BLUE_TRY(c.dtype(1, DType::F32));
    if (c.t(1).elements() != c.t(0).ne[0]) return c.fail(1, "logits must be as long as the table's rows");
    for (size_t k : {2, 3}) {
        if (c.ti.args[k] >= BLUE_MAX_BLOCK_ARGS) return BLUE_ERROR("block argument %u does not exist", c.ti.args[k]);
    }
    return Status::ok();
}

void refSpec(const Items& it, const TensorInstr& ti) {
    const TensorDecl& table = it.decl(ti.args[0]);
    const uint64_t n = table.ne[0];
    for (uint32_t item = 0; item < it.count(); ++item) {
        uint32_t sp_at = it.arg(item, ti.args[2]), sb_at = it.arg(item, ti.args[3]);
        uint32_t* sp = it.local(item, uint64_t(sp_at) + BLUE_SP_WORDS - 1) ? it.local(item, sp_at) : nullptr;
        uint32_t* sb = it.local(item, uint64_t(sb_at) + BLUE_SPEC_WORDS - 1) ? it.local(item, sb_at) : nullptr;
        if (!sp || !sb) continue;  // parameter blocks out of range: nothing to do
        SampleParams p = sampleParams(sp);
        uint32_t counter = p.counter;
        // K draft tokens follow the first row's token in local memory; clamped to the table.
        uint32_t k = std::min<uint32_t>({it.rowCount(item) - 1, uint32_t(table.ne[1]), BLUE_SPEC_MAX_DRAFT});
        uint32_t tokens = it.arg(item, BLUE_FA_TOKENS);
        if (!it.local(item, uint64_t(tokens) + k)) k = 0;
        uint32_t first = it.firstRow(item);
        if (sb[BLUE_SPEC_MODE] == 1) {  // prefill: only the last row's next token
            first += it.rowCount(item) - 1;
            k = 0;
        }
        const float* q_all = it.f32(ti.args[0], item);
        uint32_t accepted = 0, out = 0;
        for (uint32_t i = 0; i <= k; ++i) {
            const float* row = it.rowF32(ti.args[1], first + i);
            std::vector<float> l(row, row + n);
            Distribution d = samplingDistribution(l, p);
            float entropy = d.entropy;
            if (i < k) {
                uint32_t tok = *it.local(item, uint64_t(tokens) + i + 1);
                const float* q = q_all + uint64_t(i) * n;
                bool accept;
                if (p.temp <= 0.0f) {
                    accept = tok == d.argmax;
                } else {
                    double pd = tok < n ? d.w[tok] / d.total : 0.0, qd = tok < n ? double(q[tok]) : 0.0;
                    float u = philoxUniform(p.seed, counter++);
                    accept = qd > 0 && double(u) * qd < pd;
                }
                if (accept) {
                    std::memcpy(&sb[BLUE_SPEC_ENTROPY + i], &entropy, 4);
                    float lp = logProbability(l, d, tok);
                    std::memcpy(&sb[BLUE_SPEC_LOGPROB + i], &lp, 4);
                    ++accepted;
                    continue;
                }
                if (p.temp <= 0.0f) {
                    out = d.argmax;
                } else {
                    std::vector<double> r(n);
                    double total = 0;
                    for (uint64_t j = 0; j < n; ++j) total += (r[j] = std::max(0.0, d.w[j] / d.total - double(q[j])));
                    float u = philoxUniform(p.seed, counter++);
                    out = total > 0 ? drawFrom(r, total, u, d.argmax) : drawFrom(d.w, d.total, u, d.argmax);
                }
            } else {
                out = p.temp <= 0.0f ? d.argmax : drawFrom(d.w, d.total, philoxUniform(p.seed, counter++), d.argmax);
            }
            std::memcpy(&sb[BLUE_SPEC_ENTROPY + i], &entropy, 4);
            float lp = logProbability(l, d, out);
            std::memcpy(&sb[BLUE_SPEC_LOGPROB + i], &lp, 4);
            break;
        }
        sb[BLUE_SPEC_ACCEPTED] = accepted;
        sb[BLUE_SPEC_TOKEN] = out;
        sp[BLUE_SP_COUNTER] = counter;
    }
}

void refScore(const Items& it, const TensorInstr& ti) {
    const uint64_t n = it.decl(ti.args[1]).elements();
    for (uint32_t item = 0; item < it.count(); ++item) {
        uint32_t tokens = it.arg(item, BLUE_FA_TOKENS), rows = it.rowCount(item);
        double sum = 0;
        for (uint32_t r = 0; r + 1 < rows; ++r) {
            const uint32_t* next = it.local(item, uint64_t(tokens) + r + 1);
            if (!next || *next >= n) continue;  // an out-of-range token scores nothing
            const float* row = it.rowF32(ti.args[1], it.firstRow(item) + r);
            double m = *std::max_element(row, row + n), z = 0;
            for (uint64_t i = 0; i < n; ++i) z += std::exp(double(row[i]) - m);
            sum += double(row[*next]) - m - std::log(z);
        }
        it.f32(ti.args[0], item)[0] = float(sum);
    }
}

}  // namespace blue
