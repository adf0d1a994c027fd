// Tests of the GGUF reader and writer: the real stories260K model (cross-checked against its
// llama2.c checkpoint), the vocabulary-only files, writer round trips, hand-made malformed files
// with their expected messages, and a seeded mutation test.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "tests/test_paths.h"

namespace blue {
namespace {

std::string storiesDir() {
    return test::sharedDir() + "/models/stories260K";
}

std::vector<uint8_t> readFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot read " << path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Little-endian byte builder for hand-made files.
struct Bytes {
    std::vector<uint8_t> b;
    Bytes& raw(const void* p, size_t n) {
        const auto* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
        return *this;
    }
    Bytes& u32(uint32_t v) { return raw(&v, 4); }
    Bytes& u64(uint64_t v) { return raw(&v, 8); }
    Bytes& str(std::string_view s) { return u64(s.size()).raw(s.data(), s.size()); }
    Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
    }
    Bytes& padTo(size_t align) {
        while (b.size() % align) b.push_back(0);
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
};

// A file with one tensor "t": optional general.alignment (u32), the info, padding, `data` bytes.
std::vector<uint8_t> oneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t rel_offset,
                               size_t data_bytes, std::optional<uint32_t> alignment = {}) {
    Bytes f;
    f.header(3, 1, alignment ? 1 : 0);
    if (alignment) f.str("general.alignment").u32(uint32_t(GgufType::U32)).u32(*alignment);
    f.str("t").u32(uint32_t(dims.size()));
    for (uint64_t d : dims) f.u64(d);
    f.u32(type).u64(rel_offset);
    f.padTo(alignment && *alignment ? *alignment : 32).zeros(data_bytes);
    return f.b;
}

void expectError(std::vector<uint8_t> bytes, std::initializer_list<const char*> parts) {
    Result<GgufFile> r = ggufParse(std::move(bytes), "m.gguf");
    REQUIRE_FALSE(r.isOk());
    INFO("message: " << r.message());
    CHECK(r.message().rfind("m.gguf: ", 0) == 0);
    for (const char* p : parts) CHECK(r.message().find(p) != std::string::npos);
}

template <class T>
std::span<const uint8_t> asBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

TEST_CASE("gguf: stories260K header and metadata") {
    Result<GgufFile> r = ggufOpen(storiesDir() + "/stories260K.gguf");
    REQUIRE_MESSAGE(r.isOk(), r.message());
    const GgufFile& f = *r;
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.bytes().size() == 1185376);
    CHECK(f.dataOffset() == 0x3760);  // tensor infos end at 0x3748, padded to 32
    CHECK(f.kvs().size() == 19);
    CHECK(f.tensors().size() == 48);
    CHECK(*f.getString("tokenizer.ggml.model") == "llama");
    CHECK(*f.getString("general.architecture") == "llama");
    CHECK(*f.getU32("tokenizer.ggml.bos_token_id") == 1);
    CHECK(*f.getU32("tokenizer.ggml.eos_token_id") == 2);
    CHECK(*f.getI64("tokenizer.ggml.padding_token_id") == 4294967295LL);
    CHECK(*f.getU32("llama.embedding_length") == 64);
    CHECK(*f.getF32("llama.context_length") == 2048.0f);  // integers coerce to floats
    CHECK(*f.getF32("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5));

    auto tokens = f.getStringArray("tokenizer.ggml.tokens");
    REQUIRE(tokens.isOk());
    REQUIRE(tokens->size() == 512);
    CHECK((*tokens)[0] == "<unk>");
    CHECK((*tokens)[1] == "<s>");
    CHECK((*tokens)[2] == "</s>");
    CHECK((*tokens)[3] == "<0x00>");
    CHECK(f.getF32Array("tokenizer.ggml.scores")->size() == 512);
    auto types = f.getI32Array("tokenizer.ggml.token_type");
    REQUIRE(types.isOk());
    CHECK(std::vector<int32_t>(types->begin(), types->begin() + 4) ==
          std::vector<int32_t>{2, 3, 3, 6});

    Result<uint32_t> bad = f.getU32("general.name");
    REQUIRE_FALSE(bad.isOk());
    CHECK(bad.message().find("key 'general.name': expected an integer, found string") !=
          std::string::npos);
    CHECK(f.getBool("llama.block_count").message().find("expected bool, found u32") !=
          std::string::npos);
    CHECK(f.getU32("nope").message().find("missing key 'nope'") != std::string::npos);
    CHECK(*f.getU32Or("nope", 7) == 7);
    CHECK(f.getU32Or("general.name", 7).message().find("found string") != std::string::npos);
    CHECK(f.getStringArray("tokenizer.ggml.scores")
              .message()
              .find("expected array<string>, found array<f32>") != std::string::npos);
}

TEST_CASE("gguf: stories260K tensors are bit-identical to the llama2.c checkpoint") {
    Result<GgufFile> r = ggufOpen(storiesDir() + "/stories260K.gguf");
    REQUIRE_MESSAGE(r.isOk(), r.message());
    const GgufFile& f = *r;
    std::vector<uint8_t> bin = readFile(storiesDir() + "/stories260K.bin");
    int32_t hdr[7];
    std::memcpy(hdr, bin.data(), sizeof(hdr));
    const int64_t dim = hdr[0], hidden = hdr[1], layers = hdr[2], heads = hdr[3], kv_heads = hdr[4];
    const int64_t vocab = std::abs(hdr[5]), kv_dim = dim * kv_heads / heads;
    REQUIRE(dim == 64);
    REQUIRE(hidden == 172);
    REQUIRE(layers == 5);
    REQUIRE(vocab == 512);

    // llama2.c layout: [name, floats per layer (or in all), per layer?] in file order.
    struct Part {
        const char* gguf;  // "%d" stands for the layer
        int64_t floats;
        bool per_layer;
        std::vector<int64_t> ne;
    };
    const std::vector<Part> parts = {
        {"token_embd.weight", vocab * dim, false, {dim, vocab}},
        {"blk.%d.attn_norm.weight", dim, true, {dim}},
        {"blk.%d.attn_q.weight", dim * dim, true, {dim, dim}},
        {"blk.%d.attn_k.weight", dim * kv_dim, true, {dim, kv_dim}},
        {"blk.%d.attn_v.weight", dim * kv_dim, true, {dim, kv_dim}},
        {"blk.%d.attn_output.weight", dim * dim, true, {dim, dim}},
        {"blk.%d.ffn_norm.weight", dim, true, {dim}},
        {"blk.%d.ffn_gate.weight", hidden * dim, true, {dim, hidden}},
        {"blk.%d.ffn_down.weight", dim * hidden, true, {hidden, dim}},
        {"blk.%d.ffn_up.weight", hidden * dim, true, {dim, hidden}},
        {"output_norm.weight", dim, false, {dim}},
    };
    size_t pos = sizeof(hdr);
    size_t checked = 0;
    for (const Part& p : parts) {
        for (int64_t l = 0; l < (p.per_layer ? layers : 1); ++l) {
            std::string name = strFormat(p.gguf, int(l));
            const GgufTensor* t = f.findTensor(name);
            REQUIRE_MESSAGE(t != nullptr, name);
            CHECK(t->type == DType::F32);
            CHECK(std::vector<int64_t>(t->ne.begin(), t->ne.begin() + t->n_dims) == p.ne);
            size_t n = size_t(p.floats) * 4;
            REQUIRE(pos + n <= bin.size());
            auto data = f.tensorData(*t);
            REQUIRE(data.isOk());
            REQUIRE(data->size() == n);
            CHECK_MESSAGE(std::memcmp(data->data(), bin.data() + pos, n) == 0, name);
            pos += n;
            ++checked;
        }
    }
    CHECK(checked == 47);
    // The classifier is shared in the checkpoint (vocab > 0); the GGUF holds a separate copy.
    REQUIRE(hdr[5] > 0);
    auto out = f.tensorData(*f.findTensor("output.weight"));
    REQUIRE(out.isOk());
    CHECK(std::memcmp(out->data(), bin.data() + sizeof(hdr), out->size()) == 0);
}

TEST_CASE("gguf: vocabulary-only files parse with no tensors") {
    struct Vocab {
        const char* file;
        const char* model;
        uint64_t n_tokens;
    };
    for (const Vocab& v : {Vocab{"llama-spm", "llama", 32000}, Vocab{"phi-3", "llama", 32064},
                           Vocab{"gpt-2", "gpt2", 50257}, Vocab{"deepseek-coder", "gpt2", 32256}}) {
        CAPTURE(v.file);
        Result<GgufFile> r = ggufOpen(test::sharedDir() + "/vocab/ggml-vocab-" + v.file + ".gguf");
        REQUIRE_MESSAGE(r.isOk(), r.message());
        CHECK(r->tensors().empty());
        CHECK(*r->getString("tokenizer.ggml.model") == v.model);
        auto tokens = r->getStringArray("tokenizer.ggml.tokens");
        REQUIRE(tokens.isOk());
        CHECK(tokens->size() == v.n_tokens);
        if (std::string(v.model) == "gpt2")
            CHECK(r->getStringArray("tokenizer.ggml.merges")->size() > 30000);
    }
}

TEST_CASE("gguf: open reports missing files and directories") {
    Result<GgufFile> r = ggufOpen("/nonexistent/x.gguf");
    REQUIRE_FALSE(r.isOk());
    CHECK(r.message() == "/nonexistent/x.gguf: cannot open: No such file or directory");
    Result<GgufFile> d = ggufOpen(test::sharedDir());
    REQUIRE_FALSE(d.isOk());
    CHECK(d.message().find("not a regular file") != std::string::npos);
}

namespace {

struct RoundTrip {
    std::vector<float> f32 = {1.5f, -2.0f, 0.0f, 3.25f, 1e-7f, -0.0f};  // [3, 2]
    std::vector<uint8_t> f16 = std::vector<uint8_t>(64 * 2);            // [64]
    std::vector<uint8_t> q4_0 = std::vector<uint8_t>(2 * 2 * 18);       // [64, 2]
    std::vector<uint8_t> i8 = {1, 2, 3, 4, 5};                          // [5]: 5 bytes, padded
    std::vector<uint8_t> iq2 = std::vector<uint8_t>(66);                // [256], unsupported

    RoundTrip() {
        for (size_t i = 0; i < f16.size(); ++i) f16[i] = uint8_t(i * 7);
        for (size_t i = 0; i < q4_0.size(); ++i) q4_0[i] = uint8_t(255 - i);
        for (size_t i = 0; i < iq2.size(); ++i) iq2[i] = uint8_t(i ^ 0x5a);
    }

    // Q4_K [256, 5] produced by the callback: row r is filled with byte r + 1.
    static Status fillQ4K(uint64_t first, uint64_t n, std::span<uint8_t> out) {
        if (out.size() != n * 144) return BLUE_ERROR("wrong chunk size");
        for (uint64_t r = 0; r < n; ++r) std::memset(out.data() + r * 144, int(first + r + 1), 144);
        return {};
    }

    GgufWriter writer(std::optional<uint32_t> alignment) const {
        GgufWriter w;
        if (alignment) w.setAlignment(*alignment);
        w.setU8("t.u8", 200);
        w.setI8("t.i8", -100);
        w.setU16("t.u16", 60000);
        w.setI16("t.i16", -30000);
        w.setU32("t.u32", 4000000000u);
        w.setI32("t.i32", -2000000000);
        w.setU64("t.u64", 18000000000000000000ull);
        w.setI64("t.i64", -9000000000000000000ll);
        w.setF32("t.f32", 0.1f);
        w.setF64("t.f64", 1e300);
        w.setBool("t.bool", true);
        w.setString("t.string", "h\xc3\xa9llo");
        w.setString("t.empty", "");
        w.setArray<uint8_t>("t.a_u8", std::vector<uint8_t>{1, 2, 255});
        w.setArray<int8_t>("t.a_i8", std::vector<int8_t>{-1, 2});
        w.setArray<uint16_t>("t.a_u16", std::vector<uint16_t>{65535});
        w.setArray<int16_t>("t.a_i16", std::vector<int16_t>{-32768, 7});
        w.setArray<uint32_t>("t.a_u32", std::vector<uint32_t>{5, 6, 7});
        w.setArray<int32_t>("t.a_i32", std::vector<int32_t>{-5, 2147483647});
        w.setArray<uint64_t>("t.a_u64", std::vector<uint64_t>{1ull << 40});
        w.setArray<int64_t>("t.a_i64", std::vector<int64_t>{-(1ll << 40)});
        w.setArray<float>("t.a_f32", std::vector<float>{0.5f, -1.5f});
        w.setArray<double>("t.a_f64", std::vector<double>{0.25});
        w.setArray<float>("t.a_empty", std::vector<float>{});
        w.setBoolArray("t.a_bool", {true, false, true});
        w.setStringArray("t.a_string", std::vector<std::string>{"a", "", "ccc"});
        w.setU32("t.replaced", 1);
        w.setU32("t.replaced", 2);  // replaces in place, keeps the position
        REQUIRE(w.addTensor("f32", DType::F32, {3, 2}, asBytes(f32)).isOk());
        REQUIRE(w.addTensor("f16", DType::F16, {64}, f16).isOk());
        REQUIRE(w.addTensor("q4_0", DType::Q4_0, {64, 2}, q4_0).isOk());
        REQUIRE(w.addTensor("i8", DType::I8, {5}, i8).isOk());
        REQUIRE(w.addTensor("iq2", DType::IQ2_XXS, {256}, iq2).isOk());
        REQUIRE(w.addTensor("q4_k.fill", DType::Q4_K, {256, 5}, fillQ4K).isOk());
        return w;
    }
};

void checkRoundTripValues(const GgufFile& f, uint32_t alignment) {
    CHECK(f.alignment() == alignment);
    CHECK(*f.getU32("t.u8") == 200);
    CHECK(*f.getI64("t.i8") == -100);
    CHECK(*f.getU32("t.u16") == 60000);
    CHECK(*f.getI64("t.i16") == -30000);
    CHECK(*f.getU32("t.u32") == 4000000000u);
    CHECK(*f.getI64("t.i32") == -2000000000);
    CHECK(*f.getU64("t.u64") == 18000000000000000000ull);
    CHECK(*f.getI64("t.i64") == -9000000000000000000ll);
    CHECK(*f.getF32("t.f32") == 0.1f);
    CHECK(*f.find("t.f64")->toF64() == 1e300);
    CHECK(f.getF32("t.f64").message().find("does not fit f32") != std::string::npos);
    CHECK(*f.getBool("t.bool") == true);
    CHECK(*f.getString("t.string") == "h\xc3\xa9llo");
    CHECK(*f.getString("t.empty") == "");
    CHECK(f.getU32("t.i8").message().find("value -100 does not fit u32") != std::string::npos);
    CHECK(f.getI64("t.u64").message().find("does not fit i64") != std::string::npos);
    CHECK(f.find("t.a_u8")->toDisplay() == "[1, 2, 255]");
    CHECK(f.find("t.a_i8")->toDisplay() == "[-1, 2]");
    CHECK(*f.getI32Array("t.a_u16") == std::vector<int32_t>{65535});
    CHECK(*f.getI32Array("t.a_i16") == std::vector<int32_t>{-32768, 7});
    CHECK(*f.getI32Array("t.a_u32") == std::vector<int32_t>{5, 6, 7});
    CHECK(*f.getI32Array("t.a_i32") == std::vector<int32_t>{-5, 2147483647});
    CHECK(f.getI32Array("t.a_u64").message().find(
              "element 0 (value 1099511627776) does not fit i32") != std::string::npos);
    CHECK(f.find("t.a_i64")->toDisplay() == "[-1099511627776]");
    CHECK(*f.getF32Array("t.a_f32") == std::vector<float>{0.5f, -1.5f});
    CHECK(*f.getF32Array("t.a_f64") == std::vector<float>{0.25f});
    CHECK(f.getF32Array("t.a_empty")->empty());
    CHECK(f.find("t.a_bool")->toDisplay() == "[true, false, true]");
    CHECK(f.find("t.a_bool")->typeDisplay() == "array<bool>");
    CHECK(*f.getStringArray("t.a_string") == std::vector<std::string_view>{"a", "", "ccc"});
    CHECK(f.kvs().back().key == "t.replaced");
    CHECK(*f.getU32("t.replaced") == 2);
}

void checkRoundTripTensors(const GgufFile& f, const RoundTrip& rt, uint32_t alignment) {
    REQUIRE(f.tensors().size() == 6);
    uint64_t expect_offset = f.dataOffset();
    for (const GgufTensor& t : f.tensors()) {
        CAPTURE(t.name);
        CHECK(t.offset == expect_offset);  // tightly packed at aligned offsets, in order
        CHECK(t.offset % alignment == 0);
        expect_offset += (t.n_bytes + alignment - 1) / alignment * alignment;
    }
    CHECK(f.bytes().size() == expect_offset);  // the last tensor is padded too

    auto bytesOf = [&](const char* name) {
        const GgufTensor* t = f.findTensor(name);
        REQUIRE(t != nullptr);
        auto d = f.tensorData(*t);
        REQUIRE_MESSAGE(d.isOk(), d.message());
        return std::vector<uint8_t>(d->begin(), d->end());
    };
    std::span<const uint8_t> f32 = asBytes(rt.f32);
    CHECK(bytesOf("f32") == std::vector<uint8_t>(f32.begin(), f32.end()));
    CHECK(bytesOf("f16") == rt.f16);
    CHECK(bytesOf("q4_0") == rt.q4_0);
    CHECK(bytesOf("i8") == rt.i8);
    const GgufTensor* q4k = f.findTensor("q4_k.fill");
    CHECK(q4k->ne[0] == 256);
    CHECK(q4k->ne[1] == 5);
    std::vector<uint8_t> q4k_bytes = bytesOf("q4_k.fill");
    REQUIRE(q4k_bytes.size() == 5 * 144);
    for (size_t r = 0; r < 5; ++r) CHECK(q4k_bytes[r * 144 + 143] == r + 1);
    const GgufTensor* iq2 = f.findTensor("iq2");
    CHECK_FALSE(iq2->supported);
    Result<std::span<const uint8_t>> refused = f.tensorData(*iq2);
    REQUIRE_FALSE(refused.isOk());
    CHECK(refused.message() ==
          "mem.gguf: tensor 'iq2' (#4) has type IQ2_XXS, which BlueVM does not support");
    std::span<const uint8_t> raw = f.rawTensorData(*iq2);
    CHECK(std::vector<uint8_t>(raw.begin(), raw.end()) == rt.iq2);
}

// Rebuilds a file from what was read: every value copied as is, every tensor's bytes.
std::vector<uint8_t> rewrite(const GgufFile& f) {
    GgufWriter w;
    for (const GgufKv& kv : f.kvs()) w.setValue(kv.key, kv.value);
    for (const GgufTensor& t : f.tensors()) {
        std::vector<int64_t> dims(t.ne.begin(), t.ne.begin() + t.n_dims);
        REQUIRE(w.addTensor(t.name, t.type, dims, f.rawTensorData(t)).isOk());
    }
    auto bytes = w.writeToMemory();
    REQUIRE(bytes.isOk());
    return std::move(bytes).value();
}

}  // namespace

TEST_CASE("gguf: writer round trip with every value type, several tensor types and alignments") {
    RoundTrip rt;
    for (std::optional<uint32_t> alignment :
         {std::optional<uint32_t>(), std::optional<uint32_t>(64), std::optional<uint32_t>(1),
          std::optional<uint32_t>(4096)}) {
        CAPTURE(alignment.value_or(0));
        auto bytes = rt.writer(alignment).writeToMemory();
        REQUIRE(bytes.isOk());
        std::vector<uint8_t> original = *bytes;
        CHECK(original[4] == 3);
        Result<GgufFile> f = ggufParse(std::move(bytes).value(), "mem.gguf");
        REQUIRE_MESSAGE(f.isOk(), f.message());
        checkRoundTripValues(*f, alignment.value_or(32));
        checkRoundTripTensors(*f, rt, alignment.value_or(32));
        CHECK(rewrite(*f) == original);
        std::vector<uint8_t> v2 = original;  // v2 differs from v3 only in the version field
        v2[4] = 2;
        Result<GgufFile> f2 = ggufParse(std::move(v2), "mem.gguf");
        REQUIRE_MESSAGE(f2.isOk(), f2.message());
        CHECK(f2->version() == 2);
        checkRoundTripValues(*f2, alignment.value_or(32));
        checkRoundTripTensors(*f2, rt, alignment.value_or(32));
    }
}

TEST_CASE("gguf: writer output equals the file llama.cpp wrote (stories260K)") {
    std::vector<uint8_t> original = readFile(storiesDir() + "/stories260K.gguf");
    Result<GgufFile> f = ggufParse(original, "stories260K.gguf");
    REQUIRE_MESSAGE(f.isOk(), f.message());
    CHECK(rewrite(*f) == original);
}

TEST_CASE("gguf: write to a file, then map it") {
    RoundTrip rt;
    std::string path = (std::filesystem::temp_directory_path() /
                        ("blue_test_gguf_" + std::to_string(::getpid()) + ".gguf"))
                           .string();
    REQUIRE(rt.writer(std::nullopt).write(path).isOk());
    {
        Result<GgufFile> f = ggufOpen(path);
        REQUIRE_MESSAGE(f.isOk(), f.message());
        GgufFile moved = std::move(f).value();  // views stay valid across moves
        CHECK(*moved.getString("t.string") == "h\xc3\xa9llo");
        CHECK(moved.findTensor("q4_k.fill")->n_bytes == 5 * 144);
    }
    std::filesystem::remove(path);

    GgufWriter failing;
    REQUIRE(failing
                .addTensor("x", DType::F32, {4},
                           [](uint64_t, uint64_t, std::span<uint8_t>) {
                               return BLUE_ERROR("generator broke");
                           })
                .isOk());
    Status s = failing.write(path);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message() == path + ": tensor 'x': fill: generator broke");
    CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("gguf: writer refuses bad tensors") {
    GgufWriter w;
    std::vector<uint8_t> d(16);
    CHECK(w.addTensor("a", DType::F32, {4}, d).isOk());
    CHECK(w.addTensor("a", DType::F32, {4}, d).message() == "tensor 'a': added twice");
    CHECK(w.addTensor("b", DType::F32, {4, 0}, d).message().find("dims must be positive") !=
          std::string::npos);
    CHECK(w.addTensor("c", DType::F32, {}, d).message().find("0 dims") != std::string::npos);
    CHECK(w.addTensor("d", DType::Q4_0, {30}, d)
              .message()
              .find("not a whole number of Q4_0 blocks") != std::string::npos);
    CHECK(w.addTensor("e", DType::F32, {5}, d)
              .message()
              .find("16 data bytes given, its shape and type need 20") != std::string::npos);
    CHECK(w.addTensor(std::string(64, 'n'), DType::F32, {4}, d).message().find("name must be") !=
          std::string::npos);
}

TEST_CASE("gguf: malformed headers and metadata fail with precise messages") {
    SUBCASE("bad magic") {
        expectError(Bytes().raw("GGUX", 4).u32(3).u64(0).u64(0).b, {"bad magic 'GGUX'"});
    }
    SUBCASE("version 1") {
        expectError(Bytes().header(1, 0, 0).b, {"GGUF version 1 is not supported"});
    }
    SUBCASE("version 99") {
        expectError(Bytes().header(99, 0, 0).b, {"unsupported GGUF version 99"});
    }
    SUBCASE("big-endian version") {
        expectError(Bytes().header(0x03000000, 0, 0).b, {"big-endian"});
    }
    SUBCASE("truncated header") {
        expectError(Bytes().raw("GG", 2).b, {"truncated header: file is 2 bytes"});
        std::vector<uint8_t> h = Bytes().header(3, 0, 0).b;
        h.resize(20);
        expectError(h, {"truncated header: KV count at 0x10 needs 8 bytes, only 4 remain"});
    }
    SUBCASE("string length past end of file") {
        expectError(
            Bytes().header(3, 0, 1).u64(1000).raw("abcde", 5).b,
            {"key of KV #0 at 0x18: string length 1000 runs past end of file (5 bytes left)"});
        expectError(
            Bytes().header(3, 0, 1).str("k").u32(uint32_t(GgufType::String)).u64(~0ull).b,
            {"key 'k' (KV #0 at 0x18): string value at 0x25: string length 18446744073709551615"});
    }
    SUBCASE("array count huge") {
        expectError(Bytes()
                        .header(3, 0, 1)
                        .str("k")
                        .u32(9)
                        .u32(uint32_t(GgufType::U32))
                        .u64(1ull << 60)
                        .u32(1)
                        .b,
                    {"key 'k'", "count 1152921504606846976 of u32 elements",
                     "cannot fit in the 4 bytes left"});
        expectError(
            Bytes()
                .header(3, 0, 1)
                .str("k")
                .u32(9)
                .u32(uint32_t(GgufType::String))
                .u64(3)
                .str("a")
                .b,
            {"key 'k'",
             "count 3 of string elements (at least 8 bytes each) cannot fit in the 9 bytes left"});
        expectError(Bytes()
                        .header(3, 0, 1)
                        .str("k")
                        .u32(9)
                        .u32(uint32_t(GgufType::String))
                        .u64(2)
                        .str("abcdefgh")
                        .b,
                    {"key 'k'", "element 1: array string at 0x41 needs 8 bytes, only 0 remain"});
    }
    SUBCASE("nested arrays: parsed, but not too deep") {
        Bytes ok;
        ok.header(3, 0, 1).str("k").u32(9).u32(9).u64(2);
        ok.u32(uint32_t(GgufType::I16)).u64(2).zeros(4);
        ok.u32(uint32_t(GgufType::String)).u64(1).str("x");
        Result<GgufFile> f = ggufParse(ok.b, "m.gguf");
        REQUIRE_MESSAGE(f.isOk(), f.message());
        CHECK(f->find("k")->typeDisplay() == "array<array>");
        CHECK(f->find("k")->toDisplay() == "[[0, 0], [\"x\"]]");
        CHECK(f->getStringArray("k").message().find("expected array<string>, found array<array>") !=
              std::string::npos);
        Bytes deep;
        deep.header(3, 0, 1).str("k").u32(9);
        for (int i = 0; i < 20; ++i) deep.u32(9).u64(1);
        expectError(deep.b, {"key 'k'", "nested deeper than 8 levels"});
    }
    SUBCASE("unknown value types") {
        expectError(Bytes().header(3, 0, 1).str("k").u32(13).u32(0).b,
                    {"key 'k'", "unknown value type 13"});
        expectError(Bytes().header(3, 0, 1).str("k").u32(9).u32(77).u64(0).b,
                    {"unknown element type 77"});
    }
    SUBCASE("duplicate key") {
        expectError(
            Bytes().header(3, 0, 2).str("k").u32(0).raw("a", 1).str("k").u32(0).raw("b", 1).b,
            {"duplicate key 'k' (KV #1 at 0x26): first defined by KV #0"});
    }
    SUBCASE("counts larger than the file could hold") {
        expectError(Bytes().header(3, 0, 1000).zeros(100).b, {"KV count 1000 at 0x10 cannot fit"});
        expectError(Bytes().header(3, ~0ull, 0).zeros(100).b,
                    {"tensor count 18446744073709551615 at 0x8 cannot fit"});
    }
}

TEST_CASE("gguf: malformed tensor infos and data layouts fail with precise messages") {
    SUBCASE("n_dims 5") {
        expectError(oneTensor({1, 1, 1, 1, 1}, 0, 0, 4),
                    {"tensor 't' (#0): n_dims 5 at 0x21 (expected 1..4)"});
    }
    SUBCASE("n_dims 0") {
        expectError(oneTensor({}, 0, 0, 4), {"n_dims 0"});
    }
    SUBCASE("zero dim") {
        expectError(oneTensor({4, 0}, 0, 0, 16), {"tensor 't' (#0): dimension 1 at 0x2d is 0"});
    }
    SUBCASE("dim above INT64_MAX") {
        expectError(oneTensor({1ull << 63}, 0, 0, 4), {"dimension 0", "is 9223372036854775808"});
    }
    SUBCASE("dim product overflow") {
        expectError(oneTensor({1ull << 62, 4}, 0, 0, 4),
                    {"tensor 't' (#0): element count of dims ne[0..1] overflows int64"});
    }
    SUBCASE("byte size overflow") {
        expectError(oneTensor({1ull << 31, 1ull << 31}, uint32_t(DType::F64), 0, 4),
                    {"byte size of shape"});
    }
    SUBCASE("unknown type id") {
        expectError(oneTensor({4}, 99, 0, 16), {"tensor 't' (#0): unknown type id 99 at 0x2d"});
    }
    SUBCASE("row not a whole number of blocks") {
        expectError(oneTensor({30}, uint32_t(DType::Q4_0), 0, 18),
                    {"row length 30 is not a whole number of Q4_0 blocks (32 elements)"});
    }
    SUBCASE("tensor data past end of file") {
        // Header and info take 0x39 bytes, so the data section starts at 0x40: 64 bytes, 8 present.
        expectError(oneTensor({16}, 0, 0, 8),
                    {"tensor 't' (#0): data [0x40, 0x80) runs past end of file (0x48)"});
        expectError(oneTensor({16}, 0, ~0ull - 31, 8),
                    {"tensor 't' (#0): data offset", "overflows"});
    }
    SUBCASE("misaligned offset") {
        expectError(oneTensor({4}, 0, 16, 64),
                    {"tensor 't' (#0): data offset 0x10 is not a multiple of the alignment (32)"});
        CHECK(ggufParse(oneTensor({4}, 0, 16, 64, 16), "m.gguf").isOk());
    }
    SUBCASE("alignment 0 or 3") {
        expectError(oneTensor({4}, 0, 0, 16, 0), {"general.alignment 0 is not a power of two"});
        expectError(oneTensor({4}, 0, 0, 16, 3), {"general.alignment 3 is not a power of two"});
        expectError(Bytes().header(3, 0, 1).str("general.alignment").u32(8).str("x").b,
                    {"general.alignment: expected an integer, found string"});
    }
    SUBCASE("duplicate tensor name") {
        Bytes f;
        f.header(3, 2, 0);
        for (int i = 0; i < 2; ++i) f.str("w").u32(1).u64(8).u32(0).u64(uint64_t(i) * 32);
        f.padTo(32).zeros(64);
        expectError(f.b, {"duplicate tensor name 'w' (#1 at 0x39; first is #0)"});
    }
    SUBCASE("empty tensor name") {
        expectError(Bytes().header(3, 1, 0).str("").u32(1).u64(4).u32(0).u64(0).zeros(32).b,
                    {"tensor #0 at 0x18: empty name"});
    }
    SUBCASE("names are printed safely") {
        expectError(Bytes().header(3, 1, 0).str("a\x01\n").u32(7).zeros(64).b,
                    {"tensor 'a\\x01\\x0a' (#0): n_dims 7"});
    }
}

TEST_CASE("gguf: tensors of unsupported types are listed, their data refused") {
    std::vector<uint8_t> file = oneTensor({256}, uint32_t(DType::IQ2_XXS), 0, 66);
    Result<GgufFile> f = ggufParse(file, "m.gguf");
    REQUIRE_MESSAGE(f.isOk(), f.message());
    const GgufTensor& t = f->tensors()[0];
    CHECK(t.type == DType::IQ2_XXS);
    CHECK(t.n_bytes == 66);
    CHECK(f->tensorData(t).message() ==
          "m.gguf: tensor 't' (#0) has type IQ2_XXS, which BlueVM does not support");
    CHECK(ggufDescribe(*f).find("IQ2_XXS!") != std::string::npos);
    // llama.cpp's ternary and MXFP4 types (ids 34, 35, 39) are read: their data is handed out.
    for (auto [type, bytes] : {std::pair{DType::TQ1_0, 54u}, {DType::TQ2_0, 66u}, {DType::MXFP4, 136u}}) {
        Result<GgufFile> g = ggufParse(oneTensor({256}, uint32_t(type), 0, bytes), "m.gguf");
        REQUIRE_MESSAGE(g.isOk(), g.message());
        CHECK(g->tensors()[0].n_bytes == bytes);
        CHECK(g->tensorData(g->tensors()[0]).isOk());
    }
}

namespace {

struct MutationStats {
    int parsed = 0, failed = 0, bad_message = 0, bad_span = 0;
};

void mutate(std::vector<uint8_t>& b, std::mt19937_64& rng, size_t hot_end) {
    auto pick = [&](size_t n) { return size_t(rng() % std::max<size_t>(n, 1)); };
    // Most mutations hit the header, metadata and tensor infos; some land anywhere.
    auto pos = [&]() { return rng() % 5 ? pick(std::min(hot_end, b.size())) : pick(b.size()); };
    static constexpr uint64_t k8[] = {0, ~0ull, 0x7fffffffffffffffull, 1ull << 63, 1ull << 32,
                                      1, 32};
    static constexpr uint32_t k4[] = {0, ~0u, 0x7fffffffu, 0x80000000u, 1, 5, 31};
    static constexpr uint8_t k1[] = {0x00, 0xff, 0x7f, 0x80};
    if (b.empty()) return;
    switch (rng() % 8) {
        case 0:
            b[pos()] ^= uint8_t(1u << (rng() % 8));
            break;
        case 1:
            b[pos()] = k1[rng() % 4];
            break;
        case 2: {
            size_t p = pos();
            uint32_t v = rng() % 2 ? k4[rng() % 7] : uint32_t(rng());
            std::memcpy(b.data() + p, &v, std::min<size_t>(4, b.size() - p));
            break;
        }
        case 3: {
            size_t p = pos();
            uint64_t v = k8[rng() % 7];
            std::memcpy(b.data() + p, &v, std::min<size_t>(8, b.size() - p));
            break;
        }
        case 4:
            b.resize(pick(b.size()));
            break;
        case 5: {
            size_t p = pos();
            std::vector<uint8_t> ins(1 + rng() % 16);
            for (uint8_t& c : ins) c = uint8_t(rng());
            b.insert(b.begin() + long(p), ins.begin(), ins.end());
            break;
        }
        case 6: {
            size_t p = pos();
            b.erase(b.begin() + long(p), b.begin() + long(std::min(b.size(), p + 1 + rng() % 16)));
            break;
        }
        default:
            b[pos()] = uint8_t(rng());
            break;
    }
}

// Parses a mutant; when it parses, every view must lie inside its bytes, and everything that reads
// values (getters, display, the model config check) must run without reading out of bounds.
void checkMutant(std::vector<uint8_t> bytes, MutationStats& st) {
    Result<GgufFile> r = ggufParse(std::move(bytes), "mut.gguf");
    if (!r) {
        st.failed++;
        if (r.message().size() <= std::string("mut.gguf: ").size() ||
            r.message().rfind("mut.gguf: ", 0) != 0) {
            st.bad_message++;
        }
        return;
    }
    st.parsed++;
    const GgufFile& f = *r;
    const uint8_t* lo = f.bytes().data();
    const uint8_t* hi = lo + f.bytes().size();
    auto inside = [&](std::span<const uint8_t> s) {
        return s.empty() || (s.data() >= lo && s.data() + s.size() <= hi);
    };
    for (const GgufTensor& t : f.tensors()) {
        std::span<const uint8_t> d = f.rawTensorData(t);
        if (!inside(d) || d.size() != t.n_bytes || t.offset < f.dataOffset() ||
            t.offset % f.alignment()) {
            st.bad_span++;
        }
    }
    for (const GgufKv& kv : f.kvs()) {
        if (!inside(kv.value.encodedPayload())) st.bad_span++;
        (void)kv.value.toDisplay();
        (void)kv.value.toStringArray();
        (void)kv.value.toI32Array();
        (void)kv.value.toF32Array();
    }
    (void)ggufDescribe(f);
}

}  // namespace

TEST_CASE("gguf: IQ4 tensors: whole blocks load; truncated, ragged or mutated ones are refused") {
    // Valid: [64, 2] IQ4_NL (2 x 2 blocks of 18 bytes) and [256] IQ4_XS (one 136-byte block).
    for (auto [type, dims, bytes] : {std::tuple{DType::IQ4_NL, std::vector<uint64_t>{64, 2}, 72},
                                     std::tuple{DType::IQ4_XS, std::vector<uint64_t>{256}, 136}}) {
        CAPTURE(dtypeName(type));
        Result<GgufFile> f = ggufParse(oneTensor(dims, uint32_t(type), 0, size_t(bytes)), "m.gguf");
        REQUIRE_MESSAGE(f.isOk(), f.message());
        CHECK(f->tensors()[0].n_bytes == uint64_t(bytes));
        CHECK(f->tensorData(f->tensors()[0]).isOk());
        // One byte short of the last block.
        expectError(oneTensor(dims, uint32_t(type), 0, size_t(bytes) - 1),
                    {"tensor 't' (#0): data [0x", "runs past end of file"});
    }
    expectError(oneTensor({100}, uint32_t(DType::IQ4_NL), 0, 18 * 4),
                {"row length 100 is not a whole number of IQ4_NL blocks (32 elements)"});
    expectError(oneTensor({64}, uint32_t(DType::IQ4_XS), 0, 136),
                {"row length 64 is not a whole number of IQ4_XS blocks (256 elements)"});

    // Mutants of a file holding both types parse or fail with a message naming the file.
    GgufWriter w;
    std::vector<uint8_t> nl(18 * 4), xs(136 * 2);
    for (size_t i = 0; i < nl.size(); ++i) nl[i] = uint8_t(i * 13);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = uint8_t(i * 7 + 1);
    REQUIRE(w.addTensor("nl", DType::IQ4_NL, {64, 2}, nl).isOk());
    REQUIRE(w.addTensor("xs", DType::IQ4_XS, {256, 2}, xs).isOk());
    std::vector<uint8_t> file = *w.writeToMemory();
    std::mt19937_64 rng(0x1a4);
    MutationStats st;
    for (int i = 0; i < 3000; ++i) {
        std::vector<uint8_t> m = file;
        mutate(m, rng, 0x80);
        checkMutant(std::move(m), st);
    }
    CHECK(st.bad_message == 0);
    CHECK(st.bad_span == 0);
    CHECK(st.parsed > 100);
    CHECK(st.failed > 300);
}

TEST_CASE("gguf: mutants parse or fail cleanly") {
    std::vector<uint8_t> stories = readFile(storiesDir() + "/stories260K.gguf");
    RoundTrip rt;
    std::vector<uint8_t> small = *rt.writer(std::optional<uint32_t>(64)).writeToMemory();
    std::mt19937_64 rng(0x5eed);
    MutationStats st;
    struct Seed {
        const std::vector<uint8_t>* bytes;
        size_t hot_end;  // end of the header, metadata and tensor infos
        int mutants;
    };
    for (const Seed& seed : {Seed{&stories, 0x3760, 2500}, Seed{&small, small.size(), 5000}}) {
        for (int i = 0; i < seed.mutants; ++i) {
            std::vector<uint8_t> m = *seed.bytes;
            int n = 1 + int(rng() % 3);
            for (int k = 0; k < n; ++k) mutate(m, rng, seed.hot_end);
            checkMutant(std::move(m), st);
        }
    }
    MESSAGE("mutants: " << st.parsed << " parsed, " << st.failed << " rejected");
    CHECK(st.bad_message == 0);
    CHECK(st.bad_span == 0);
    CHECK(st.parsed > 100);  // the test exercises the accepting paths too
    CHECK(st.failed > 1000);
}

}  // namespace blue
