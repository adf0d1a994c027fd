// Engine: KV persistence of a conversation (see engine.h KvRun and host/memory/kv_snapshot.h).
// Restoring writes the snapshot's token ids into the instance's history and its rows into every
// layer's K and V cache before the run; the request's start position tells the program to go on
// from there. Saving reads them back after the run. Both happen while nothing is submitted: the
// host moves I/O and never decides what runs. With a paged KV cache the rows go into pool pages
// 0..n-1 of a fresh machine, mapped in order in instance 0's page table (the program takes
// those pages as the request's own), and are read back through that table; the file is the same
// either way, so a snapshot of one loads into the other.
#include <algorithm>
#include <cstring>

#include "host/llm/engine.h"
#include "vm/kv_pages_abi.h"
#include "vm/llm_abi.h"

namespace blue {

std::vector<uint32_t> Engine::kvCaches() const {
    std::vector<uint32_t> out;
    for (uint32_t l = 0; l < config_.n_layer; ++l) {
        for (const char* kind : {"k", "v"}) {
            const std::string name = kind + std::string(kv_page_ ? "pool." : "cache.") + std::to_string(l);
            for (uint32_t t = 0; t < module_.tensors.size(); ++t) {
                if (module_.tensors[t].name == name) out.push_back(t);
            }
        }
    }
    return out;
}

KvLayout Engine::kvLayout() const {
    KvLayout l;
    l.model_hash = model_hash_;
    l.ctx = ctx_;
    std::vector<uint32_t> caches = kvCaches();
    l.caches = uint32_t(caches.size());
    if (!caches.empty()) {
        const TensorDecl& t = module_.tensors[caches[0]];
        l.type = t.dtype;
        l.row_elems = uint32_t(t.ne[0]);
    }
    return l;
}

std::vector<uint32_t> Engine::continuationTokens(const std::string& text, bool special) const {
    std::vector<uint32_t> out;
    for (int32_t id : tokenizer_.encode(text, false, special)) out.push_back(uint32_t(id));
    return out;
}

Result<KvSnapshot> Engine::readKv(const std::string& path) const {
    auto s = kvSnapshotRead(path);
    if (!s) return s.status();
    BLUE_TRY(kvSnapshotCheck(s.value(), kvLayout(), config_.n_vocab, path));
    return s;
}

Status Engine::writeKv(const KvSnapshot& s, const std::string& path) const {
    return kvSnapshotWrite(s, path);
}

Result<GenerationRequest> Engine::kvRequest(const GenerationRequest& in,
                                            const KvSnapshot& restore) const {
    BLUE_TRY(kvSnapshotCheck(restore, kvLayout(), config_.n_vocab, "the KV snapshot"));
    GenerationRequest r = in;
    const uint32_t n = uint32_t(restore.tokens.size());
    if (r.prompt.empty()) {  // go on generating: the last token again, at its own position
        r.prompt = {restore.tokens.back()};
        r.start = n - 1;
    } else {
        r.start = n;
    }
    return r;
}

Status Engine::kvRestore(GpuMachine& machine, const KvSnapshot& s, uint32_t positions) const {
    const KvLayout l = kvLayout();
    const std::vector<uint32_t> caches = kvCaches();
    std::span<const uint32_t> tokens(s.tokens.data(), positions);
    BLUE_TRY(machine.writeLocal(0, BLUE_LM_HISTORY, tokens));
    if (kv_page_) {  // pages 0..n-1 in order: position p's row is row p of the pool
        std::vector<uint32_t> table((positions + kv_page_ - 1) / kv_page_);
        for (uint32_t k = 0; k < table.size(); ++k) table[k] = k;
        BLUE_TRY(machine.writeLocal(0, BLUE_KVP_PAGE_TABLE(ctx_), table));
    }
    const uint64_t bytes = uint64_t(positions) * l.rowBytes();
    for (size_t c = 0; c < caches.size(); ++c) {
        BLUE_TRY(machine.writeInstanceTensor(caches[c], 0, 0,
                                             std::span<const uint8_t>(s.caches[c].data(), bytes)));
    }
    return Status::ok();
}

Status Engine::kvSave(GpuMachine& machine, KvSnapshot* out) const {
    uint32_t n = 0;
    BLUE_TRY(machine.readLocal(0, BLUE_LM_SAMPLING + BLUE_SP_HIST_LEN, std::span<uint32_t>(&n, 1)));
    if (n == 0) return Status::error("the run processed no tokens: there is no KV state to save");
    if (n > ctx_)
        return BLUE_ERROR("the instance reports %u positions, more than the context (%u)", n, ctx_);
    KvSnapshot s;
    s.layout = kvLayout();
    s.tokens.resize(n);
    BLUE_TRY(machine.readLocal(0, BLUE_LM_HISTORY, s.tokens));
    const std::vector<uint32_t> caches = kvCaches();
    const uint64_t row = s.layout.rowBytes(), bytes = uint64_t(n) * row;
    std::vector<uint32_t> table;
    if (kv_page_) {  // the finished request's page table: which page holds each PS positions
        table.resize((n + kv_page_ - 1) / kv_page_);
        BLUE_TRY(machine.readLocal(0, BLUE_KVP_PAGE_TABLE(ctx_), table));
        for (uint32_t k = 0; k < table.size(); ++k) {
            if (table[k] >= kv_pages_)
                return BLUE_ERROR("page table entry %u is %u; the pool has %u pages", k, table[k], kv_pages_);
        }
    }
    for (uint32_t t : caches) {
        s.caches.emplace_back(bytes);
        std::vector<uint8_t>& rows = s.caches.back();
        if (!kv_page_) {
            BLUE_TRY(machine.readInstanceTensor(t, 0, 0, rows));
            continue;
        }
        // One read per run of consecutive pages (a fresh machine's request takes pages in order,
        // so usually one read per tensor).
        for (uint32_t k = 0; k < table.size();) {
            uint32_t end = k + 1;
            while (end < table.size() && table[end] == table[end - 1] + 1) ++end;
            const uint64_t first = uint64_t(k) * kv_page_;
            const uint64_t count = std::min<uint64_t>(uint64_t(end - k) * kv_page_, n - first);
            BLUE_TRY(machine.readInstanceTensor(t, 0, uint64_t(table[k]) * kv_page_ * row,
                                                std::span<uint8_t>(rows.data() + first * row, count * row)));
            k = end;
        }
    }
    *out = std::move(s);
    return Status::ok();
}

}  // namespace blue
