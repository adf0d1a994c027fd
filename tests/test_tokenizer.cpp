// Tests of the tokenizers: llama.cpp's published vocabulary vectors (every string must encode to
// exactly the expected ids and decode back), the stories260K model's greedy output, special
// tokens, streaming decoding against batch decoding, arbitrary bytes, hand-made vocabularies
// that pin down merge order, malformed vocabularies with their messages, and a seeded mutation
// test of the loader.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "compiler/gguf.h"
#include "compiler/tokenizer.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

Tokenizer loadTokenizer(const std::string& path) {
    Result<GgufFile> f = ggufOpen(path);
    REQUIRE_MESSAGE(f.isOk(), f.message());
    Result<Tokenizer> t = Tokenizer::fromGguf(*f);
    REQUIRE_MESSAGE(t.isOk(), t.message());
    return std::move(t).value();
}

std::string vocabPath(const std::string& name) {
    return test::sharedDir() + "/vocab/ggml-vocab-" + name + ".gguf";
}

Tokenizer loadVocab(const std::string& name) {
    return loadTokenizer(vocabPath(name));
}

std::string storiesDir() {
    return test::sharedDir() + "/models/stories260K";
}

struct VocabCase {
    std::string text;
    std::vector<int32_t> ids;
};

// The .inp file holds strings each followed by "\n__ggml_vocab_test__\n"; the .out file one line
// of space-separated ids per string.
std::vector<VocabCase> readVocabCases(const std::string& name) {
    std::string inp = readText(vocabPath(name) + ".inp");
    std::string out = readText(vocabPath(name) + ".out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<VocabCase> cases;
    size_t pos = 0;
    for (size_t m; (m = inp.find(sep, pos)) != std::string::npos; pos = m + sep.size())
        cases.push_back({inp.substr(pos, m - pos), {}});
    REQUIRE(pos == inp.size());
    std::istringstream lines(out);
    std::string line;
    size_t i = 0;
    for (; std::getline(lines, line); ++i) {
        REQUIRE(i < cases.size());
        std::istringstream ids(line);
        for (int32_t id; ids >> id;) cases[i].ids.push_back(id);
    }
    REQUIRE(i == cases.size());
    return cases;
}

std::string idList(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += " " + std::to_string(id);
    return s;
}

bool isValidUtf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        uint8_t c = uint8_t(s[i]);
        size_t len = c < 0x80                ? 1
                     : c >= 0xC2 && c < 0xE0 ? 2
                     : c >= 0xE0 && c < 0xF0 ? 3
                     : c >= 0xF0 && c < 0xF5 ? 4
                                             : 0;
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k)
            if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

// Streams `ids` token by token; checks every chunk ends on a character boundary when the whole
// text is valid UTF-8, and returns the concatenation.
std::string streamDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool render_special,
                         bool at_start = true) {
    TokenStreamDecoder d(t, render_special, at_start);
    std::string all;
    std::string expect = t.decode(ids, render_special);
    for (int32_t id : ids) {
        std::string chunk = d.push(id);
        if (isValidUtf8(expect)) CHECK_MESSAGE(isValidUtf8(chunk), "chunk after token " << id);
        all += chunk;
    }
    all += d.finish();
    CHECK(d.heldBytes() == 0);
    return all;
}

}  // namespace

TEST_CASE("tokenizer: llama.cpp vocabulary vectors encode exactly and decode back") {
    struct Vocab {
        const char* name;
        int32_t bos;
        bool add_bos;
    };
    // The published ids carry no BOS (the first string, "ied 4 ½ months", starts with "▁ied" /
    // "ied"): they are what encode(text, add_special = false, parse_special = false) returns.
    for (const Vocab& v : {Vocab{"llama-spm", 1, true}, Vocab{"phi-3", 1, true},
                           Vocab{"gpt-2", 50256, false}, Vocab{"deepseek-coder", 32013, true}}) {
        CAPTURE(std::string(v.name));
        Tokenizer t = loadVocab(v.name);
        std::vector<VocabCase> cases = readVocabCases(v.name);
        REQUIRE(cases.size() == 46);
        CHECK(t.bos() == v.bos);
        CHECK(t.addBos() == v.add_bos);
        REQUIRE_FALSE(cases[0].ids.empty());
        CHECK(cases[0].ids[0] != t.bos());
        int encoded = 0, decoded = 0;
        for (size_t i = 0; i < cases.size(); ++i) {
            const VocabCase& c = cases[i];
            CAPTURE(i);
            CAPTURE(c.text);
            std::vector<int32_t> got = t.encode(c.text, false, false);
            CHECK_MESSAGE(got == c.ids, "expected" << idList(c.ids) << "\ngot     " << idList(got));
            encoded += got == c.ids;
            std::vector<int32_t> with_bos = t.encode(c.text, true, false);
            std::vector<int32_t> expect_bos = c.ids;
            if (v.add_bos) expect_bos.insert(expect_bos.begin(), v.bos);
            CHECK(with_bos == expect_bos);
            std::string back = t.decode(c.ids);
            CHECK(back == c.text);
            decoded += back == c.text;
            CHECK(t.decode(with_bos) == c.text);  // a leading BOS does not take the space strip
        }
        MESSAGE(std::string(v.name)
                << ": " << encoded << "/" << cases.size() << " vectors encode exactly, " << decoded
                << "/" << cases.size() << " decode back");
    }
}

TEST_CASE("tokenizer: vocabulary metadata and accessors") {
    Tokenizer s = loadTokenizer(storiesDir() + "/stories260K.gguf");
    CHECK(s.model() == TokenizerModel::Spm);
    CHECK(s.vocabSize() == 512);
    CHECK(s.bos() == 1);
    CHECK(s.eos() == 2);
    CHECK(s.unk() == 0);
    CHECK(s.pad() == kNoToken);  // stored as 0xFFFFFFFF
    CHECK(s.eot() == kNoToken);
    CHECK(s.addBos());
    CHECK_FALSE(s.addEos());
    CHECK(s.addSpacePrefix());
    CHECK(s.isEog(2));
    CHECK_FALSE(s.isEog(1));
    CHECK_FALSE(s.isEog(-1));
    CHECK_FALSE(s.isEog(512));
    CHECK(s.isControl(1));
    CHECK_FALSE(s.isControl(403));
    CHECK(s.tokenType(0) == TokenType::Unknown);
    CHECK(s.tokenType(3) == TokenType::Byte);
    CHECK(s.tokenType(9999) == TokenType::Undefined);
    CHECK(s.tokenText(3) == "<0x00>");
    CHECK(s.tokenText(403) == "\xe2\x96\x81Once");
    CHECK(s.tokenText(-5).empty());
    CHECK(s.piece(403) == " Once");
    CHECK(s.piece(13) == "\n");  // <0x0A>
    CHECK(s.piece(1).empty());
    CHECK(s.piece(1, true) == "<s>");
    CHECK(s.findToken("\xe2\x96\x81Once") == 403);
    CHECK(s.findToken("Once upon") == kNoToken);

    Tokenizer g = loadVocab("gpt-2");
    CHECK(g.model() == TokenizerModel::Bpe);
    CHECK(g.preTokenizer() == "gpt-2");
    CHECK(g.vocabSize() == 50257);
    CHECK(g.eos() == 50256);
    CHECK(g.eot() == 50256);  // <|endoftext|>
    CHECK(g.isEog(50256));
    CHECK_FALSE(g.addSpacePrefix());
    CHECK(g.piece(g.findToken("\xc4\xa0world")) == " world");  // Ġworld

    Tokenizer p = loadVocab("phi-3");
    CHECK(p.eos() == 32000);
    CHECK(p.tokenText(p.eot()) == "<|end|>");
    CHECK(p.isEog(32000));
    CHECK(p.isEog(p.eot()));
    CHECK_FALSE(p.isEog(32010));  // <|user|>

    Tokenizer d = loadVocab("deepseek-coder");
    CHECK(d.preTokenizer() == "deepseek-coder");
    CHECK(d.eos() == 32014);
    CHECK(d.isEog(32014));
    CHECK(d.tokenType(32000) == TokenType::UserDefined);
}

TEST_CASE("tokenizer: stories260K greedy output decodes to the expected text") {
    Tokenizer t = loadTokenizer(storiesDir() + "/stories260K.gguf");
    std::string file = readText(storiesDir() + "/expected_greedy_bos_256.txt");
    size_t nl = file.find('\n');
    REQUIRE(nl != std::string::npos);
    std::vector<int32_t> ids;
    std::istringstream line(file.substr(0, nl));
    for (int32_t id; line >> id;) ids.push_back(id);
    REQUIRE(ids.size() == 256);
    // The ids are the generated tokens that followed the BOS prompt; the text file ends its last
    // line with a newline that is not part of the output.
    std::string text = file.substr(nl + 1);
    REQUIRE(!text.empty());
    REQUIRE(text.back() == '\n');
    text.pop_back();
    CHECK(t.decode(ids) == text);
    std::vector<int32_t> with_bos = ids;
    with_bos.insert(with_bos.begin(), t.bos());
    CHECK(t.decode(with_bos) == text);
    CHECK(streamDecode(t, ids, false) == text);
    CHECK(streamDecode(t, with_bos, false) == text);
    CHECK(t.decode(with_bos, true) == "<s> " + text);  // rendered BOS takes the space strip
    CHECK(text.rfind("Once upon a time, there was a little girl named Lily.", 0) == 0);
}

TEST_CASE("tokenizer: stories260K encode/decode round trips") {
    Tokenizer t = loadTokenizer(storiesDir() + "/stories260K.gguf");
    const char* texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "",
        " ",
        "  leading spaces and trailing  ",
        "Lily said, \"I can't find it!\"\nShe was sad.\n\n",
        "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 100 \xf0\x9f\xa6\x99 \xe4\xbd\xa0\xe5\xa5\xbd",
        "tab\there",
    };
    for (const char* text : texts) {
        CAPTURE(text);
        std::vector<int32_t> ids = t.encode(text, false, false);
        CHECK(t.decode(ids) == text);
        std::vector<int32_t> bos_ids = t.encode(text, true, false);
        REQUIRE(!bos_ids.empty());
        CHECK(bos_ids[0] == 1);
        CHECK(t.decode(bos_ids) == text);
        for (int32_t id : ids) CHECK(t.isValid(id));
    }
    // Characters outside the 512-token vocabulary fall back to their UTF-8 bytes.
    std::vector<int32_t> llama = t.encode("\xf0\x9f\xa6\x99", false, false);
    REQUIRE(llama.size() == 5);
    CHECK(t.tokenText(llama[0]) == "\xe2\x96\x81");
    CHECK(t.tokenText(llama[1]) == "<0xF0>");
    CHECK(t.tokenText(llama[2]) == "<0x9F>");
    CHECK(t.tokenText(llama[3]) == "<0xA6>");
    CHECK(t.tokenText(llama[4]) == "<0x99>");
    CHECK(t.encode("Once", false, false) == std::vector<int32_t>{403});
}

TEST_CASE("tokenizer: special tokens") {
    Tokenizer p = loadVocab("phi-3");
    const int32_t user = p.findToken("<|user|>"), end = p.findToken("<|end|>");
    REQUIRE(user == 32010);
    std::vector<int32_t> hi = p.encode("Hi", false, false);  // "▁Hi": the space prefix
    std::vector<int32_t> parsed = p.encode("<|user|>Hi<|end|>", false, true);
    std::vector<int32_t> expect = {user};
    expect.insert(expect.end(), hi.begin(), hi.end());
    expect.push_back(end);
    CHECK(parsed == expect);
    // Phi-3's special tokens swallow the whitespace after them.
    CHECK(p.encode("<|user|>\n  Hi<|end|>", false, true) == expect);
    std::vector<int32_t> literal = p.encode("<|user|>Hi", false, false);
    CHECK(std::find(literal.begin(), literal.end(), user) == literal.end());
    CHECK(p.decode(literal) == "<|user|>Hi");
    CHECK(p.decode(parsed) == "Hi");
    CHECK(p.decode(parsed, true) == "<|user|> Hi<|end|>");

    Tokenizer g = loadVocab("gpt-2");
    CHECK(g.encode("a<|endoftext|>b", false, true) ==
          std::vector<int32_t>{g.findToken("a"), 50256, g.findToken("b")});
    CHECK(g.encode("<|endoftext|>", false, false).size() > 1);

    // User-defined tokens are recognised even without parse_special.
    Tokenizer d = loadVocab("deepseek-coder");
    const std::string hole =
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81hole\xef\xbd\x9c>";
    int32_t hole_id = d.findToken(hole);
    REQUIRE(hole_id == 32015);
    std::vector<int32_t> ids = d.encode("x" + hole + "y", false, false);
    CHECK(ids == std::vector<int32_t>{d.findToken("x"), hole_id, d.findToken("y")});
    CHECK(d.decode(ids) == "x" + hole + "y");
}

TEST_CASE("tokenizer: streaming decoder equals batch decode") {
    Tokenizer s = loadTokenizer(storiesDir() + "/stories260K.gguf");
    // U+1F999 as four byte-fallback tokens: nothing comes out until the character is complete.
    std::vector<int32_t> ids = s.encode("a \xf0\x9f\xa6\x99 b \xc3\xbc", false, false);
    TokenStreamDecoder dec(s);
    std::string out;
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(dec.push(id));
    out = std::accumulate(chunks.begin(), chunks.end(), std::string()) + dec.finish();
    CHECK(out == "a \xf0\x9f\xa6\x99 b \xc3\xbc");
    CHECK(std::count(chunks.begin(), chunks.end(), "\xf0\x9f\xa6\x99") == 1);
    CHECK(std::count(chunks.begin(), chunks.end(), "\xc3\xbc") == 1);

    TokenStreamDecoder partial(s);
    CHECK(partial.push(s.findToken("<0xF0>")) == "");
    CHECK(partial.push(s.findToken("<0x9F>")) == "");
    CHECK(partial.heldBytes() == 2);
    CHECK(partial.finish() == "\xf0\x9f");  // an unfinished character is handed back at the end
    // A stray continuation byte can never complete: it is passed through at once.
    TokenStreamDecoder stray(s);
    CHECK(stray.push(s.findToken("<0x80>")) == "\x80");

    // Continuing after a prompt keeps the leading space.
    TokenStreamDecoder cont(s, false, false);
    CHECK(cont.push(403) == " Once");
    TokenStreamDecoder start(s);
    CHECK(start.push(1) == "");
    CHECK(start.push(403) == "Once");

    const char* texts[] = {
        "Hello, y'all! How are you \xf0\x9f\x98\x81 ?\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8"
        "apple",
        "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe",
        "  two spaces, then \xf0\x9f\x9a\x80\xf0\x9f\xa6\x99\n\ttabs",
    };
    for (std::string name : {"llama-spm", "phi-3", "gpt-2", "deepseek-coder"}) {
        CAPTURE(name);
        Tokenizer t = loadVocab(name);
        for (const char* text : texts) {
            CAPTURE(text);
            std::vector<int32_t> v = t.encode(text, true, true);
            CHECK(streamDecode(t, v, false) == t.decode(v));
            CHECK(streamDecode(t, v, true) == t.decode(v, true));
            std::string prefix = t.addSpacePrefix() ? " " : "";
            CHECK(streamDecode(t, v, false, false) == prefix + t.decode(v));
            CHECK(t.decode(v) == text);
        }
    }
}

TEST_CASE("tokenizer: arbitrary bytes, invalid UTF-8 included, round trip") {
    std::mt19937 rng(1234);
    std::string common = {'a',        'b',        ' ',        ' ',        '\n',
                          '1',        '\'',       '.',        char(0x80), char(0xBF),
                          char(0xC3), char(0xE2), char(0xF0), char(0x9F)};
    // Bytes that never occur in UTF-8 (C0, FF, ...). DeepSeek Coder's vocabulary has them only as
    // user-defined tokens whose text is the byte-level character ("À", "ÿ"), which
    // decode as that text, so it cannot represent these bytes.
    std::string never_utf8 = {char(0xC0), char(0xFF)};
    for (std::string name : {"llama-spm", "gpt-2", "deepseek-coder"}) {
        CAPTURE(name);
        Tokenizer t = loadVocab(name);
        std::string alphabet = name == "deepseek-coder" ? common : common + never_utf8;
        for (int iter = 0; iter < 200; ++iter) {
            std::string text(rng() % 24, ' ');
            for (char& c : text) c = alphabet[rng() % alphabet.size()];
            CAPTURE(text);
            std::vector<int32_t> ids = t.encode(text, false, true);
            for (int32_t id : ids) REQUIRE(t.isValid(id));
            CHECK(t.decode(ids) == text);
            CHECK(streamDecode(t, ids, false) == text);
        }
    }
}

namespace {

// GPT-2's byte-level alphabet, written out independently of the tokenizer's own table.
std::string byteLevel(uint8_t b) {
    uint32_t cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        uint32_t n = 0;
        for (uint32_t c = 0; c < b; ++c)
            n += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        cp = 256 + n;
    }
    if (cp < 0x80) return std::string(1, char(cp));
    return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}

const std::string kSp = "\xe2\x96\x81";  // U+2581
const std::string kG = "\xc4\xa0";       // byte-level space

// A small SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then ▁ a b ▁a ab and a
// control token. `ab_score` decides whether "▁ab" becomes ▁a+b or ▁+ab.
GgufWriter spmWriter(float ab_score) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(strFormat("<0x%02X>", b));
        types.push_back(6);
    }
    for (const std::string& t :
         {kSp, std::string("a"), std::string("b"), kSp + "a", std::string("ab")}) {
        tokens.push_back(t);
        types.push_back(1);
    }
    tokens.push_back("<|im_start|>");
    types.push_back(3);
    std::vector<float> scores(tokens.size(), 0.0f);
    scores[259] = -5;  // ▁
    scores[260] = -6;  // a
    scores[261] = -7;  // b
    scores[262] = -1;  // ▁a
    scores[263] = ab_score;
    GgufWriter w;
    w.setString("general.architecture", "llama");
    w.setString("tokenizer.ggml.model", "llama");
    w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    w.setArray<float>("tokenizer.ggml.scores", scores);
    w.setArray<int32_t>("tokenizer.ggml.token_type", types);
    w.setU32("tokenizer.ggml.bos_token_id", 1);
    w.setU32("tokenizer.ggml.eos_token_id", 2);
    w.setU32("tokenizer.ggml.unknown_token_id", 0);
    return w;
}

// A small byte-level BPE vocabulary: the 256 byte characters in byte order, then "ab", "Ġa",
// "Ġab" and <|endoftext|>, with the given merges.
GgufWriter bpeWriter(const std::vector<std::string>& merges) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(byteLevel(uint8_t(b)));
    for (const std::string& t : {std::string("ab"), kG + "a", kG + "ab"}) tokens.push_back(t);
    tokens.push_back("<|endoftext|>");
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = 3;
    GgufWriter w;
    w.setString("tokenizer.ggml.model", "gpt2");
    w.setString("tokenizer.ggml.pre", "gpt2");
    w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    w.setArray<int32_t>("tokenizer.ggml.token_type", types);
    w.setStringArray("tokenizer.ggml.merges", std::span<const std::string>(merges));
    w.setU32("tokenizer.ggml.eos_token_id", 259);
    return w;
}

const std::vector<std::string> kMerges = {"a b", kG + " a", kG + "a b"};

Result<Tokenizer> parseVocab(const GgufWriter& w, const std::string& name = "m.gguf") {
    auto bytes = w.writeToMemory();
    REQUIRE(bytes.isOk());
    Result<GgufFile> f = ggufParse(std::move(bytes).value(), name);
    REQUIRE_MESSAGE(f.isOk(), f.message());
    return Tokenizer::fromGguf(*f);
}

}  // namespace

TEST_CASE("tokenizer: SentencePiece merges follow the scores") {
    Result<Tokenizer> a = parseVocab(spmWriter(-2.0f));  // ▁a (-1) beats ab (-2)
    REQUIRE_MESSAGE(a.isOk(), a.message());
    CHECK(a->encode("ab", false, false) == std::vector<int32_t>{262, 261});
    Result<Tokenizer> b = parseVocab(spmWriter(0.0f));  // ab (0) beats ▁a (-1)
    REQUIRE_MESSAGE(b.isOk(), b.message());
    CHECK(b->encode("ab", false, false) == std::vector<int32_t>{259, 263});
    // Equal scores: the leftmost pair merges first.
    Result<Tokenizer> c = parseVocab(spmWriter(-1.0f));
    REQUIRE_MESSAGE(c.isOk(), c.message());
    CHECK(c->encode("ab", false, false) == std::vector<int32_t>{262, 261});
    CHECK(c->encode("ab", true, false) == std::vector<int32_t>{1, 262, 261});
    // "c" is not in the vocabulary: its byte token; a space-prefix follows a special token.
    CHECK(c->encode("c<|im_start|>a", false, true) == std::vector<int32_t>{259, 3 + 'c', 264, 262});
    CHECK(c->decode(c->encode("c<|im_start|>a", false, true)) == "c a");

    GgufWriter no_prefix = spmWriter(-2.0f);
    no_prefix.setBool("tokenizer.ggml.add_space_prefix", false);
    Result<Tokenizer> d = parseVocab(no_prefix);
    REQUIRE_MESSAGE(d.isOk(), d.message());
    CHECK(d->encode("ab", false, false) == std::vector<int32_t>{263});
    CHECK(d->encode(" a", false, false) == std::vector<int32_t>{262});
    CHECK(d->decode(std::vector<int32_t>{262}) == " a");
}

TEST_CASE("tokenizer: byte-level BPE merges follow the ranks") {
    Result<Tokenizer> t = parseVocab(bpeWriter(kMerges));
    REQUIRE_MESSAGE(t.isOk(), t.message());
    // Ids 0..255 are the byte characters in byte order: the space (Ġ) is 32.
    const int32_t space = 32, ab = 256, ga = 257, gab = 258;
    REQUIRE(t->findToken(kG) == space);
    CHECK(t->encode(" ab", false, false) == std::vector<int32_t>{space, ab});  // "a b" first
    CHECK(t->encode(" a", false, false) == std::vector<int32_t>{ga});
    CHECK(t->encode("ab ab", false, false) == std::vector<int32_t>{ab, space, ab});

    Result<Tokenizer> r = parseVocab(bpeWriter({kG + " a", kG + "a b", "a b"}));
    REQUIRE_MESSAGE(r.isOk(), r.message());
    CHECK(r->encode(" ab", false, false) == std::vector<int32_t>{gab});
    CHECK(r->encode("\n\xc3\xa9", false, false) == std::vector<int32_t>{10, 0xC3, 0xA9});
    CHECK(r->decode(std::vector<int32_t>{gab, 10, 0xC3, 0xA9}) == " ab\n\xc3\xa9");
    CHECK(r->isEog(259));
    CHECK(r->encode("<|endoftext|>", false, true) == std::vector<int32_t>{259});
}

namespace {

// A vocabulary of `texts` with types (N normal, C control, U unknown) and scores.
GgufWriter modelWriter(const char* model, const std::vector<std::string>& texts,
                       const std::string& types, const std::vector<float>& scores = {}) {
    GgufWriter w;
    w.setString("tokenizer.ggml.model", model);
    w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(texts));
    std::vector<int32_t> t;
    for (char c : types) t.push_back(c == 'C' ? 3 : c == 'U' ? 2 : 1);
    w.setArray("tokenizer.ggml.token_type", std::span<const int32_t>(t));
    if (!scores.empty()) w.setArray("tokenizer.ggml.scores", std::span<const float>(scores));
    return w;
}

}  // namespace

TEST_CASE("tokenizer: WordPiece is greedy longest-match-first with an unknown word") {
    // llama.cpp's spelling: word starts carry U+2581, continuations are bare. Ids 0..3 are BERT's
    // [PAD] [UNK] [CLS] [SEP]; the defaults add [CLS] first and [SEP] last.
    const std::string m = "\xe2\x96\x81";
    GgufWriter w = modelWriter(
        "bert",
        {"[PAD]", "[UNK]", "[CLS]", "[SEP]", m + "un", m + "una", "ffable", "ff", "able",
         m + "hello", m + ",", m + "\u4e2d", m + "\u6587", m + "cafe", "a", m + "!", m + "a"},
        "CUCCNNNNNNNNNNNNN");
    w.setU32("tokenizer.ggml.unknown_token_id", 1);
    w.setU32("tokenizer.ggml.bos_token_id", 2);
    w.setU32("tokenizer.ggml.seperator_token_id", 3);
    Result<Tokenizer> t = parseVocab(w);
    REQUIRE_MESSAGE(t.isOk(), t.message());
    using Ids = std::vector<int32_t>;
    // Greedy: "una" is the longest start, then "ffable"; "##ff" "##able" would fit as well.
    CHECK(t->encode("unaffable", false, false) == Ids{5, 6});
    CHECK(t->encode("unaff", false, false) == Ids{5, 7});
    // Lowercased; punctuation is a word of its own; [CLS] and [SEP] around.
    CHECK(t->encode("Hello, UNAFFABLE!", true, false) == Ids{2, 9, 10, 5, 6, 15, 3});
    CHECK(t->decode(t->encode("Hello, UNAFFABLE!", false, false)) == "hello , unaffable !");
    // A word with a part no token covers is one [UNK], whatever matched before it.
    CHECK(t->encode("unx hello", false, false) == Ids{1, 9});
    // CJK ideographs are words; accents go after NFD; tabs and line breaks cut words; controls
    // and invalid UTF-8 are dropped.
    CHECK(t->encode("\u4e2d\u6587", false, false) == Ids{11, 12});
    CHECK(t->encode("Caf\u00e9", false, false) == Ids{13});
    CHECK(t->encode("hello\t\nhello", false, false) == Ids{9, 9});
    CHECK(t->encode("hel\x01lo\xff", false, false) == Ids{9});
    // BERT's limit: a word of more than 100 characters is unknown.
    CHECK(t->encode("aaa", false, false) == Ids{16, 14, 14});
    CHECK(t->encode(std::string(100, 'a'), false, false).size() == 100);
    CHECK(t->encode(std::string(101, 'a'), false, false) == Ids{1});
    CHECK(t->encode("", true, false) == Ids{2, 3});

    // Hugging Face's spelling: continuations carry "##".
    GgufWriter h = modelWriter("bert",
                               {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "una", "##ffable", "##ff",
                                "##able", "hello", ",", "!"},
                               "CUCCNNNNNNNN");
    Result<Tokenizer> hf = parseVocab(h);  // llama.cpp's default ids (100..102) lie outside
    REQUIRE_FALSE(hf.isOk());
    h.setU32("tokenizer.ggml.unknown_token_id", 1);
    h.setU32("tokenizer.ggml.bos_token_id", 2);
    h.setU32("tokenizer.ggml.seperator_token_id", 3);
    h.setBool("tokenizer.ggml.add_sep_token", false);
    hf = parseVocab(h);
    REQUIRE_MESSAGE(hf.isOk(), hf.message());
    CHECK(hf->encode("hello, unaffable!", true, false) == Ids{2, 9, 10, 5, 6, 11});
    // Greedy, never backtracking: "una" leaves "ble", which no "##" piece covers, so "unable" is
    // unknown though "un" "##able" would cover it.
    CHECK(hf->encode("unaff unable", false, false) == Ids{5, 7, 1});
    CHECK(hf->decode(Ids{9, 10, 5, 6, 11}) == "hello , unaffable !");
}

TEST_CASE("tokenizer: Unigram takes the best-scoring segmentation") {
    const std::string m = "\xe2\x96\x81";
    GgufWriter w = modelWriter(
        "t5", {"<pad>", "</s>", "<unk>", m, m + "a", "b", m + "ab", "a", "c", m + "abc"},
        "CCUNNNNNNN", {0, 0, 0, -2, -1, -2, -5, -3, -4, -7.5f});
    w.setBool("tokenizer.ggml.remove_extra_whitespaces", true);
    Result<Tokenizer> t = parseVocab(w);
    REQUIRE_MESSAGE(t.isOk(), t.message());
    using Ids = std::vector<int32_t>;
    // "▁abc" alone scores -7.5, "▁a" "b" "c" -7: Viterbi, not the longest match.
    CHECK(t->encode("abc", false, false) == Ids{4, 5, 8});
    CHECK(t->encode("abc", true, false) == Ids{4, 5, 8, 1});  // T5 ends with </s>
    CHECK(t->encode("ab", false, false) == Ids{4, 5});        // -3 beats "▁ab" at -5
    CHECK(t->decode(Ids{4, 5, 8}) == "abc");
    // Characters no piece covers: one <unk> for the run (each scored 10 below the lowest piece).
    CHECK(t->encode("axyb", false, false) == Ids{4, 2, 5});
    CHECK(t->encode("a\xff", false, false) == Ids{4, 2});
    // Extra whitespace removed: leading, trailing, runs; spaces only give nothing.
    CHECK(t->encode("  a   b  ", false, false) == Ids{4, 3, 5});
    CHECK(t->encode("   ", true, false) == Ids{1});

    w.setBool("tokenizer.ggml.remove_extra_whitespaces", false);
    Result<Tokenizer> keep = parseVocab(w);
    REQUIRE_MESSAGE(keep.isOk(), keep.message());
    CHECK(keep->encode("a  b", false, false) == Ids{4, 3, 3, 5});

    // A precompiled character map (a Darts-clone double array) mapping "A" to "a": the root's
    // offset 1 leads to unit 1 ^ 'A' = 64, labelled 'A' with a leaf whose value (unit 64 ^ 1 =
    // 65) is 0, the start of "a" in the pool.
    std::vector<uint32_t> units(66, 0);
    units[0] = 1u << 10;
    units[64] = 'A' | (1u << 8) | (1u << 10);
    units[65] = 1u << 31;
    std::vector<uint8_t> map = {uint8_t(units.size() * 4), uint8_t(units.size() * 4 >> 8), 0, 0};
    for (uint32_t u : units)
        for (int k = 0; k < 4; ++k) map.push_back(uint8_t(u >> (8 * k)));
    map.push_back('a');
    map.push_back(0);
    w.setArray("tokenizer.ggml.precompiled_charsmap", std::span<const uint8_t>(map));
    Result<Tokenizer> mapped = parseVocab(w);
    REQUIRE_MESSAGE(mapped.isOk(), mapped.message());
    CHECK(mapped->encode("AbA", false, false) == Ids{4, 5, 7});
    map.resize(10);  // the array no longer fits
    w.setArray("tokenizer.ggml.precompiled_charsmap", std::span<const uint8_t>(map));
    CHECK_FALSE(parseVocab(w).isOk());
}

TEST_CASE("tokenizer: malformed vocabularies are refused with messages naming the key") {
    struct Case {
        const char* what;
        std::function<GgufWriter()> make;
        std::vector<const char*> parts;
    };
    auto spm = [](auto edit) {
        return [edit]() {
            GgufWriter w = spmWriter(-2.0f);
            edit(w);
            return w;
        };
    };
    auto bpe = [](auto edit) {
        return [edit]() {
            GgufWriter w = bpeWriter(kMerges);
            edit(w);
            return w;
        };
    };
    const std::vector<std::string> dup = {"<unk>", "<s>", "a", "b", "a"};
    const std::vector<Case> cases = {
        {"model",
         spm([](GgufWriter& w) { w.setString("tokenizer.ggml.model", "rwkv"); }),
         {"key 'tokenizer.ggml.model'", "'rwkv' is not supported", "'t5' = Unigram"}},
        {"no tokens",
         [] {
             GgufWriter w;
             w.setString("tokenizer.ggml.model", "llama");
             return w;
         },
         {"missing key 'tokenizer.ggml.tokens'"}},
        {"tokens type",
         spm([](GgufWriter& w) { w.setU32("tokenizer.ggml.tokens", 3); }),
         {"tokenizer.ggml.tokens", "array<string>"}},
        {"empty",
         spm([](GgufWriter& w) {
             w.setStringArray("tokenizer.ggml.tokens", std::vector<std::string>{});
         }),
         {"key 'tokenizer.ggml.tokens' is empty"}},
        {"duplicate",
         spm([&](GgufWriter& w) {
             w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(dup));
         }),
         {"tokenizer.ggml.tokens", "token 4 duplicates token 2 ('a')"}},
        {"scores length",
         spm([](GgufWriter& w) {
             w.setArray<float>("tokenizer.ggml.scores", std::vector<float>{1, 2, 3});
         }),
         {"key 'tokenizer.ggml.scores' has 3 entries, but 'tokenizer.ggml.tokens' has 265"}},
        {"nan score",
         spm([](GgufWriter& w) {
             std::vector<float> s(265, 0.0f);
             s[7] = std::nanf("");
             w.setArray<float>("tokenizer.ggml.scores", s);
         }),
         {"tokenizer.ggml.scores", "score of token 7 is NaN"}},
        {"type range",
         spm([](GgufWriter& w) {
             std::vector<int32_t> t(265, 1);
             t[5] = 9;
             w.setArray<int32_t>("tokenizer.ggml.token_type", t);
         }),
         {"tokenizer.ggml.token_type", "token 5 has type 9"}},
        {"types length",
         spm([](GgufWriter& w) {
             w.setArray<int32_t>("tokenizer.ggml.token_type", std::vector<int32_t>{1});
         }),
         {"'tokenizer.ggml.token_type' has 1 entries"}},
        {"byte text",
         spm([](GgufWriter& w) {
             std::vector<int32_t> t(265, 1);
             t[260] = 6;
             w.setArray<int32_t>("tokenizer.ggml.token_type", t);
         }),
         {"tokenizer.ggml.token_type", "token 260 is a byte token but its text 'a' is not <0xNN>"}},
        {"bos range",
         spm([](GgufWriter& w) { w.setU32("tokenizer.ggml.bos_token_id", 999); }),
         {"key 'tokenizer.ggml.bos_token_id' = 999 is outside the vocabulary (265 tokens)"}},
        {"pad negative",
         spm([](GgufWriter& w) { w.setI32("tokenizer.ggml.padding_token_id", -7); }),
         {"'tokenizer.ggml.padding_token_id' = -7 is outside"}},
        {"eos type",
         spm([](GgufWriter& w) { w.setString("tokenizer.ggml.eos_token_id", "2"); }),
         {"key 'tokenizer.ggml.eos_token_id'", "found string"}},
        {"add_bos without bos",
         spm([](GgufWriter& w) {
             w.setI32("tokenizer.ggml.bos_token_id", -1);
             w.setBool("tokenizer.ggml.add_bos_token", true);
         }),
         {"'tokenizer.ggml.add_bos_token' is true but the vocabulary has no BOS token"}},
        {"add_eos type",
         spm([](GgufWriter& w) { w.setU8("tokenizer.ggml.add_eos_token", 1); }),
         {"tokenizer.ggml.add_eos_token", "expected bool"}},
        {"no byte tokens",
         spm([](GgufWriter& w) {
             std::vector<std::string> t = {"<unk>", "<s>", "</s>", "a"};
             w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(t));
             w.setArray<float>("tokenizer.ggml.scores", std::vector<float>(4, 0.0f));
             w.setArray<int32_t>("tokenizer.ggml.token_type", std::vector<int32_t>{3, 3, 3, 1});
             w.setI32("tokenizer.ggml.unknown_token_id", -1);
         }),
         {"no token for byte 0x00 and no unknown token"}},
        {"merge separator",
         bpe([](GgufWriter& w) {
             w.setStringArray("tokenizer.ggml.merges", std::vector<std::string>{"a b", "ab"});
         }),
         {"key 'tokenizer.ggml.merges': merge 1 ('ab') is not two pieces"}},
        {"no merges",
         [] {
             GgufWriter w = bpeWriter(kMerges);
             w.setU32("tokenizer.ggml.merges", 0);
             return w;
         },
         {"tokenizer.ggml.merges", "array<string>"}},
        {"pre",
         bpe([](GgufWriter& w) { w.setString("tokenizer.ggml.pre", "llama-5"); }),
         {"key 'tokenizer.ggml.pre'", "pre-tokenizer 'llama-5' is not supported", "qwen2", "tekken",
          "kimi-k2"}},
    };
    for (const Case& c : cases) {
        CAPTURE(std::string(c.what));
        Result<Tokenizer> t = parseVocab(c.make());
        REQUIRE_FALSE(t.isOk());
        INFO("message: " << t.message());
        CHECK(t.message().rfind("m.gguf: ", 0) == 0);
        for (const char* part : c.parts) CHECK(t.message().find(part) != std::string::npos);
    }
}

TEST_CASE("tokenizer: BPE pre-tokenizer choice changes the pieces merges may join") {
    // Digits "1234" with a merge "3 4": GPT-2 and BLOOM keep "1234" as one piece and SuperBPE and
    // AFMoE cut "1" | "234", so 3 and 4 merge; the default chain (llama.cpp's choice when
    // tokenizer.ggml.pre is absent) and GPT-4o cut "123" | "4" and DeepSeek Coder cuts every
    // digit, so they cannot.
    auto make = [](const char* pre) {
        std::vector<std::string> tokens;
        for (int b = 0; b < 256; ++b) tokens.push_back(byteLevel(uint8_t(b)));
        tokens.push_back("34");
        GgufWriter w;
        w.setString("tokenizer.ggml.model", "gpt2");
        if (pre) w.setString("tokenizer.ggml.pre", pre);
        w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
        w.setStringArray("tokenizer.ggml.merges", std::vector<std::string>{"3 4"});
        w.setU32("tokenizer.ggml.bos_token_id", 0);  // Llama 3 adds BOS by default
        return parseVocab(w);
    };
    const std::vector<int32_t> merged = {'1', '2', 256}, split = {'1', '2', '3', '4'};
    struct Case {
        const char* pre;  // nullptr: no tokenizer.ggml.pre key
        bool merges;
    };
    const Case cases[] = {
        {"gpt2", true},    {"gpt-2", true},      {"deepseek-llm", true},    {"qwen2", false},
        {"llama3", false}, {"llama-bpe", false}, {"deepseek-coder", false}, {"default", false},
        {nullptr, false},  {"starcoder", false}, {"bloom", true},           {"superbpe", true},
        {"afmoe", true},   {"gpt-4o", false},    {"tekken", false},         {"kimi-k2", false},
        {"falcon", false}, {"chameleon", false}, {"deepseek-v3", false},    {"seed-coder", false},
    };
    for (const Case& c : cases) {
        CAPTURE(std::string(c.pre ? c.pre : "(none)"));
        Result<Tokenizer> t = make(c.pre);
        REQUIRE_MESSAGE(t.isOk(), t.message());
        CHECK(t->encode("1234", false, false) == (c.merges ? merged : split));
        CHECK(t->decode(t->encode("1234", false, false)) == "1234");
    }
}

namespace {

// One random edit of a file's bytes: flipped bits, special values, truncation, insertion,
// deletion; most land in the metadata, where the vocabulary is.
void mutate(std::vector<uint8_t>& b, std::mt19937_64& rng) {
    if (b.empty()) return;
    auto pos = [&]() { return size_t(rng() % b.size()); };
    static constexpr uint32_t k4[] = {0, ~0u, 0x7fffffffu, 0x80000000u, 1, 6, 9, 255, 0x10000};
    switch (rng() % 7) {
        case 0:
            b[pos()] ^= uint8_t(1u << (rng() % 8));
            break;
        case 1: {
            size_t p = pos();
            uint32_t v = k4[rng() % std::size(k4)];
            std::memcpy(b.data() + p, &v, std::min<size_t>(4, b.size() - p));
            break;
        }
        case 2:
            b.resize(pos());
            break;
        case 3: {
            size_t p = pos();
            std::vector<uint8_t> ins(1 + rng() % 8);
            for (uint8_t& c : ins) c = uint8_t(rng());
            b.insert(b.begin() + long(p), ins.begin(), ins.end());
            break;
        }
        case 4: {
            size_t p = pos();
            b.erase(b.begin() + long(p), b.begin() + long(std::min(b.size(), p + 1 + rng() % 8)));
            break;
        }
        default:
            b[pos()] = uint8_t(rng());
            break;
    }
}

// Everything a user of a loaded tokenizer does, on inputs that include special-token text,
// invalid UTF-8 and ids outside the vocabulary; every id produced must be valid.
void exercise(const Tokenizer& t, std::mt19937_64& rng) {
    const std::string texts[] = {"", "ab c", " a<|im_start|>b</s>\n\n", "\xf0\x9f\xa6\x99\xc3",
                                 "<|endoftext|>  x'll 123"};
    for (const std::string& text : texts) {
        for (bool special : {false, true}) {
            std::vector<int32_t> ids = t.encode(text, special, special);
            for (int32_t id : ids) REQUIRE(t.isValid(id));
            std::string back = t.decode(ids, special);
            TokenStreamDecoder d(t, special);
            std::string streamed;
            for (int32_t id : ids) streamed += d.push(id);
            streamed += d.finish();
            CHECK(streamed == back);
        }
    }
    std::vector<int32_t> random_ids(16);
    for (int32_t& id : random_ids) id = int32_t(rng() % uint64_t(t.vocabSize() + 8)) - 4;
    (void)t.decode(random_ids, true);
    for (int32_t id : random_ids) {
        (void)t.isEog(id);
        (void)t.tokenText(id);
        (void)t.piece(id, true);
    }
}

}  // namespace

TEST_CASE("tokenizer: mutated vocabulary files never crash the loader") {
    GgufWriter stories_vocab;
    {
        Result<GgufFile> f = ggufOpen(storiesDir() + "/stories260K.gguf");
        REQUIRE(f.isOk());
        for (const GgufKv& kv : f->kvs())
            if (kv.key.rfind("tokenizer.", 0) == 0) stories_vocab.setValue(kv.key, kv.value);
    }
    std::vector<std::vector<uint8_t>> bases;
    for (const GgufWriter* w : {&stories_vocab}) bases.push_back(*w->writeToMemory());
    bases.push_back(*spmWriter(-2.0f).writeToMemory());
    bases.push_back(*bpeWriter(kMerges).writeToMemory());

    std::mt19937_64 rng(20240611);
    int parsed = 0, loaded = 0, refused = 0;
    for (const std::vector<uint8_t>& base : bases) {
        for (int iter = 0; iter < 1500; ++iter) {
            std::vector<uint8_t> bytes = base;
            for (int k = rng() % 4 ? 1 : 2; k > 0; --k) mutate(bytes, rng);
            Result<GgufFile> f = ggufParse(std::move(bytes), "mut.gguf");
            if (!f) continue;
            ++parsed;
            Result<Tokenizer> t = Tokenizer::fromGguf(*f);
            if (!t) {
                ++refused;
                CHECK(t.message().rfind("mut.gguf: ", 0) == 0);
                continue;
            }
            ++loaded;
            exercise(*t, rng);
        }
    }
    MESSAGE("mutants: " << parsed << " parsed as GGUF, " << loaded << " loaded, " << refused
                        << " refused by the tokenizer loader");
    CHECK(loaded > 100);
    CHECK(refused > 100);
}

TEST_CASE("tokenizer: random vocabularies never crash the loader") {
    std::mt19937_64 rng(77);
    const std::string pieces[] = {
        "a",      "b",      " ",    kSp,    kG, "<s>", "</s>", "<|im_start|>",
        "<0x41>", "<0xZZ>", "\xc3", "\xa9", "", "ab"};
    int loaded = 0;
    std::map<std::string, int> loaded_by_model;
    for (int iter = 0; iter < 300; ++iter) {
        const char* kModels[] = {"llama", "gpt2", "bert", "t5"};
        const std::string model = kModels[rng() % 4];
        const bool bpe = model == "gpt2";
        std::vector<std::string> tokens;
        std::vector<int32_t> types;
        if (rng() % 2) {  // with every byte: loads more often
            for (int b = 0; b < 256; ++b) {
                tokens.push_back(bpe ? byteLevel(uint8_t(b)) : strFormat("<0x%02X>", b));
                types.push_back(bpe ? 1 : 6);
            }
        }
        for (size_t i = 1 + rng() % 40; i > 0; --i) {
            std::string t = pieces[rng() % std::size(pieces)] + pieces[rng() % std::size(pieces)];
            tokens.push_back(t + (rng() % 3 ? std::to_string(tokens.size()) : ""));
            types.push_back(rng() % 3 ? 1 : int32_t(rng() % 8));
        }
        const size_t n = tokens.size();
        std::vector<float> scores(n);
        for (float& score : scores) score = rng() % 50 ? float(int(rng() % 200) - 100) : INFINITY;
        std::vector<std::string> merges;
        for (size_t i = rng() % 10; i > 0; --i)
            merges.push_back(tokens[rng() % n] + (rng() % 9 ? " " : "") + tokens[rng() % n]);
        GgufWriter w;
        w.setString("tokenizer.ggml.model", model);
        w.setStringArray("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
        w.setArray<int32_t>("tokenizer.ggml.token_type", types);
        w.setArray<float>("tokenizer.ggml.scores", scores);
        if (bpe) w.setStringArray("tokenizer.ggml.merges", std::span<const std::string>(merges));
        if (model == "t5" && rng() % 2) {  // a random character map, its size field often right
            std::vector<uint8_t> map(4 + 4 * (rng() % 64) + rng() % 16);
            for (uint8_t& b : map) b = uint8_t(rng());
            const size_t units = rng() % 64;
            for (int k = 0; k < 4; ++k) map[size_t(k)] = uint8_t(units * 4 >> (8 * k));
            w.setArray<uint8_t>("tokenizer.ggml.precompiled_charsmap", map);
        }
        for (const char* key : {"bos", "eos", "unknown", "eot", "seperator"})
            if (rng() % 2)
                w.setI32(std::string("tokenizer.ggml.") + key + "_token_id",
                         int32_t(rng() % (n + 2)) - 1);
        Result<Tokenizer> t = parseVocab(w, "rnd.gguf");
        if (!t) {
            CHECK(t.message().rfind("rnd.gguf: ", 0) == 0);
            continue;
        }
        ++loaded;
        ++loaded_by_model[model];
        exercise(*t, rng);
    }
    for (const char* model : {"llama", "gpt2", "bert", "t5"}) {
        MESSAGE(std::string(model)
                << ": " << loaded_by_model[model] << " random vocabularies loaded");
        CHECK(loaded_by_model[model] > 3);
    }
    CHECK(loaded > 20);
}

}  // namespace blue
