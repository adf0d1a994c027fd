// The per-op GPU-vs-reference case of SAMPLEG (see test_ops_gpu.cpp): SAMPLE constrained by a
// grammar automaton over token bytes. A hand-made vocabulary of 2000 tokens (one to three of
// the bytes a, b, c, x; token 2 an end-of-generation token; token 5 a control token; token 9 a
// text token with no bytes) and the automaton of (ab|c)*x: state 0 takes a (to 1), c (to 0) and
// x (to 2); state 1 takes only b (to 0); state 2 is accepting and takes nothing. 40 instances
// start in each of the three states under greedy, temperature, all filters and top-k 5 over
// random logits (four run with no automaton: plain SAMPLE) and draw 6 tokens each. Half of them
// have a pending emitted token (BLUE_GR_PENDING), which the first sample takes before it masks;
// nothing else moves the state (the program sets the pending token as it emits). Checked:
//   - every drawn token is allowed in the state after the pending token (replayed on the host
//     with GrammarWalk), and in the accepting state only the end token is drawn;
//   - both machines draw the same tokens (greedy always; sampled at least 98%) and, when every
//     draw agreed, leave the same automaton words (the final states) and the same logits
//     (masked ones at -1e30).
#include <doctest/doctest.h>

#include <bit>
#include <cstring>

#include "host/machine_plan.h"
#include "tests/gpu_fixture.h"
#include "tests/test_ops_gpu.h"
#include "tests/vm_programs.h"
#include "vm/abi.h"
#include "vm/grammar_walk.h"
#include "vm/llm_abi.h"

namespace blue::test {

namespace {

constexpr uint32_t kVocab = 2000, kDists = 3, kInstances = 40, kDraws = 6, kEnd = 2, kControl = 5, kEmpty = 9;
constexpr uint32_t kGrammarWords = BLUE_GR_ACCEPT + 1 + 8;

// The token table (vm/llm_abi.h BLUE_TB_*).
std::vector<uint32_t> tokenTable() {
    std::vector<uint32_t> info(kVocab);
    std::string bytes;
    const char letters[] = "abcx";
    for (uint32_t t = 0; t < kVocab; ++t) {
        if (t == kEnd) {
            info[t] = BLUE_TB_END << 8;
            continue;
        }
        if (t == kControl) {
            info[t] = BLUE_TB_NONE << 8;
            continue;
        }
        uint32_t len = t == kEmpty ? 0 : 1 + t % 3;
        info[t] = uint32_t(bytes.size()) << 10 | BLUE_TB_TEXT << 8 | len;
        for (uint32_t k = 0; k < len; ++k) bytes += letters[(t * 7 + k * 3 + t / 3) % 4];
    }
    std::vector<uint32_t> out = info;
    out.resize(kVocab + (bytes.size() + 3) / 4, 0);
    std::memcpy(out.data() + kVocab, bytes.data(), bytes.size());
    return out;
}

// The packed automaton of (ab|c)*x starting in `state` (classes: a 0, b 1, c 2, x 3, others 4).
std::vector<uint32_t> automaton(uint32_t state) {
    std::vector<uint32_t> w(kGrammarWords, 0);
    w[BLUE_GR_STATES] = 3;
    w[BLUE_GR_CLASSES] = 5;
    w[BLUE_GR_STATE] = state;
    for (uint32_t b = 0; b < 256; ++b) {
        uint32_t c = b == 'a' ? 0 : b == 'b' ? 1 : b == 'c' ? 2 : b == 'x' ? 3 : 4;
        w[BLUE_GR_CLASS_MAP + b / 4] |= c << (8 * (b % 4));
    }
    w[BLUE_GR_ACCEPT] = 1u << 2;
    const uint32_t D = BLUE_GR_DEAD;
    const uint32_t next[3][5] = {{1, D, 0, 2, D}, {D, 0, D, D, D}, {D, D, D, D, D}};
    for (uint32_t e = 0; e < 15; ++e) w[BLUE_GR_ACCEPT + 1 + e / 2] |= next[e / 5][e % 5] << (16 * (e % 2));
    return w;
}

struct Config {
    float temp;
    uint32_t top_k;
    float top_p, min_p;
};
const Config kConfigs[] = {{0, 0, 1, 0}, {1.0f, 0, 1, 0}, {0.8f, 40, 0.9f, 0.02f}, {1.5f, 5, 1, 0}};

std::vector<std::pair<uint32_t, uint32_t>> samplingWords(const Config& c, uint32_t seed) {
    const uint32_t sp = BLUE_LM_SAMPLING;
    auto f = [](float v) { return std::bit_cast<uint32_t>(v); };
    return {{sp + BLUE_SP_TEMP, f(c.temp)},     {sp + BLUE_SP_TOP_K, c.top_k},
            {sp + BLUE_SP_TOP_P, f(c.top_p)},   {sp + BLUE_SP_MIN_P, f(c.min_p)},
            {sp + BLUE_SP_REPEAT_PENALTY, f(1)}, {sp + BLUE_SP_SEED, seed},
            {sp + BLUE_SP_COUNTER, seed % 5}};
}

std::vector<uint32_t> tokensOf(const std::vector<OutputRecord>& all, uint32_t inst) {
    std::vector<OutputRecord> recs = recordsOf(all, inst);
    REQUIRE(recs.size() == 3 * kDraws);
    std::vector<uint32_t> out;
    for (uint32_t k = 0; k < kDraws; ++k) out.push_back(recs[3 * k].value);
    return out;
}

// The SAMPLEG step over `vocab` logits: TSCALE copies the ROWS input `rows` into the instance's
// logits, then SAMPLEG samples them under the instance's grammar tensor and the token table (a
// WEIGHT of `table_words` words that putTokenTable fills in the built module).
struct SamplegSteps {
    uint32_t logits, grammar, bytes;
};
SamplegSteps samplegSteps(OpModule& om, uint32_t rows, uint32_t vocab, size_t table_words) {
    SamplegSteps st;
    st.logits = om.tensor("logits", BLUE_TC_INSTANCE, DType::F32, {vocab});
    st.grammar = om.tensor("grammar", BLUE_TC_INSTANCE, DType::I32, {kGrammarWords});
    st.bytes = om.data("token_bytes", BLUE_TC_WEIGHT, DType::I32, {table_words},
                       std::vector<float>(table_words, 0.0f));
    om.step(Op::TSCALE, {st.logits, rows, std::bit_cast<uint32_t>(1.0f)});
    om.step(Op::SAMPLEG, {st.logits, BLUE_FA_SAMPLING, st.grammar, st.bytes});
    om.outputsAfterRun();
    return st;
}

void putTokenTable(Module& m, uint32_t bytes, const std::vector<uint32_t>& table) {
    std::memcpy(m.data.data() + m.tensors[bytes].offset, table.data(), table.size() * 4);
}

// Words as the harness's tensor values (bit patterns kept).
std::vector<float> asFloats(const std::vector<uint32_t>& words) {
    std::vector<float> out;
    for (uint32_t w : words) out.push_back(std::bit_cast<float>(w));
    return out;
}

// A wide vocabulary whose tokens spell only a, c and x (so state 1 of automaton(), which takes only
// b, allows none of them) and whose one end token is the last.
std::vector<uint32_t> tokenTableWithoutB(uint32_t vocab) {
    std::vector<uint32_t> info(vocab);
    std::string bytes;
    const char letters[] = "acx";
    for (uint32_t t = 0; t + 1 < vocab; ++t) {
        uint32_t len = 1 + t % 3;
        info[t] = uint32_t(bytes.size()) << 10 | BLUE_TB_TEXT << 8 | len;
        for (uint32_t k = 0; k < len; ++k) bytes += letters[(t + k) % 3];
    }
    info[vocab - 1] = BLUE_TB_END << 8;
    std::vector<uint32_t> out = info;
    out.resize(vocab + (bytes.size() + 3) / 4, 0);
    std::memcpy(out.data() + vocab, bytes.data(), bytes.size());
    return out;
}

// A state that allows no token over a 70,000-token vocabulary: the kernel ends the text with the
// end tokens, which it looked for with one invocation walking the whole vocabulary, past
// lavapipe's 65,535 loop iterations per invocation (KernelChoice::loop_limit): the end token,
// the last, was never seen and token 0 was drawn instead.
void samplegNothingAllowedCase() {
    constexpr uint32_t kWide = 70000, kWideInstances = 2;
    OpModule om(2, kWideInstances, 256, 0x6A8);
    const std::vector<uint32_t> table = tokenTableWithoutB(kWide);
    const SamplegSteps st = samplegSteps(om, om.rowsInput("logit_rows", kWide, -3, 3), kWide, table.size());
    std::vector<InstancePlan> plans(kWideInstances);
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        InstancePlan& p = plans[i];
        p.tokens = {i};
        p.runs = kDraws;
        p.local_words = samplingWords(kConfigs[i % 2], 40 + i);  // greedy, then temperature
        p.tensor_words.push_back({st.grammar, asFloats(automaton(1))});
    }
    Module m = om.build(plans);
    putTokenTable(m, st.bytes, table);
    auto both = runOnBoth(m, kWideInstances);
    if (!both) return;
    for (uint32_t i = 0; i < kWideInstances; ++i) {
        CAPTURE(i);
        CHECK(tokensOf(both->ref_report.output, i) == std::vector<uint32_t>(kDraws, kWide - 1));
        CHECK(tokensOf(both->gpu_report.output, i) == std::vector<uint32_t>(kDraws, kWide - 1));
    }
}

}  // namespace

void samplegCase(uint32_t history) {
    CAPTURE(history);
    CAPTURE(sampleWidth(deviceLoopLimit(true), kVocab, history));
    OpModule om(kDists, kInstances, 256, 0x6A7);
    std::vector<float> dists = om.random(size_t(kDists) * kVocab, -3, 3);
    dists[kVocab + 2] = 8.0f;  // the end token leads distribution 1
    const std::vector<uint32_t> table = tokenTable();
    const SamplegSteps st = samplegSteps(om, om.rowsInput("logit_rows", kVocab, dists), kVocab, table.size());
    const uint32_t logits = st.logits, grammar = st.grammar;
    std::vector<InstancePlan> plans(kInstances);
    std::vector<std::vector<uint32_t>> starts(kInstances);
    for (uint32_t i = 0; i < kInstances; ++i) {
        InstancePlan& p = plans[i];
        p.tokens = {i % kDists};
        p.runs = kDraws;
        p.local_words = samplingWords(kConfigs[(i / 3) % 4], 900 + 11 * i);
        starts[i] = i >= kInstances - 4 ? std::vector<uint32_t>(kGrammarWords, 0) : automaton(i % 3);
        if (i % 2 && i < kInstances - 4) {  // a pending token that moves the state where one can
            GrammarWalk w{starts[i], table, kVocab};
            uint32_t t = 10 + i;
            for (uint32_t u = 10 + i; u < kVocab; ++u) {
                uint32_t next = w.next(i % 3, u);
                if (next != BLUE_GR_DEAD && next != i % 3) {
                    t = u;
                    break;
                }
            }
            starts[i][BLUE_GR_PENDING] = 1 + t;
        }
        p.tensor_words.push_back({grammar, asFloats(starts[i])});
    }
    Module m = om.build(plans);
    putTokenTable(m, st.bytes, table);
    auto both = runOnBoth(m, kInstances, nullptr, 0, [history](GpuOptions& o) { o.sample_history = history; });
    if (!both) return;  // refused under a device profile (runOnBoth said why)
    uint32_t stochastic = 0, agree = 0, end_draws = 0, moved = 0;
    for (uint32_t i = 0; i < kInstances; ++i) {
        CAPTURE(i);
        std::vector<uint32_t> g = tokensOf(both->gpu_report.output, i), r = tokensOf(both->ref_report.output, i);
        const bool greedy = kConfigs[(i / 3) % 4].temp == 0;
        if (greedy) CHECK(g == r);
        for (uint32_t k = 0; k < kDraws; ++k) {
            if (!greedy) ++stochastic, agree += g[k] == r[k];
        }
        if (i >= kInstances - 4) continue;  // no automaton: plain SAMPLE
        GrammarWalk w{starts[i], table, kVocab};
        REQUIRE(w.active());
        uint32_t state = w.state();
        if (uint32_t pending = starts[i][BLUE_GR_PENDING]; pending != 0) {
            uint32_t next = w.next(state, pending - 1);
            if (next != BLUE_GR_DEAD) state = next;
            moved += next != BLUE_GR_DEAD && next != w.state();
        }
        for (uint32_t tok : g) {
            CAPTURE(state);
            CAPTURE(tok);
            CHECK(w.allows(state, tok));
            if (state == 2) CHECK(tok == kEnd);
            end_draws += tok == kEnd;
        }
    }
    MESSAGE("SAMPLEG: " << agree << " of " << stochastic << " stochastic draws agree; " << end_draws
                        << " end tokens drawn");
    CHECK(agree * 100 >= stochastic * 98);
    CHECK(end_draws > 0);
    CHECK(moved > 0);  // some pending tokens changed the state
    if (agree == stochastic) {  // the same draws: the same final states and masked logits
        CHECK(both->gpuBytes(grammar) == both->refBytes(grammar));
        expectClose(*both, logits, 0, 1e-6, "SAMPLEG logits (masked in place)");
    }
    if (history == 0) samplegNothingAllowedCase();
}

}  // namespace blue::test
