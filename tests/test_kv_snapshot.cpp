// KV snapshot files (host/memory/kv_snapshot.h), without a device: a snapshot survives encode and
// decode; every truncation and every flipped byte is refused with a message, never a crash; a
// wrong version, another model (another GGUF header or other weights) and another KV layout are
// refused naming what differs. The GPU round trips are in test_cli.cpp and test_capi.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "host/memory/kv_snapshot.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

KvSnapshot sample(uint32_t tokens) {
    KvSnapshot s;
    s.layout.model_hash = 0x0123456789abcdefull;
    s.layout.type = DType::F16;
    s.layout.caches = 4;
    s.layout.row_elems = 6;
    s.layout.ctx = 32;
    for (uint32_t i = 0; i < tokens; ++i) s.tokens.push_back(7 + 3 * i);
    for (uint32_t c = 0; c < s.layout.caches; ++c) {
        std::vector<uint8_t> rows(tokens * s.layout.rowBytes());
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = uint8_t(c * 31 + i * 7);
        s.caches.push_back(rows);
    }
    return s;
}

std::string refusal(std::span<const uint8_t> bytes) {
    auto r = kvSnapshotDecode(bytes, "x.kv");
    REQUIRE_FALSE(r);
    return r.message();
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

TEST_CASE(
    "kv snapshot: encode and decode give the snapshot back, and it passes its own layout's check") {
    KvSnapshot s = sample(5);
    std::vector<uint8_t> bytes = kvSnapshotEncode(s);
    CHECK(bytes.size() == kKvSnapshotHeaderBytes + 5 * 4 + 4 * 5 * 12);
    auto d = kvSnapshotDecode(bytes, "x.kv");
    REQUIRE_MESSAGE(d, d.message());
    CHECK(d->tokens == s.tokens);
    CHECK(d->caches == s.caches);
    CHECK(d->layout.model_hash == s.layout.model_hash);
    CHECK(d->layout.ctx == 32);
    CHECK(kvSnapshotCheck(d.value(), s.layout, 100, "x.kv").isOk());
}

TEST_CASE("kv snapshot: every truncation and every flipped byte is refused with a message") {
    const std::vector<uint8_t> good = kvSnapshotEncode(sample(3));
    for (size_t n = 0; n < good.size(); ++n) {
        CAPTURE(n);
        std::string m = refusal(std::span<const uint8_t>(good.data(), n));
        CHECK((contains(m, "x.kv: truncated") || contains(m, "bad magic")));
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    CHECK(contains(refusal(longer), "x.kv: 1 unexpected bytes after the snapshot's end"));
    for (size_t i = 0; i < good.size(); ++i) {
        for (uint8_t bit : {uint8_t(1), uint8_t(0x80)}) {
            CAPTURE(i);
            std::vector<uint8_t> bad = good;
            bad[i] ^= bit;
            std::string m = refusal(bad);
            if (i < 8) {
                CHECK(contains(m, "bad magic"));
            } else if (i < 12) {
                CHECK(contains(m, "snapshot format version"));
            } else if (i < kKvSnapshotHeaderBytes) {
                CHECK(contains(m, "x.kv: byte 60: header checksum mismatch"));
            } else {
                CHECK(contains(m, "x.kv: byte 64: payload checksum mismatch"));
            }
        }
    }
    std::vector<uint8_t> v2 = good;
    v2[8] = 2;
    CHECK(refusal(v2) == "x.kv: snapshot format version 2; this build reads version 1");
}

TEST_CASE(
    "kv snapshot: another model, KV layout, cache type or a short context are refused naming the "
    "difference") {
    const KvSnapshot s = sample(3);
    KvLayout here = s.layout;
    auto refused = [&](const KvLayout& l, uint32_t vocab, const std::string& part) {
        Status st = kvSnapshotCheck(s, l, vocab, "x.kv");
        REQUIRE_FALSE(st.isOk());
        CHECK_MESSAGE(contains(st.message(), part), st.message());
    };
    KvLayout other = here;
    other.model_hash ^= 1;
    refused(other, 100,
            "x.kv: saved with another model (model hash 0123456789abcdef; this model's is "
            "0123456789abcdee)");
    other = here;
    other.row_elems = 8;
    refused(other, 100,
            "KV layout differs: the snapshot has 4 caches of 6-element rows, this program 4 of 8");
    other = here;
    other.type = DType::F32;
    refused(other, 100, "KV cache type differs: the snapshot holds F16 rows, this program F32");
    other = here;
    other.ctx = 3;
    refused(other, 100, "the snapshot holds 3 tokens; this context holds 3");
    refused(here, 11, "token 13 at position 2 is outside the vocabulary (11)");
    KvSnapshot empty = sample(0);
    CHECK(kvSnapshotCheck(empty, here, 100, "x.kv").message() ==
          "x.kv: the snapshot holds no tokens");
}

TEST_CASE("kv snapshot: the model hash covers the GGUF header and the weights' bytes") {
    const std::string path = sharedDir() + "/models/stories260K/stories260K.gguf";
    auto g = ggufOpen(path);
    REQUIRE_MESSAGE(g, g.message());
    const uint64_t h = kvModelHash(g.value());
    std::span<const uint8_t> all = g->bytes();
    const GgufTensor& last = g->tensors().back();
    auto hashWith = [&](uint64_t at) {
        std::vector<uint8_t> copy(all.begin(), all.end());
        copy[at] ^= 1;
        auto changed = ggufParse(std::move(copy), "changed");
        REQUIRE_MESSAGE(changed, changed.message());
        return kvModelHash(changed.value());
    };
    CHECK(hashWith(last.offset) != h);  // a weight's first bytes
    // A byte of the header: the first letter of a tensor's name.
    const std::string name(last.name);
    auto at = std::search(all.begin(), all.begin() + g->dataOffset(), name.begin(), name.end());
    REQUIRE(at != all.begin() + g->dataOffset());
    CHECK(hashWith(uint64_t(at - all.begin())) != h);
    auto again = ggufOpen(path);
    REQUIRE(again);
    CHECK(kvModelHash(again.value()) == h);
}

}  // namespace
}  // namespace blue::test
