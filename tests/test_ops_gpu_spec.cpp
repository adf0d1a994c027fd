// The per-op GPU-vs-reference cases of the speculative-decoding ops (see test_ops_gpu.cpp).
// SAMPLEQ: SAMPLE's draws, plus the distribution drawn from written into a table row (a row
// beyond the table: nothing written). SPEC: 48 instances verify 0 to 4 draft tokens against
// draft distributions of their own, greedy and sampled with filters, some in prefill mode, four
// times each (the counter advances). The logits reach both machines bit for bit (embedded rows),
// so results can differ only where float rounding of the sampling arithmetic moves a boundary:
// greedy results must be equal, sampled ones equal in at least 99% of the verifications
// (accepted count and token), the written distributions within 1e-5.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>

#include "tests/gpu_fixture.h"
#include "tests/test_ops_gpu.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"

namespace blue::test {

namespace {

constexpr uint32_t kVocab = 16;  // logits per row, and tokens of the embedded table
constexpr uint32_t kInstances = 48, kRuns = 4;

struct Config {
    float temp, top_p, min_p;
    uint32_t top_k;
};
const Config kConfigs[] = {{0, 1, 0, 0}, {1.0f, 1, 0, 0}, {0.7f, 0.9f, 0.02f, 6}, {1.3f, 0.8f, 0, 0}};

std::vector<std::pair<uint32_t, uint32_t>> samplingWords(const Config& c, uint32_t seed) {
    auto f = [](float v) { return std::bit_cast<uint32_t>(v); };
    const uint32_t sp = BLUE_LM_SAMPLING;
    return {{sp + BLUE_SP_TEMP, f(c.temp)}, {sp + BLUE_SP_TOP_K, c.top_k},       {sp + BLUE_SP_TOP_P, f(c.top_p)},
            {sp + BLUE_SP_MIN_P, f(c.min_p)}, {sp + BLUE_SP_REPEAT_PENALTY, f(1)}, {sp + BLUE_SP_REPEAT_LAST_N, 0},
            {sp + BLUE_SP_PRESENCE, 0},       {sp + BLUE_SP_FREQUENCY, 0},         {sp + BLUE_SP_SEED, seed},
            {sp + BLUE_SP_COUNTER, 0},        {sp + BLUE_SP_HIST_ADDR, BLUE_LM_HISTORY}, {sp + BLUE_SP_HIST_LEN, 0}};
}

// A random distribution over kVocab tokens, some entries zero.
std::vector<float> draftDistribution(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<float> d(kVocab);
    float sum = 0;
    for (float& x : d) sum += (x = u(rng) < 0.25f ? 0.0f : u(rng));
    for (float& x : d) x /= sum;
    return d;
}

}  // namespace

void sampleqCase(uint32_t history) {
    CAPTURE(history);
    OpModule om(kVocab, kInstances, kTokens + 8, 0x5A4);
    uint32_t rows = om.rowsInput("logit_rows", kVocab, -3, 3);
    uint32_t logits = om.tensor("logits", BLUE_TC_INSTANCE, DType::F32, {kVocab});
    uint32_t table = om.tensor("table", BLUE_TC_INSTANCE, DType::F32, {kVocab, 4});
    om.step(Op::TSCALE, {logits, rows, std::bit_cast<uint32_t>(1.0f)});
    om.step(Op::SAMPLEQ, {logits, BLUE_FA_SAMPLING, table});
    om.outputsAfterRun();
    std::vector<InstancePlan> plans(kInstances);
    std::uniform_int_distribution<uint32_t> tok(0, kVocab - 1);
    for (uint32_t i = 0; i < kInstances; ++i) {
        plans[i].tokens = {tok(om.rng())};
        plans[i].local_words = samplingWords(kConfigs[i % 4], 300 + i);
        plans[i].local_words.push_back({BLUE_LM_SAMPLING + BLUE_SP_ROW, i % 5});  // row 4: none
    }
    Module m = om.build(plans);
    auto both = runOnBoth(m, kInstances, nullptr, 0, [history](GpuOptions& o) { o.sample_history = history; });
    if (!both) return;
    uint32_t agree = 0, draws = 0;
    for (uint32_t i = 0; i < kInstances; ++i) {
        std::vector<OutputRecord> g = recordsOf(both->gpu_report.output, i), r = recordsOf(both->ref_report.output, i);
        REQUIRE(g.size() == 3);
        REQUIRE(r.size() == 3);
        if (kConfigs[i % 4].temp == 0) CHECK(g[0].value == r[0].value);
        agree += g[0].value == r[0].value;
        ++draws;
    }
    CHECK(agree * 100 >= draws * 99);
    expectClose(*both, table, 0, 1e-5, "SAMPLEQ distribution table");
}

void specCase() {
    OpModule om(kVocab, kInstances * 5, kSpecBlock + BLUE_SPEC_WORDS, 0x5A5);
    uint32_t rows = om.rowsInput("target_rows", kVocab, -2, 2);
    uint32_t table = om.tensor("q", BLUE_TC_INSTANCE, DType::F32, {kVocab, BLUE_SPEC_MAX_DRAFT});
    om.step(Op::SPEC, {table, rows, BLUE_FA_SAMPLING, BLUE_FA_SPEC});
    om.outputWords({kSpecBlock + BLUE_SPEC_ACCEPTED, kSpecBlock + BLUE_SPEC_TOKEN});
    std::vector<InstancePlan> plans(kInstances);
    std::uniform_int_distribution<uint32_t> tok(0, kVocab - 1);
    for (uint32_t i = 0; i < kInstances; ++i) {
        InstancePlan& p = plans[i];
        uint32_t k = i % 5;
        p.rows = k + 1;
        for (uint32_t j = 0; j <= k; ++j) p.tokens.push_back(tok(om.rng()));
        p.runs = kRuns;
        p.local_words = samplingWords(kConfigs[i % 4], 900 + i);
        p.local_words.push_back({kSpecBlock + BLUE_SPEC_MODE, i % 7 == 3 ? 1u : 0u});
        std::vector<float> q;
        for (uint32_t j = 0; j < BLUE_SPEC_MAX_DRAFT; ++j) {
            std::vector<float> d = draftDistribution(om.rng());
            q.insert(q.end(), d.begin(), d.end());
        }
        p.tensor_words.push_back({table, q});
    }
    Module m = om.build(plans);
    auto both = runOnBoth(m, kInstances);
    if (!both) return;
    uint32_t agree = 0, total = 0, accepted = 0;
    for (uint32_t i = 0; i < kInstances; ++i) {
        CAPTURE(i);
        std::vector<OutputRecord> g = recordsOf(both->gpu_report.output, i), r = recordsOf(both->ref_report.output, i);
        REQUIRE(g.size() == 2 * kRuns);
        REQUIRE(r.size() == 2 * kRuns);
        for (uint32_t k = 0; k < kRuns; ++k) {
            uint32_t acc = r[2 * k].value, t = r[2 * k + 1].value;
            CHECK(acc <= i % 5);
            CHECK(t < kVocab);
            if (i % 7 == 3) CHECK(acc == 0);  // prefill mode drafts nothing
            bool same = g[2 * k].value == acc && g[2 * k + 1].value == t;
            if (kConfigs[i % 4].temp == 0) CHECK(same);
            agree += same;
            accepted += acc;
            ++total;
        }
    }
    MESSAGE("SPEC: " << agree << " of " << total << " verifications agree on the GPU and the reference ("
                     << accepted << " draft tokens accepted)");
    CHECK(agree * 100 >= total * 99);
    CHECK(accepted > 0);

    // Qwen2's vocabulary (152,064) with six drafts, sampled with top-p and no top-k over flat rows
    // (logits in [-3, 3): the 1,024 largest do not carry the mass, so top-p searches the whole
    // row). One workgroup verifies its seven rows: about 25 walks over the vocabulary each, which
    // one logit per lane per iteration made 96,000 loop iterations, past lavapipe's 65,535 per
    // invocation (KernelChoice::loop_limit); the later rows came out wrong. Each draft's
    // probability in the draft distribution is tiny, so every draft is accepted and every row
    // walked.
    constexpr uint32_t kWideVocab = 152064, kWideInstances = 4, kDrafts = 6;
    OpModule wide(kTokens + 24, kWideInstances * (kDrafts + 1), kSpecBlock + BLUE_SPEC_WORDS, 0x5A8);
    // The draft tokens (the module's tokens, below kTokens + 24) lead every row, so top-p keeps
    // them and they are accepted.
    std::vector<float> wtable = wide.random(size_t(kTokens + 24) * kWideVocab, -3, 3);
    for (uint32_t t = 0; t < kTokens + 24; ++t) {
        for (uint32_t d = 0; d < kTokens + 24; ++d) wtable[size_t(t) * kWideVocab + d] = 2.5f;
    }
    uint32_t wrows = wide.rowsInput("target_rows", kWideVocab, wtable);
    uint32_t wq = wide.tensor("q", BLUE_TC_INSTANCE, DType::F32, {kWideVocab, BLUE_SPEC_MAX_DRAFT});
    wide.step(Op::SPEC, {wq, wrows, BLUE_FA_SAMPLING, BLUE_FA_SPEC});
    wide.outputWords({kSpecBlock + BLUE_SPEC_ACCEPTED, kSpecBlock + BLUE_SPEC_TOKEN});
    std::vector<InstancePlan> wplans(kWideInstances);
    std::uniform_int_distribution<uint32_t> wtok(0, kTokens + 23);
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        InstancePlan& p = wplans[i];
        p.rows = kDrafts + 1;
        for (uint32_t j = 0; j <= kDrafts; ++j) p.tokens.push_back(wtok(wide.rng()));
        p.local_words = samplingWords({1.0f, 0.9f, 0, 0}, 700 + i);
        std::vector<float> q(size_t(kWideVocab) * BLUE_SPEC_MAX_DRAFT, 0.0f);
        for (uint32_t j = 0; j < kDrafts; ++j) q[size_t(j) * kWideVocab + p.tokens[j + 1]] = 1e-9f;
        p.tensor_words.push_back({wq, q});
    }
    Module wm = wide.build(wplans);
    auto wboth = runOnBoth(wm, kWideInstances);
    if (!wboth) return;
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        CAPTURE(i);
        std::vector<OutputRecord> g = recordsOf(wboth->gpu_report.output, i),
                                  r = recordsOf(wboth->ref_report.output, i);
        REQUIRE(g.size() == 2);
        REQUIRE(r.size() == 2);
        CHECK(r[0].value == kDrafts);
        CHECK(g[0].value == r[0].value);
        CHECK(g[1].value == r[1].value);
        CHECK(r[1].value < kWideVocab);
    }
}

void scoreCase() {
    // Every row gets its own token (the harness tags rows by token), and tokens must index the
    // logits: 256 of each.
    OpModule om(256, kInstances * 6, kTokens + 8, 0x5A6);
    uint32_t rows = om.rowsInput("rows", 256, -3, 3);
    uint32_t sum = om.tensor("sum", BLUE_TC_INSTANCE, DType::F32, {1});
    om.step(Op::SCORE, {sum, rows});
    std::vector<uint32_t> counts;
    for (uint32_t i = 0; i < kInstances; ++i) counts.push_back(1 + i % 6);
    std::vector<uint32_t> pos(kInstances, 0);
    Module m = om.build(raggedPlans(om, counts, pos));
    auto both = runOnBoth(m, kInstances);
    if (!both) return;
    // Sums of up to five log-softmax values of logits in [-3, 3): float on the GPU, double on
    // the reference; one-row instances sum nothing (0).
    expectClose(*both, sum, 0, 1e-5, "SCORE log-likelihood");

    // Qwen2's vocabulary (152,064) over one instance's 80 rows: each workgroup walks every row
    // twice over the vocabulary, which lavapipe counts against its 65,535 loop iterations per
    // invocation (KernelChoice::loop_limit): 8 logits per lane per iteration keep it at about
    // 80 x 190 rather than 80 x 1,220.
    // The harness's inputs are a table of a row per token, so the module's tokens are few (88);
    // they index the first logits of each 152,064-wide row.
    constexpr uint32_t kWideVocab = 152064, kWideRows = 80;
    OpModule wide(kWideRows + 8, kWideRows, kTokens + kWideRows + 8, 0x5A7);
    uint32_t wrows = wide.rowsInput("rows", kWideVocab, -3, 3);
    uint32_t wsum = wide.tensor("sum", BLUE_TC_INSTANCE, DType::F32, {1});
    wide.step(Op::SCORE, {wsum, wrows});
    Module wm = wide.build(raggedPlans(wide, {kWideRows}, {0}));
    auto wboth = runOnBoth(wm, 1);
    if (!wboth) return;
    // 79 log-softmax values over 152,064 logits each: float sums of that many terms (~1e-7
    // relative each) against the reference's double; 1e-5 of the total.
    expectClose(*wboth, wsum, 0, 1e-5, "SCORE log-likelihood, 152,064-token vocabulary, 80 rows");
}

}  // namespace blue::test
