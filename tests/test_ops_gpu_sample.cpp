// The per-op GPU-vs-reference case of SAMPLE (see test_ops_gpu.cpp). 96 instances each draw 6
// tokens from one of six 2000-logit distributions (peaked, flat, wide, a tie for the maximum, six
// near-equal leaders) under one of nine parameter sets: greedy, top-k 1, temperature alone, every
// filter, top-p, min-p, penalties over a token history, top-k 5, top-p 0.97. More logits than the
// kernel's candidate list (SAMPLE_CANDIDATES, 1024) so both of its top-p paths run (forcing the
// list where it lacks the mass fails the 99% agreement: 434 of 444 in a trial): the list of
// the 1024 largest where they carry the mass (top-p 0.5; the wide row), the whole row where they
// do not (top-p 0.97 on the flat rows). The logits reach both machines
// bit for bit (an embedded row copied by TSCALE 1.0), so draws can differ only by the float
// rounding of the sampling arithmetic itself. The rule checked:
//   - greedy and top-k 1 draws give the same token on both machines: the lowest-index maximum
//     (top-k 1 keeps every token tied at the maximum, by the rule that keeps the k-th value's
//     ties);
//   - other draws with the same seed give the same token in at least 99% of the trials: a draw
//     may differ only where rounding moves a boundary (between two tokens' shares of the draw,
//     or a filter's cut) across it, a chance of order 1e-6 per draw;
//   - no draw picks a token that top-k, top-p or min-p removed (cuts recomputed here in double);
//     in particular top-k 5 never draws the sixth of six near-equal leaders;
//   - the GPU is deterministic: a second run writes exactly the same records;
//   - entropy and log-probability match within a stated bound.
// Then the top-N alternatives (BLUE_SP_TOP_N, sampleTopCase): 48 instances asking for 0, 1, 5 or
// 20 of them, under greedy, temperature and penalties, over the same distributions plus a flat
// one (every logit equal): both machines write the same ids (most likely first, ties lower id
// first: the tie gives 10 then 700, the flat row 0, 1, 2...), log-probabilities within 1e-5 and
// sorted; greedy's chosen token and log-probability are the first alternative's; asking for 0
// writes nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <set>

#include "host/machine_plan.h"
#include "tests/gpu_fixture.h"
#include "tests/test_ops_gpu.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"

namespace blue::test {

namespace {

constexpr uint32_t kLogits = 2000, kDists = 6, kInstances = 96, kDraws = 6, kHistLen = 24;

struct SampleConfig {
    const char* what;
    float temp = 0, top_p = 1, min_p = 0, repeat = 1, presence = 0, frequency = 0;
    uint32_t top_k = 0, last_n = 0;
};

const SampleConfig kConfigs[] = {
    {"greedy"},
    {"top-k 1", 1.0f, 1, 0, 1, 0, 0, 1},
    {"temperature", 1.0f},
    {"all filters", 0.7f, 0.9f, 0.02f, 1, 0, 0, 40},
    {"top-p", 1.3f, 0.5f},
    {"min-p", 1.0f, 1, 0.1f},
    {"penalties", 0.9f, 1, 0, 1.3f, 0.4f, 0.2f, 0, 16},
    {"top-k 5", 1.5f, 1, 0, 1, 0, 0, 5},
    {"top-p 0.97", 1.0f, 0.97f},
};
constexpr uint32_t kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);
constexpr uint32_t kTopK5 = 7, kBanDist = 3;

// [kDists][kLogits] logits.
std::vector<float> distributions(OpModule& om) {
    std::vector<float> all;
    auto add = [&](std::vector<float> d) { all.insert(all.end(), d.begin(), d.end()); };
    add(om.random(kLogits, -3, 3));
    std::vector<float> peaked = om.random(kLogits, -3, 3);
    peaked[123] = 9.0f;
    add(peaked);
    std::vector<float> tie = om.random(kLogits, -3, 3);
    tie[10] = tie[700] = 5.0f;
    add(tie);
    std::vector<float> leaders = om.random(kLogits, -6, -4);
    const float lead[] = {6.0f, 5.9f, 5.8f, 5.7f, 5.6f, 5.55f};  // token 105 is sixth
    for (int i = 0; i < 6; ++i) leaders[100 + i] = lead[i];
    add(leaders);
    add(om.random(kLogits, -0.5f, 0.5f));
    add(om.random(kLogits, -8, 8));
    return all;
}

uint32_t distOf(uint32_t inst) {
    return inst % kConfigCount == kTopK5 ? kBanDist : (inst / kConfigCount) % kDists;
}

std::vector<std::pair<uint32_t, uint32_t>> samplingWords(const SampleConfig& c, uint32_t seed) {
    const uint32_t sp = BLUE_LM_SAMPLING;
    auto f = [](float v) { return std::bit_cast<uint32_t>(v); };
    return {{sp + BLUE_SP_TEMP, f(c.temp)},
            {sp + BLUE_SP_TOP_K, c.top_k},
            {sp + BLUE_SP_TOP_P, f(c.top_p)},
            {sp + BLUE_SP_MIN_P, f(c.min_p)},
            {sp + BLUE_SP_REPEAT_PENALTY, f(c.repeat)},
            {sp + BLUE_SP_REPEAT_LAST_N, c.last_n},
            {sp + BLUE_SP_PRESENCE, f(c.presence)},
            {sp + BLUE_SP_FREQUENCY, f(c.frequency)},
            {sp + BLUE_SP_SEED, seed},
            {sp + BLUE_SP_COUNTER, seed % 7},
            {sp + BLUE_SP_HIST_ADDR, BLUE_LM_HISTORY},
            {sp + BLUE_SP_HIST_LEN, kHistLen}};
}

// Instance i: config i % 8, its distribution, seed, and a history that repeats the
// distribution's three largest logits (so the penalties move the maximum).
std::vector<InstancePlan> samplePlans(OpModule& om, const std::vector<float>& dists) {
    std::vector<InstancePlan> plans(kInstances);
    std::uniform_int_distribution<uint32_t> tok(0, kLogits - 1);
    for (uint32_t i = 0; i < kInstances; ++i) {
        InstancePlan& p = plans[i];
        p.tokens = {distOf(i)};
        p.runs = kDraws;
        p.local_words = samplingWords(kConfigs[i % kConfigCount], 7000 + 13 * i);
        const float* d = &dists[size_t(distOf(i)) * kLogits];
        std::vector<uint32_t> order(kLogits);
        std::iota(order.begin(), order.end(), 0u);
        std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                          [&](uint32_t a, uint32_t b) { return d[a] > d[b]; });
        for (uint32_t h = 0; h < kHistLen; ++h) {
            uint32_t t = h < 6 ? order[h % 3] : tok(om.rng());
            p.local_words.push_back({BLUE_LM_HISTORY + h, t});
        }
    }
    return plans;
}

struct Draw {
    uint32_t token;
    float entropy, logprob;
};

std::vector<Draw> drawsOf(const std::vector<OutputRecord>& all, uint32_t inst) {
    std::vector<OutputRecord> recs = recordsOf(all, inst);
    REQUIRE(recs.size() == 3 * kDraws);
    std::vector<Draw> out;
    for (uint32_t k = 0; k < kDraws; ++k) {
        CHECK(recs[3 * k].kind == BLUE_OUT_INT);
        out.push_back({recs[3 * k].value, std::bit_cast<float>(recs[3 * k + 1].value),
                       std::bit_cast<float>(recs[3 * k + 2].value)});
    }
    return out;
}

// Entropy in nats of softmax(d), in double.
double entropyOf(const float* d) {
    double m = *std::max_element(d, d + kLogits), z = 0, zl = 0;
    for (uint32_t i = 0; i < kLogits; ++i) {
        double e = std::exp(d[i] - m);
        z += e;
        zl += e * (d[i] - m);
    }
    return std::log(z) - zl / z;
}

std::vector<OutputRecord> runGpuAgain(const BothMachines& b, uint32_t instances, uint32_t history) {
    GpuOptions opt;
    opt.instances = instances;
    opt.sample_history = history;
    opt.max_cycles = 1000;
    opt.chain_cycles = 8;
    auto g = GpuMachine::create(*gpu().device, *gpu().pipelines, *b.module, *b.weights, opt);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    Result<RunReport> r = g.value()->run();
    REQUIRE_MESSAGE(r.isOk(), r.message());
    return r.value().output;
}

struct SampleTally {
    uint32_t stochastic = 0, agree = 0;
    ErrorStat entropy, logprob;
    std::set<uint32_t> top_k5_drawn;
};

// The lowest logit the filters keep (top-k, top-p over what top-k kept, min-p) by the rule of
// vm/tensor_ops_llm.cpp, in double, loosened by 1e-5 so that a cut decided within rounding of its
// boundary still passes. Only for parameter sets without penalties.
double keptFloor(const float* d, const SampleConfig& c) {
    std::vector<double> v(d, d + kLogits);
    std::sort(v.begin(), v.end(), std::greater<double>());
    double thr = -INFINITY;
    if (c.top_k > 0 && c.top_k < kLogits) thr = v[c.top_k - 1];
    if (c.top_p < 1) {
        double zk = 0, acc = 0;
        for (double x : v) zk += x >= thr ? std::exp(x - v[0]) : 0.0;
        for (double x : v) {
            acc += std::exp(x - v[0]);
            if (acc >= (c.top_p + 1e-5) * zk) {
                thr = std::max(thr, x);
                break;
            }
        }
    }
    if (c.min_p > 0) thr = std::max(thr, v[0] + std::log(double(c.min_p)) - 1e-5);
    return thr;
}

void checkInstance(uint32_t i, const std::vector<Draw>& g, const std::vector<Draw>& r,
                   const float* d, SampleTally* t) {
    const SampleConfig& c = kConfigs[i % kConfigCount];
    CAPTURE(i);
    CAPTURE(std::string(c.what));
    const float max = *std::max_element(d, d + kLogits);
    const uint32_t argmax = uint32_t(std::max_element(d, d + kLogits) - d);
    const bool tie = std::count(d, d + kLogits, max) > 1;
    const double floor = keptFloor(d, c);
    for (uint32_t k = 0; k < kDraws; ++k) {
        CAPTURE(k);
        t->entropy.add(g[k].entropy, r[k].entropy);
        if (c.repeat == 1.0f) CHECK(std::fabs(r[k].entropy - entropyOf(d)) <= 1e-5);
        if (c.temp == 0 || c.top_k == 1) {
            // Greedy: the lowest-index maximum. Top-k 1 keeps every token tied at the maximum
            // (the k-th value's ties are kept) and draws among them; equal weights sum exactly.
            CHECK(g[k].token == r[k].token);
            CHECK(d[r[k].token] == max);
            if (c.temp == 0 || !tie) CHECK(r[k].token == argmax);
        } else {
            ++t->stochastic;
            t->agree += g[k].token == r[k].token;
        }
        if (g[k].token == r[k].token) t->logprob.add(g[k].logprob, r[k].logprob);
        if (c.temp > 0 && c.repeat == 1.0f) {
            CHECK(d[g[k].token] >= floor);
            CHECK(d[r[k].token] >= floor);
        }
        if (i % kConfigCount == kTopK5) {
            t->top_k5_drawn.insert(g[k].token);
            t->top_k5_drawn.insert(r[k].token);
        }
    }
}

constexpr uint32_t kTopInstances = 48, kTopAddr = kTokens + 8;
const uint32_t kTopCounts[] = {0, 1, 5, 20};
const SampleConfig kTopConfigs[] = {kConfigs[0], kConfigs[2], kConfigs[6]};  // greedy, T, penalties

uint32_t topCount(uint32_t i) { return kTopCounts[i % 4]; }
const SampleConfig& topConfig(uint32_t i) { return kTopConfigs[(i / 4) % 3]; }
uint32_t topDist(uint32_t i) { return (i / 12) % (kDists + 1); }  // kDists: the flat row

struct TopDraw {
    Draw draw;
    std::vector<std::pair<uint32_t, float>> top;  // [BLUE_MAX_TOP_LOGPROBS]
};

std::vector<TopDraw> topDrawsOf(const std::vector<OutputRecord>& all, uint32_t inst) {
    std::vector<OutputRecord> recs = recordsOf(all, inst);
    const uint32_t per = 2 * BLUE_MAX_TOP_LOGPROBS + 3;
    REQUIRE(recs.size() == per * kDraws);
    std::vector<TopDraw> out(kDraws);
    for (uint32_t k = 0; k < kDraws; ++k) {
        const OutputRecord* r = &recs[per * k];
        for (uint32_t j = 0; j < BLUE_MAX_TOP_LOGPROBS; ++j) {
            out[k].top.push_back({r[2 * j].value, std::bit_cast<float>(r[2 * j + 1].value)});
        }
        r += 2 * BLUE_MAX_TOP_LOGPROBS;
        out[k].draw = {r[0].value, std::bit_cast<float>(r[1].value), std::bit_cast<float>(r[2].value)};
    }
    return out;
}

void checkTop(uint32_t i, const std::vector<TopDraw>& g, const std::vector<TopDraw>& r, ErrorStat* err) {
    const uint32_t n = topCount(i);
    CAPTURE(i);
    CAPTURE(n);
    for (uint32_t k = 0; k < kDraws; ++k) {
        CAPTURE(k);
        for (uint32_t j = 0; j < BLUE_MAX_TOP_LOGPROBS; ++j) {
            if (j >= n) {  // not asked: never written
                CHECK(g[k].top[j].first == 0);
                CHECK(r[k].top[j].first == 0);
                continue;
            }
            CHECK(g[k].top[j].first == r[k].top[j].first);
            err->add(g[k].top[j].second, r[k].top[j].second);
            CHECK(r[k].top[j].second <= 0.0f);
            if (j > 0) CHECK(r[k].top[j].second <= r[k].top[j - 1].second);
        }
        if (n == 0) continue;
        if (topConfig(i).temp == 0) {  // greedy: the chosen token is the first alternative
            CHECK(g[k].draw.token == g[k].top[0].first);
            CHECK(g[k].draw.logprob == g[k].top[0].second);
        }
        if (topDist(i) == 2 && topConfig(i).repeat == 1.0f && n > 1) {  // the tie: lower id first
            CHECK(r[k].top[0].first == 10);
            CHECK(r[k].top[1].first == 700);
        }
        if (topDist(i) == kDists && topConfig(i).repeat == 1.0f) {  // flat: ids in order
            for (uint32_t j = 0; j < n; ++j) CHECK(g[k].top[j].first == j);
        }
    }
}

}  // namespace

// SAMPLE's top-N alternatives (see the file comment).
void sampleTopCase() {
    OpModule om(kDists + 1, kTopInstances, kTopAddr + 2 * BLUE_MAX_TOP_LOGPROBS, 0x70B);
    std::vector<float> dists = distributions(om);
    dists.insert(dists.end(), kLogits, 0.25f);
    uint32_t rows = om.rowsInput("logit_rows", kLogits, dists);
    uint32_t logits = om.tensor("logits", BLUE_TC_INSTANCE, DType::F32, {kLogits});
    om.step(Op::TSCALE, {logits, rows, std::bit_cast<uint32_t>(1.0f)});
    om.step(Op::SAMPLE, {logits, BLUE_FA_SAMPLING});
    std::vector<uint32_t> words;
    for (uint32_t j = 0; j < 2 * BLUE_MAX_TOP_LOGPROBS; ++j) words.push_back(kTopAddr + j);
    om.outputWords(words);
    om.outputsAfterRun();
    std::vector<InstancePlan> plans(kTopInstances);
    for (uint32_t i = 0; i < kTopInstances; ++i) {
        InstancePlan& p = plans[i];
        p.tokens = {topDist(i)};
        p.runs = kDraws;
        p.local_words = samplingWords(topConfig(i), 300 + 7 * i);
        p.local_words.push_back({BLUE_LM_SAMPLING + BLUE_SP_TOP_N, topCount(i)});
        p.local_words.push_back({BLUE_LM_SAMPLING + BLUE_SP_TOP_ADDR, kTopAddr});
        for (uint32_t h = 0; h < kHistLen; ++h) p.local_words.push_back({BLUE_LM_HISTORY + h, (h * 37 + i) % kLogits});
    }
    Module m = om.build(plans);
    auto both = runOnBoth(m, kTopInstances);
    if (!both) return;  // refused under a device profile (runOnBoth said why)
    ErrorStat err;
    for (uint32_t i = 0; i < kTopInstances; ++i) {
        checkTop(i, topDrawsOf(both->gpu_report.output, i), topDrawsOf(both->ref_report.output, i), &err);
    }
    INFO("top log-probabilities " << err.normalised());
    CHECK(err.normalised() <= 1e-5);
    opMeasures().push_back({"SAMPLE top logprobs", err.normalised(), 1e-5});
}

// Penalties over the longest window the host lets through on lavapipe (maxPenaltyWindow: about
// 15,700 tokens at a vocabulary of 32,768 sampled on 256 lanes; about 8,000 at 4,096, which
// samples on 64 lanes: sampleWidth), the row's three largest logits only at the window's end.
// At 32,768 every token is distinct (each window position walks the whole window: the worst
// case); at 4,096 the window repeats a vocabulary's worth of tokens. One word an iteration, the
// kernel took ceil(6000 / 256) * 6,001 = 144,000 loop iterations an invocation at 6,000 tokens,
// past lavapipe's 65,535 (KernelChoice::loop_limit), so the window's last tokens went unpenalized
// there.
void samplePenaltyWindowCase(uint32_t vocab, uint32_t least_window, bool sampled) {
    CAPTURE(vocab);
    CAPTURE(sampled);
    constexpr uint32_t kWideInstances = 2;
    const uint32_t window = maxPenaltyWindow(deviceLoopLimit(true), vocab);
    REQUIRE(window > least_window);
    REQUIRE(window < 32000);
    // The leaders and a token never in the history sit in the vocabulary's last 800 ids.
    const uint32_t lead = vocab - 700, history_ids = vocab - 800;
    OpModule om(kWideInstances, kWideInstances, BLUE_LM_HISTORY + window + 8, 0x5A9);
    std::vector<float> dists;
    for (uint32_t d = 0; d < kWideInstances; ++d) {
        std::vector<float> row = om.random(vocab, -3, 3);
        row[lead + d] = 9.0f;
        row[lead + 100 + d] = 8.5f;
        row[lead + 200 + d] = 8.0f;
        row[lead + 300 + d] = 7.0f;  // not in the history
        dists.insert(dists.end(), row.begin(), row.end());
    }
    uint32_t rows = om.rowsInput("logit_rows", vocab, dists);
    uint32_t logits = om.tensor("logits", BLUE_TC_INSTANCE, DType::F32, {vocab});
    om.step(Op::TSCALE, {logits, rows, std::bit_cast<uint32_t>(1.0f)});
    om.step(Op::SAMPLE, {logits, BLUE_FA_SAMPLING});
    om.outputsAfterRun();
    std::vector<InstancePlan> plans(kWideInstances);
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        InstancePlan& p = plans[i];
        p.tokens = {i};
        // Sampled: the draw's walks (top-k 40, top-p 0.95, min-p 0.05, the prefilter's list on
        // 32,768 tokens) after the window's.
        SampleConfig c = sampled ? SampleConfig{"long window, sampled", 1.0f, 0.95f, 0.05f, 1.3f, 0.5f, 0.25f, 40, window}
                                 : SampleConfig{"long window", 0, 1, 0, 1.3f, 0.5f, 0.25f, 0, window};
        p.local_words = samplingWords(c, 11 + i);
        p.local_words.back().second = window;  // BLUE_SP_HIST_LEN
        for (uint32_t h = 0; h < window; ++h) {
            const uint32_t from_end = window - h;
            const uint32_t t = from_end == 3   ? lead + i
                               : from_end == 2 ? lead + 100 + i
                               : from_end == 1 ? lead + 200 + i
                                               : h % history_ids;
            p.local_words.push_back({BLUE_LM_HISTORY + h, t});
        }
    }
    Module m = om.build(plans);
    auto both = runOnBoth(m, kWideInstances);
    if (!both) return;
    expectClose(*both, logits, 0, 1e-6, "SAMPLE logits penalised over the longest window lavapipe allows");
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        CAPTURE(i);
        std::vector<OutputRecord> g = recordsOf(both->gpu_report.output, i), r = recordsOf(both->ref_report.output, i);
        REQUIRE(g.size() == 3);
        REQUIRE(r.size() == 3);
        // Greedy after penalties: the leader's 9 / 1.3 - 0.5 - 0.25 = 6.17 falls below the token
        // never in the history, 7. Sampled, min-p 0.05 keeps the logits from 7 + ln 0.05 = 4.0:
        // the four leaders (the rest are 3 or less).
        if (!sampled) CHECK(r[0].value == lead + 300 + i);
        const uint32_t t = uint32_t(r[0].value);
        CHECK((t == lead + 300 + i || t == lead + i || t == lead + 100 + i || t == lead + 200 + i));
        CHECK(g[0].value == r[0].value);
    }
}

void sampleCase(uint32_t history) {
    CAPTURE(history);
    CAPTURE(sampleWidth(deviceLoopLimit(true), kLogits, history));
    OpModule om(kDists, kInstances, kTokens + 8, 0x5A3);
    std::vector<float> dists = distributions(om);
    uint32_t rows = om.rowsInput("logit_rows", kLogits, dists);
    uint32_t logits = om.tensor("logits", BLUE_TC_INSTANCE, DType::F32, {kLogits});
    om.step(Op::TSCALE, {logits, rows, std::bit_cast<uint32_t>(1.0f)});
    om.step(Op::SAMPLE, {logits, BLUE_FA_SAMPLING});
    om.outputsAfterRun();
    Module m = om.build(samplePlans(om, dists));
    auto both = runOnBoth(m, kInstances, nullptr, 0, [history](GpuOptions& o) { o.sample_history = history; });
    if (!both) return;  // refused under a device profile (runOnBoth said why)
    // Deterministic: each instance writes the same records again (instances interleave their
    // records in the ring in whatever order they reach it).
    std::vector<OutputRecord> again = runGpuAgain(*both, kInstances, history);
    for (uint32_t i = 0; i < kInstances; ++i) {
        CHECK(recordsOf(again, i) == recordsOf(both->gpu_report.output, i));
    }
    // Untouched logits are copies; penalised ones went through a division (2.5 ULP on the GPU)
    // and two subtractions that the machines order differently: a few ULP of values up to 9.
    expectClose(*both, logits, 0, 1e-6, "SAMPLE logits (penalised in place)");

    SampleTally t;
    for (uint32_t i = 0; i < kInstances; ++i) {
        checkInstance(i, drawsOf(both->gpu_report.output, i), drawsOf(both->ref_report.output, i),
                      &dists[size_t(distOf(i)) * kLogits], &t);
    }
    // Top-k 5 on six near-equal leaders: the sixth (token 105) is never drawn, the others are.
    CHECK(t.top_k5_drawn.count(105) == 0);
    CHECK(t.top_k5_drawn.size() == 5);
    MESSAGE("SAMPLE: " << t.agree << " of " << t.stochastic
                       << " stochastic draws give the same token on the GPU and the reference");
    CHECK(t.agree * 100 >= t.stochastic * 99);
    // Entropy: float sums of exp over 1000 logits in a fixed tree order on the GPU, double on
    // the reference: ~1e-6 relative; 1e-5 of the largest entropy. The log-probability
    // l - m - log(z) of the same token: the same sums; 1e-5.
    const double bound = 1e-5;
    INFO("entropy " << t.entropy.normalised() << ", logprob " << t.logprob.normalised());
    CHECK(t.entropy.normalised() <= bound);
    CHECK(t.logprob.normalised() <= bound);
    opMeasures().push_back({"SAMPLE entropy", t.entropy.normalised(), bound});
    opMeasures().push_back({"SAMPLE logprob", t.logprob.normalised(), bound});
    if (history != 0) return;
    sampleTopCase();
    for (bool sampled : {false, true}) {
        samplePenaltyWindowCase(32768, 15000, sampled);
        samplePenaltyWindowCase(kNarrowSampleVocab, 7500, sampled);
    }
}

}  // namespace blue::test
