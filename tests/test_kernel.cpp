// Custom kernels (vm/kernel.h, compiler/cascade/kernel_source.h, host/machine_kernel.cpp): a
// table of malformed and hostile kernels is refused with the message that names the problem, at
// compile time and at load time; a module whose embedded SPIR-V was corrupted after compilation is
// refused (mutation test); a cascade with a GLSL kernel and one with a SPIR-V file run on the GPU,
// the kernel's result equals what the host computes from the slot's tokens, and it drives a
// condition both ways.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "compiler/cascade/cascade.h"
#include "compiler/cascade/kernel_source.h"
#include "compiler/gguf.h"
#include "compiler/tokenizer.h"
#include "host/cascade/cascade_run.h"
#include "tests/child.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"
#include "vm/abi.h"
#include "vm/interp.h"
#include "vm/isa.h"
#include "vm/kernel.h"
#include "vm/kernel_abi.h"
#include "vm/verify.h"

namespace blue::test {
namespace {

std::string stories() {
    return sharedDir() + "/models/stories260K/stories260K.gguf";
}

std::string readText(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void writeText(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

void writeWords(const std::string& path, const std::vector<uint32_t>& w) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(w.data()), std::streamsize(w.size() * 4));
}

// A kernel that keeps the contract: counts token `param` in the slot.
std::string goodKernel() {
    return readText(std::string(BLUE_SOURCE_DIR) + "/programs/kernel_count.comp");
}

std::vector<uint32_t> goodSpirv() {
    auto w = compileGlslKernel(goodKernel(), "count.comp");
    REQUIRE_MESSAGE(w, w.message());
    return w.value();
}

// The contract's declarations, for the table's variants.
const char* kHead = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer Items { uint items[]; };
layout(set = 0, binding = 1) readonly buffer Slots { uint slots[]; };
layout(set = 0, binding = 2) buffer Results { float results[]; };
)";
const char* kBody = "void main() { results[0] = float(slots[items[0]]); }\n";

// Word index of the first instruction with opcode `op` (0 when none).
size_t findOp(const std::vector<uint32_t>& w, uint32_t op) {
    for (size_t at = 5; at < w.size() && (w[at] >> 16); at += w[at] >> 16) {
        if ((w[at] & 0xFFFF) == op) return at;
    }
    return 0;
}

TEST_CASE("kernel: malformed and hostile kernels are refused with a message naming the problem") {
    struct Bad {
        const char* what;
        std::string source;
        const char* message;
    };
    std::string head = kHead, body = kBody;
    const Bad bad[] = {
        {"GLSL syntax error", head + "void main() { results[0] = ; }\n", "k.comp:6:"},
        {"wrong binding",
         std::string("#version 450\nlayout(local_size_x = 1) in;\n"
                     "layout(set = 0, binding = 5) buffer R { float r[]; };\n"
                     "void main() { r[0] = 1.0; }\n"),
         "binding 5: the contract has bindings 0 (items), 1 (slots), 2 (results) and 3 (out) only"},
        {"extra descriptor set",
         head + "layout(set = 1, binding = 0) buffer X { uint x[]; };\n"
                "void main() { x[0] = slots[0]; results[0] = 1.0; }\n",
         "a buffer in descriptor set 1"},
        {"binding declared twice",
         head + "layout(set = 0, binding = 2) buffer R2 { uint r2[]; };\n"
                "void main() { r2[0] = items[0]; results[0] = 1.0; }\n",
         "binding 2 is declared twice"},
        {"writable slots",
         std::string("#version 450\nlayout(local_size_x = 1) in;\n"
                     "layout(set = 0, binding = 1) buffer Slots { uint slots[]; };\n"
                     "void main() { slots[0] = 7u; }\n"),
         "binding 1 (slots) must be declared readonly"},
        {"push constants beyond the contract",
         head + "layout(push_constant) uniform P { uint w[16]; } p;\n"
                "void main() { results[0] = float(p.w[15]); }\n",
         "push constants of 64 bytes; the contract gives 32"},
        {"huge local size",
         std::string("#version 450\nlayout(local_size_x = 1024) in;\n"
                     "layout(set = 0, binding = 2) buffer R { float r[]; };\n"
                     "void main() { r[gl_LocalInvocationID.x] = 1.0; }\n"),
         "workgroup size 1024x1x1 is 1024 invocations; the contract allows 1 to 256"},
        {"uniform buffer",
         std::string("#version 450\nlayout(local_size_x = 1) in;\n"
                     "layout(set = 0, binding = 0) uniform U { uint u; };\n"
                     "layout(set = 0, binding = 2) buffer R { float r[]; };\n"
                     "void main() { r[0] = float(u); }\n"),
         "binding 0 is a uniform buffer"},
        {"image",
         std::string("#version 450\nlayout(local_size_x = 1) in;\n"
                     "layout(set = 0, binding = 2, r32f) uniform image2D img;\n"
                     "void main() { imageStore(img, ivec2(0), vec4(1.0)); }\n"),
         "storage class UniformConstant"},
        {"a capability the device may lack",
         std::string("#version 450\n#extension GL_ARB_gpu_shader_int64 : require\n"
                     "layout(local_size_x = 1) in;\n"
                     "layout(set = 0, binding = 2) buffer R { uint64_t r[]; };\n"
                     "void main() { r[0] = 1ul; }\n"),
         "declares SPIR-V capability 11"},
        {"too much shared memory",
         head + "shared float big[8192];\n"
                "void main() { big[gl_LocalInvocationID.x] = 1.0; results[0] = big[3]; }\n",
         "uses 32768 bytes of workgroup (shared) memory; the contract allows 16384"},
        {"specialization constants",
         head + "layout(constant_id = 0) const uint N = 4u;\n"
                "void main() { results[0] = float(N); }\n",
         "declares specialization constants"},
    };
    for (const Bad& b : bad) {
        INFO(b.what);
        TempDir dir;
        std::string path = dir.path + "/k.comp";
        writeText(path, b.source);
        auto r = loadKernelFile(path);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(b.message) != std::string::npos, r.message());
        CHECK(r.message().find(path) == 0);
        CHECK(r.message().find('\n') == std::string::npos);
    }

    // SPIR-V files: not SPIR-V, truncated, invalid for spirv-val, another execution model.
    std::vector<uint32_t> good = goodSpirv();
    REQUIRE(checkKernelSpirv(good, "good"));
    // Cut inside the first instruction of 3 or more words past the middle: its length word
    // claims words the file no longer has.
    std::vector<uint32_t> truncated;
    for (size_t at = 5; at < good.size(); at += good[at] >> 16) {
        if (at > good.size() / 2 && (good[at] >> 16) >= 3) {
            truncated.assign(good.begin(), good.begin() + long(at + 2));
            break;
        }
    }
    REQUIRE(!truncated.empty());
    std::vector<uint32_t> no_memory_model = good;
    size_t mm = findOp(good, 14);
    REQUIRE(mm);
    no_memory_model.erase(no_memory_model.begin() + long(mm),
                          no_memory_model.begin() + long(mm + (good[mm] >> 16)));
    std::vector<uint32_t> vertex = good;
    size_t ep = findOp(good, 15);
    REQUIRE(ep);
    vertex[ep + 1] = 0;  // execution model Vertex
    std::vector<uint32_t> text(8, 0x20202020u);
    struct BadSpv {
        const char* what;
        std::vector<uint32_t> words;
        const char* message;
    };
    const BadSpv spv[] = {
        {"not SPIR-V", text, "not SPIR-V: first word 0x20202020 is not the magic number"},
        {"truncated SPIR-V", truncated, "truncated: the instruction at word"},
        {"spirv-val failure", no_memory_model, "spirv-val:"},
        {"wrong execution model", vertex, "execution model 0, not GLCompute (5)"},
    };
    for (const BadSpv& b : spv) {
        INFO(b.what);
        TempDir dir;
        std::string path = dir.path + "/k.spv";
        writeWords(path, b.words);
        auto r = loadKernelFile(path);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(b.message) != std::string::npos, r.message());
        CHECK(r.message().find('\n') == std::string::npos);
    }
    TempDir dir;
    writeText(dir.path + "/odd.spv", "12345");
    auto odd = loadKernelFile(dir.path + "/odd.spv");
    REQUIRE_FALSE(odd);
    CHECK(odd.message().find("not a whole number of 32-bit words") != std::string::npos);
}

// A module with one KERNEL block, built by hand (no model needed).
Module kernelModule(std::vector<uint32_t> spirv) {
    Module m;
    m.layout.max_rows = 1;
    m.code = {encodeWord0(uint8_t(Op::HALT), 0, 0, 0), 0};
    TensorDecl result;
    result.name = "result";
    result.cls = BLUE_TC_INSTANCE;
    result.ne = {BLUE_KERNEL_RESULT_WORDS, 1, 1, 1};
    TensorDecl slot;
    slot.name = "slot";
    slot.dtype = DType::I32;
    slot.cls = BLUE_TC_INSTANCE;
    slot.ne = {33, 1, 1, 1};
    m.tensors = {result, slot};
    m.tcode = {encodeTensorHeader(uint8_t(Op::KERNEL), 5), 0, 1, 0, 7, 0xFFFFFFFFu};
    m.blocks.push_back({"score", 0, 6, 1});
    m.kernels.push_back({"count", std::move(spirv)});
    return m;
}

TEST_CASE(
    "kernel: the KERNELS section round-trips, the verifier checks KERNEL's operands, --ref "
    "refuses") {
    Module m = kernelModule(goodSpirv());
    REQUIRE_MESSAGE(verifyModule(m), verifyModule(m).message());
    std::vector<uint8_t> bytes = serializeModule(m);
    uint16_t minor = 0;
    std::memcpy(&minor, bytes.data() + 6, 2);
    CHECK(minor == kModuleMinorKernels);
    auto back = parseModule(bytes, "k.bir");
    REQUIRE_MESSAGE(back, back.message());
    REQUIRE(back->kernels.size() == 1);
    CHECK(back->kernels[0].name == "count");
    CHECK(back->kernels[0].spirv == m.kernels[0].spirv);
    Status ref = refCanRun(m);
    REQUIRE_FALSE(ref);
    CHECK(ref.message().find("reference interpreter (--ref) cannot run") != std::string::npos);
    CHECK(refCanRun(Module{}));

    struct Case {
        const char* what;
        void (*mutate)(Module&);
        const char* message;
    };
    const Case cases[] = {
        {"a kernel that writes a slot, run without one",
         [](Module& k) {
             auto w = compileGlslKernel(
                 readText(std::string(BLUE_SOURCE_DIR) + "/programs/kernel_drop.comp"),
                 "drop.comp");
             REQUIRE(w);
             k.kernels[0].spirv = w.value();
         },
         "kernel 'count' declares binding 3 (a slot it writes), but the instruction names no slot"},
        {"a written slot of the wrong type", [](Module& k) { k.tcode[5] = 0; },
         "operand 4 (tensor 'result'): type F32, expected I32"},
        {"kernel index out of range", [](Module& k) { k.tcode[3] = 1; },
         "kernel 1 does not exist (1 kernels)"},
        {"results not INSTANCE", [](Module& k) { k.tensors[0].cls = BLUE_TC_GLOBAL; },
         "results must be an INSTANCE tensor"},
        {"too many result words", [](Module& k) { k.tensors[0].ne[0] = 17; },
         "17 result words per instance, at most 16"},
        {"slot not I32", [](Module& k) { k.tensors[1].dtype = DType::F32; },
         "type F32, expected I32"},
        {"an unnamed kernel", [](Module& k) { k.kernels[0].name.clear(); },
         "a name of 1 to 64 characters"},
        {"corrupt SPIR-V", [](Module& k) { k.kernels[0].spirv[0] ^= 1; },
         "kernel 0 'count': not SPIR-V"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        Module k = kernelModule(goodSpirv());
        c.mutate(k);
        Status s = verifyModule(k);
        REQUIRE_FALSE(s);
        CHECK_MESSAGE(s.message().find(c.message) != std::string::npos, s.message());
    }
}

TEST_CASE(
    "kernel: a module whose embedded SPIR-V was corrupted after compilation is refused at load") {
    Module m = kernelModule(goodSpirv());
    std::vector<uint8_t> bytes = serializeModule(m);
    // Where the SPIR-V lies in the file: find its first words.
    const std::vector<uint32_t>& spirv = m.kernels[0].spirv;
    size_t at = 0;
    for (size_t i = 0; i + 8 <= bytes.size(); i += 4) {
        if (std::memcmp(bytes.data() + i, spirv.data(), 8) == 0) {
            at = i;
            break;
        }
    }
    REQUIRE(at > 0);
    TempDir dir;
    std::string path = dir.path + "/k.bir";
    auto load = [&](const std::vector<uint8_t>& b) {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
        out.close();
        return loadModuleFile(path);
    };
    REQUIRE(load(bytes));
    // Targeted corruptions, each refused with its reason.
    auto binding = bytes;
    size_t words = spirv.size();
    bool patched = false;
    for (size_t w = 5; w < words && !patched;) {
        uint32_t n = spirv[w] >> 16, op = spirv[w] & 0xFFFF;
        if (op == 71 && n == 4 && spirv[w + 2] == 33 &&
            spirv[w + 3] == 2) {  // OpDecorate %x Binding 2
            uint32_t seven = 7;
            std::memcpy(binding.data() + at + (w + 3) * 4, &seven, 4);
            patched = true;
        }
        w += n ? n : words;
    }
    REQUIRE(patched);
    auto r = load(binding);
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.message().find("kernel 0 'count': binding 7") != std::string::npos,
                  r.message());
    auto count = bytes;
    uint32_t huge = 0x7FFFFFFF;
    std::memcpy(count.data() + at - 4, &huge, 4);  // the SPIR-V word count
    r = load(count);
    REQUIRE_FALSE(r);
    CHECK_MESSAGE(r.message().find("KERNELS") != std::string::npos, r.message());

    // Random corruptions of the SPIR-V: each is refused at load or still keeps the contract (a
    // changed constant may); none crashes, and whatever loads passes both checks again.
    std::mt19937 rng(7);
    uint32_t refused = 0, kept = 0;
    for (int i = 0; i < 300; ++i) {
        auto mutated = bytes;
        size_t word = 5 + rng() % (words - 5);
        uint32_t v = 0;
        std::memcpy(&v, mutated.data() + at + word * 4, 4);
        v ^= 1u << (rng() % 32);
        std::memcpy(mutated.data() + at + word * 4, &v, 4);
        auto lm = load(mutated);
        if (!lm) {
            ++refused;
            CHECK(lm.message().find("kernel 0 'count'") != std::string::npos);
        } else {
            ++kept;
            CHECK(checkKernelSpirv(lm->kernels[0].spirv, "again"));
        }
    }
    MESSAGE("corrupted SPIR-V: " << refused << " refused, " << kept << " still valid");
    CHECK(refused > 150);
}

// ---- on the GPU ------------------------------------------------------------------------------

const char* kCascade = R"(model tiny = "MODEL"
kernel count = "KERNEL"
slot story[64]
slot ending[8]
stage tell {
    prompt "Once upon a time" + input
    write story
    max_tokens 48
    temperature 0
}
score count over story param " the"
if count.value >= THRESHOLD and count.value1 == LENGTH {
    stage yes {
        prompt story + " Yes"
        write ending
        max_tokens 2
        temperature 0
    }
} else {
    stage no {
        prompt story + " No"
        write ending
        max_tokens 2
        temperature 0
    }
}
output story, ending
)";

std::string fill(std::string s, const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) {
        size_t at = s.find(k);
        REQUIRE(at != std::string::npos);
        s.replace(at, k.size(), v);
    }
    return s;
}

// Compiles the cascade in `dir` (the kernel file beside it) and runs one task on the GPU.
CascadeResult runKernelCascade(const TempDir& dir, const std::string& source,
                               bool reference = false) {
    std::string cas = dir.path + "/k.cas";
    writeText(cas, source);
    CascadeOptions o;
    o.module_dir = dir.path;
    auto m = compileCascadeFile(cas, o);
    REQUIRE_MESSAGE(m, m.message());
    std::string bir = dir.path + "/k.bir";
    REQUIRE(writeModuleFile(m.value(), bir));
    CascadeRunOptions ro;
    ro.reference = reference;
    ro.instances = 2;
    ro.max_submit_ms = 0;
    auto runner = CascadeRunner::open(bir, ro);
    REQUIRE_MESSAGE(runner, runner.message());
    auto results = runner.value()->run({{"Once upon a time", 1}, {"The dog", 2}});
    REQUIRE_MESSAGE(results, results.message());
    CHECK(runner.value()->validationErrors() == 0);
    REQUIRE(results->size() == 2);
    return results.value()[0];
}

uint32_t theToken() {
    auto g = ggufOpen(stories());
    REQUIRE(g);
    auto t = Tokenizer::fromGguf(g.value());
    REQUIRE(t);
    std::vector<int32_t> ids = t->encode("the", false, true);  // SentencePiece: "▁the"
    REQUIRE(ids.size() == 1);
    return uint32_t(ids[0]);
}

uint32_t stageRuns(const CascadeResult& r, const std::string& name) {
    for (const StageStats& s : r.stages) {
        if (s.name == name) return s.runs;
    }
    FAIL("no stage " << name);
    return 0;
}

TEST_CASE(
    "kernel: a GLSL kernel's result over a slot drives a condition both ways on the GPU; a .spv "
    "kernel too") {
    TempDir dir;
    writeText(dir.path + "/count.comp", goodKernel());
    std::map<std::string, std::string> vars = {
        {"MODEL", stories()}, {"KERNEL", "count.comp"}, {"THRESHOLD", "0"}, {"LENGTH", "0"}};
    // First run: learn the story's tokens (greedy, so every run writes the same story).
    CascadeResult first = runKernelCascade(dir, fill(kCascade, vars));
    const std::vector<int32_t>& story = first.slots[0];
    REQUIRE(!story.empty());
    uint32_t the = theToken(), expected = 0;
    for (int32_t t : story) expected += uint32_t(t) == the;
    MESSAGE("story of " << story.size() << " tokens uses 'the' " << expected << " times");
    CHECK(stageRuns(first, "no") == 1);  // value1 == 0 is false: the slot is not empty
    CHECK(stageRuns(first, "yes") == 0);
    // The kernel's count and length equal the host's: the condition holds at the exact values...
    vars["LENGTH"] = std::to_string(story.size());
    vars["THRESHOLD"] = std::to_string(expected);
    CascadeResult at = runKernelCascade(dir, fill(kCascade, vars));
    CHECK(at.slots[0] == story);
    CHECK(stageRuns(at, "yes") == 1);
    CHECK(stageRuns(at, "no") == 0);
    // ...and fails one above the count.
    vars["THRESHOLD"] = std::to_string(expected + 1);
    CascadeResult above = runKernelCascade(dir, fill(kCascade, vars));
    CHECK(stageRuns(above, "yes") == 0);
    CHECK(stageRuns(above, "no") == 1);

    // The same kernel as a SPIR-V file.
    writeWords(dir.path + "/count.spv", goodSpirv());
    vars["KERNEL"] = "count.spv";
    vars["THRESHOLD"] = std::to_string(expected);
    CascadeResult spv = runKernelCascade(dir, fill(kCascade, vars));
    CHECK(stageRuns(spv, "yes") == 1);

    // The reference interpreter refuses the module, naming the kernel.
    std::string cas = dir.path + "/k.cas";
    CascadeOptions o;
    o.module_dir = dir.path;
    auto m = compileCascadeFile(cas, o);
    REQUIRE(m);
    REQUIRE(writeModuleFile(m.value(), dir.path + "/k.bir"));
    CascadeRunOptions ro;
    ro.reference = true;
    auto runner = CascadeRunner::open(dir.path + "/k.bir", ro);
    if (runner) {
        auto r = runner.value()->run({{"Once upon a time", 1}});
        REQUIRE_FALSE(r);
        CHECK(r.message().find("custom kernels ('count')") != std::string::npos);
    } else {
        CHECK(runner.message().find("custom kernels ('count')") != std::string::npos);
    }
}

TEST_CASE("kernel: cascade sources with kernels fail with FILE:LINE:COL naming the problem") {
    TempDir dir;
    writeText(dir.path + "/count.comp", goodKernel());
    writeText(dir.path + "/bad.comp", std::string(kHead) + "void main() { results[0] = ; }\n");
    writeText(dir.path + "/drop.comp",
              readText(std::string(BLUE_SOURCE_DIR) + "/programs/kernel_drop.comp"));
    std::string model = "model tiny = \"" + stories() + "\"\n";
    std::string stage = "stage s {\n    prompt \"Once\"\n    write story\n    max_tokens 4\n}\n";
    struct Bad {
        std::string source;
        const char* message;
    };
    const Bad bad[] = {
        {model + "kernel k = \"bad.comp\"\nslot story[8]\n" + stage + "score k over story\n",
         "k.cas:2:12: kernel 'k': "},
        {model + "kernel k = \"missing.comp\"\nslot story[8]\n" + stage + "score k over story\n",
         "cannot open the kernel file"},
        {model + "slot story[8]\n" + stage + "score k over story\n",
         "k.cas:8:7: no kernel 'k' is declared"},
        {model + "kernel k = \"count.comp\"\nslot story[8]\n" + stage + "score k over nothing\n",
         "k.cas:9:14: no slot named 'nothing'"},
        {model + "kernel k = \"count.comp\"\nslot story[8]\n" + stage +
             "if k.value > 1 {\n    run s\n}\nscore k over story\n",
         "is not run by a `score` statement before this condition"},
        {model + "kernel k = \"count.comp\"\nslot story[8]\n" + stage +
             "score k over story\nif k.value16 > 1 {\n    run s\n}\n",
         "a kernel's results are 'value' (word 0) and 'value1'..'value15'"},
        {model + "kernel k = \"count.comp\"\nslot story[8]\n" + stage +
             "score k over story param \"once upon\"\n",
         "a text param must be exactly one token"},
        {model + "kernel story = \"count.comp\"\nslot story[8]\n", "'story' is already a kernel"},
        {model + "kernel k = \"count.comp\"\nslot story[8]\n" + stage +
             "filter story with k into story\n",
         "k.cas:9:26: kernel 'k' declares no binding 3, the slot a `filter` writes"},
        {model + "kernel k = \"drop.comp\"\nslot story[8]\n" + stage + "score k over story\n",
         "k.cas:9:1: kernel 'k' writes a slot (binding 3): run it with `filter SLOT with k into "
         "TARGET`"},
        {model + "kernel k = \"drop.comp\"\nslot story[8]\n" + stage +
             "filter story with k into input\n",
         "k.cas:9:26: the input slot is read-only"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.source);
        std::string cas = dir.path + "/k.cas";
        writeText(cas, b.source);
        CascadeOptions o;
        auto r = compileCascadeFile(cas, o);
        REQUIRE_FALSE(r);
        CHECK_MESSAGE(r.message().find(b.message) != std::string::npos, r.message());
    }
}

TEST_CASE(
    "kernel: programs/kernel_score.cas through bluec cascade and bluevm run; --ref refuses it") {
    TempDir dir;
    std::string bir = dir.path + "/score.bir";
    auto bin = [](const std::string& rel) { return std::string(BLUE_BINARY_DIR) + "/" + rel; };
    {
        Child c({bin("compiler/bluec"), "cascade",
                 std::string(BLUE_SOURCE_DIR) + "/programs/kernel_score.cas", "-o", bir, "--model",
                 "tiny=" + stories()});
        REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    }
    Child c({bin("host/bluevm"), "run", bir, "--prompt", "Once upon a time", "--stats"});
    REQUIRE_MESSAGE(c.wait() == 0, c.err_text);
    auto stats = nlohmann::json::parse(c.err_text.substr(0, c.err_text.find('\n')));
    CHECK(stats["machine"]["round_trips"] == 0);
    // The branch taken agrees with the story's count of " the" (the program's threshold is 3).
    size_t story_at = c.out_text.find("--- story ---\n"),
           ending_at = c.out_text.find("\n--- ending ---");
    REQUIRE(story_at != std::string::npos);
    REQUIRE(ending_at != std::string::npos);
    std::string story = c.out_text.substr(story_at + 14, ending_at - story_at - 14);
    uint32_t the = 0;
    for (size_t at = story.find(" the "); at != std::string::npos; at = story.find(" the ", at + 1))
        ++the;
    MESSAGE("story: " << story << " (" << the << " times ' the ')");
    bool plain = stats["stages"][1]["runs"] == 1, rich = stats["stages"][2]["runs"] == 1;
    CHECK(plain != rich);
    CHECK(plain == (the >= 3));
    // The filter example compiles and runs too: `bare` is the story without its commas.
    std::string fbir = dir.path + "/filter.bir";
    Child f({bin("compiler/bluec"), "cascade",
             std::string(BLUE_SOURCE_DIR) + "/programs/kernel_filter.cas", "-o", fbir, "--model",
             "tiny=" + stories()});
    REQUIRE_MESSAGE(f.wait() == 0, f.err_text);
    Child fr({bin("host/bluevm"), "run", fbir, "--prompt", "Once upon a time"});
    REQUIRE_MESSAGE(fr.wait() == 0, fr.err_text);
    size_t s_at = fr.out_text.find("--- story ---\n"), b_at = fr.out_text.find("\n--- bare ---\n");
    size_t m_at = fr.out_text.find("\n--- more ---");
    REQUIRE(s_at != std::string::npos);
    REQUIRE(b_at != std::string::npos);
    REQUIRE(m_at != std::string::npos);
    std::string fstory = fr.out_text.substr(s_at + 14, b_at - s_at - 14);
    std::string bare = fr.out_text.substr(b_at + 14, m_at - b_at - 14);
    CHECK(fstory.find(',') != std::string::npos);
    CHECK(bare.find(',') == std::string::npos);
    std::string no_commas;
    for (char ch : fstory) {
        if (ch != ',') no_commas += ch;
    }
    // A slot's text drops its first token's leading space ("▁there" after a leading ",").
    no_commas.erase(0, no_commas.find_first_not_of(' '));
    CHECK(bare == no_commas);
    Child r({bin("host/bluevm"), "run", bir, "--prompt", "Once upon a time", "--ref"});
    CHECK(r.wait() != 0);
    CHECK_MESSAGE(r.err_text.find("custom kernels ('count')") != std::string::npos, r.err_text);
}

TEST_CASE("kernel: `filter` writes the slot a kernel produced; the host checks it token by token") {
    TempDir dir;
    writeText(dir.path + "/drop.comp",
              readText(std::string(BLUE_SOURCE_DIR) + "/programs/kernel_drop.comp"));
    std::string src = std::string("model tiny = \"") + stories() + R"("
kernel drop = "drop.comp"
slot story[64]
slot kept[64]
slot short[8]
stage tell {
    prompt "Once upon a time" + input
    write story
    max_tokens 48
    temperature 0
}
filter story with drop into kept param " the"
filter story with drop into short param " the"
if drop.value >= 1 {
    run tell
}
output story, kept, short
)";
    CascadeResult r = runKernelCascade(dir, src);
    REQUIRE(r.slots.size() == 3);
    // The first run's story is gone (`run tell` rewrites it), but greedy gives the same story.
    const std::vector<int32_t>& story = r.slots[0];
    const int32_t the = int32_t(theToken());
    std::vector<int32_t> expected;
    for (int32_t t : story) {
        if (t != the) expected.push_back(t);
    }
    CHECK(r.slots[1] == expected);
    // A target smaller than what the kernel wrote keeps its capacity's worth.
    CHECK(r.slots[2] ==
          std::vector<int32_t>(expected.begin(),
                               expected.begin() + long(std::min<size_t>(8, expected.size()))));
    // drop.value (tokens dropped) drove the condition: `tell` ran again exactly when one was.
    CHECK(stageRuns(r, "tell") == (expected.size() < story.size() ? 2u : 1u));
}

}  // namespace
}  // namespace blue::test
