// Speculative decoding's verification op (SPEC, vm/tensor_ops_spec.cpp, shaders/spec.comp) on a
// small vocabulary, on the reference machine and the GPU: with sampling, the first token it emits
// (the draft token when accepted, else its own draw from the residual) is distributed as the
// target's distribution p, not the draft's q, although the draft token was drawn from q — the
// lossless rule, checked with a chi-square test; greedy, it accepts exactly the target's argmax.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "compiler/code_builder.h"
#include "tests/gpu_fixture.h"
#include "vm/abi.h"
#include "vm/llm_abi.h"
#include "vm/verify.h"
#include "vm/weights.h"

namespace blue::test {
namespace {

constexpr uint32_t kVocab = 8;
constexpr uint32_t kTokensAt = 40, kSpecAt = 60;
// The target's logits at the verified position (row 0), and the draft's distribution there.
const float kTargetLogits[kVocab] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f, 1.5f, 0.7f};
const float kDraft[kVocab] = {0.05f, 0.30f, 0.20f, 0.05f, 0.15f, 0.10f, 0.05f, 0.10f};

std::vector<double> targetProbs(float temperature) {
    std::vector<double> p(kVocab);
    double z = 0;
    for (uint32_t i = 0; i < kVocab; ++i) z += (p[i] = std::exp(double(kTargetLogits[i]) / temperature));
    for (double& v : p) v /= z;
    return p;
}

// A module whose instances each take messages {seed, draft token}, verify that one draft token
// at temperature `temp`, and write (draft token, accepted, SPEC's token) per message.
Module specModule(float temp) {
    Module m;
    m.layout.regs = 32;
    m.layout.local_words = 100;
    m.layout.in_slots = 64;
    m.layout.in_slot_words = 3;
    m.layout.max_rows = 256;
    // The logits table EMBED reads by token: row 0 is the verified position's logits; the rows
    // of the other tokens (the bonus position, never reached when the test reads the first
    // emitted token) are arbitrary.
    std::vector<float> table(kVocab * kVocab);
    for (uint32_t t = 0; t < kVocab; ++t) {
        for (uint32_t i = 0; i < kVocab; ++i) table[t * kVocab + i] = t == 0 ? kTargetLogits[i] : 0.1f * float((t * 7 + i * 3) % 11);
    }
    TensorDecl w;
    w.name = "table";
    w.cls = BLUE_TC_WEIGHT;
    w.ndim = 2;
    w.ne = {kVocab, kVocab, 1, 1};
    w.source = DataSource::DATA;
    w.offset = 0;
    w.bytes = table.size() * 4;
    m.data.resize(w.bytes);
    std::memcpy(m.data.data(), table.data(), w.bytes);
    m.tensors.push_back(w);
    TensorDecl logits;
    logits.name = "logits";
    logits.cls = BLUE_TC_ROWS;
    logits.ne = {kVocab, 1, 1, 1};
    m.tensors.push_back(logits);
    TensorDecl q;
    q.name = "q";
    q.cls = BLUE_TC_INSTANCE;
    q.ndim = 2;
    q.ne = {kVocab, BLUE_SPEC_MAX_DRAFT, 1, 1};
    m.tensors.push_back(q);

    CodeBuilder cb(&m);
    cb.beginBlock("verify", BLUE_FA_COUNT + 1);
    cb.tensor(Op::EMBED, {1, 0, BLUE_FA_TOKENS});
    cb.tensor(Op::SPEC, {2, 1, BLUE_FA_SAMPLING, BLUE_FA_SPEC});
    cb.endBlock();
    enum : uint8_t { kSlot = 1, kTmp, kIdx, kSeed, kDraftTok, kZero, kMinus1, kA = 20 };
    auto loop = cb.newLabel(), halt = cb.newLabel();
    auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
    cb.li(kZero, 0);
    cb.li(kMinus1, 0xFFFFFFFFu);
    for (uint32_t j = 0; j < kVocab; ++j) {  // the draft's distribution, row 0 of the table
        cb.li(kTmp, bits(kDraft[j]));
        cb.li(kIdx, j);
        cb.op(Op::TST, {kTmp, kIdx}, 2);
    }
    const std::pair<uint32_t, uint32_t> sampling[] = {
        {BLUE_SP_TEMP, bits(temp)}, {BLUE_SP_TOP_K, 0}, {BLUE_SP_TOP_P, bits(1.0f)}, {BLUE_SP_MIN_P, 0},
        {BLUE_SP_REPEAT_PENALTY, bits(1.0f)}, {BLUE_SP_REPEAT_LAST_N, 0}, {BLUE_SP_PRESENCE, 0},
        {BLUE_SP_FREQUENCY, 0}};
    for (auto [word, value] : sampling) {
        cb.li(kTmp, value);
        cb.op(Op::ST, {kTmp, kZero}, BLUE_LM_SAMPLING + word);
    }
    cb.op(Op::ST, {kZero, kZero}, kTokensAt);           // the last accepted token: logits row 0
    cb.op(Op::ST, {kZero, kZero}, kSpecAt + BLUE_SPEC_MODE);
    cb.bind(loop);
    cb.op(Op::INRECV, {kSlot});
    cb.jump(Op::BEQ, {kSlot, kMinus1}, halt);
    cb.li(kIdx, 0);
    cb.op(Op::INLD, {kSeed, kSlot, kIdx});
    cb.li(kIdx, 1);
    cb.op(Op::INLD, {kDraftTok, kSlot, kIdx});
    cb.op(Op::INFREE, {kSlot});
    cb.op(Op::ST, {kSeed, kZero}, BLUE_LM_SAMPLING + BLUE_SP_SEED);
    cb.op(Op::ST, {kZero, kZero}, BLUE_LM_SAMPLING + BLUE_SP_COUNTER);
    cb.op(Op::ST, {kDraftTok, kZero}, kTokensAt + 1);
    cb.li(kA, 2);                 // rows: the last token and one draft
    cb.li(kA + 1, 0);             // position
    cb.li(kA + 2, kTokensAt);     // tokens
    cb.li(kA + 3, BLUE_LM_SAMPLING);
    cb.li(kA + 4, kSpecAt);
    cb.op(Op::RUN, {kA}, 0);
    cb.op(Op::OUT, {kDraftTok});
    cb.op(Op::LD, {kTmp, kZero}, kSpecAt + BLUE_SPEC_ACCEPTED);
    cb.op(Op::OUT, {kTmp});
    cb.op(Op::LD, {kTmp, kZero}, kSpecAt + BLUE_SPEC_TOKEN);
    cb.op(Op::OUT, {kTmp});
    cb.jump(Op::JMP, {}, loop);
    cb.bind(halt);
    cb.op(Op::HALT);
    REQUIRE(cb.finish());
    Status s = verifyModule(m);
    REQUIRE_MESSAGE(s, s.message());
    return m;
}

// Messages {seed, draft token} with the draft tokens drawn from kDraft.
std::vector<std::vector<uint32_t>> draftMessages(uint32_t n) {
    std::mt19937 rng(2026);
    std::discrete_distribution<uint32_t> q(std::begin(kDraft), std::end(kDraft));
    std::vector<std::vector<uint32_t>> msgs;
    for (uint32_t i = 0; i < n; ++i) msgs.push_back({1000 + i * 7919u, q(rng)});
    return msgs;
}

double chiSquare(const std::vector<uint32_t>& counts, const std::vector<double>& p, uint32_t n) {
    double chi = 0;
    for (uint32_t i = 0; i < kVocab; ++i) {
        double e = p[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

TEST_CASE("spec: sampled verification emits the target's distribution, not the draft's (chi-square, 8 tokens)") {
    const uint32_t n = 4096;
    Module m = specModule(1.0f);
    auto w = WeightSource::open(m, "");
    REQUIRE(w);
    auto msgs = draftMessages(n);
    BothRuns runs = runBoth(m, w.value(), 32, msgs, 100000, 16);
    std::vector<double> p = targetProbs(1.0f), q(std::begin(kDraft), std::end(kDraft));
    for (bool on_gpu : {false, true}) {
        CAPTURE(on_gpu);
        const RunReport& r = on_gpu ? runs.gpu : runs.ref;
        REQUIRE(r.status);
        // Per message: the draft token, whether it was accepted, SPEC's token. The first token
        // emitted is the draft token when accepted, else SPEC's draw from the residual.
        std::map<uint32_t, std::vector<uint32_t>> per_inst;
        for (const OutputRecord& rec : r.output) per_inst[rec.inst].push_back(rec.value);
        uint32_t total = 0, accepted = 0;
        std::vector<uint32_t> counts(kVocab, 0);
        for (auto& [inst, v] : per_inst) {
            REQUIRE(v.size() % 3 == 0);
            for (size_t k = 0; k < v.size(); k += 3) {
                uint32_t draft = v[k], acc = v[k + 1], tok = v[k + 2];
                REQUIRE(draft < kVocab);
                REQUIRE(tok < kVocab);
                uint32_t first = acc ? draft : tok;
                ++counts[first];
                accepted += acc;
                ++total;
            }
        }
        REQUIRE(total == n);
        double chi_p = chiSquare(counts, p, n), chi_q = chiSquare(counts, q, n);
        MESSAGE(std::string(on_gpu ? "GPU" : "reference") << ": acceptance " << double(accepted) / n << ", chi-square vs target "
                                               << chi_p << ", vs draft " << chi_q << " (7 degrees of freedom)");
        CHECK(chi_p < 24.32);  // the 0.999 quantile: a correct rule fails 1 run in 1000 seeds
        CHECK(chi_q > 200);    // and the test can tell the two distributions apart
        CHECK(accepted > 0);
        CHECK(accepted < n);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

TEST_CASE("spec: greedy verification accepts exactly the target's argmax") {
    Module m = specModule(0.0f);
    auto w = WeightSource::open(m, "");
    REQUIRE(w);
    std::vector<std::vector<uint32_t>> msgs;
    for (uint32_t d = 0; d < kVocab; ++d) msgs.push_back({d + 1, d});
    BothRuns runs = runBoth(m, w.value(), 4, msgs, 100000, 16);
    for (const RunReport* r : {&runs.ref, &runs.gpu}) {
        std::map<uint32_t, std::vector<uint32_t>> per_inst;
        for (const OutputRecord& rec : r->output) per_inst[rec.inst].push_back(rec.value);
        uint32_t seen = 0;
        for (auto& [inst, v] : per_inst) {
            for (size_t k = 0; k < v.size(); k += 3) {
                uint32_t draft = v[k], acc = v[k + 1], tok = v[k + 2];
                CHECK(acc == (draft == 3u ? 1u : 0u));  // logit 2.0 at token 3 is the argmax
                if (!acc) CHECK(tok == 3u);
                ++seen;
            }
        }
        CHECK(seen == kVocab);
    }
    CHECK_NO_VALIDATION_ERRORS();
}

}  // namespace
}  // namespace blue::test
