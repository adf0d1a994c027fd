// Engine: a language model on the GPU VM. Opens a GGUF model (lowering it to Blue-IR in memory)
// or a lowered .bir module, its tokenizer, a Vulkan device, and runs generation requests on N
// instances that share one copy of the weights. The generation loop itself (forward pass,
// sampling, stop conditions, taking the next request) runs inside GPU chains; the engine only
// feeds requests in and turns the output ring's token records into text.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "compiler/chat_template.h"
#include "compiler/gguf.h"
#include "compiler/lower_model.h"
#include "compiler/model_config.h"
#include "compiler/tokenizer.h"
#include "host/device.h"
#include "host/memory/kv_snapshot.h"
#include "host/machine.h"
#include "host/pipelines.h"
#include "host/vk_check.h"
#include "vm/llm_request.h"
#include "vm/module.h"
#include "vm/weights.h"

namespace blue {

// Sets LP_NUM_THREADS=0 (lavapipe runs dispatches on its queue thread) for models under 16 MiB
// of weights, where the per-dispatch hand-off to worker threads dominates. Other drivers ignore
// the variable; a value the user set is kept. Call before creating the device.
void chooseLavapipeThreads(uint64_t weight_bytes);

struct EngineOptions {
    std::string device;         // see DeviceOptions::select
    uint32_t instances = 1;
    uint32_t ctx = 0;           // context per instance (0: the module's, or min(trained, 2048))
    uint32_t chain_cycles = 64;
    uint32_t max_rows = 0;      // forward rows per step (0: the compiler's default)
    uint32_t grammar_words = kGrammarWordsAuto;  // structured output: automaton words per instance (0: none)
    DType kv_type = DType::F16;
    // Embeddings (GenerationRequest::embed): how the program pools, when lowering a GGUF
    // (nullopt: the file's `<arch>.pooling_type`; Pooling::None: no embeddings). A .bir module
    // keeps the pooling it was lowered with.
    std::optional<Pooling> pooling;
    uint32_t sessions = 0;      // LowerOptions::sessions when lowering a GGUF (a .bir keeps its own)
    // Paged KV (LowerOptions::kv_page, kv_pool) when lowering a GGUF (a .bir keeps its own):
    // positions per page (8, 16 or 32; 0: per-instance caches) and positions in each layer's pool
    // (0: kv_pool_contexts x ctx, where kv_pool_contexts 0 means `instances`: the memory of
    // per-instance caches).
    uint32_t kv_page = 0;
    uint32_t kv_pool = 0;
    uint32_t kv_pool_contexts = 0;
    bool profile = false;
    bool validation = false;
    uint64_t max_cycles = 0;    // watchdog (0: derived from the requests)
    uint64_t vram_budget = 0;   // GpuOptions::vram_budget (--vram-budget; 0: none)
    bool expert_cache = true;   // GpuOptions::expert_cache (--expert-cache)
    GpuOptions::HostWeights host_weights = GpuOptions::HostWeights::AUTO;
    // Called while a machine uploads the weights (bytes done, total): progress bars.
    std::function<void(uint64_t done, uint64_t total)> on_load;
};

// Log-probabilities of one generated token (GenerationRequest::logprobs), of the distribution
// after penalties at temperature 1: the token's own and its `top` most likely alternatives'
// (most likely first, ties lower id first).
struct TokenLogprobs {
    float logprob = 0;
    std::vector<std::pair<uint32_t, float>> top;  // (id, log-probability)
};

// Collects the output records the generation program writes ahead of a token when asked
// (vm/llm_abi.h BLUE_REQ_LOGPROBS): OUTF lp, then (OUT id, OUTF lp) per alternative.
struct LogprobRecords {
    TokenLogprobs pending;
    bool have = false;  // the token's own log-probability arrived
    // True when `r` was one of them.
    bool take(const OutputRecord& r);
    // The token's log-probabilities (nullopt when none came), starting the next token's.
    std::optional<TokenLogprobs> pop();
};

// One finished request.
struct Completion {
    std::vector<uint32_t> tokens;  // generated ids (stop tokens excluded)
    std::vector<TokenLogprobs> logprobs;  // one per token when the request asked
    std::string text;
    bool finished = false;         // its end marker arrived
    uint32_t cached_tokens = 0;    // leading prompt tokens whose KV rows the instance reused
    std::vector<float> embedding;  // an embedding request's pooled vector (n_embd; not normalised)
};

// Called from the engine's thread as tokens arrive (once per chain, in order per request).
using TokenCallback = std::function<void(size_t request, uint32_t token, const std::string& text)>;

// KV persistence of one conversation in a run() of a single request (host/memory/kv_snapshot.h).
// restore: the instance starts with the snapshot's tokens and KV rows, and the request's prompt
// continues after them (position P); an empty prompt re-runs the snapshot's last token at P - 1,
// so the run goes on as if the saved one had asked for more tokens. save: after the request
// ended, the tokens the instance processed (prompt and generated, as fed back: a stop token
// that ended it is not among them) and their KV rows.
struct KvRun {
    const KvSnapshot* restore = nullptr;
    KvSnapshot* save = nullptr;
};

class Engine {
public:
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // `path`: a .gguf model or a .bir module lowered from one. Fails with a clear message when the
    // file is missing or malformed, the architecture is unsupported, or no device can run it.
    // `*device_failed` (when given) tells a device failure from a model one.
    //
    // Device failures (host/vk_check.h) come back as Status messages that name the Vulkan call and
    // what was running: "device lost (VK_ERROR_DEVICE_LOST from vkQueueSubmit at
    // host/machine.cpp:344) while generating request 0 (after 3 chain submits, at VM cycle 40)".
    // A lost device stays lost: later work fails fast until resetDevice() builds a new one.
    static Result<std::unique_ptr<Engine>> open(const std::string& path, const EngineOptions& options,
                                                bool* device_failed = nullptr);

    const ModelConfig& config() const { return config_; }
    const Tokenizer& tokenizer() const { return tokenizer_; }
    const Module& module() const { return module_; }
    uint32_t contextLength() const { return ctx_; }
    // Words of a grammar automaton an instance holds (0: the program has no grammar support).
    uint32_t grammarWords() const { return grammar_words_; }
    // How embedding requests pool (Pooling::None: the program has no embed block).
    Pooling pooling() const { return pooling_; }
    // Session slots of the program (GenerationRequest::session; 0: none).
    uint32_t sessions() const { return sessions_; }
    // Paged KV: positions per page and pages in each pool (both 0: per-instance caches), and the
    // most pages the last run() held at once (the program's counter, read after the run).
    uint32_t kvPage() const { return kv_page_; }
    uint32_t kvPages() const { return kv_pages_; }
    uint32_t kvPagesPeak() const { return kv_pages_peak_; }
    uint32_t kvEvictions() const { return kv_evictions_; }  // of the last run()
    // The device; only while hasDevice() (after open, and after a resetDevice that succeeded).
    Device& device() { return *device_; }
    const Device& device() const { return *device_; }
    bool hasDevice() const { return device_ && pipelines_; }
    // True when the device was lost (a call returned VK_ERROR_DEVICE_LOST) or is missing.
    bool deviceLost() const { return !hasDevice() || device_->lost(); }
    // Destroys the device and its pipelines and creates new ones, for the same model (the GGUF
    // stays open; machines created afterwards upload the weights again). Every machine created
    // from the old device must be destroyed first. On failure there is no device until a later
    // call succeeds.
    Status resetDevice();
    // After a failed operation on this thread: the Vulkan failure behind it (result VK_SUCCESS
    // when none; see lastVkFailure), marking the device lost when it was VK_ERROR_DEVICE_LOST.
    VkFailure noteDeviceFailure();
    // Validation-layer findings on every device this engine has had (thread-safe).
    uint32_t validationErrors() const;

    // Token ids for a prompt: BOS as the vocabulary asks; an empty prompt gives just BOS.
    std::vector<uint32_t> promptTokens(const std::string& text) const;
    // Token ids for text that may hold special-token text (a chat-formatted prompt).
    std::vector<uint32_t> specialTokens(const std::string& text) const;
    // A conversation formatted with the model's chat template, ending with the opening of an
    // assistant turn. Fails on roles the template cannot express.
    Result<std::string> formatChat(const std::vector<ChatMessage>& messages) const;
    // The chat template family formatChat uses ("chatml", ...); "" when the file's is unknown.
    std::string chatTemplateName() const;
    // general.name, or the architecture when the file has none.
    std::string modelName() const;
    // Checks a request against the context length and limits; the message names the problem.
    Status validate(const GenerationRequest& r) const;

    // Runs requests to completion on the engine's instances. Requests are queued in order; free
    // instances take them on the GPU. `on_token` streams the text as it is produced. With `kv`
    // restoring or saving, there must be one request, and it runs on one instance.
    Result<std::vector<Completion>> run(const std::vector<GenerationRequest>& requests,
                                        const TokenCallback& on_token = {}, const KvRun& kv = {});

    // KV persistence (engine_kv.cpp). The layout a snapshot must match to be restored here.
    KvLayout kvLayout() const;
    // Token ids for text that continues a restored conversation (no BOS); `special`: special-
    // token text becomes special tokens (a chat-formatted turn).
    std::vector<uint32_t> continuationTokens(const std::string& text, bool special = false) const;
    // Reads a snapshot file and checks it against this model and context; messages name the
    // file and what is wrong (never a crash on a malformed file).
    Result<KvSnapshot> readKv(const std::string& path) const;
    Status writeKv(const KvSnapshot& s, const std::string& path) const;

    // Replaces EngineOptions::on_load for the machines created from now on.
    void setLoadCallback(std::function<void(uint64_t, uint64_t)> f) { options_.on_load = std::move(f); }

    // Instances the next run() uses.
    void setInstances(uint32_t n) { options_.instances = n; }
    uint32_t instances() const { return options_.instances; }

    // Bytes of weight matrices one forward step of one token reads (every MATMUL operand once;
    // of a mixture-of-experts matmul, k of its E experts), as stored.
    uint64_t matmulWeightBytes() const;
    // Multiply-adds of one forward step per token: the elements of those matrices.
    uint64_t matmulWeightElements() const;
    // Bytes of every expert of every MoE matmul (0 for a dense model).
    uint64_t expertWeightBytes() const;

    // A machine running the generation program on `instances` instances (serving keeps one up).
    Result<std::unique_ptr<GpuMachine>> createMachine(uint32_t instances, uint32_t chain_cycles,
                                                      uint64_t max_cycles);

    // Counters of the last run().
    const GpuStats& stats() const { return stats_; }

private:
    Engine() = default;
    Status deviceUsable() const;
    // Reads the module's paged-KV metadata; fails when it is malformed or a pool passes a binding.
    Status readKvPaging(const std::string& path);
    // engine_kv.cpp: the K and V cache tensors in snapshot order (kcache.0, vcache.0, ...).
    std::vector<uint32_t> kvCaches() const;
    // A request continuing `restore`: its start position and (for an empty prompt) the last token.
    Result<GenerationRequest> kvRequest(const GenerationRequest& r, const KvSnapshot& restore) const;
    Status kvRestore(GpuMachine& machine, const KvSnapshot& s, uint32_t positions) const;
    Status kvSave(GpuMachine& machine, KvSnapshot* out) const;

    EngineOptions options_;
    GgufFile gguf_;
    ModelConfig config_;
    Tokenizer tokenizer_;
    Module module_;
    std::unique_ptr<WeightSource> weights_;
    std::unique_ptr<Device> device_;
    std::unique_ptr<Pipelines> pipelines_;
    mutable std::mutex device_mutex_;         // guards replacing device_ against validationErrors()
    uint32_t retired_validation_errors_ = 0;  // of devices resetDevice() destroyed
    uint32_t ctx_ = 0;
    uint32_t grammar_words_ = 0;
    Pooling pooling_ = Pooling::None;
    uint32_t sessions_ = 0;
    uint32_t kv_page_ = 0, kv_pages_ = 0, kv_pages_peak_ = 0, kv_evictions_ = 0;
    uint64_t model_hash_ = 0;  // kvModelHash of the GGUF
    GpuStats stats_;
};

}  // namespace blue
