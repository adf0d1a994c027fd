// Tests of structured output's host half: GBNF parsing (errors with line and column, mutation
// fuzzing), the byte automaton (literals, classes, repetition, UTF-8, recursion bounds, limits,
// packing), the JSON object grammar, and JSON schemas: random walks through the automata of fixed
// and of 200 generated schemas must give JSON that parses and that tests/schema_check.h accepts,
// and texts that break the schema must be rejected.
#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "compiler/grammar/dfa.h"
#include "compiler/grammar/gbnf.h"
#include "compiler/grammar/json_schema.h"
#include "tests/schema_check.h"

namespace blue {
namespace {

using nlohmann::json;

ByteDfa compile(const std::string& text, DfaLimits limits = {}) {
    Result<Grammar> g = parseGbnf(text);
    REQUIRE_MESSAGE(g.isOk(), g.message());
    Result<ByteDfa> d = buildDfa(*g, limits);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    return std::move(d).value();
}

template <class Json>
ByteDfa compileSchema(const Json& schema) {
    Result<std::string> text = jsonSchemaToGbnf(schema);
    REQUIRE_MESSAGE(text.isOk(), text.message());
    return compile(*text);
}

std::string parseError(const std::string& text) {
    Result<Grammar> g = parseGbnf(text);
    return g.isOk() ? std::string("(parsed)") : g.message();
}

// Random texts of the automaton: uniform over allowed byte classes until `target` bytes, then
// the shortest way to an accepting state.
class Walker {
  public:
    explicit Walker(const ByteDfa& d) : d_(d), dist_(d.states(), kFar), bytes_(d.n_classes) {
        for (int b = 0; b < 256; ++b) bytes_[d.byte_class[b]].push_back(uint8_t(b));
        for (uint32_t s = 0; s < d.states(); ++s)
            if (d.accepting[s]) dist_[s] = 0;
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t s = 0; s < d.states(); ++s)
                for (uint32_t c = 0; c < d.n_classes; ++c)
                    if (uint16_t t = d.next[s * d.n_classes + c];
                        t != kDfaDead && dist_[t] + 1 < dist_[s])
                        dist_[s] = dist_[t] + 1, changed = true;
        }
    }

    std::string walk(std::mt19937& rng, size_t target) {
        std::string out;
        uint32_t s = d_.start;
        while (!(d_.accepting[s] && out.size() >= target)) {
            REQUIRE(out.size() < target + 10000);
            std::vector<uint32_t> options;
            for (uint32_t c = 0; c < d_.n_classes; ++c) {
                uint16_t t = d_.next[s * d_.n_classes + c];
                if (t == kDfaDead) continue;
                if (out.size() >= target && dist_[t] >= dist_[s]) continue;
                options.push_back(c);
            }
            if (options.empty() && d_.accepting[s])
                break;                  // a complete sentence, nothing may follow
            REQUIRE(!options.empty());  // every state can reach acceptance
            uint32_t c = options[rng() % options.size()];
            const auto& in_class = bytes_[c];
            out += char(in_class[rng() % in_class.size()]);
            s = d_.next[s * d_.n_classes + c];
        }
        return out;
    }

  private:
    static constexpr uint32_t kFar = 1u << 30;
    const ByteDfa& d_;
    std::vector<uint32_t> dist_;
    std::vector<std::vector<uint8_t>> bytes_;
};

// Walks `d` and checks every text against `schema`.
void checkWalks(const ByteDfa& d, const json& schema, std::mt19937& rng, int walks) {
    Walker w(d);
    for (int i = 0; i < walks; ++i) {
        std::string text = w.walk(rng, rng() % 200);
        INFO("schema: " << schema.dump() << "\ntext: " << text);
        json v;
        REQUIRE_NOTHROW(v = json::parse(text));
        CHECK(schemaViolation(schema, v) == "");
        CHECK(dfaAccepts(d, text));
    }
}

double msSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const char* kValidGrammar = R"(# a greeting
root ::= greeting ( " " name )* "!"
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]{1,10}
)";

TEST_CASE("grammar: GBNF errors name line and column") {
    CHECK(parseGbnf(kValidGrammar).isOk());
    CHECK(parseError("root ::= \"hi") == "grammar line 1, column 10: unterminated string literal");
    CHECK(parseError("root ::= ( \"a\" \"b\"\n") ==
          "grammar line 2, column 1: expected ')' to close the '(' on line 1, found end of text");
    CHECK(parseError("root ::= \"a\" )") == "grammar line 1, column 14: unexpected ')'");
    CHECK(parseError("root ::= \"a\\q\"") == "grammar line 1, column 12: unknown escape '\\q'");
    CHECK(parseError("root ::= \"\\x4\"") ==
          "grammar line 1, column 14: escape \\x needs 2 hex digits");
    CHECK(parseError("root ::= greeting\n") ==
          "grammar line 1, column 10: undefined rule 'greeting'");
    CHECK(parseError("start ::= \"a\"") == "grammar has no rule 'root'");
    CHECK(parseError("root \"a\"") ==
          "grammar line 1, column 6: expected '::=' after rule name 'root'");
    CHECK(parseError("  # nothing\n\n") == "grammar is empty");
    CHECK(parseError("root ::= a\na ::= \"x\" |\n  [b-a]") ==
          "grammar line 3, column 5: character range is reversed");
    CHECK(parseError("root ::= \"a\"{3,2}") ==
          "grammar line 1, column 13: repetition {3,2}: the maximum is below the minimum");
    CHECK(parseError("root ::= \"a\"\nroot ::= \"b\"") ==
          "grammar line 2, column 1: rule 'root' is defined twice (first on line 1)");
    CHECK(parseError("root ::= [a-") == "grammar line 1, column 10: unterminated character class");
    CHECK(parseError("root ::= \"\xff\"") == "grammar line 1, column 11: invalid UTF-8");
    CHECK(parseError(std::string(300, '(')).find("grammar line 1") == 0);
    CHECK(
        parseError("root ::= \"a\"" + std::string(20, '?')).find("too many repetition operators") !=
        std::string::npos);
}

TEST_CASE("grammar: mutated GBNF never crashes the parser or the automaton builder") {
    std::mt19937 rng(1234);
    std::string base = kValidGrammar;
    base += "extra ::= ( [^\"\\\\] | \"\\u00e9\" )* root | extra \"x\" | .{2,3}\n";
    int parsed = 0;
    for (int i = 0; i < 2000; ++i) {
        std::string text = base;
        for (int m = 1 + int(rng() % 4); m > 0 && !text.empty(); --m) {
            size_t at = rng() % text.size();
            const char kPool[] = "()[]{}|*+?\"\\^-.:=# \n0123456789abcdefxu,";
            char c = rng() % 3 ? kPool[rng() % (sizeof(kPool) - 1)] : char(rng() % 256);
            switch (rng() % 4) {
                case 0:
                    text[at] = c;
                    break;
                case 1:
                    text.insert(text.begin() + long(at), c);
                    break;
                case 2:
                    text.erase(at, 1 + rng() % 3);
                    break;
                default:
                    text.resize(at);
                    break;
            }
        }
        Result<Grammar> g = parseGbnf(text);
        if (!g) {
            CHECK(g.message().rfind("grammar ", 0) == 0);
            continue;
        }
        ++parsed;
        Result<ByteDfa> d = buildDfa(*g, DfaLimits{2000, 4});
        if (d) CHECK(d->states() <= 2000);
    }
    CHECK(parsed > 100);
}

TEST_CASE("grammar: literals, classes and repetition") {
    ByteDfa d = compile(kValidGrammar);
    CHECK(dfaAccepts(d, "hi!"));
    CHECK(dfaAccepts(d, "hello Ann Bob!"));
    CHECK_FALSE(dfaAccepts(d, "hello Ann"));
    CHECK_FALSE(dfaAccepts(d, "hello A!"));          // [a-z]{1,10} needs one
    CHECK(dfaAccepts(d, "hi Abcdefghijk!"));         // ten
    CHECK_FALSE(dfaAccepts(d, "hi Abcdefghijkl!"));  // eleven
    CHECK_FALSE(dfaAccepts(d, "hey!"));
    CHECK_FALSE(dfaAccepts(d, ""));

    ByteDfa r = compile("root ::= \"a\"{2} \"b\"{1,} \"c\"{,2} \"d\"? ( \"e\" | \"f\" )+");
    CHECK(dfaAccepts(r, "aabe"));
    CHECK(dfaAccepts(r, "aabbbccdfef"));
    CHECK_FALSE(dfaAccepts(r, "abe"));
    CHECK_FALSE(dfaAccepts(r, "aabccce"));
    CHECK_FALSE(dfaAccepts(r, "aab"));

    ByteDfa e = compile(R"(root ::= "\x41\u00e9\U0001F600\t\\\"\[\]" [\]\[-] [\n\r])");
    CHECK(dfaAccepts(e, "A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]-\n"));
    CHECK(dfaAccepts(e, "A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]]\r"));
    CHECK_FALSE(dfaAccepts(e, "A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]x\n"));
}

TEST_CASE("grammar: UTF-8 classes, negation and any character") {
    ByteDfa s = compile(R"(root ::= "\"" [^"\\]* "\"")");
    CHECK(dfaAccepts(s, "\"\xc3\xa9\""));                          // é
    CHECK(dfaAccepts(s, "\"\xe6\x97\xa5\xf0\x9f\x98\x80\x7f\""));  // 日, U+1F600, DEL
    CHECK_FALSE(dfaAccepts(s, "\"a\"b\""));
    CHECK_FALSE(dfaAccepts(s, "\"\\\""));
    CHECK_FALSE(dfaAccepts(s, "\"\xed\xa0\x80\""));  // a surrogate is no character
    CHECK_FALSE(dfaAccepts(s, "\"\xc0\xaf\""));      // overlong
    CHECK_FALSE(dfaAccepts(s, "\"\xc3\""));          // truncated

    ByteDfa r = compile(R"(root ::= [a-c\u00e0-\u00ff\u0400-\u04ff\U00010000-\U0010FFFF]+)");
    CHECK(dfaAccepts(r, "ab\xc3\xa0\xc3\xbf\xd0\x80\xd3\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"));
    CHECK_FALSE(dfaAccepts(r, "d"));
    CHECK_FALSE(dfaAccepts(r, "\xc3\x9f"));          // U+00DF
    CHECK_FALSE(dfaAccepts(r, "\xd4\x80"));          // U+0500
    CHECK_FALSE(dfaAccepts(r, "\xef\xbf\xbf"));      // U+FFFF
    CHECK_FALSE(dfaAccepts(r, "\xf4\x90\x80\x80"));  // past U+10FFFF

    ByteDfa any = compile("root ::= . .");
    CHECK(dfaAccepts(any, "\n\xe0\xa0\x80"));            // U+0800
    CHECK(dfaAccepts(any, "\xed\x9f\xbf\xee\x80\x80"));  // U+D7FF, U+E000
    CHECK_FALSE(dfaAccepts(any, "\xed\xa0\x80\xed\xbf\xbf"));
    CHECK_FALSE(dfaAccepts(any, "abc"));
}

TEST_CASE("grammar: recursion is bounded by depth, left recursion terminates") {
    ByteDfa p = compile("root ::= \"(\" root \")\" | \"x\"", DfaLimits{65000, 4});
    CHECK(dfaAccepts(p, "x"));
    CHECK(dfaAccepts(p, "((((x))))"));          // four pending expansions
    CHECK_FALSE(dfaAccepts(p, "(((((x)))))"));  // five
    CHECK_FALSE(dfaAccepts(p, "((x)"));

    ByteDfa left = compile("root ::= root \"a\" | \"b\"");
    CHECK(dfaAccepts(left, "b"));
    CHECK(dfaAccepts(left, "baaaaaaaa"));
    CHECK_FALSE(dfaAccepts(left, "baaaaaaaaa"));
    CHECK_FALSE(dfaAccepts(left, "a"));

    // Right recursion is a tail call: unbounded.
    ByteDfa list = compile("root ::= \"a\" root | \"\"");
    CHECK(dfaAccepts(list, std::string(500, 'a')));
    ByteDfa loop = compile("root ::= a\na ::= b | \"z\"\nb ::= a");
    CHECK(dfaAccepts(loop, "z"));
}

TEST_CASE("grammar: automaton limits and empty languages fail cleanly") {
    auto t0 = std::chrono::steady_clock::now();
    Result<Grammar> g = parseGbnf("root ::= [ab]* \"a\" [ab]{14}");
    REQUIRE(g.isOk());
    Result<ByteDfa> d = buildDfa(*g, DfaLimits{1000, 8});
    REQUIRE_FALSE(d.isOk());
    CHECK(d.message() == "grammar needs more than 3000 automaton states (at most 1000)");
    CHECK(msSince(t0) < 2000);

    t0 = std::chrono::steady_clock::now();
    Result<Grammar> nested = parseGbnf("root ::= ( [a-z]{0,100} ){0,100}");
    REQUIRE(nested.isOk());
    Result<ByteDfa> nd = buildDfa(*nested);
    REQUIRE_FALSE(nd.isOk());
    CHECK(nd.message().rfind("grammar is too complex: building its automaton took more than", 0) ==
          0);
    CHECK(msSince(t0) < 5000);

    for (const char* empty : {"root ::= \"(\" root \")\"", "root ::= [^\\x00-\\U0010FFFF]"}) {
        Result<Grammar> e = parseGbnf(empty);
        REQUIRE(e.isOk());
        Result<ByteDfa> ed = buildDfa(*e);
        REQUIRE_FALSE(ed.isOk());
        CHECK(ed.message() == "grammar accepts no text (rule 'root', nesting depth at most 8)");
    }
    ByteDfa only_empty = compile("root ::= \"\"");
    CHECK(only_empty.states() == 1);
    CHECK(dfaAccepts(only_empty, ""));
    CHECK_FALSE(dfaAccepts(only_empty, "a"));
}

TEST_CASE("grammar: JSON object grammar") {
    auto t0 = std::chrono::steady_clock::now();
    ByteDfa d = compile(jsonObjectGbnf());
    double ms = msSince(t0);
    MESSAGE("json_object (depth 8): " << d.states() << " states, " << d.n_classes << " classes, "
                                      << ms << " ms");
    CHECK(d.states() < 65000);
    CHECK(dfaAccepts(d, R"({"a":[1,2,{"b":null}],"c":"x\"y"})"));
    CHECK(dfaAccepts(d, R"({"a": -0.5e+3, "b": [true, false], "\u00e9": "\ud7ff\n"})"));
    CHECK(dfaAccepts(d, "{}"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":})"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":1} x)"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":1}})"));
    CHECK_FALSE(dfaAccepts(d, R"([1])"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":01})"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":"\ud800"})"));  // lone surrogate escape
    CHECK_FALSE(dfaAccepts(d, "{\"a\":\"\x01\"}"));   // raw control character
    // Eight nested non-empty containers fit the default depth (a ninth may be empty); more do not.
    CHECK(dfaAccepts(d, R"({"a":[[[[[[[1]]]]]]]})"));
    CHECK(dfaAccepts(d, R"({"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":1}}}}}}}})"));
    CHECK(dfaAccepts(d, R"({"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{}}}}}}}}})"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":[[[[[[[[1]]]]]]]]})"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}})"));
    CHECK_FALSE(dfaAccepts(d, R"({"a":[[[[[[[[[]]]]]]]]]})"));
    std::mt19937 rng(7);
    Walker w(d);
    for (int i = 0; i < 50; ++i) {
        std::string text = w.walk(rng, rng() % 300);
        INFO(text);
        json v;
        REQUIRE_NOTHROW(v = json::parse(text));
        CHECK(v.is_object());
    }
}

// A random JSON value whose containers nest at most `depth` deep (counting containers that hold
// values), with strings that need escapes and non-ASCII characters.
json randomValue(std::mt19937& rng, int depth) {
    static const char* kStrings[] = {"",         "a",        "q\"uote",          "back\\",
                                     "\n\t\x01", "\xc3\xa9", "\xf0\x9f\x98\x80", "/"};
    int kind = int(rng() % (depth > 0 ? 8 : 6));
    switch (kind) {
        case 0:
            return nullptr;
        case 1:
            return rng() % 2 == 0;
        case 2:
            return int(rng() % 20001) - 10000;
        case 3:
            return double(int(rng() % 2000) - 1000) / 64.0;
        case 4:
            return kStrings[rng() % 8];
        case 5:
            return depth > 0 ? json::array() : json::object();
        case 6: {
            json a = json::array();
            for (int n = int(rng() % 4); n > 0; --n) a.push_back(randomValue(rng, depth - 1));
            return a;
        }
        default: {
            json o = json::object();
            for (int n = int(rng() % 4); n > 0; --n)
                o[kStrings[rng() % 8]] = randomValue(rng, depth - 1);
            return o;
        }
    }
}

TEST_CASE("grammar: JSON object automaton accepts compact JSON within the depth, and only JSON") {
    ByteDfa d = compile(jsonObjectGbnf());
    std::mt19937 rng(99);
    for (int i = 0; i < 300; ++i) {
        json o = json::object();
        for (int n = int(rng() % 4); n > 0; --n) o["k" + std::to_string(n)] = randomValue(rng, 7);
        std::string text = o.dump();
        INFO(text);
        CHECK(dfaAccepts(d, text));
        // Byte mutations: whatever the automaton still accepts must parse as a JSON object.
        for (int m = 0; m < 20 && !text.empty(); ++m) {
            std::string bad = text;
            size_t at = rng() % bad.size();
            const char kPool[] = "{}[],:\"\\ 0123456789.eE-+tfnu\x01\xc3\xa9";
            if (rng() % 2)
                bad[at] = kPool[rng() % (sizeof(kPool) - 1)];
            else
                bad.erase(at, 1);
            if (!dfaAccepts(d, bad)) continue;
            INFO(bad);
            CHECK(json::accept(bad));
        }
    }
}

TEST_CASE("grammar: packDfa layout") {
    ByteDfa d = compile(kValidGrammar);
    std::vector<uint32_t> w = packDfa(d);
    uint32_t states = d.states(), accept_words = (states + 31) / 32;
    REQUIRE(w.size() == 4 + 64 + accept_words + (states * d.n_classes + 1) / 2);
    CHECK(w[0] == states);
    CHECK(w[1] == d.n_classes);
    CHECK(w[2] == d.start);
    CHECK(w[3] == 0);
    for (int b = 0; b < 256; ++b)
        CHECK(((w[4 + b / 4] >> (8 * (b % 4))) & 0xFF) == d.byte_class[b]);
    for (uint32_t s = 0; s < states; ++s) {
        CHECK(((w[68 + s / 32] >> (s % 32)) & 1) == d.accepting[s]);
        for (uint32_t c = 0; c < d.n_classes; ++c) {
            uint32_t e = s * d.n_classes + c;
            CHECK(((w[68 + accept_words + e / 2] >> (16 * (e % 2))) & 0xFFFF) == d.next[e]);
        }
    }
    // Walk "hi!" on the packed words.
    uint32_t s = w[2];
    for (char ch : std::string("hi!")) {
        uint8_t b = uint8_t(ch);
        uint32_t cls = (w[4 + b / 4] >> (8 * (b % 4))) & 0xFF;
        uint32_t e = s * w[1] + cls;
        s = (w[68 + accept_words + e / 2] >> (16 * (e % 2))) & 0xFFFF;
        REQUIRE(s != 0xFFFF);
    }
    CHECK(((w[68 + s / 32] >> (s % 32)) & 1) == 1);
}

const nlohmann::ordered_json kPerson = nlohmann::ordered_json::parse(R"({
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "person", "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": ["string", "null"], "format": "email"},
    "tags": {"type": "array", "items": {"enum": ["a", "b\"c", "\u00e9\u65e5", "tab\t"]}, "maxItems": 3},
    "address": {"type": "object", "properties": {"street": {"type": "string"},
                "city": {"type": "string"}}, "required": ["city"]},
    "score": {"type": "number"},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age"]
})");

TEST_CASE("grammar: schema texts are valid JSON satisfying the schema") {
    const json schemas[] = {
        json(kPerson),
        json::parse(R"({"$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["value", "children"]}}, "$ref": "#/$defs/node"})"),
        json::parse(R"({"type": "array", "prefixItems": [{"const": "x"}, {"type": "boolean"}],
            "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4})"),
        json::parse(R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"},
            {"type": "object", "properties": {"k": {}}}]})"),
        json::parse(R"({"type": "object", "properties": {"any": true, "list": {"type": "array"}},
            "required": ["any", "list"], "additionalProperties": false})"),
        json::parse(R"({"definitions": {"e": {"enum": [1, 2.5, "three", null, [1], {"a": 1}]}},
            "type": "array", "items": {"$ref": "#/definitions/e"}, "minItems": 2, "maxItems": 2})"),
    };
    std::mt19937 rng(42);
    for (const json& s : schemas) {
        ByteDfa d = compileSchema(s);
        checkWalks(d, s, rng, 40);
    }
}

TEST_CASE("grammar: schema automata reject texts that break the schema") {
    ByteDfa d = compileSchema(kPerson);
    CHECK(dfaAccepts(d, R"({"name":"Ann","age":30})"));
    CHECK(
        dfaAccepts(d, R"({"name": "Ann", "age": 150, "email": null, "tags": ["b\"c", "tab\t"]})"));
    CHECK(dfaAccepts(d, R"({"name":"\u00e9\u00e9","age":0,"address":{"city":"X"},"active":true})"));
    CHECK_FALSE(dfaAccepts(d, R"({"age":30})"));      // name is required
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann"})"));  // age is required
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":151})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":-1})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":1.5})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"","age":3})"));                       // minLength 1
    CHECK_FALSE(dfaAccepts(d, R"({"name":"abcdefghijklmnopqrstu","age":3})"));  // 21 > 20
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3,"zip":1})"));            // not listed
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3,"tags":["a","a","a","a"]})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3,"tags":["c"]})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3,"address":{"street":"S"}})"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3,)"));
    CHECK_FALSE(dfaAccepts(d, R"({"name":"Ann","age":3} )"));

    // Integer ranges are exact.
    struct Range {
        const char* schema;
        long lo, hi;
    };
    for (const Range& r : {Range{R"({"type":"integer","minimum":-37,"maximum":1234})", -37, 1234},
                           Range{R"({"type":"integer","minimum":5})", 5, 1L << 40},
                           Range{R"({"type":"integer","maximum":-3})", -(1L << 40), -3},
                           Range{R"({"type":"integer","minimum":0,"maximum":0})", 0, 0},
                           Range{R"({"type":"integer","minimum":-9.5,"maximum":99.9})", -9, 99}}) {
        ByteDfa ri = compileSchema(json::parse(r.schema));
        INFO(r.schema);
        for (long i = -2000; i <= 2000; ++i)
            CHECK(dfaAccepts(ri, std::to_string(i)) == (i >= r.lo && i <= r.hi));
        CHECK_FALSE(dfaAccepts(ri, "-0"));
        CHECK_FALSE(dfaAccepts(ri, "007"));
    }
}

// Random schemas: nested objects, arrays, enums with escapes and Unicode, numbers, integers,
// booleans, null, bounded strings, nullable types, anyOf over disjoint types.
json randomSchema(std::mt19937& rng, int depth) {
    auto pick = [&](int n) { return int(rng() % unsigned(n)); };
    int kind = pick(depth >= 3 ? 8 : 11);
    switch (kind) {
        case 0: {
            json s = {{"type", "string"}};
            if (pick(2)) s["maxLength"] = pick(6);
            if (pick(3) == 0) s["minLength"] = pick(2);
            if (s.contains("maxLength") && s.contains("minLength") &&
                s["maxLength"] < s["minLength"])
                s["maxLength"] = s["minLength"];
            return s;
        }
        case 1: {
            json s = {{"type", "integer"}};
            if (pick(2)) s["minimum"] = pick(200) - 100;
            if (pick(2))
                s["maximum"] = (s.contains("minimum") ? s["minimum"].get<int>() : -100) + pick(300);
            return s;
        }
        case 2:
            return {{"type", "number"}, {"description", "a number"}};
        case 3:
            return {{"type", "boolean"}};
        case 4:
            return {{"type", "null"}};
        case 5: {
            static const json kValues = json::array(
                {"plain", "quo\"te", "back\\slash", "new\nline", "\u00e9t\u00e9", "\u65e5\u672c",
                 "\xf0\x9f\x98\x80", "ctl\x01", "", 0, -12, 3.25, true, nullptr});
            json e = json::array();
            for (int n = 1 + pick(4); n > 0; --n) {
                const json& v = kValues[size_t(pick(int(kValues.size())))];
                if (std::find(e.begin(), e.end(), v) == e.end()) e.push_back(v);
            }
            return {{"enum", e}};
        }
        case 6:
            return {{"type", json::array({"integer", "null"})}};
        case 7:
            return {{"const", "k\"\u00e9"}};
        case 8: {
            json s = {{"type", "object"}, {"properties", json::object()}};
            json req = json::array();
            for (int n = pick(5), i = 0; i < n; ++i) {
                std::string key =
                    std::string("p") + char('a' + i) + (pick(4) == 0 ? "\"\u00e9" : "");
                s["properties"][key] = randomSchema(rng, depth + 1);
                if (pick(2)) req.push_back(key);
            }
            if (!req.empty()) s["required"] = req;
            if (pick(2)) s["additionalProperties"] = false;
            return s;
        }
        case 9: {
            json s = {{"type", "array"}, {"items", randomSchema(rng, depth + 1)}};
            if (pick(2)) s["maxItems"] = pick(4);
            if (pick(3) == 0) s["minItems"] = std::min(1, s.value("maxItems", 1));
            return s;
        }
        default:
            return {{"anyOf", json::array({{{"type", "string"}, {"maxLength", 4}},
                                           randomSchema(rng, depth + 1).contains("type")
                                               ? json{{"type", "boolean"}}
                                               : json{{"type", "array"}, {"maxItems", 1}}})}};
    }
}

TEST_CASE("grammar: 200 random schemas, random walks are all valid") {
    std::mt19937 rng(2024);
    size_t max_states = 0;
    for (int i = 0; i < 200; ++i) {
        json s = randomSchema(rng, rng() % 2 ? 0 : 1);
        ByteDfa d = compileSchema(s);
        max_states = std::max<size_t>(max_states, d.states());
        checkWalks(d, s, rng, 5);
    }
    MESSAGE("largest random-schema automaton: " << max_states << " states");
}

TEST_CASE("grammar: a 10-property schema compiles quickly") {
    json s = json::parse(R"({"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                    "zip": {"type": "string", "maxLength": 10}}, "required": ["city"]},
        "note": {"type": ["string", "null"]}},
      "required": ["id", "name", "email", "role"]})");
    auto t0 = std::chrono::steady_clock::now();
    ByteDfa d = compileSchema(s);
    double ms = msSince(t0);
    MESSAGE("10-property schema: " << d.states() << " states, " << d.n_classes << " classes, " << ms
                                   << " ms");
    std::mt19937 rng(5);
    checkWalks(d, s, rng, 30);
}

TEST_CASE("grammar: malformed and unsupported schemas are refused with their path") {
    auto error = [](const char* text) {
        Result<std::string> r = jsonSchemaToGbnf(json::parse(text));
        return r.isOk() ? std::string("(accepted)") : r.message();
    };
    CHECK(error(R"({"type": 5})") ==
          "schema at the root: 'type' must be a string or an array of strings");
    CHECK(error(R"({"properties": {"age": {"type": [1]}}})") ==
          "schema at /properties/age: 'type' must be a string or an array of strings");
    CHECK(error(R"({"type": "object", "properties": 3})") ==
          "schema at the root: 'properties' must be an object");
    CHECK(error(R"({"type": "string", "pattern": "a+"})") ==
          "schema at the root: unsupported keyword 'pattern'");
    CHECK(error(R"({"properties": {"a/b": {"not": {}}}})") ==
          "schema at /properties/a~1b: unsupported keyword 'not'");
    CHECK(error(R"({"type": "object", "patternProperties": {}})") ==
          "schema at the root: unsupported keyword 'patternProperties'");
    CHECK(error(R"({"items": {"if": true}})") == "schema at /items: unsupported keyword 'if'");
    CHECK(error(R"({"$ref": "#/$defs/missing"})") ==
          "schema at the root: '$ref' '#/$defs/missing' names no definition");
    CHECK(error(R"({"$ref": "http://x/y"})") ==
          "schema at the root: '$ref' 'http://x/y' names no definition");
    CHECK(error(R"({"type": "strin"})") == "schema at the root: unknown type 'strin'");
    CHECK(error(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})") ==
          "schema at the root: required property 'b' is not in 'properties'");
    CHECK(error(R"({"type": "number", "minimum": 0})") ==
          "schema at the root: 'minimum'/'maximum' are supported on integers only");
    CHECK(error(R"({"type": "array", "minItems": 3, "maxItems": 2})") ==
          "schema at the root: the array's item counts allow no value");
    CHECK(error(R"({"anyOf": [{"type": "string"}, false]})") ==
          "schema at /anyOf/1: the schema 'false' allows no value");
    CHECK(error(R"({"allOf": [{}, {}]})") ==
          "schema at the root: 'allOf' with more than one schema is not supported");
    CHECK(error(R"(7)") == "schema at the root: a schema must be an object or a boolean");
    CHECK(error(R"({"type": "object", "additionalProperties": {"type": "string"}})") ==
          "schema at the root: 'additionalProperties' must be true or false");
    json deep = {{"type", "string"}};
    for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
    Result<std::string> too_deep = jsonSchemaToGbnf(deep);
    REQUIRE_FALSE(too_deep.isOk());
    CHECK(too_deep.message().find(": schemas nest deeper than 64") != std::string::npos);
    CHECK(too_deep.message().rfind("schema at /items/items/", 0) == 0);
    const char* annotated =
        R"({"title": "t", "description": "d", "examples": [1], "default": 1, "format": "x"})";
    CHECK(error(annotated) == "(accepted)");
}

}  // namespace
}  // namespace blue
