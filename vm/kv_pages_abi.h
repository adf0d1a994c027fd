// Paged KV caches (LowerOptions::kv_page): where the generation program keeps its page state, for
// the compiler that writes that program (compiler/lower_kv_pages.cpp), the host that reads its
// counters after a run (host/llm/engine.cpp) and the tests. Plain #defines.
//
// The state lives in the heap from word BLUE_KVP_BASE(in_slots), after claimRequest's marks
// (a tag and a cycle per input slot): a header of BLUE_KVP_HEADER_WORDS words, then one state
// word per page (0 free, 1 held by an instance). Each instance's page table (one page id per PS
// positions, 0xFFFFFFFF unmapped) is in its local memory, not here.
#ifndef BLUE_VM_KV_PAGES_ABI_H
#define BLUE_VM_KV_PAGES_ABI_H

#define BLUE_KVP_BASE(in_slots) (2u * (in_slots))
#define BLUE_KVP_COMMITTED 0  // pages admitted requests reserved: held plus still to take
#define BLUE_KVP_CLOCK 1      // the allocation sweep's hand (a counter; the page is it mod NP)
#define BLUE_KVP_IN_USE 2     // pages held now
#define BLUE_KVP_PEAK 3       // most pages held at once
#define BLUE_KVP_HEADER_WORDS 8
#define BLUE_KVP_STATE BLUE_KVP_HEADER_WORDS  // [NP] page states
#define BLUE_KVP_HEAP_WORDS(pages) (BLUE_KVP_HEADER_WORDS + (pages))

#define BLUE_KVP_MIN_PAGE 8u  // positions per page: a power of two in [8, 32] (the pool ops')
#define BLUE_KVP_MAX_PAGE 32u
// Allocation probes one instance makes in one cycle before it yields (the sweep goes on next
// cycle); a free page exists whenever an admitted request needs one.
#define BLUE_KVP_PROBES 16u

#endif  // BLUE_VM_KV_PAGES_ABI_H
