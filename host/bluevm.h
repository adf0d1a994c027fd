/* BlueVM's public C API: serve a language model to many concurrent requests from C (or any
 * language with a C FFI). Opaque handles, status codes, no C++ types or exceptions cross it.
 *
 *   bluevm_model*  a GGUF model (or a .bir lowered from one) with its tokenizer, on a Vulkan device
 *   bluevm_engine* N instances of the generation program sharing the model's one copy of the
 *                  weights; requests are batched continuously on the GPU
 *   bluevm_cascade* N instances of a compiled cascade (several models, one result per task)
 *
 * Typical use:
 *
 *   bluevm_model* model; bluevm_engine* engine; uint64_t id;
 *   bluevm_model_options mo; bluevm_model_options_init(&mo);
 *   if (bluevm_model_open("m.gguf", &mo, &model) != BLUEVM_OK) puts(bluevm_last_error());
 *   bluevm_engine_options eo; bluevm_engine_options_init(&eo); eo.instances = 8;
 *   bluevm_engine_create(model, &eo, &engine);
 *   bluevm_request r; bluevm_request_init(&r); r.prompt = "Once upon a time"; r.max_tokens = 64;
 *   bluevm_submit(engine, &r, &id);
 *   for (bluevm_event ev;;) {
 *       bluevm_poll(engine, id, -1, &ev);         // waits for new text or the end
 *       fwrite(ev.text, 1, ev.text_len, stdout);
 *       if (ev.finished) break;
 *   }
 *   bluevm_release(engine, id);
 *   bluevm_engine_destroy(engine); bluevm_model_close(model);
 *
 * Threads: every function may be called from any thread. A model must outlive its engines.
 * Errors: a function that fails returns a status other than BLUEVM_OK and sets the calling
 * thread's message (bluevm_last_error), which names what is wrong.
 * Device loss: when the device is lost or runs out of memory while an engine serves, its running
 * and waiting requests end with BLUEVM_FINISH_ERROR and event.error BLUEVM_ERR_DEVICE_LOST (the
 * message names the Vulkan call and what was running); the engine rebuilds the device, the
 * machine and the weights by itself and serves again. Meanwhile bluevm_submit returns
 * BLUEVM_ERR_DEVICE_LOST and bluevm_engine_health reports BLUEVM_ENGINE_RECOVERING.
 */
#ifndef BLUEVM_H
#define BLUEVM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BLUEVM_API_VERSION 16
#define BLUEVM_GRAMMAR_WORDS_AUTO 0xFFFFFFFFu

typedef enum bluevm_status {
    BLUEVM_OK = 0,
    BLUEVM_ERR_INVALID_ARGUMENT = 1, /* a null pointer, an out-of-range parameter, a bad message */
    BLUEVM_ERR_IO = 2,               /* a file is missing or unreadable */
    BLUEVM_ERR_MODEL = 3,            /* the model is malformed or its architecture unsupported */
    BLUEVM_ERR_DEVICE = 4,           /* no Vulkan device, or the device failed or is too small */
    BLUEVM_ERR_TOO_LONG = 5,         /* the prompt does not fit the context */
    BLUEVM_ERR_QUEUE_FULL = 6,       /* too many requests waiting; retry later */
    BLUEVM_ERR_NOT_FOUND = 7,        /* an unknown (or released) request id */
    BLUEVM_ERR_TIMEOUT = 8,          /* bluevm_poll: nothing new within the timeout */
    BLUEVM_ERR_SHUTDOWN = 9,         /* the engine is stopping or has failed */
    BLUEVM_ERR_INTERNAL = 10,
    BLUEVM_ERR_DEVICE_LOST = 11, /* the device was lost or ran out of memory; an engine
                                   rebuilds it by itself (retry later); a failed
                                   bluevm_engine_create may simply be called again */
    BLUEVM_ERR_SNAPSHOT = 12,    /* (API 6) a KV snapshot is malformed, corrupt, of another
                                    format version or of another model */
    BLUEVM_ERR_BUSY = 13,        /* (API 11) the request's session has a turn running, or every
                                    session slot has one: send it after that turn ends */
    BLUEVM_ERR_GRAMMAR_TOO_LARGE = 14 /* (API 12) the request's grammar, json_schema or json_object
                                         needs more automaton words than an instance holds
                                         (bluevm_model_options.grammar_words) */
} bluevm_status;

/* "ok", "invalid argument", ... (static strings). */
const char* bluevm_status_name(bluevm_status s);
/* The calling thread's message for its last failed call ("" if none). Valid until its next call. */
const char* bluevm_last_error(void);
/* BLUEVM_API_VERSION of the library. */
int bluevm_api_version(void);

/* ---- models -------------------------------------------------------------------------------- */

typedef struct bluevm_model bluevm_model;

typedef struct bluevm_model_options {
    const char* device;  /* Vulkan device: index or part of its name; NULL picks the best */
    uint32_t ctx;        /* context per instance in tokens; 0: the model's, at most 2048 */
    int validation;      /* nonzero: the Khronos validation layer on (slow; for debugging) */
    uint64_t vram_budget; /* device-local bytes its engines may use; weights beyond stay in host
                             memory; 0: no limit (API version 6) */
    int host_weights;     /* with vram_budget: 1 the GPU reads them in host memory, 2 it streams
                             them into device memory ahead of use, 0 the device decides */
    uint32_t grammar_words; /* API 8: structured output, automaton words each instance holds
                               (bluevm_request.grammar...); default BLUEVM_GRAMMAR_WORDS_AUTO:
                               58368, or fewer where 16 instances' would not fit one device page
                               (1 MiB pages: 16384); 0: no grammars */
    int expert_cache;       /* API 9: MoE models with vram_budget: nonzero (the default) keeps
                               the experts in host memory and caches those the GPU's routing
                               picks in the device memory left; 0 treats them as other weights */
    const char* pooling;    /* API 11: embeddings (bluevm_request.embed): how a prompt's hidden
                               states (after the output norm) pool into one vector, "mean",
                               "cls" (the first token's), "last" or "none" (no embeddings);
                               NULL (the default): the file's <arch>.pooling_type, none without
                               it. A .bir keeps the pooling it was lowered with. */
    uint32_t sessions;      /* API 11: session slots (bluevm_request.session): conversations whose
                               tokens and KV rows the GPU keeps between their turns, each slot a
                               whole context of KV rows; 0 (the default): none. A .bir keeps the
                               count it was lowered with. */
    uint32_t kv_page;       /* API 13: paged KV, positions per page (8, 16 or 32): each layer's K and
                               V rows live in pools all instances share, taken by a request as it
                               writes them; 0 (the default): per-instance caches. Not yet with
                               sessions. A .bir keeps the layout it was lowered with. */
    uint32_t kv_pool;       /* API 13: paged KV, positions in each layer's pool; 0 (the default):
                               8 x ctx. A request waits until the pool holds its worst case. */
} bluevm_model_options;

void bluevm_model_options_init(bluevm_model_options* o);

/* Opens a GGUF model or a .bir lowered from one. */
bluevm_status bluevm_model_open(const char* path, const bluevm_model_options* options,
                                bluevm_model** out);
void bluevm_model_close(bluevm_model* model);

typedef struct bluevm_model_info {
    const char* name;          /* general.name, or the architecture */
    const char* architecture;  /* "llama", "qwen2", ... */
    const char* device;        /* the Vulkan device it runs on */
    uint32_t n_vocab, n_ctx, n_layer, n_embd;
    uint32_t validation_errors; /* Khronos validation errors so far (with validation on) */
    /* API 10: the chat template family the model's conversations are formatted with ("chatml",
       "llama3", "mistral-v7", ...; "" when the file's template is not one BlueVM knows). */
    const char* chat_template;
    /* API 11: how embeddings pool ("mean", "cls", "last"; "none": bluevm_request.embed is
       refused) */
    const char* pooling;
    uint32_t sessions;  /* API 11: session slots of the program (0: none) */
} bluevm_model_info;

/* Strings stay valid while the model is open. */
bluevm_status bluevm_model_get_info(const bluevm_model* model, bluevm_model_info* out);

/* Token ids of `text` (with BOS as the vocabulary asks when add_bos is nonzero). Writes at most
 * `capacity` ids and sets *count to the number the text has (call again with more room when it
 * is larger). */
bluevm_status bluevm_tokenize(const bluevm_model* model, const char* text, size_t text_len,
                              int add_bos, uint32_t* ids, size_t capacity, size_t* count);
/* API 16: bluevm_tokenize, and with parse_special nonzero the text of control and user-defined
 * tokens ("<|im_start|>", "[INST]", ...) becomes those tokens, as chat prompts are tokenized;
 * with 0 it is text, as bluevm_tokenize takes it. */
bluevm_status bluevm_tokenize_special(const bluevm_model* model, const char* text, size_t text_len, int add_bos,
                                      int parse_special, uint32_t* ids, size_t capacity, size_t* count);

/* API 6: the text of token ids, as generation streams it (SentencePiece drops one leading space
 * of the first piece; control tokens give no text, but for Mistral's [TOOL_CALLS], which shows where
 * tool calls start). Writes at most `capacity` bytes (no NUL) and
 * sets *len to the bytes the text has (call again with more room when it is larger). An id
 * outside the vocabulary fails with BLUEVM_ERR_INVALID_ARGUMENT naming it. */
bluevm_status bluevm_detokenize(const bluevm_model* model, const uint32_t* ids, size_t n_ids,
                                char* text, size_t capacity, size_t* len);
/* API 6: the text one token contributes (spaces restored; empty for control tokens but
 * [TOOL_CALLS], and for ids outside the vocabulary); *text stays valid while the model is open (not NUL-terminated). */
bluevm_status bluevm_token_piece(const bluevm_model* model, uint32_t id, const char** text, size_t* len);
/* API 16: bluevm_token_piece, and with render_special nonzero control and unknown tokens give
 * their text too ("<|im_start|>", "[INST]", "</s>"), as /tokenize's pieces show them. */
bluevm_status bluevm_token_piece_special(const bluevm_model* model, uint32_t id, int render_special, const char** text,
                                         size_t* len);

/* A chat conversation formatted with the model's chat template, ending with the opening of an
 * assistant turn, as a NUL-terminated string the caller frees with bluevm_free. */
bluevm_status bluevm_format_chat(const bluevm_model* model, const char* const* roles,
                                 const char* const* contents, size_t n_messages, char** out);
void bluevm_free(void* p);

/* ---- engines and requests ------------------------------------------------------------------ */

typedef struct bluevm_engine bluevm_engine;

typedef struct bluevm_engine_options {
    uint32_t instances;    /* concurrent requests on the GPU (default 4) */
    uint32_t max_queue;    /* requests waiting for an instance before BLUEVM_ERR_QUEUE_FULL;
                              0: 8 per instance */
    uint32_t chain_cycles; /* cycles per submitted chain: fewer stream sooner (default 16) */
    /* Called while bluevm_engine_create uploads the weights (bytes done of total), e.g. to draw
       a progress bar; NULL: none. */
    void (*on_load)(uint64_t done, uint64_t total, void* user);
    void* on_load_user;
} bluevm_engine_options;

void bluevm_engine_options_init(bluevm_engine_options* o);
bluevm_status bluevm_engine_create(bluevm_model* model, const bluevm_engine_options* options,
                                   bluevm_engine** out);
/* Cancels what is running, stops the engine and frees it (and every request it holds). */
void bluevm_engine_destroy(bluevm_engine* engine);

typedef struct bluevm_request {
    const char* prompt;       /* text (NUL-terminated), used when prompt_ids is NULL; an empty
                                 prompt starts from BOS */
    const uint32_t* prompt_ids; /* or token ids, taken as they are */
    size_t n_prompt_ids;
    int parse_special;        /* nonzero: special-token text in `prompt` becomes special tokens
                                 (chat-formatted prompts) */
    uint32_t max_tokens;      /* default 256 */
    float temperature;        /* default 0.8; 0 is greedy */
    uint32_t top_k;           /* default 40; 0 off */
    float top_p;              /* default 0.95; 1 off */
    float min_p;              /* default 0.05; 0 off */
    float repeat_penalty;     /* default 1 (off) */
    float presence_penalty, frequency_penalty; /* default 0 */
    uint32_t seed;            /* same seed, same text */
    const char* const* stop;  /* strings that end the request when they appear (cut from the text) */
    size_t n_stop;
    int ignore_eos;           /* nonzero: generate max_tokens tokens whatever they are (benchmarks) */
    /* API 6: nonzero: each token's log-probability (of the model's distribution after the
     * penalties, at temperature 1) comes on the events; default 0 */
    int logprobs;
    uint32_t top_logprobs;    /* and that many most likely alternatives' (0..20; implies logprobs) */
    /* API 7: nonzero: recompute the whole prompt. By default an instance skips the leading prompt
     * tokens whose KV rows it still holds from its last request (a shared system prompt, an earlier
     * turn of the conversation); the output is the same either way. */
    int no_prefix_reuse;
    /* API 8: structured output, at most one of: `grammar`, GBNF text (llama.cpp's grammar
     * language) whose rule `root` the text follows; `json_schema`, a JSON schema (as JSON text)
     * the text is valid against; `json_object` nonzero: the text is one JSON object. Compiled on
     * the host into an automaton the sampler applies on the GPU each step; a malformed grammar
     * or schema fails bluevm_submit with BLUEVM_ERR_INVALID_ARGUMENT naming what is wrong. */
    const char* grammar;
    const char* json_schema;
    int json_object;
    /* API 11: nonzero: an embedding of the prompt instead of generation. The prompt runs through
     * the model (no token is generated; the sampling fields, stop strings and constraints are not
     * used) and the finished event carries the pooled vector (bluevm_event.embedding). Refused
     * with BLUEVM_ERR_INVALID_ARGUMENT when the model's pooling is "none". */
    int embed;
    /* API 11: a conversation's name (NUL-terminated, at most 256 bytes; NULL or "": none). Its
     * turns are kept in one of the engine's session slots (bluevm_model_options.sessions): the
     * next turn, on whatever instance takes it, reuses the KV rows of everything the conversation
     * holds so far (prompt and answer), where its prompt repeats them (cached_tokens says how
     * many). A new conversation takes a free slot, else the least recently used idle one. One
     * turn at a time: BLUEVM_ERR_BUSY while one runs. The output is the same with or without. */
    const char* session;
} bluevm_request;

void bluevm_request_init(bluevm_request* r);

/* Queues a request; *id names it until bluevm_release. Fails with BLUEVM_ERR_QUEUE_FULL when
 * max_queue requests are already waiting, BLUEVM_ERR_TOO_LONG when the prompt does not fit. */
bluevm_status bluevm_submit(bluevm_engine* engine, const bluevm_request* request, uint64_t* id);

typedef enum bluevm_finish {
    BLUEVM_FINISH_NONE = 0,      /* still running */
    BLUEVM_FINISH_STOP = 1,      /* an end-of-generation token or a stop string */
    BLUEVM_FINISH_LENGTH = 2,    /* max_tokens reached */
    BLUEVM_FINISH_CANCELLED = 3, /* bluevm_cancel */
    BLUEVM_FINISH_ERROR = 4      /* the engine failed (bluevm_last_error after bluevm_poll) */
} bluevm_finish;

typedef struct bluevm_event {
    const char* text;       /* new text since the previous poll (UTF-8, not NUL-terminated) */
    size_t text_len;
    const uint32_t* tokens; /* new token ids since the previous poll */
    size_t n_tokens;
    int finished;           /* nonzero once: the request has ended */
    bluevm_finish reason;
    uint32_t prompt_tokens, completion_tokens; /* completion_tokens: total so far */
    bluevm_status error; /* with BLUEVM_FINISH_ERROR: BLUEVM_ERR_DEVICE_LOST when the device
                            failed (the engine is rebuilding it), else BLUEVM_ERR_INTERNAL */
    /* API 6, with bluevm_request.logprobs or top_logprobs (else NULL and 0): */
    const float* logprobs;      /* [n_tokens]: each new token's log-probability */
    uint32_t n_top;             /* alternatives per token (top_logprobs, at most the vocabulary) */
    const uint32_t* top_ids;    /* [n_tokens * n_top]: token i's alternatives at i * n_top,
                                   most likely first (ties: lower id first) */
    const float* top_logprobs;  /* [n_tokens * n_top]: their log-probabilities */
    /* API 7: leading prompt tokens the instance did not recompute (prefix reuse); known from the
     * first event on */
    uint32_t cached_tokens;
    /* API 11, on the finished event of a bluevm_request.embed request that ran to its end (else
     * NULL and 0): the pooled vector, n_embd floats, not normalised */
    const float* embedding;
    uint32_t n_embedding;
} bluevm_event;

/* Waits up to timeout_ms (negative: without limit, 0: not at all) for new text or the end of a
 * request and takes it. The event's pointers stay valid until the next bluevm_poll or
 * bluevm_release of the same id. After the finished event, further polls return it again with no
 * new text. Returns BLUEVM_ERR_TIMEOUT when nothing arrived. A request that ended with
 * BLUEVM_FINISH_ERROR returns BLUEVM_OK with bluevm_last_error saying what failed. */
bluevm_status bluevm_poll(bluevm_engine* engine, uint64_t id, int timeout_ms, bluevm_event* out);
/* Ends a request early; its instance is freed for the next request. */
bluevm_status bluevm_cancel(bluevm_engine* engine, uint64_t id);
/* Forgets a request (cancelling it if it still runs). */
bluevm_status bluevm_release(bluevm_engine* engine, uint64_t id);

typedef struct bluevm_metrics {
    uint64_t requests_total, requests_finished, requests_cancelled, requests_rejected;
    uint64_t prompt_tokens, completion_tokens;
    uint64_t queue_depth;    /* accepted requests waiting for an instance */
    uint32_t queue_capacity; /* requests that may wait before BLUEVM_ERR_QUEUE_FULL */
    uint64_t busy_instances; /* instances serving a request */
    uint32_t instances;
    uint64_t submits, round_trips, cycles; /* GPU chain submits, host round trips, VM cycles */
    uint64_t resumes; /* submits that restarted the GPU after it idled with no request */
    uint64_t recoveries; /* device rebuilds after a device failure */
    uint64_t expert_bytes; /* MoE models: expert weight bytes the chosen experts' matmuls read (API 5) */
    uint64_t prefix_hits;   /* API 7: requests that reused KV rows of their prompt's prefix */
    uint64_t prefix_tokens; /* prompt tokens those requests did not recompute */
    /* API 9, MoE models under vram_budget with the expert cache: experts the GPU's routing found
       in the cache, copied into it from host memory, and read in place (no slot free); bytes
       copied */
    uint64_t expert_hits, expert_misses, expert_inplace, expert_paged_bytes;
    /* API 11: conversations in session slots now; conversations forgotten for new ones */
    uint64_t sessions, session_evictions;
    /* API 14, paged KV (kv_page): positions per page and pages in each layer's pool (0: per-instance
       caches); pages held and reserved by requests now, and the most held at once */
    uint32_t kv_page, kv_pages;
    uint64_t kv_pages_in_use, kv_pages_committed, kv_pages_peak;
    /* API 15: cached pages of the prefix index taken for other rows */
    uint64_t kv_evictions;
} bluevm_metrics;

bluevm_status bluevm_engine_metrics(const bluevm_engine* engine, bluevm_metrics* out);

typedef enum bluevm_engine_state {
    BLUEVM_ENGINE_SERVING = 0,
    BLUEVM_ENGINE_RECOVERING = 1, /* rebuilding the device after a failure; submits are refused */
    BLUEVM_ENGINE_STOPPED = 2
} bluevm_engine_state;

typedef struct bluevm_health {
    bluevm_engine_state state;
    uint32_t recoveries;      /* device rebuilds that succeeded */
    uint32_t failed_attempts; /* rebuild attempts that failed since the last device failure */
    char failure[512];        /* the last device failure and what was running ("" if none) */
    char attempt_error[512];  /* why the last rebuild attempt failed ("" if none) */
} bluevm_health;

bluevm_status bluevm_engine_health(const bluevm_engine* engine, bluevm_health* out);

/* ---- one request with KV persistence (API 6) -------------------------------------------------- */
/* A conversation can be saved after a run and continued later: the continued run gives exactly
 * the tokens an uninterrupted one would (greedy or seeded). Snapshot files are versioned,
 * checksummed and bound to the model (README "KV snapshots"); `bluevm generate --kv-save/--kv-load`
 * reads and writes the same files. */
typedef struct bluevm_completion {
    char* text;            /* the generated text, NUL-terminated */
    size_t text_len;
    uint32_t* tokens;      /* the generated token ids */
    size_t n_tokens;
    uint32_t prompt_tokens;  /* prompt tokens run (after the restored ones) */
    bluevm_finish reason;  /* BLUEVM_FINISH_STOP or BLUEVM_FINISH_LENGTH */
} bluevm_completion;
/* Runs one request to its end on one instance of the model's device, outside any engine (do not
 * call it while an engine of the same model serves). kv_load (may be NULL): a snapshot file;
 * the request's prompt continues the saved conversation (text is tokenized without BOS, with
 * parse_special as for bluevm_submit; ids are taken as they are) and an empty prompt goes on generating as if the saved run had asked for
 * more tokens. kv_save (may be NULL; may equal kv_load): where the conversation (every token it
 * holds, and their KV rows) is saved after the run. Stop strings are not supported here
 * (n_stop must be 0). Fails with BLUEVM_ERR_IO when a snapshot cannot be read or written,
 * BLUEVM_ERR_SNAPSHOT when it is truncated, corrupt, of another version or of another model
 * (the message names the file and the fault), BLUEVM_ERR_TOO_LONG when the conversation and
 * the prompt do not fit the context. On BLUEVM_OK free *out with bluevm_completion_free. */
bluevm_status bluevm_generate(bluevm_model* model, const bluevm_request* request, const char* kv_load,
                              const char* kv_save, bluevm_completion* out);
void bluevm_completion_free(bluevm_completion* c);
/* ---- cascades -------------------------------------------------------------------------------- */

/* A compiled cascade (`bluec cascade X.cas -o X.bir`): several models taking turns over a
 * per-request thinking buffer, every decision made on the GPU. A bluevm_cascade keeps N instances
 * of it on one device; tasks are batched continuously like an engine's requests. A cascade
 * reports its slots at the end of a request, so each request's result arrives whole (the answer
 * slot's final writes can also be read as they stream, bluevm_cascade_stream):
 *
 *   bluevm_cascade* c; bluevm_cascade_result* r;
 *   bluevm_cascade_options o; bluevm_cascade_options_init(&o); o.instances = 4;
 *   if (bluevm_cascade_open("draft_refine.bir", &o, &c) != BLUEVM_OK) puts(bluevm_last_error());
 *   bluevm_cascade_run(c, "Once upon a time", 7, &r);    (or bluevm_cascade_submit + _wait)
 *   puts(bluevm_cascade_result_answer(r, NULL));
 *   bluevm_cascade_result_free(r); bluevm_cascade_close(c);
 */
typedef struct bluevm_cascade bluevm_cascade;
typedef struct bluevm_cascade_result bluevm_cascade_result;

typedef struct bluevm_cascade_options {
    const char* device;      /* Vulkan device: index or part of its name; NULL picks the best */
    uint32_t instances;      /* requests run at once (default 4) */
    uint32_t max_queue;      /* requests waiting before BLUEVM_ERR_QUEUE_FULL; 0: 8 per instance */
    uint32_t chain_cycles;   /* cycles per submitted chain (default 32) */
    /* Model files replacing the module's, by model name (same tensors, types and shapes):
       model_names[i] is read from model_paths[i]. */
    const char* const* model_names;
    const char* const* model_paths;
    size_t n_models;
    /* Since API 4: when not NULL, every request that ends (stop or length) appends one JSON line
       to this file: task, seed, every stage's statistics, every slot, and the cascade's `prefer`
       pair (the same lines as `bluevm run --trace`). */
    const char* trace_path;
} bluevm_cascade_options;

void bluevm_cascade_options_init(bluevm_cascade_options* o);
/* Opens a .bir written by `bluec cascade`, loads its models onto the device and starts serving.
 * BLUEVM_ERR_IO: no such file; BLUEVM_ERR_MODEL: not a cascade, or a model override that does
 * not fit (the message names it); BLUEVM_ERR_DEVICE(_LOST): the device failed. */
bluevm_status bluevm_cascade_open(const char* path, const bluevm_cascade_options* options,
                                  bluevm_cascade** out);
/* Cancels what runs and frees the cascade with the requests it holds (results already handed
 * out stay valid until bluevm_cascade_result_free). */
void bluevm_cascade_close(bluevm_cascade* cascade);

typedef struct bluevm_cascade_info {
    const char* device;          /* the Vulkan device it runs on */
    const char* const* stages;   /* stage names, in declaration order */
    uint32_t n_stages;
    const char* const* slots;    /* slot names without `input`, in declaration order */
    uint32_t n_slots;
    const char* answer_slot;     /* the last slot of the `output` line; the answer is the last
                                    of them that holds text (a skipped stage's slot is empty) */
    uint32_t input_capacity;     /* task tokens the input slot holds */
    uint32_t instances;
    uint32_t validation_errors;  /* Khronos validation errors so far (with validation on) */
} bluevm_cascade_info;

/* Strings stay valid while the cascade is open. */
bluevm_status bluevm_cascade_get_info(const bluevm_cascade* cascade, bluevm_cascade_info* out);

/* Queues a task (its text becomes the `input` slot); the seed drives every sampled stage. Fails
 * with BLUEVM_ERR_TOO_LONG when the task has more tokens than the input slot holds,
 * BLUEVM_ERR_QUEUE_FULL, BLUEVM_ERR_DEVICE_LOST while the device is rebuilt. */
bluevm_status bluevm_cascade_submit(bluevm_cascade* cascade, const char* task, uint32_t seed,
                                    uint64_t* id);
/* Waits up to timeout_ms (negative: without limit, 0: not at all) for request `id` to end. On
 * BLUEVM_OK, *out is its result (free it with bluevm_cascade_result_free) and the id is
 * forgotten. BLUEVM_ERR_TIMEOUT: it still runs. */
bluevm_status bluevm_cascade_wait(bluevm_cascade* cascade, uint64_t id, int timeout_ms,
                                  bluevm_cascade_result** out);
/* Streaming: waits up to timeout_ms (as bluevm_cascade_wait) for answer text the cascade
 * streamed (the final writes of its answer slot; vm/cascade_abi.h) or for the request's end.
 * *text and *len: the text streamed since the previous call, whole UTF-8 characters (valid until
 * the next call for the id, its wait or release); *ended (may be NULL): nonzero once the request
 * has ended (bluevm_cascade_wait then returns its result at once). The result's answer begins
 * with everything this returned: the rest of the answer is what follows. BLUEVM_ERR_TIMEOUT:
 * nothing new and not ended. */
bluevm_status bluevm_cascade_stream(bluevm_cascade* cascade, uint64_t id, int timeout_ms,
                                    const char** text, size_t* len, int* ended);
/* Ends a request early (its result finishes with BLUEVM_FINISH_CANCELLED). */
bluevm_status bluevm_cascade_cancel(bluevm_cascade* cascade, uint64_t id);
/* Forgets a request (cancelling it if it still runs). */
bluevm_status bluevm_cascade_release(bluevm_cascade* cascade, uint64_t id);
/* bluevm_cascade_submit, then bluevm_cascade_wait without limit. */
bluevm_status bluevm_cascade_run(bluevm_cascade* cascade, const char* task, uint32_t seed,
                                 bluevm_cascade_result** out);

/* BLUEVM_FINISH_STOP: the program ran to its end; LENGTH: a stage found the cascade's token
 * budget spent; CANCELLED; ERROR (see bluevm_cascade_result_error). */
bluevm_finish bluevm_cascade_result_finish(const bluevm_cascade_result* r);
/* With BLUEVM_FINISH_ERROR: what failed, and *status (may be NULL) BLUEVM_ERR_DEVICE_LOST when
 * the device failed, else BLUEVM_ERR_INTERNAL. "" and BLUEVM_OK otherwise. */
const char* bluevm_cascade_result_error(const bluevm_cascade_result* r, bluevm_status* status);
/* The answer: the text of the answer slot (NUL-terminated; *len its bytes when len is not NULL). */
const char* bluevm_cascade_result_answer(const bluevm_cascade_result* r, size_t* len);
/* A slot's text by name; NULL when the cascade has no such slot. */
const char* bluevm_cascade_result_slot(const bluevm_cascade_result* r, const char* name,
                                       size_t* len);
/* {"stages":[{"name","state","runs","tokens","cycles","entropy_mean","entropy_max",
 * "logprob_mean"}...],"generated":N} */
const char* bluevm_cascade_result_stats_json(const bluevm_cascade_result* r);
/* Task tokens, and tokens generated over all stages (either pointer may be NULL). */
void bluevm_cascade_result_usage(const bluevm_cascade_result* r, uint32_t* prompt_tokens,
                                 uint32_t* completion_tokens);
void bluevm_cascade_result_free(bluevm_cascade_result* r);

/* The same counters and states as an engine's (completion_tokens: tokens over all stages). */
bluevm_status bluevm_cascade_metrics(const bluevm_cascade* cascade, bluevm_metrics* out);
bluevm_status bluevm_cascade_health(const bluevm_cascade* cascade, bluevm_health* out);

#ifdef __cplusplus
}
#endif

#endif /* BLUEVM_H */
