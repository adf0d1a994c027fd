// Memory as a user meets it, through `bluevm generate`:
//   - matrices larger than the device's largest binding: a model whose embedding table (tied to
//     the output, Q6_K in llama.cpp's Q4_0 mix) is larger than a page of an emulated device
//     (`--device-limits`) runs split by rows across pages, with the ids of the unsplit run;
//   - `--vram-budget`: weights beyond the budget stay in host memory that the GPU reads directly;
//     the ids are those of the run without a budget, for F32 and Q4_0 files, on 1 and 16
//     instances, and `--stats` shows what went where (the cases that size a budget for reading
//     in place say `--host-weights read`: the default streams on a GPU with its own memory);
//   - MoE under a budget the weights do not fit: the experts stay in host memory and the GPU's
//     routing pages the ones it picks into a device-local cache; the ids are those of the run
//     without a budget, and the GPU's counters add up.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/gguf.h"
#include "tests/child.h"
#include "tests/moe_models.h"
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

TEST_CASE("memory: a model whose embedding is larger than a page runs split by rows, same ids") {
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

// The ids (or JSONL) and the --stats JSON of a `bluevm generate` run.
struct Generated {
    std::string out;
    nlohmann::json stats;
};
Generated generate(std::vector<std::string> args) {
    args.insert(args.begin(), {binary("host/bluevm"), "generate", "--ctx", "64", "--stats", "--no-echo"});
    Child c(args);
    INFO("stderr: " << c.err_text);
    REQUIRE(c.wait() == 0);
    // Under BLUE_VALIDATION (the test runs), the child's validation layer reports here.
    CHECK(c.err_text.find("[validation") == std::string::npos);
    Generated g;
    g.out = c.out_text;
    g.stats = nlohmann::json::parse(c.err_text.substr(c.err_text.rfind('{')));
    return g;
}

TEST_CASE("memory: under --vram-budget, weights beyond it are read from host memory, same ids") {
    const std::string stories = sharedDir() + "/models/stories260K/stories260K.gguf";
    // One instance: the known greedy continuation, with about half of the weights (1.1 MiB in
    // all) or more in host memory: 787 KB on lavapipe, 621 KB under the CI's device profiles,
    // whose smaller pages place the weights differently.
    std::vector<std::string> one = {"--model", stories, "--prompt", "", "-n", "48", "--ids", "--temp", "0"};
    Generated plain = generate(one);
    std::vector<std::string> budget = one;
    budget.insert(budget.end(), {"--vram-budget", "1.75M", "--host-weights", "read"});
    Generated paged = generate(budget);
    CHECK(paged.out == plain.out);
    CHECK(plain.stats["host_weight_bytes"] == 0);
    CHECK(paged.stats["host_weight_bytes"].get<uint64_t>() > 550000u);
    CHECK(paged.stats["vram_bytes"].get<uint64_t>() <= uint64_t(1.75 * 1048576));
    CHECK(paged.stats["vram_bytes"].get<uint64_t>() < plain.stats["vram_bytes"].get<uint64_t>());
    CHECK(paged.stats["round_trips"] == 0);
    CHECK(paged.stats["streamed_bytes"] == 0);
    // Streamed: copied a group of matrices at a time into two device-local slots.
    budget = one;
    budget.insert(budget.end(), {"--vram-budget", "2M", "--host-weights", "stream"});
    Generated streamed = generate(budget);
    CHECK(streamed.out == plain.out);
    CHECK(streamed.stats["host_weight_bytes"].get<uint64_t>() > 550000u);
    CHECK(streamed.stats["vram_bytes"].get<uint64_t>() <= uint64_t(2 * 1048576));
    // Every submitted cycle copies the host-memory weights once.
    CHECK(streamed.stats["streamed_bytes"].get<uint64_t>() >=
          streamed.stats["host_weight_bytes"].get<uint64_t>() * streamed.stats["cycles"].get<uint64_t>());
    CHECK(streamed.stats["round_trips"] == 0);
    // The known greedy ids from BOS (the shared model's reference output).
    std::vector<uint32_t> want = expectedGreedyIds();
    std::string want_text;
    for (size_t i = 0; i < 48 && i < want.size(); ++i) want_text += (i ? " " : "") + std::to_string(want[i]);
    CHECK(plain.out.substr(0, want_text.size()) == want_text);

    // Sixteen instances with sixteen prompts.
    const std::string prompts = "/tmp/blue_test_budget_prompts.txt";
    {
        std::ofstream f(prompts);
        for (const char* p : {"Once upon a time", "The dog", "Lily went", "One day", "Tom", "A cat",
                              "The sun", "Mom said", "The bird", "Ben and", "It was", "She saw",
                              "They ran", "The big", "A little", "He was"}) {
            f << p << "\n";
        }
    }
    // (No grammar memory: 16 instances of it would take 4 MiB of device memory, beside the point.)
    std::vector<std::string> many = {"--model", stories, "--prompts", prompts, "--instances", "16",
                                     "-n", "24", "--temp", "0", "--grammar-words", "0"};
    Generated many_plain = generate(many);
    many.insert(many.end(), {"--vram-budget", "2.3M", "--host-weights", "read"});
    Generated many_paged = generate(many);
    CHECK(many_paged.out == many_plain.out);
    CHECK(std::count(many_plain.out.begin(), many_plain.out.end(), '\n') == 16);
    CHECK(many_paged.stats["host_weight_bytes"].get<uint64_t>() > 600000u);
    CHECK(many_paged.stats["vram_bytes"].get<uint64_t>() <= uint64_t(2.3 * 1048576));
    many.back() = "stream";
    Generated many_streamed = generate(many);
    CHECK(many_streamed.out == many_plain.out);
    CHECK(many_streamed.stats["streamed_bytes"].get<uint64_t>() > 0u);
    std::remove(prompts.c_str());

    // A Q4_0 file (with its Q6_K table), sampled with a seed.
    SynthConfig c = *synthPreset("qwen2-0.5b");
    c.n_layer = 4;
    c.dim = 256;
    c.n_ff = 384;  // activations within the 1 MiB pages of the Mali and minimum profiles
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_vocab = 4096;
    SynthOptions opt;
    opt.type = DType::Q4_0;
    const std::string model = "/tmp/blue_test_budget_q4.gguf";
    Status s = synthWrite(c, opt, model);
    REQUIRE_MESSAGE(s, s.message());
    std::vector<std::string> q = {"--model", model, "--prompt", "Once upon a time", "-n", "24",
                                  "--temp", "0.8", "--seed", "5", "--ids"};
    Generated q_plain = generate(q);
    const uint64_t q_vram = q_plain.stats["vram_bytes"].get<uint64_t>();
    std::vector<std::string> q_read = q;
    q_read.insert(q_read.end(), {"--vram-budget", std::to_string(q_vram * 3 / 4), "--host-weights", "read"});
    Generated q_paged = generate(q_read);
    CHECK(q_paged.out == q_plain.out);
    CHECK(q_paged.stats["host_weight_bytes"].get<uint64_t>() > 0u);
    CHECK(q_paged.stats["vram_bytes"].get<uint64_t>() <= q_vram * 3 / 4);
    // Streaming reserves two slots as large as the largest matrix (the 0.9 MiB Q6_K table): with
    // the unbudgeted run's device memory as the budget, the rest of the weights partly stream.
    q.insert(q.end(), {"--vram-budget", std::to_string(q_vram), "--host-weights", "stream"});
    Generated q_streamed = generate(q);
    CHECK(q_streamed.out == q_plain.out);
    CHECK(q_streamed.stats["streamed_bytes"].get<uint64_t>() > 0u);

    // A budget below what the activations need is refused with the numbers; a bad size too.
    Child small({binary("host/bluevm"), "generate", "--model", stories, "-n", "1", "--vram-budget", "1M", "--host-weights", "read"});
    CHECK(small.wait() == 1);
    CHECK(small.err_text.find("more than the VRAM budget of 1.0 MiB (weights could go to host memory; "
                              "these cannot)") != std::string::npos);
    Child bad({binary("host/bluevm"), "generate", "--model", stories, "--vram-budget", "lots"});
    CHECK(bad.wait() != 0);
    CHECK(bad.err_text.find("'lots' is not a size such as 512M") != std::string::npos);
    std::remove(model.c_str());
}

TEST_CASE("memory: MoE experts paged into a device-local cache by the GPU's routing, same ids") {
    const std::string model = "/tmp/blue_test_budget_moe.gguf";
    const SynthConfig c = writeSmallMoe(model);
    const uint32_t E = c.n_expert, layers = c.n_layer;
    std::vector<std::string> one = {"--model", model, "--prompt", "Once upon a time", "-n", "32",
                                    "--temp", "0.8", "--seed", "3", "--ids"};
    Generated plain = generate(one);
    const uint64_t vram = plain.stats["vram_bytes"].get<uint64_t>();
    CHECK(plain.stats["expert_cache_slots"] == 0);

    // One byte short of everything: the experts go to host memory and E - 1 slots per layer fit.
    std::vector<std::string> args = one;
    args.insert(args.end(), {"--vram-budget", std::to_string(vram - 1), "--host-weights", "read"});
    Generated almost = generate(args);
    CHECK(almost.out == plain.out);
    REQUIRE(almost.stats["expert_cache_slots"] == E - 1);
    // One slot in every layer: one expert's gate, up and down matrices per layer.
    const uint64_t per_slot = almost.stats["expert_cache_bytes"].get<uint64_t>() / (E - 1);
    const uint64_t experts = per_slot * E;  // every expert of every layer
    CHECK(almost.stats["host_weight_bytes"].get<uint64_t>() >= experts);

    // A quarter of the experts: two slots a layer for top-2 routing.
    const uint64_t budget = budgetForSlots(vram, per_slot, E, 2);
    args = one;
    args.insert(args.end(), {"--vram-budget", std::to_string(budget), "--host-weights", "read"});
    Generated paged = generate(args);
    CHECK(paged.out == plain.out);
    CHECK(paged.stats["expert_cache_slots"] == 2);
    CHECK(paged.stats["vram_bytes"].get<uint64_t>() <= budget);
    CHECK(paged.stats["round_trips"] == 0);
    // Every expert a run asks for is found, copied in, or (no slot free: the prompt's rows ask
    // for more than two) read in place; a decode step asks for k = 2 per layer, which two slots
    // hold. Every copy moves one expert's matrices.
    const uint64_t hits = paged.stats["expert_hits"], misses = paged.stats["expert_misses"],
                   inplace = paged.stats["expert_inplace"];
    CHECK(misses >= 2 * layers);  // the cold cache fills
    CHECK(hits > 0);
    CHECK(hits + misses + inplace >= 32 * 2 * layers);
    CHECK(inplace <= (E - 2) * layers);  // only the prompt's cycle
    CHECK(paged.stats["expert_paged_bytes"].get<uint64_t>() * layers == misses * per_slot);
    // Same budget, experts as any other weight: read in place, no cache.
    args.insert(args.end(), {"--expert-cache", "off"});
    Generated off = generate(args);
    CHECK(off.out == plain.out);
    CHECK(off.stats["expert_cache_slots"] == 0);
    CHECK(off.stats["expert_misses"] == 0);
    // Streaming the other weights (two slots as large as the largest matrix come out of the
    // budget): the experts still go through the cache.
    args = one;
    args.insert(args.end(), {"--vram-budget", std::to_string(budget + 3 * per_slot), "--host-weights", "stream"});
    Generated streamed = generate(args);
    CHECK(streamed.out == plain.out);
    CHECK(streamed.stats["expert_cache_slots"].get<uint32_t>() > 0u);
    CHECK(streamed.stats["expert_misses"].get<uint64_t>() > 0u);
    // No room left for a cache: the experts stay in host memory, read in place, not streamed.
    args = one;
    args.insert(args.end(), {"--vram-budget", std::to_string(vram - experts), "--host-weights", "stream"});
    Generated no_room = generate(args);
    CHECK(no_room.out == plain.out);
    CHECK(no_room.stats["expert_cache_slots"] == 0);
    CHECK(no_room.stats["host_weight_bytes"].get<uint64_t>() >= experts);

    // Six instances with one slot a layer: a cycle's rows want more experts than the cache holds,
    // and those are read in place.
    const std::string prompts = "/tmp/blue_test_budget_moe_prompts.txt";
    {
        std::ofstream f(prompts);
        for (int i = 0; i < 6; ++i) f << "Once upon a time " << i << "\n";
    }
    std::vector<std::string> many = {"--model", model, "--prompts", prompts, "--instances", "6",
                                     "-n", "16", "--temp", "0.8", "--seed", "9", "--ids"};
    Generated many_plain = generate(many);
    const uint64_t many_vram = many_plain.stats["vram_bytes"].get<uint64_t>();
    many.insert(many.end(), {"--vram-budget", std::to_string(budgetForSlots(many_vram, per_slot, E, 1)), "--host-weights", "read"});
    Generated many_paged = generate(many);
    CHECK(many_paged.out == many_plain.out);
    CHECK(many_paged.stats["expert_cache_slots"] == 1);
    CHECK(many_paged.stats["expert_inplace"].get<uint64_t>() > 0u);
    CHECK(many_paged.stats["expert_misses"].get<uint64_t>() >= layers);
    CHECK(many_paged.stats["round_trips"] == 0);
    std::remove(prompts.c_str());
    std::remove(model.c_str());
}

}  // namespace
}  // namespace blue::test
