// Internal to the model compiler (lower_model.cpp, lower_generate.cpp): the Lowering state that
// declares a model's tensors and emits its blocks and generation program, the generation
// program's registers and the instance-memory addresses it uses. Not a public interface.
#pragma once

#include <bit>
#include <cassert>
#include <map>
#include <string>

#include "compiler/asm.h"
#include "compiler/code_builder.h"
#include "compiler/lower_model.h"
#include "vm/abi.h"
#include "vm/kv_pages_abi.h"
#include "vm/llm_abi.h"

namespace blue::lower_model {

constexpr uint32_t kNone = 0xFFFFFFFFu;
// Heap words of claimRequest: per input slot, the tag + 1 of the message first seen there, and the
// cycle it was first seen in (in_slots words after).
constexpr uint32_t kSeenTagHeap = 0;
// A grammar automaton of more words than this is copied into the instance in a cycle of its own.
constexpr uint32_t kGrammarCopyAlone = 4096;

inline uint32_t floatBits(float f) { return std::bit_cast<uint32_t>(f); }

// Registers of the generation program.
enum Reg : uint8_t {
    kSlot = 1, kTmp, kTmp2, kPrompt, kMaxNew, kTag, kPos, kGenerated, kCtx, kChunk, kMinus1,
    kTok, kI, kN, kWord, kHist, kNStop, kFlags, kArgRows = 20, kArgPos, kArgTokens, kArgSampling, kIid, kCancelMark, kFlagWord,
    kStart, kLp, kReuse, kEmbed, kSess,
    // Paged KV (lower_kv_pages.cpp): pages the page table maps, pages reserved but not taken yet,
    // and scratch of the allocation and release loops.
    kHeld, kLeft, kPage, kProbe, kAddr, kOld, kOne,
    // The prefix index: the key hash of the pages before kJ (the next page looked up) and of page
    // kJ, the parent a page's key names and its generation, pages to publish and the next to mark
    // ready, a page's state, the constant 8, a bucket, whether an insert may still give way, and
    // whether the pages published so far form an unbroken chain (more may follow).
    kH, kHNext, kParent, kPgen, kJ, kPubEnd, kReady, kS, kEight, kB, kMayYield, kChain,
};
// Registers of a paged program (an unpaged one keeps 32: its module is as before paging).
constexpr uint32_t kPagedRegs = 51;

// Where SAMPLE writes the top log-probabilities: after the history.
inline uint32_t topLogprobsAddr(uint32_t ctx) { return BLUE_LM_HISTORY + ctx; }
// The word after them: positions whose KV rows match the history (vm/llm_abi.h).
inline uint32_t kvValidAddr(uint32_t ctx) { return topLogprobsAddr(ctx) + 2 * BLUE_MAX_TOP_LOGPROBS; }
// The word after it: the first position whose KV row and token a session save writes (those
// before it came from the slot unchanged).
inline uint32_t sessionFromAddr(uint32_t ctx) { return kvValidAddr(ctx) + 1; }
// Paged KV: the page table, ceil(ctx / PS) words after it (local_words grows by as many).
inline uint32_t pageTableAddr(uint32_t ctx) {
    assert(sessionFromAddr(ctx) + 1 == BLUE_KVP_PAGE_TABLE(ctx));
    return BLUE_KVP_PAGE_TABLE(ctx);
}

// The labels of the generation program, made in one place so the pieces below share them.
struct GenLabels {
    CodeBuilder::Label next, halt, copy_params, copy_stop, prefill, gen, finish, chunk_ok, eog_loop, stop_loop,
        emit, reject;
};

struct Lowering {
    const GgufFile& gguf;
    const ModelConfig& cfg;
    DType kv_type;
    Module& m;
    std::string prefix;         // before every tensor and block name (several models in one module)
    uint32_t extern_index = 0;  // the model's file among the module's externs
    std::map<std::string, uint32_t> ids;
    uint32_t grammar = kNone, token_bytes = kNone;  // SAMPLEG's operands (structured output)
    Pooling pooling = Pooling::None;                  // embeddings: the embed block pools so
    uint32_t embed_block = kNone, pooled = kNone;     // ... and writes `pooled`
    uint32_t sessions = 0;                            // session slots (LowerOptions::sessions)
    uint32_t session_tokens = kNone, session_load = kNone, session_save = kNone;
    // Paged KV (LowerOptions::kv_page; 0: per-instance caches): positions a page, pages in the
    // pools, and the heap word where the page state starts (vm/kv_pages_abi.h).
    uint32_t kv_page = 0, kv_pages = 0, kv_heap = 0;

    // A WEIGHT tensor read from the GGUF file, by its GGUF name.
    uint32_t weight(const std::string& name) {
        if (auto it = ids.find(prefix + name); it != ids.end()) return it->second;
        const GgufTensor* g = gguf.findTensor(name);
        assert(g && "modelConfigFromGguf checked the tensor exists");
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = g->type;
        t.cls = BLUE_TC_WEIGHT;
        t.ndim = g->n_dims;
        for (uint32_t d = 0; d < 4; ++d) t.ne[d] = uint64_t(g->ne[d]);
        t.source = DataSource::EXTERN;
        t.extern_index = extern_index;
        t.offset = g->offset;
        t.bytes = g->n_bytes;
        return add(t);
    }
    uint32_t layerWeight(uint32_t layer, const char* name) {
        return weight("blk." + std::to_string(layer) + "." + name);
    }
    // Rows [row0, row0 + rows) of a fused matrix as a WEIGHT of its own (the rows are contiguous
    // in every type, so this is a narrower view of the same file bytes).
    uint32_t layerWeightRows(uint32_t layer, const char* name, uint64_t row0, uint64_t rows) {
        std::string gname = "blk." + std::to_string(layer) + "." + name;
        std::string view = gname + strFormat("[%llu:%llu]", (unsigned long long)row0, (unsigned long long)(row0 + rows));
        if (auto it = ids.find(prefix + view); it != ids.end()) return it->second;
        const GgufTensor* g = gguf.findTensor(gname);
        assert(g && "modelConfigFromGguf checked the tensor exists");
        uint64_t row_bytes = *dtypeRowBytes(g->type, uint64_t(g->ne[0]));
        TensorDecl t;
        t.name = prefix + view;
        t.dtype = g->type;
        t.cls = BLUE_TC_WEIGHT;
        t.ndim = 2;
        t.ne[0] = uint64_t(g->ne[0]);
        t.ne[1] = rows;
        t.source = DataSource::EXTERN;
        t.extern_index = extern_index;
        t.offset = g->offset + row0 * row_bytes;
        t.bytes = rows * row_bytes;
        return add(t);
    }
    bool hasTensor(const std::string& name) const { return gguf.findTensor(name) != nullptr; }
    // A constant WEIGHT vector the compiler computes, stored in the module's DATA section.
    template <typename T>
    uint32_t constant(const std::string& name, DType type, const std::vector<T>& values) {
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = type;
        t.cls = BLUE_TC_WEIGHT;
        t.ne[0] = values.size();
        appendTensorData(&m, &t, values.data(), values.size() * sizeof(T));
        return add(t);
    }
    // YaRN's per-pair frequency divisors, computed here from the config: one DATA tensor every
    // layer's ROPE shares.
    uint32_t yarnDivisors() {
        if (auto it = ids.find(prefix + "rope_yarn_divisors"); it != ids.end()) return it->second;
        return constant("rope_yarn_divisors", DType::F32, yarnFreqDivisors(cfg));
    }

    uint32_t activation(const std::string& name, uint32_t cls, DType type,
                        std::initializer_list<uint64_t> dims) {
        if (auto it = ids.find(prefix + name); it != ids.end()) return it->second;  // another block's
        TensorDecl t;
        t.name = prefix + name;
        t.dtype = type;
        t.cls = cls;
        t.ndim = uint32_t(dims.size());
        uint32_t d = 0;
        for (uint64_t n : dims) t.ne[d++] = n;
        return add(t);
    }
    uint32_t add(const TensorDecl& t) {
        m.tensors.push_back(t);
        return ids[t.name] = uint32_t(m.tensors.size() - 1);
    }

    uint32_t forwardBlock(CodeBuilder& cb, uint32_t ctx, ForwardHead head = ForwardHead::Sample, uint32_t table = kNone);
    void attention(CodeBuilder& cb, uint32_t layer, uint32_t ctx, const std::map<std::string, uint32_t>& a);
    void experts(CodeBuilder& cb, uint32_t layer, const std::map<std::string, uint32_t>& a);
    void feedForward(CodeBuilder& cb, uint32_t layer, const std::map<std::string, uint32_t>& a);
    void sessionBlocks(CodeBuilder& cb, uint32_t ctx);
    // The generation program (lower_generate.cpp) and its pieces, in program order.
    void generationProgram(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk);
    void requestParams(CodeBuilder& cb, uint32_t ctx, const GenLabels& g);
    void promptSection(CodeBuilder& cb, const GenLabels& g);
    void prefixReuse(CodeBuilder& cb, uint32_t ctx);
    void prefill(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t chunk, const GenLabels& g);
    void decode(CodeBuilder& cb, uint32_t block, uint32_t ctx, uint32_t eog_at, const GenLabels& g);
    void finishRequest(CodeBuilder& cb, uint32_t ctx, const GenLabels& g);
    // Paged KV (lower_kv_pages.cpp).
    void pagedCaches(CodeBuilder& cb, uint32_t layer, uint32_t ctx, const std::map<std::string, uint32_t>& a,
                     uint32_t qscale, uint32_t window, uint32_t softcap);
    void admitPages(CodeBuilder& cb, uint32_t ctx, const GenLabels& g);
    void sharePrefix(CodeBuilder& cb, uint32_t ctx);
    void storedSession(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label done);
    void indexPage(CodeBuilder& cb, CodeBuilder::Label indexed, CodeBuilder::Label failed,
                   CodeBuilder::Label give_way);
    void publishAnswer(CodeBuilder& cb, uint32_t ctx);
    void takePage(CodeBuilder& cb, uint32_t ctx);
    void pageTaken(CodeBuilder& cb, uint32_t ctx, bool map);
    void ensurePages(CodeBuilder& cb, uint32_t ctx, const GenLabels& g);
    void markReady(CodeBuilder& cb, uint32_t ctx);
    void releasePages(CodeBuilder& cb, uint32_t ctx);
    uint32_t kvArray(uint32_t offset) const { return kv_heap + offset; }  // a heap address
    void claimRequest(CodeBuilder& cb, uint32_t ctx, CodeBuilder::Label halt);
    void loadSession(CodeBuilder& cb, uint32_t ctx);
    void loadSessionRows(CodeBuilder& cb, uint32_t ctx);
    void saveSession(CodeBuilder& cb, uint32_t ctx);
    void unlessStored(CodeBuilder& cb, CodeBuilder::Label skip);
};

}  // namespace blue::lower_model
