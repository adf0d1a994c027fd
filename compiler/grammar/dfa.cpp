// Grammar -> ByteDfa (see dfa.h): rules to byte NFAs with call edges, bounded subset construction
// over configuration stacks, pruning of states that cannot accept, Moore minimization, byte
// classes, and the packed form the GPU reads.
#include "compiler/grammar/dfa.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "vm/llm_abi.h"

namespace blue {
namespace {

constexpr size_t kMaxNfaStates = size_t(1) << 20;  // about 100 MB of NFA at most
// Work bound of the subset construction (about a second): grammars whose automaton states each
// hold thousands of positions, like nested bounded repetitions, fail instead of running long. The
// JSON object grammar at depth 8 takes 0.2M steps.
constexpr uint64_t kMaxSteps = 10'000'000;

struct ByteEdge {
    uint8_t lo, hi;
    uint32_t to;
};

struct CallEdge {
    uint32_t rule;
    uint32_t ret;  // the caller's state after the callee returns (one per call edge)
};

struct NfaState {
    std::vector<ByteEdge> bytes;
    std::vector<uint32_t> eps;
    std::vector<CallEdge> calls;
    uint32_t rule = 0;
};

enum class Push : uint8_t { Tail, Uncounted, Counted };

struct Nfa {
    std::vector<NfaState> st;
    std::vector<uint32_t> rule_start, rule_final;
    std::vector<Push> push;       // per return state: how a call returning there grows the stack
    std::vector<uint32_t> canon;  // per return state: the first return state with the same future
};

struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const {
        uint64_t h = 1469598103934665603ull;
        for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
        return size_t(h ^ (h >> 29));
    }
};

struct VecHash64 {
    size_t operator()(const std::vector<uint64_t>& v) const {
        uint64_t h = 1469598103934665603ull;
        for (uint64_t x : v) h = (h ^ x ^ (x >> 32)) * 1099511628211ull;
        return size_t(h ^ (h >> 29));
    }
};

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;  // one byte range per position

void encodeUtf8(uint32_t cp, uint8_t* b, int len) {
    if (len == 1) {
        b[0] = uint8_t(cp);
        return;
    }
    static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int i = len - 1; i > 0; --i, cp >>= 6) b[i] = uint8_t(0x80 | (cp & 0x3F));
    b[0] = uint8_t(kLead[len] | cp);
}

// Splits code points lo..hi (surrogates excluded) into UTF-8 byte range sequences whose byte-wise
// product is exactly the encodings of the range.
void utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8Sequences(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8Sequences(0xE000, hi, out);
        return;
    }
    static constexpr uint32_t kLenMax[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (uint32_t m : kLenMax) {
        if (lo <= m && hi > m) {
            utf8Sequences(lo, m, out);
            utf8Sequences(m + 1, hi, out);
            return;
        }
    }
    int len = lo <= 0x7F ? 1 : lo <= 0x7FF ? 2 : lo <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < len; ++i) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m)) continue;
        if ((lo & m) != 0) {
            utf8Sequences(lo, lo | m, out);
            utf8Sequences((lo | m) + 1, hi, out);
            return;
        }
        if ((hi & m) != m) {
            utf8Sequences(lo, (hi & ~m) - 1, out);
            utf8Sequences(hi & ~m, hi, out);
            return;
        }
    }
    uint8_t a[4], b[4];
    encodeUtf8(lo, a, len);
    encodeUtf8(hi, b, len);
    ByteSeq seq;
    for (int i = 0; i < len; ++i) seq.push_back({a[i], b[i]});
    out.push_back(std::move(seq));
}

class NfaBuilder {
  public:
    NfaBuilder(const Grammar& g, Nfa& nfa) : g_(g), n_(nfa) {}

    Status build() {
        size_t rules = g_.rules.size();
        n_.rule_start.resize(rules);
        n_.rule_final.resize(rules);
        for (uint32_t r = 0; r < rules; ++r) {
            rule_ = r;
            n_.rule_start[r] = add();
            n_.rule_final[r] = add();
        }
        for (uint32_t r = 0; r < rules; ++r) {
            rule_ = r;
            if (!node(g_.rules[r].body, n_.rule_start[r], n_.rule_final[r]))
                return BLUE_ERROR(
                    "grammar expands to more than %zu automaton positions (rule '%s')",
                    kMaxNfaStates, g_.rules[r].name.c_str());
        }
        return Status::ok();
    }

  private:
    const Grammar& g_;
    Nfa& n_;
    uint32_t rule_ = 0;

    uint32_t add() {
        n_.st.emplace_back();
        n_.st.back().rule = rule_;
        return uint32_t(n_.st.size() - 1);
    }
    void eps(uint32_t from, uint32_t to) { n_.st[from].eps.push_back(to); }

    // Adds paths from `from` to `to` for node `id`; false when the NFA grows too large.
    bool node(uint32_t id, uint32_t from, uint32_t to) {
        if (n_.st.size() > kMaxNfaStates) return false;
        const GrammarNode& nd = g_.nodes[id];
        switch (nd.kind) {
            case GrammarNode::Kind::Chars: {
                std::vector<ByteSeq> seqs;
                for (const auto& [lo, hi] : nd.ranges) utf8Sequences(lo, hi, seqs);
                for (const ByteSeq& seq : seqs) {
                    uint32_t cur = from;
                    for (size_t i = 0; i < seq.size(); ++i) {
                        uint32_t nxt = i + 1 == seq.size() ? to : add();
                        n_.st[cur].bytes.push_back({seq[i].first, seq[i].second, nxt});
                        cur = nxt;
                    }
                }
                return true;
            }
            case GrammarNode::Kind::Seq: {
                if (nd.children.empty()) eps(from, to);
                uint32_t cur = from;
                for (size_t i = 0; i < nd.children.size(); ++i) {
                    uint32_t nxt = i + 1 == nd.children.size() ? to : add();
                    if (!node(nd.children[i], cur, nxt)) return false;
                    cur = nxt;
                }
                return true;
            }
            case GrammarNode::Kind::Alt:
                for (uint32_t c : nd.children)
                    if (!node(c, from, to)) return false;
                return true;
            case GrammarNode::Kind::Ref: {
                uint32_t ret = add();
                n_.st[from].calls.push_back({nd.rule, ret});
                eps(ret, to);
                return true;
            }
            case GrammarNode::Kind::Repeat:
                return repeat(nd, from, to);
        }
        return true;
    }

    // Repetitions use fresh loop states so that edges added at `from` by siblings never repeat.
    bool repeat(const GrammarNode& nd, uint32_t from, uint32_t to) {
        uint32_t child = nd.children[0];
        uint32_t cur = from;
        for (uint32_t i = 0; i < nd.min; ++i) {
            uint32_t nxt = add();
            if (!node(child, cur, nxt)) return false;
            cur = nxt;
        }
        if (nd.max == kGrammarUnbounded) {
            uint32_t loop = add(), back = add();
            eps(cur, loop);
            if (!node(child, loop, back)) return false;
            eps(back, loop);
            eps(loop, to);
            return true;
        }
        for (uint32_t i = nd.min; i < nd.max; ++i) {
            eps(cur, to);
            uint32_t nxt = add();
            if (!node(child, cur, nxt)) return false;
            cur = nxt;
        }
        eps(cur, to);
        return true;
    }
};

// Return states whose epsilon closures reach the same moving states (and the rule's end alike)
// have the same future; frames use one of them so that equal stacks are equal configurations.
void canonicalizeReturns(Nfa& n) {
    n.canon.resize(n.st.size());
    std::unordered_map<std::vector<uint32_t>, uint32_t, VecHash> first;
    std::vector<uint32_t> work, key;
    std::set<uint32_t> seen;
    for (const NfaState& s : n.st) {
        for (const CallEdge& c : s.calls) {
            key = {uint32_t(n.push[c.ret]), 0};
            seen.clear();
            work = {c.ret};
            while (!work.empty()) {
                uint32_t x = work.back();
                work.pop_back();
                if (!seen.insert(x).second) continue;
                const NfaState& xs = n.st[x];
                if (!xs.bytes.empty() || !xs.calls.empty()) key.push_back(x);
                if (x == n.rule_final[s.rule]) key[1] = 1;
                for (uint32_t e : xs.eps) work.push_back(e);
            }
            std::sort(key.begin() + 2, key.end());
            n.canon[c.ret] = first.emplace(key, c.ret).first->second;
        }
    }
}

// Classifies each call's return state: a tail call when nothing but the rule's end follows it;
// otherwise the pushed frame counts toward the depth when the callee can call back into the caller.
void classifyCalls(const Grammar& g, Nfa& n) {
    size_t rules = g.rules.size();
    std::vector<std::vector<uint8_t>> reach(rules, std::vector<uint8_t>(rules, 0));
    std::vector<std::vector<uint32_t>> callees(rules);
    for (const NfaState& s : n.st)
        for (const CallEdge& c : s.calls) callees[s.rule].push_back(c.rule);
    for (uint32_t r = 0; r < rules; ++r) {
        std::vector<uint32_t> work = {r};
        while (!work.empty()) {
            uint32_t x = work.back();
            work.pop_back();
            for (uint32_t y : callees[x])
                if (!reach[r][y]) reach[r][y] = 1, work.push_back(y);
        }
    }
    n.push.assign(n.st.size(), Push::Tail);
    std::vector<uint32_t> work, seen_mark(n.st.size(), 0);
    uint32_t mark = 0;
    for (const NfaState& s : n.st) {
        for (const CallEdge& c : s.calls) {
            // Tail when the return state's epsilon closure holds no moves and reaches the end.
            bool moves = false, ends = false;
            work = {c.ret};
            ++mark;
            while (!work.empty() && !moves) {
                uint32_t x = work.back();
                work.pop_back();
                if (seen_mark[x] == mark) continue;
                seen_mark[x] = mark;
                const NfaState& xs = n.st[x];
                moves = !xs.bytes.empty() || !xs.calls.empty();
                ends |= x == n.rule_final[s.rule];
                for (uint32_t e : xs.eps) work.push_back(e);
            }
            if (!moves && ends) continue;
            n.push[c.ret] = reach[c.rule][s.rule] ? Push::Counted : Push::Uncounted;
        }
    }
    canonicalizeReturns(n);
}

// Raw automaton before pruning and minimization; kNone marks a dead transition.
constexpr uint32_t kNone = 0xFFFFFFFFu;
struct RawDfa {
    uint32_t classes = 0;
    std::array<uint8_t, 256> byte_class{};
    std::vector<uint32_t> next;  // [state * classes + class]
    std::vector<uint8_t> accepting;
};

// A configuration is (stack id << 32 | position): the position is the NFA state on top; the
// stack of return frames below it is interned as a tree of (parent stack, frame) nodes, id 0 being
// the empty stack, so configurations are plain integers.
using Config = uint64_t;

class SubsetBuilder {
  public:
    SubsetBuilder(const Nfa& n, uint32_t max_depth, uint32_t cap, uint32_t max_states)
        : n_(n), max_depth_(max_depth), cap_(cap), max_states_(max_states) {
        stacks_.push_back({0, 0, 0});
    }

    Result<RawDfa> run(uint32_t root) {
        makeClasses();
        std::vector<Config> seed = {n_.rule_start[root]};
        intern(closure(seed));
        // Per class: the moved configurations, in kernel order.
        std::vector<std::vector<Config>> buckets(raw_.classes);
        for (size_t s = 0; s < kernels_.size(); ++s) {
            std::vector<Config> kernel = std::move(kernels_[s]);
            for (auto& b : buckets) b.clear();
            for (Config c : kernel)
                for (const ByteEdge& e : n_.st[uint32_t(c)].bytes)
                    for (uint32_t k = raw_.byte_class[e.lo]; k <= raw_.byte_class[e.hi]; ++k)
                        buckets[k].push_back((c & ~0xFFFFFFFFull) | e.to);
            // Classes with the same moves share one closure.
            std::unordered_map<uint64_t, uint32_t> same;  // bucket hash -> an earlier class
            for (uint32_t k = 0; k < raw_.classes; ++k) {
                uint32_t to = kNone;
                if (!buckets[k].empty()) {
                    uint64_t h = 0;
                    for (Config c : buckets[k]) h = (h ^ c) * 0x100000001b3ull;
                    auto [it, fresh] = same.emplace(h, k);
                    if (!fresh && buckets[it->second] == buckets[k]) {
                        to = raw_.next[s * raw_.classes + it->second];
                    } else {
                        to = intern(closure(buckets[k]));
                    }
                }
                raw_.next[s * raw_.classes + k] = to;
            }
            if (kernels_.size() > cap_)
                return BLUE_ERROR("grammar needs more than %u automaton states (at most %u)", cap_,
                                  max_states_);
            if (steps_ > kMaxSteps)
                return BLUE_ERROR(
                    "grammar is too complex: building its automaton took more than "
                    "%llu steps (%zu states so far)",
                    (unsigned long long)kMaxSteps, kernels_.size());
        }

        return std::move(raw_);
    }

  private:
    struct StackNode {
        uint32_t parent, frame, counted;  // counted: frames that count toward the depth
    };
    struct Closed {
        std::vector<Config> kernel;  // sorted configurations whose position reads a byte
        bool accept = false;
    };

    const Nfa& n_;
    uint32_t max_depth_, cap_, max_states_;
    RawDfa raw_;
    std::vector<std::vector<Config>> kernels_;  // per state, until its transitions are made
    std::unordered_map<std::vector<Config>, uint32_t, VecHash64> ids_;
    std::vector<StackNode> stacks_;
    std::unordered_map<uint64_t, uint32_t> stack_ids_;  // parent << 32 | frame -> stack id
    std::unordered_set<Config> seen_;
    std::vector<Config> work_;
    uint64_t steps_ = 0;  // configurations visited by closures, plus kernel entries interned

    // Byte classes from the boundaries of every byte edge: classes are intervals of bytes.
    void makeClasses() {
        std::array<uint8_t, 257> cut{};
        cut[0] = 1;
        for (const NfaState& s : n_.st)
            for (const ByteEdge& e : s.bytes) cut[e.lo] = 1, cut[size_t(e.hi) + 1] = 1;
        int k = -1;
        for (int b = 0; b < 256; ++b) raw_.byte_class[b] = uint8_t(k += cut[b]);
        raw_.classes = uint32_t(k + 1);
    }

    uint32_t pushStack(uint32_t parent, uint32_t frame) {
        uint64_t key = uint64_t(parent) << 32 | frame;
        auto [it, fresh] = stack_ids_.emplace(key, uint32_t(stacks_.size()));
        if (fresh)
            stacks_.push_back(
                {parent, frame,
                 stacks_[parent].counted + (n_.push[frame] == Push::Counted ? 1 : 0)});
        return it->second;
    }

    static Config make(uint64_t stack, uint32_t pos) { return stack << 32 | pos; }

    Closed closure(const std::vector<Config>& start) {
        Closed out;
        seen_.clear();
        work_.assign(start.begin(), start.end());
        while (!work_.empty()) {
            Config c = work_.back();
            work_.pop_back();
            if (!seen_.insert(c).second) continue;
            ++steps_;
            uint32_t stack = uint32_t(c >> 32), pos = uint32_t(c);
            const NfaState& s = n_.st[pos];
            if (!s.bytes.empty()) out.kernel.push_back(c);
            for (uint32_t e : s.eps) work_.push_back(make(stack, e));
            for (const CallEdge& call : s.calls) {
                Push p = n_.push[call.ret];
                uint32_t callee = n_.rule_start[call.rule];
                if (p == Push::Tail) {
                    work_.push_back(make(stack, callee));
                } else if (p == Push::Uncounted || stacks_[stack].counted + 1 <= max_depth_) {
                    work_.push_back(make(pushStack(stack, n_.canon[call.ret]), callee));
                }
            }
            if (pos == n_.rule_final[s.rule]) {
                if (stack == 0) {
                    out.accept = true;
                } else {
                    const StackNode& sn = stacks_[stack];
                    work_.push_back(make(sn.parent, sn.frame));
                }
            }
        }
        std::sort(out.kernel.begin(), out.kernel.end());
        return out;
    }

    uint32_t intern(Closed closed) {
        if (closed.kernel.empty() && !closed.accept) return kNone;
        closed.kernel.push_back(closed.accept ? 1 : 0);  // the key: kernel, then the accept flag
        steps_ += closed.kernel.size();
        auto [it, fresh] = ids_.emplace(closed.kernel, uint32_t(kernels_.size()));
        if (fresh) {
            closed.kernel.pop_back();
            kernels_.push_back(std::move(closed.kernel));
            raw_.accepting.push_back(closed.accept ? 1 : 0);
            raw_.next.resize(raw_.next.size() + raw_.classes, kNone);
        }
        return it->second;
    }
};

// Marks states from which an accepting state is reachable.
std::vector<uint8_t> liveStates(const RawDfa& raw) {
    size_t states = raw.accepting.size();
    std::vector<std::vector<uint32_t>> into(states);
    for (size_t s = 0; s < states; ++s)
        for (uint32_t k = 0; k < raw.classes; ++k)
            if (uint32_t t = raw.next[s * raw.classes + k]; t != kNone)
                into[t].push_back(uint32_t(s));
    std::vector<uint8_t> live(states, 0);
    std::vector<uint32_t> work;
    for (size_t s = 0; s < states; ++s)
        if (raw.accepting[s]) live[s] = 1, work.push_back(uint32_t(s));
    while (!work.empty()) {
        uint32_t t = work.back();
        work.pop_back();
        for (uint32_t s : into[t])
            if (!live[s]) live[s] = 1, work.push_back(s);
    }
    return live;
}

// Moore partition refinement over live states; returns the block of each state (kNone if dead).
// States are grouped by a hash of (block, live successors' classes and blocks) and compared
// exactly within a group; successors are kept sparse since most bytes are dead in most states.
std::vector<uint32_t> minimizeBlocks(const RawDfa& raw, const std::vector<uint8_t>& live) {
    size_t states = raw.accepting.size();
    std::vector<uint32_t> first(states + 1, 0);  // state s: succ[first[s] .. first[s + 1])
    std::vector<uint64_t> succ;                  // class << 32 | target
    for (size_t s = 0; s < states; ++s) {
        first[s] = uint32_t(succ.size());
        if (!live[s]) continue;
        for (uint32_t k = 0; k < raw.classes; ++k)
            if (uint32_t t = raw.next[s * raw.classes + k]; t != kNone && live[t])
                succ.push_back(uint64_t(k) << 32 | t);
    }
    first[states] = uint32_t(succ.size());
    std::vector<uint32_t> block(states, kNone), fresh(states, kNone);
    for (size_t s = 0; s < states; ++s)
        if (live[s]) block[s] = raw.accepting[s];
    auto same = [&](size_t a, size_t b) {
        if (block[a] != block[b] || first[a + 1] - first[a] != first[b + 1] - first[b])
            return false;
        for (uint32_t i = first[a], j = first[b]; i < first[a + 1]; ++i, ++j)
            if ((succ[i] >> 32) != (succ[j] >> 32) ||
                block[uint32_t(succ[i])] != block[uint32_t(succ[j])])
                return false;
        return true;
    };
    size_t count = 0;
    std::unordered_map<uint64_t, std::vector<std::pair<uint32_t, uint32_t>>> groups;
    while (true) {
        groups.clear();
        uint32_t ids = 0;
        for (size_t s = 0; s < states; ++s) {
            if (!live[s]) continue;
            uint64_t h = block[s] * 0x9E3779B97F4A7C15ull;
            for (uint32_t i = first[s]; i < first[s + 1]; ++i)
                h = (h ^ (succ[i] >> 32) ^ (uint64_t(block[uint32_t(succ[i])]) << 16)) *
                    0x100000001b3ull;
            auto& group = groups[h];
            uint32_t id = kNone;
            for (const auto& [rep, rep_id] : group)
                if (same(s, rep)) id = rep_id;
            if (id == kNone) group.push_back({uint32_t(s), id = ids++});
            fresh[s] = id;
        }
        bool stable = ids == count;
        count = ids;
        block.swap(fresh);
        if (stable) return block;
    }
}

}  // namespace

Result<ByteDfa> buildDfa(const Grammar& g, const DfaLimits& limits) {
    if (g.rules.empty() || g.root >= g.rules.size()) return BLUE_ERROR("grammar has no rules");
    uint32_t max_states = std::min<uint32_t>(limits.max_states, 0xFFFE);
    Nfa nfa;
    BLUE_TRY(NfaBuilder(g, nfa).build());
    classifyCalls(g, nfa);
    uint32_t cap = max_states * 2 + 1000;
    BLUE_TRY_ASSIGN(RawDfa raw, SubsetBuilder(nfa, limits.max_depth, cap, max_states).run(g.root));
    std::vector<uint8_t> live = raw.accepting.empty() ? std::vector<uint8_t>{} : liveStates(raw);
    if (raw.accepting.empty() || !live[0])
        return BLUE_ERROR("grammar accepts no text (rule '%s', nesting depth at most %u)",
                          g.rules[g.root].name.c_str(), limits.max_depth);
    std::vector<uint32_t> block = minimizeBlocks(raw, live);

    // Renumber blocks in breadth-first order from the start state.
    size_t raw_states = raw.accepting.size();
    std::vector<uint32_t> rep, id_of_block(raw_states, kNone);
    id_of_block[block[0]] = 0;
    rep.push_back(0);
    for (size_t i = 0; i < rep.size(); ++i) {
        for (uint32_t k = 0; k < raw.classes; ++k) {
            uint32_t t = raw.next[size_t(rep[i]) * raw.classes + k];
            if (t == kNone || !live[t] || id_of_block[block[t]] != kNone) continue;
            id_of_block[block[t]] = uint32_t(rep.size());
            rep.push_back(t);
        }
    }
    if (rep.size() > max_states)
        return BLUE_ERROR("grammar needs more than %u automaton states (at most %u)", max_states,
                          max_states);

    // Merge raw byte classes whose columns are equal in the minimized automaton.
    uint32_t states = uint32_t(rep.size());
    auto target = [&](uint32_t s, uint32_t k) -> uint16_t {
        uint32_t t = raw.next[size_t(rep[s]) * raw.classes + k];
        return (t == kNone || !live[t]) ? kDfaDead : uint16_t(id_of_block[block[t]]);
    };
    std::unordered_map<std::vector<uint32_t>, uint32_t, VecHash> columns;
    std::vector<uint32_t> final_class(raw.classes), col(states);
    std::vector<uint32_t> class_rep;
    for (uint32_t k = 0; k < raw.classes; ++k) {
        for (uint32_t s = 0; s < states; ++s) col[s] = target(s, k);
        auto [it, fresh] = columns.emplace(col, uint32_t(class_rep.size()));
        if (fresh) class_rep.push_back(k);
        final_class[k] = it->second;
    }
    ByteDfa d;
    d.n_classes = uint32_t(class_rep.size());
    for (int b = 0; b < 256; ++b) d.byte_class[b] = uint8_t(final_class[raw.byte_class[b]]);
    d.accepting.resize(states);
    d.next.resize(size_t(states) * d.n_classes);
    for (uint32_t s = 0; s < states; ++s) {
        d.accepting[s] = raw.accepting[rep[s]];
        for (uint32_t c = 0; c < d.n_classes; ++c)
            d.next[s * d.n_classes + c] = target(s, class_rep[c]);
    }
    return d;
}

bool dfaAccepts(const ByteDfa& d, std::string_view text) {
    uint32_t s = d.start;
    for (char ch : text) {
        uint16_t t = d.next[size_t(s) * d.n_classes + d.byte_class[uint8_t(ch)]];
        if (t == kDfaDead) return false;
        s = t;
    }
    return d.accepting[s] != 0;
}

std::vector<uint32_t> packDfa(const ByteDfa& d) {
    uint32_t states = d.states();
    size_t entries = size_t(states) * d.n_classes;
    size_t accept_words = (states + 31) / 32;
    std::vector<uint32_t> w(BLUE_GR_ACCEPT + accept_words + (entries + 1) / 2, 0);
    w[BLUE_GR_STATES] = states;
    w[BLUE_GR_CLASSES] = d.n_classes;
    w[BLUE_GR_STATE] = d.start;
    for (int b = 0; b < 256; ++b)
        w[BLUE_GR_CLASS_MAP + b / 4] |= uint32_t(d.byte_class[b]) << (8 * (b % 4));
    for (uint32_t s = 0; s < states; ++s)
        if (d.accepting[s]) w[BLUE_GR_ACCEPT + s / 32] |= 1u << (s % 32);
    size_t base = BLUE_GR_ACCEPT + accept_words;
    for (size_t e = 0; e < entries; ++e) w[base + e / 2] |= uint32_t(d.next[e]) << (16 * (e % 2));
    return w;
}

}  // namespace blue
