// The model compiler: lowers a GGUF transformer (llama, qwen2, qwen3, their MoE forms, gemma2,
// gemma3, phi3) to a Blue-IR generation program. The module holds
//   - WEIGHT tensors that point into the GGUF file (extern 0), never copied;
//   - ROWS activations for the tokens of one step, INSTANCE KV caches and logits;
//   - one block, `forward`, that runs every layer for a ragged batch of rows (prefill chunks and
//     single decode tokens of many instances together), then the last row of each instance
//     through the output norm, the LM head and SAMPLE;
//   - control code that serves requests from the input ring (vm/llm_abi.h): copy the prompt,
//     prefill in chunks, then sample, check stop conditions, emit and feed back each token, and
//     take the next request when done. All of it runs on the GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/gguf.h"
#include "compiler/model_config.h"
#include "vm/module.h"

namespace blue {

// 228 KiB per instance: the most a device whose compiler limits loops (lavapipe) copies in one
// cycle (host/machine_plan.h maxGrammarWords), so a program bluec lowers runs on every device.
inline constexpr uint32_t kDefaultGrammarWords = 58368;
// Engines (host/llm/engine.h): kDefaultGrammarWords, or fewer when 16 instances' automata would
// not fit one page of the device (Mali-class texel limits: 1 MiB pages, 16384 words).
inline constexpr uint32_t kGrammarWordsAuto = 0xFFFFFFFFu;
inline constexpr uint32_t kMaxSessions = 4096;  // LowerOptions::sessions
// LowerOptions::kv_pool 0: this many contexts of positions (bluec, the C API).
inline constexpr uint32_t kDefaultKvPoolContexts = 8;

// How an embedding pools a prompt's hidden states (after the output norm) into one vector, as
// llama.cpp's `<arch>.pooling_type` numbers them: mean over the tokens, the first token's (CLS), the
// last token's. None: the program has no embed block and embeddings are refused. (Its RANK, a
// reranker's classification head, is not supported.)
enum class Pooling : uint8_t { None = 0, Mean = 1, Cls = 2, Last = 3 };
const char* poolingName(Pooling p);  // "none", "mean", "cls", "last"
// "none", "mean", "cls", "last" (a --pooling value); nullopt for anything else.
std::optional<Pooling> parsePooling(std::string_view name);
// The file's `<arch>.pooling_type` (None when absent, and for 4, a reranker's); fails on values
// llama.cpp does not define, naming the key and the value.
Result<Pooling> poolingOf(const GgufFile& gguf, const ModelConfig& config);

struct LowerOptions {
    uint32_t ctx = 0;        // context length per instance (0: min(trained context, 2048))
    uint32_t max_rows = 0;   // rows one forward step takes over all instances (0: 512)
    uint32_t chunk = 0;      // prompt tokens one instance prefills per step (0: 128)
    uint32_t in_slots = 64;  // requests waiting in the input ring
    // Words of a request's grammar automaton an instance holds (structured output, SAMPLEG;
    // vm/llm_abi.h BLUE_GR_*): 0 lowers plain SAMPLE and refuses grammars. The input slots grow
    // by as much.
    uint32_t grammar_words = kDefaultGrammarWords;
    DType kv_type = DType::F16;
    // Embeddings: an `embed` forward block pooling as this says (nullopt: the file's pooling type).
    std::optional<Pooling> pooling;
    // Session slots (vm/llm_abi.h BLUE_REQ_SESSION): conversations whose tokens and KV rows the
    // program keeps in a GLOBAL store between requests, on whichever instance takes each turn.
    // Each slot holds a whole context of KV rows (as much as an instance's caches). 0: none.
    uint32_t sessions = 0;
    // Paged KV caches (vm/kv_pages_abi.h, compiler/lower_kv_pages.cpp): each layer's K and V rows
    // in GLOBAL pools of kv_pool positions that all instances share, in pages of kv_page positions
    // (a power of two from 8 to 32), taken by a request as it writes them and given back when it
    // ends. 0: per-instance caches of ctx positions (the layout without paging). kv_pool 0:
    // kv_pool_contexts x ctx; rounded up to whole pages, at least one full context.
    // Not yet with sessions, prefix reuse (requests recompute their prompts) or KV snapshots.
    uint32_t kv_page = 0;
    uint32_t kv_pool = 0;
    uint32_t kv_pool_contexts = kDefaultKvPoolContexts;  // kv_pool 0: this many contexts
    // The GGUF path as the module records it (relative to the module's folder, or absolute).
    std::string model_path;
};

// The pools LowerOptions ask for with context `ctx` and KV rows of `row_bytes`: positions a page
// and pages (both 0: no paging). Fails, with the numbers, for a page size that is not 8, 16 or 32,
// a pool smaller than one request of the full context, a pool past a tensor's 4 GiB, a page
// state past the heap, or sessions with paging.
struct KvPaging {
    uint32_t page = 0, pages = 0;
};
Result<KvPaging> kvPaging(const LowerOptions& options, uint32_t ctx, uint64_t row_bytes);

// Lowers a validated model. Fails for architectures or features the forward block does not
// implement yet (MoE, YaRN), naming them.
Result<Module> lowerModel(const GgufFile& gguf, const ModelConfig& config, const LowerOptions& options);

// Fails, naming the feature, for models the forward block does not implement yet.
Status checkLowerable(const ModelConfig& config);

class CodeBuilder;
// What a forward block ends with. Sample: the last row of each instance through the LM head and
// SAMPLE. SampleQ: the same with SAMPLEQ, which also writes the distribution drawn from into row
// local[sampling + BLUE_SP_ROW] of `table` (a speculative draft). Verify: every row's logits and
// SPEC against `table` (a speculative target; the block takes BLUE_FA_SPEC as a fifth argument).
// Score: every row's logits and SCORE into `table` (an INSTANCE [1] result: the log-likelihood
// of the rows' tokens after the first).
// Embed: the output norm of every row (last pooling: of the last row) pooled by POOL into the
// INSTANCE tensor `pooled` [n_embd]; no LM head (`table` is the Pooling).
enum class ForwardHead { Sample, SampleQ, Verify, Score, Embed };

// Adds one model's forward block (vm/llm_abi.h: BLUE_FA_* arguments) and its tensors to `m`:
// weights read from extern `extern_index`, activations and KV caches (`ctx` positions, `kv_type`)
// of its own; every tensor and the block are named with `prefix` first, so several models can
// share a module, and blocks added for the same prefix share that model's tensors (one KV cache
// for its plain, draft and verify blocks). Returns the block's index. The model must pass
// checkLowerable.
uint32_t addForwardBlock(Module& m, CodeBuilder& cb, const GgufFile& gguf, const ModelConfig& config,
                         DType kv_type, uint32_t ctx, uint32_t extern_index, const std::string& prefix,
                         ForwardHead head = ForwardHead::Sample, uint32_t table = 0xFFFFFFFFu);

// The model's end-of-generation tokens (eos, eot, eom as its metadata names them).
std::vector<uint32_t> endOfGenerationTokens(const GgufFile& gguf, const ModelConfig& config);

// Module metadata keys the host reads.
inline constexpr const char* kMetaKind = "blue.kind";          // "llm-generate"
inline constexpr const char* kMetaCtx = "llm.context";         // decimal
inline constexpr const char* kMetaArch = "llm.architecture";
inline constexpr const char* kMetaRequest = "llm.request";     // BLUE_REQ_LAYOUT, decimal
inline constexpr const char* kMetaGrammarWords = "llm.grammar_words";  // LowerOptions::grammar_words
inline constexpr const char* kMetaPooling = "llm.pooling";     // poolingName; absent: none
inline constexpr const char* kMetaSessions = "llm.sessions";   // LowerOptions::sessions; absent: 0
inline constexpr const char* kMetaKvPage = "llm.kv_page";     // LowerOptions::kv_page; absent: 0
inline constexpr const char* kMetaKvPages = "llm.kv_pages";   // pages in each pool (paged only)

// The model's token bytes as SAMPLEG reads them (vm/llm_abi.h BLUE_TB_*): one info word per
// token, then the bytes of the text tokens as decoding writes them.
class Tokenizer;
std::vector<uint32_t> tokenBytesTable(const Tokenizer& tokenizer, uint32_t vocab);

// Checks that `m` (read from `path`, untrusted) is a generation program this build runs: its kind,
// the model file it names, its request layout (BLUE_REQ_LAYOUT) and its context length, which it
// returns. Messages name the file.
Result<uint32_t> checkGenerationModule(const Module& m, const std::string& path);

}  // namespace blue
