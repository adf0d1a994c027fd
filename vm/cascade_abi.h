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
#define BLUE_CAS_ST_CHOICE 10   // select stages: the option written (0-based)
#define BLUE_CAS_STAGE_WORDS 11

#define BLUE_CAS_STATE_NOT_REACHED 0  // control never came to the stage
#define BLUE_CAS_STATE_RAN 1
#define BLUE_CAS_STATE_SKIPPED 2      // its `skip if` held
#define BLUE_CAS_STATE_NO_BUDGET 3    // the request's token budget was spent

// ---- the output ring, per request ---------------------------------------------------------------
// OUTBEGIN tag; then for every stage in declaration order: OUTU state, OUTU tokens, OUTF entropy
// sum, OUTF entropy max, OUTF log-probability sum, OUTU cycles, OUTU runs, OUTU drafted, OUTU
// accepted, OUTU target passes, OUTU choice; then for every slot
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
#define BLUE_CAS_OUT_STAGE_RECORDS 11
#define BLUE_CAS_CHECKPOINT_MARKER "cascade.checkpoint"
#define BLUE_CAS_CKPT_FIXED 5  // records before the loop counters: marker, step, stage, runs, total

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
