// Paged KV caches (LowerOptions::kv_page): where the generation program keeps its page state, for
// the compiler that writes that program (compiler/lower_kv_pages.cpp), the host that reads its
// counters (host/llm/engine.cpp, serving.cpp) and the tests. Plain #defines and one helper.
//
// The state lives in the heap from word BLUE_KVP_BASE(in_slots), after claimRequest's marks
// (a tag and a cycle per input slot): a header of BLUE_KVP_HEADER_WORDS words, then arrays of NP
// words (one per page: its state, generation, key and bucket), each page's PS key tokens, and the
// prefix index, an open-addressed table of blueKvpBuckets(NP) entries (page + 1; 0 empty, ~0
// a removed entry). Each instance's page table (one page id per PS positions, 0xFFFFFFFF
// unmapped) is in its local memory, not here.
//
// A page's key is (its parent page, that parent's generation when the key was written, its PS
// tokens): the page holds the KV rows of those tokens after the chain of pages from the root
// (page 0 of a sequence has parent BLUE_KVP_ROOT). A page's generation goes up every time it is
// taken, so the child of a page that was reused for other rows never matches again.
#ifndef BLUE_VM_KV_PAGES_ABI_H
#define BLUE_VM_KV_PAGES_ABI_H

#include "vm/llm_abi.h"

#define BLUE_KVP_BASE(in_slots) (2u * (in_slots))
// Each instance's page table, in its local memory: after the history, the top log-probabilities,
// the valid-rows word and the session word (compiler/lower_model_internal.h; the host writes it
// when it restores a KV snapshot into pages 0..n-1).
#define BLUE_KVP_PAGE_TABLE(ctx) (BLUE_LM_HISTORY + (ctx) + 2u * BLUE_MAX_TOP_LOGPROBS + 2u)
// Header. The first BLUE_IO_SNAP3_WORDS (4) are the ones every chain copies to the host
// (GpuOptions::heap_watch): /metrics reads them.
#define BLUE_KVP_COMMITTED 0  // pages held by requests plus pages admitted requests may still take
#define BLUE_KVP_EVICTIONS 1  // cached pages of the prefix index taken for other rows
#define BLUE_KVP_IN_USE 2     // pages held now (shared pages once)
#define BLUE_KVP_PEAK 3       // most pages held at once
#define BLUE_KVP_CLOCK 4      // the allocation sweep's hand (a counter; the page is it mod NP)
#define BLUE_KVP_HEADER_WORDS 8
// The arrays, as word offsets from the state's start.
#define BLUE_KVP_STATE(np) (BLUE_KVP_HEADER_WORDS)
#define BLUE_KVP_GEN(np) (BLUE_KVP_HEADER_WORDS + (np))
#define BLUE_KVP_PARENT(np) (BLUE_KVP_HEADER_WORDS + 2u * (np))
#define BLUE_KVP_PGEN(np) (BLUE_KVP_HEADER_WORDS + 3u * (np))
#define BLUE_KVP_HASH(np) (BLUE_KVP_HEADER_WORDS + 4u * (np))
#define BLUE_KVP_BUCKET(np) (BLUE_KVP_HEADER_WORDS + 5u * (np))
#define BLUE_KVP_TOKENS(np) (BLUE_KVP_HEADER_WORDS + 6u * (np))
#define BLUE_KVP_TABLE(np, ps) (BLUE_KVP_HEADER_WORDS + (6u + (ps)) * (np))
#define BLUE_KVP_HEAP_WORDS(np, ps) (BLUE_KVP_TABLE(np, ps) + blueKvpBuckets(np))

// A page's state word: how many requests hold it, and three flags.
#define BLUE_KVP_REFS 0x00FFFFFFu
#define BLUE_KVP_INDEXED 0x01000000u  // in the prefix index: its key is written
#define BLUE_KVP_READY 0x02000000u    // its rows are computed: others may take it (else pending)
#define BLUE_KVP_RECENT 0x04000000u   // taken from the index since the sweep last passed
#define BLUE_KVP_ROOT 0xFFFFFFFFu     // the parent of a sequence's first page
#define BLUE_KVP_HASH_SEED 2166136261u

#define BLUE_KVP_MIN_PAGE 8u  // positions per page: a power of two in [8, 32] (the pool ops')
#define BLUE_KVP_MAX_PAGE 32u
// Allocation probes one instance makes in one cycle before it yields (the sweep goes on next
// cycle); a free or cached page exists whenever an admitted request needs one.
#define BLUE_KVP_PROBES 16u
// Entries of the prefix index a lookup or an insert looks at, from the key's bucket on.
#define BLUE_KVP_TABLE_PROBES 8u

// Entries of the prefix index: the power of two at least 2 x NP (at least 16). In 64 bits, so
// the compiler can size a pool of any page count before it refuses one too large for the heap.
static inline unsigned long long blueKvpBuckets(unsigned long long np) {
    unsigned long long b = 16u;
    while (b < 2u * np) b *= 2u;
    return b;
}

#endif  // BLUE_VM_KV_PAGES_ABI_H
