// Matrices larger than the device's largest binding, as a user meets them: a model whose
// embedding table (tied to the output, Q6_K in llama.cpp's Q4_0 mix) is larger than a page of an
// emulated device (`--device-limits`) runs through `bluevm generate`, split by rows across pages,
// and gives the ids the unsplit run gives, on one instance and on four.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "compiler/gguf.h"
#include "tests/child.h"
#include "tests/test_paths.h"
#include "tools/synth/synth.h"

namespace blue::test {
namespace {

std::string binary(const std::string& rel) { return std::string(BLUE_BINARY_DIR) + "/" + rel; }

// Seeded sampled ids of `bluevm generate` (sampling reads every logit, so a wrong row of the
// output matrix changes them), with extra options.
std::string sampledIds(const std::string& model, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {binary("host/bluevm"), "generate", "--model", model,
                                     "--prompt", "Once upon a time", "-n", "24", "--temp", "0.8",
                                     "--seed", "11", "--ctx", "64", "--ids", "--no-echo"};
    args.insert(args.end(), extra.begin(), extra.end());
    Child c(args);
    INFO("stderr: " << c.err_text);
    REQUIRE(c.wait() == 0);
    return c.out_text;
}

TEST_CASE("split: a model whose embedding is larger than a page runs split by rows, same ids") {
    // A Qwen2-shaped model (tied output) with a vocabulary of 8192: the Q6_K table is 1.8 MiB in
    // the GPU weight layout, larger than the emulated device's 1 MiB pages.
    SynthConfig c = *synthPreset("qwen2-0.5b");
    c.n_layer = 2;
    c.dim = 256;
    c.n_ff = 256;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_vocab = 8192;
    SynthOptions opt;
    opt.type = DType::Q4_0;  // llama.cpp's Q4_0 mix: the tied table is Q6_K
    const std::string model = "/tmp/blue_test_split.gguf";
    Status s = synthWrite(c, opt, model);
    REQUIRE_MESSAGE(s, s.message());
    Result<GgufFile> f = ggufOpen(model);
    REQUIRE_MESSAGE(f, f.message());
    const GgufTensor* table = f->findTensor("token_embd.weight");
    REQUIRE(table);
    CHECK(table->type == DType::Q6_K);
    CHECK(f->findTensor("output.weight") == nullptr);

    const std::string profile = "/tmp/blue_test_split_pages.json";
    {
        std::ofstream p(profile);
        p << R"({"name": "pages-1m", "device": "test", "source": "tests/test_split.cpp",
  "limits": {"maxTexelBufferElements": 65536}})";
    }
    const std::string want = sampledIds(model, {});
    CHECK(want.size() > 24);
    CHECK(sampledIds(model, {"--device-limits", profile}) == want);
    CHECK(sampledIds(model, {"--device-limits", profile, "--instances", "4"}) == want);

    // 8 rows of the table (one 256-element block each, 14 texels) are 1792 bytes: a device whose
    // pages hold less cannot hold the matrix at all, and says so.
    {
        std::ofstream p(profile);
        p << R"({"name": "pages-1k", "device": "test", "source": "tests/test_split.cpp",
  "limits": {"maxTexelBufferElements": 64}})";
    }
    Child tiny({binary("host/bluevm"), "generate", "--model", model, "-n", "1", "--device-limits",
                profile});
    CHECK(tiny.wait() == 1);
    CHECK(tiny.err_text.find("more than the device's largest storage binding") !=
          std::string::npos);
    std::remove(profile.c_str());
    std::remove(model.c_str());
}

}  // namespace
}  // namespace blue::test
