// The contract between a cascade program (compiler/cascade/lower.cpp) and the host that feeds it
// tasks and reads its results (host/cascade/): the request message, the per-instance local-memory
// layout and the output-ring protocol. Plain #defines, like vm/llm_abi.h (whose sampling block
// the cascade reuses at local address 0).
#ifndef BLUE_VM_CASCADE_ABI_H
#define BLUE_VM_CASCADE_ABI_H

// ---- a task: one input-ring message (u32 words) ---------------------------------------------
#define BLUE_CAS_REQ_TAG 0     // request id, echoed by OUTBEGIN/OUTEND
#define BLUE_CAS_REQ_SEED 1    // the request's seed; stage runs derive theirs from it
#define BLUE_CAS_REQ_FLAGS 2   // 0, or BLUE_CAS_REQ_RESUME (the program takes any nonzero value as it)
#define BLUE_CAS_REQ_HEADER 3  // then the resume block (with BLUE_CAS_REQ_RESUME), then the task's
                               // tokens to the message end (they become the `input` slot)
#define BLUE_CAS_REQ_RESUME 1u // continue a request from a checkpoint (durable slots)

// The resume block (words; sizes from the module's `cascade.loops` metadata and CascadeInfo):
//   step id (the checkpoint's; the program continues right after that stage statement),
//   stage runs so far (kRuns, which seeds the next stage run), tokens generated (kTotal),
//   one word per loop nesting level (the loop counters, outermost first),
//   every stage's BLUE_CAS_STAGE_WORDS statistics in declaration order,
//   every slot but `input` in declaration order: its length, then its full capacity in tokens
//   (words past the length are ignored).
#define BLUE_CAS_RESUME_STEP 0
#define BLUE_CAS_RESUME_RUNS 1
#define BLUE_CAS_RESUME_TOTAL 2
#define BLUE_CAS_RESUME_LOOPS 3

// ---- per-instance local memory -----------------------------------------------------------------
// [0, BLUE_SP_WORDS)               the sampling block (vm/llm_abi.h)
// then per stage BLUE_CAS_STAGE_WORDS words of statistics (below)
// then, when a stage speculates, the speculation block SPEC writes (BLUE_SPEC_WORDS)
// then per slot: one length word, then its capacity in tokens (slot 0 is `input`)
// then the history the running stage prefills and extends (its model's context)
#define BLUE_CAS_ST_STATE 0     // BLUE_CAS_STATE_*
#define BLUE_CAS_ST_TOKENS 1    // tokens the last run generated
#define BLUE_CAS_ST_ENT_SUM 2   // f32: sum of those tokens' entropies (nats)
#define BLUE_CAS_ST_ENT_MAX 3   // f32: the largest of them
#define BLUE_CAS_ST_LP_SUM 4    // f32: sum of their log-probabilities
#define BLUE_CAS_ST_CYCLES 5    // VM cycles the last run took
#define BLUE_CAS_ST_RUNS 6      // times the stage ran for this request
#define BLUE_CAS_ST_DRAFTED 7   // speculative stages: draft tokens proposed in the last run
#define BLUE_CAS_ST_ACCEPTED 8  // of which the target accepted
#define BLUE_CAS_ST_PASSES 9    // target forward passes (verifications) after the prefill
#define BLUE_CAS_ST_CHOICE 10   // select stages: the option written; fork stages: the branch kept (0-based)
#define BLUE_CAS_ST_BRANCHES 11 // fork stages: branches of the last run (0: not a fork)
#define BLUE_CAS_ST_SIBLINGS 12 // of which sibling instances ran (the rest ran on the request's own)
#define BLUE_CAS_ST_BRANCH_TOKENS 13  // tokens all branches generated (ST_TOKENS: the kept one's)
#define BLUE_CAS_STAGE_WORDS 14

#define BLUE_CAS_STATE_NOT_REACHED 0  // control never came to the stage
#define BLUE_CAS_STATE_RAN 1
#define BLUE_CAS_STATE_SKIPPED 2      // its `skip if` held
#define BLUE_CAS_STATE_NO_BUDGET 3    // the request's token budget was spent

// ---- the output ring, per request ---------------------------------------------------------------
// OUTBEGIN tag; then for every stage in declaration order: OUTU state, OUTU tokens, OUTF entropy
// sum, OUTF entropy max, OUTF log-probability sum, OUTU cycles, OUTU runs, OUTU drafted, OUTU
// accepted, OUTU target passes, OUTU choice, OUTU branches, OUTU sibling branches, OUTU branch
// tokens; then for every slot
// but `input` in declaration order: OUTU length and that many OUTT tokens; then OUTEND tag.
// A cancelled request (host flag word = tag + 1) ends early with OUTEND alone after OUTBEGIN.
//
// Checkpoints: between OUTBEGIN and the final records, after every stage statement that ran,
// was skipped or found no budget, the program writes one checkpoint:
//   OUTS BLUE_CAS_CHECKPOINT_MARKER (a constant-pool string; no other record of the protocol is
//   a string), OUTU step id (1..`cascade.steps`, unique per stage statement of the source, in
//   source order), OUTU stage index, OUTU stage runs so far (kRuns), OUTU tokens generated so far
//   (kTotal), OUTU per loop nesting level (`cascade.loops` of them) its counter, the stage's
//   BLUE_CAS_OUT_STAGE_RECORDS statistics records (as in the final records), OUTU the index of the slot the stage writes
//   (0: the first slot after `input`), OUTU its length and that many OUTT tokens.
// Replaying the checkpoints in order rebuilds the whole state a resume request carries.
#define BLUE_CAS_OUT_STAGE_RECORDS 14
#define BLUE_CAS_CHECKPOINT_MARKER "cascade.checkpoint"
#define BLUE_CAS_CKPT_FIXED 5  // records before the loop counters: marker, step, stage, runs, total

// ---- fork and join: the heap (modules with a `fork` stage) ------------------------------------
// A fork stage's branches run at once as sibling instances. heap[BLUE_CAS_HEAP_ACTIVE] counts the
// requests in progress (an idle instance halts once the input is closed and it is 0). Then
// `cascade.fork_records` fork records of `cascade.fork_record_words` words from
// BLUE_CAS_HEAP_FORKS. A request's instance takes a free record (CAS of STATE 0 -> 1), writes
// the branch parameters and the prompt, and a cycle later opens it (NEXT = 0); every instance
// (idle ones, and the request's own) claims branches with an atomic add on NEXT and runs them;
// a sibling writes its branch's result into the record and SENDs the branch index to the
// request's instance, which joins once all K are in and frees the record (STATE = 0; NEXT stays
// >= K, so a late claim takes nothing).
#define BLUE_CAS_HEAP_ACTIVE 0
#define BLUE_CAS_HEAP_FORKS 1
#define BLUE_CAS_FORK_STATE 0    // 0 free, 1 taken
#define BLUE_CAS_FORK_NEXT 1     // the next branch to claim (>= K: none)
#define BLUE_CAS_FORK_K 2        // branches
#define BLUE_CAS_FORK_STAGE 3    // the stage whose branch code runs
#define BLUE_CAS_FORK_PARENT 4   // the instance that forked (gets the mailbox messages)
#define BLUE_CAS_FORK_MARK 5     // its cancel mark (the host flag word value that cancels)
#define BLUE_CAS_FORK_SEED 6     // the stage run's seed; branch b draws from SEED + b * 0x85EBCA6B
#define BLUE_CAS_FORK_CAP 7      // tokens each branch may generate
#define BLUE_CAS_FORK_PLEN 8     // prompt tokens
#define BLUE_CAS_FORK_HEADER 9   // then per branch BLUE_CAS_BRANCH_WORDS + max_tokens, then the prompt
#define BLUE_CAS_BR_TOKENS 0     // tokens generated
#define BLUE_CAS_BR_ENT_SUM 1    // f32, as the stage statistics
#define BLUE_CAS_BR_ENT_MAX 2
#define BLUE_CAS_BR_LP_SUM 3
#define BLUE_CAS_BR_FINISH 4     // the cycle it finished in
#define BLUE_CAS_BR_BY_SIBLING 5 // 1 when a sibling instance ran it
#define BLUE_CAS_BR_LEN 6        // tokens kept (stop strings removed), then the tokens
#define BLUE_CAS_BRANCH_WORDS 7

// ---- more output-ring records: streamed text and stage times -------------------------------
// Streamed answer text: between OUTBEGIN and the final records, the program writes
//   OUTS BLUE_CAS_STREAM_MARKER, OUTU n, then n OUTT tokens
// whenever the stream slot (`cascade.stream` metadata: the last `output` slot) grew by tokens
// that are final: written by a stage statement after which no replacing write of the slot
// (`write SLOT`, or a select stage writing it) can follow on any path, and no longer removable by
// a stop string (the last (longest stop's tokens - 1) tokens of a run are held back until the
// run ends). Each record continues the previous ones: together they are a prefix of the slot's
// final tokens (the first of them catches up with what an earlier, non-final write left there).
// Statements that are not final stream nothing; their text arrives with the final records.
// A resumed request (durable slots) starts its stream again from the slot's first token.
#define BLUE_CAS_STREAM_MARKER "cascade.stream"

// Stage time: after every run of a stage (not a skip), the program writes
//   OUTS BLUE_CAS_STAGE_TIME_MARKER, OUTU stage index, OUTU the VM cycle the run started in,
//   OUTU the cycles it took (as BLUE_CAS_ST_CYCLES)
// so the host can map the run onto the times it measured for the chains that ran those cycles
// (the GPU has no portable clock; --stats prints the result as `ms`).
#define BLUE_CAS_STAGE_TIME_MARKER "cascade.stage_time"
#define BLUE_CAS_STAGE_TIME_RECORDS 4  // marker, stage, start cycle, cycles

#endif  // BLUE_VM_CASCADE_ABI_H
