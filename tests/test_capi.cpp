// The public C API (host/bluevm.h), used as a C program would: stories260K greedy from BOS through
// submit/poll gives the expected 256 tokens; concurrent requests stream their text; cancel frees
// the instance; every misuse gets a status and a message, never a crash; bluevm_generate saves
// and restores a conversation (KV snapshot) and goes on exactly as an uninterrupted run, and
// refuses damaged snapshots; log-probabilities reach the events and bluevm_detokenize inverts the
// stream.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "host/bluevm.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace blue::test {
namespace {

std::string storiesPath() { return sharedDir() + "/models/stories260K/stories260K.gguf"; }

struct Opened {
    bluevm_model* model = nullptr;
    bluevm_engine* engine = nullptr;
    ~Opened() {
        bluevm_engine_destroy(engine);
        bluevm_model_close(model);
    }
};

// stories260K with model options `mo` and an engine of `instances`.
void open(Opened* o, const bluevm_model_options& mo, uint32_t instances, uint32_t max_queue = 0) {
    REQUIRE_MESSAGE(bluevm_model_open(storiesPath().c_str(), &mo, &o->model) == BLUEVM_OK, bluevm_last_error());
    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = instances;
    eo.max_queue = max_queue;
    REQUIRE_MESSAGE(bluevm_engine_create(o->model, &eo, &o->engine) == BLUEVM_OK, bluevm_last_error());
}

void open(Opened* o, uint32_t instances, uint32_t ctx, uint32_t max_queue = 0) {
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = ctx;
    open(o, mo, instances, max_queue);
}

// A grammar that does not fit an instance's grammar memory has its own status (API 12), so a
// caller (the server's parallel tool calls) can tell it from a malformed one.
TEST_CASE("capi: an automaton larger than grammar_words gets BLUEVM_ERR_GRAMMAR_TOO_LARGE, a bad one INVALID_ARGUMENT") {
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 64;
    mo.grammar_words = 1024;
    Opened o;
    open(&o, mo, 1);
    bluevm_request r;
    bluevm_request_init(&r);
    r.prompt = "Lily";
    r.max_tokens = 4;
    uint64_t id = 0;
    r.json_object = 1;  // 8 levels need far more than 1,024 words, and even one level does
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_GRAMMAR_TOO_LARGE);
    CHECK(std::string(bluevm_last_error()).find("an instance holds 1024 (--grammar-words)") != std::string::npos);
    CHECK(std::string(bluevm_status_name(BLUEVM_ERR_GRAMMAR_TOO_LARGE)) == "grammar too large");
    r.json_object = 0;
    r.grammar = "root ::= \"a\" (";
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    r.grammar = "root ::= \"yes\" | \"no\"";
    REQUIRE_MESSAGE(bluevm_submit(o.engine, &r, &id) == BLUEVM_OK, bluevm_last_error());
}

// Polls a request to its end; returns its text and tokens.
struct Finished {
    std::string text;
    std::vector<uint32_t> tokens;
    bluevm_finish reason = BLUEVM_FINISH_NONE;
    uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    int events = 0;
};

Finished drain(bluevm_engine* e, uint64_t id) {
    Finished f;
    for (int guard = 0; guard < 100000; ++guard) {
        bluevm_event ev;
        bluevm_status s = bluevm_poll(e, id, 30000, &ev);
        REQUIRE_MESSAGE(s == BLUEVM_OK, bluevm_status_name(s), ": ", bluevm_last_error());
        f.text.append(ev.text, ev.text_len);
        f.tokens.insert(f.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
        ++f.events;
        if (ev.finished) {
            f.reason = ev.reason;
            f.prompt_tokens = ev.prompt_tokens;
            f.completion_tokens = ev.completion_tokens;
            f.cached_tokens = ev.cached_tokens;
            return f;
        }
    }
    FAIL("request did not finish");
    return f;
}

void checkNoValidationErrors(bluevm_model* m) {
    bluevm_model_info info;
    REQUIRE(bluevm_model_get_info(m, &info) == BLUEVM_OK);
    CHECK(info.validation_errors == 0u);
}

TEST_CASE("capi: stories260K greedy from BOS through submit and poll gives the expected 256 tokens") {
    Opened o;
    open(&o, 2, 512);
    bluevm_model_info info;
    REQUIRE(bluevm_model_get_info(o.model, &info) == BLUEVM_OK);
    CHECK(std::string(info.architecture) == "llama");
    CHECK(info.n_vocab == 512);
    CHECK(info.n_ctx == 512);
    CHECK(std::string(info.chat_template) == "chatml");  // no template in the file: ChatML
    bluevm_request r;
    bluevm_request_init(&r);
    r.prompt = "";
    r.max_tokens = 256;
    r.temperature = 0;
    uint64_t id = 0;
    REQUIRE(bluevm_submit(o.engine, &r, &id) == BLUEVM_OK);
    Finished f = drain(o.engine, id);
    CHECK(f.tokens == expectedGreedyIds());
    CHECK(f.reason == BLUEVM_FINISH_LENGTH);
    CHECK(f.prompt_tokens == 1);
    CHECK(f.completion_tokens == 256);
    CHECK(f.text.rfind("Once upon a time, there was a little girl named Lily.", 0) == 0);
    // After the end, a poll returns the finish again with nothing new.
    bluevm_event ev;
    REQUIRE(bluevm_poll(o.engine, id, 0, &ev) == BLUEVM_OK);
    CHECK(ev.finished);
    CHECK(ev.text_len == 0);
    REQUIRE(bluevm_release(o.engine, id) == BLUEVM_OK);
    CHECK(bluevm_poll(o.engine, id, 0, &ev) == BLUEVM_ERR_NOT_FOUND);
    checkNoValidationErrors(o.model);
}

TEST_CASE("capi: log-probabilities on the events (greedy: the chosen token is the first of 4 alternatives); detokenize") {
    Opened o;
    open(&o, 1, 256);
    bluevm_request r;
    bluevm_request_init(&r);
    CHECK(r.logprobs == 0);
    CHECK(r.top_logprobs == 0u);
    r.prompt = "Once upon a time";
    r.max_tokens = 24;
    r.temperature = 0;
    uint64_t plain_id = 0, id = 0;
    REQUIRE(bluevm_submit(o.engine, &r, &plain_id) == BLUEVM_OK);
    Finished plain = drain(o.engine, plain_id);
    r.top_logprobs = 4;
    REQUIRE(bluevm_submit(o.engine, &r, &id) == BLUEVM_OK);
    std::vector<uint32_t> tokens;
    for (bool done = false; !done;) {
        bluevm_event ev;
        REQUIRE(bluevm_poll(o.engine, id, 30000, &ev) == BLUEVM_OK);
        tokens.insert(tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
        done = ev.finished;
        if (ev.n_tokens == 0) continue;
        REQUIRE(ev.logprobs);
        REQUIRE(ev.n_top == 4u);
        for (size_t i = 0; i < ev.n_tokens; ++i) {
            CHECK(ev.top_ids[i * 4] == ev.tokens[i]);
            CHECK(ev.top_logprobs[i * 4] == ev.logprobs[i]);
            CHECK(ev.logprobs[i] <= 0.0f);
            for (size_t k = 1; k < 4; ++k) CHECK(ev.top_logprobs[i * 4 + k] <= ev.top_logprobs[i * 4 + k - 1]);
        }
    }
    CHECK(tokens == plain.tokens);  // asking for log-probabilities changes nothing else
    // Detokenize gives the streamed text back; an id outside the vocabulary is named.
    std::string text(plain.text.size() + 64, '\0');
    size_t len = 0;
    REQUIRE(bluevm_detokenize(o.model, tokens.data(), tokens.size(), text.data(), text.size(), &len) == BLUEVM_OK);
    text.resize(len);
    CHECK((text == plain.text || " " + text == plain.text));  // SentencePiece drops a leading space
    uint32_t bad[] = {1, 600};
    CHECK(bluevm_detokenize(o.model, bad, 2, nullptr, 0, &len) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("token 600") != std::string::npos);
    r.top_logprobs = 21;
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("top_logprobs") != std::string::npos);
    checkNoValidationErrors(o.model);
}

TEST_CASE("capi: concurrent requests on 3 instances equal one-at-a-time runs; cancel frees the instance") {
    Opened o;
    open(&o, 3, 128);
    const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily wanted", "Tom",
                                              "One day, a little", "The sun"};
    auto request = [&](const std::string& p, uint32_t n) {
        bluevm_request r;
        bluevm_request_init(&r);
        r.prompt = p.c_str();
        r.max_tokens = n;
        r.temperature = 0;
        uint64_t id = 0;
        REQUIRE_MESSAGE(bluevm_submit(o.engine, &r, &id) == BLUEVM_OK, bluevm_last_error());
        return id;
    };
    std::vector<std::string> alone;
    for (const std::string& p : prompts) {
        uint64_t id = request(p, 30);
        alone.push_back(drain(o.engine, id).text);
        bluevm_release(o.engine, id);
    }
    std::vector<uint64_t> ids;
    for (const std::string& p : prompts) ids.push_back(request(p, 30));
    for (size_t i = 0; i < ids.size(); ++i) {
        CAPTURE(prompts[i]);
        CHECK(drain(o.engine, ids[i]).text == alone[i]);
    }
    // A long request is cancelled after its first text; its instance then serves another.
    bluevm_request r;
    bluevm_request_init(&r);
    r.prompt = "Once";
    r.max_tokens = 120;
    r.ignore_eos = 1;
    r.temperature = 0;
    uint64_t longer = 0;
    REQUIRE(bluevm_submit(o.engine, &r, &longer) == BLUEVM_OK);
    bluevm_event ev;
    REQUIRE(bluevm_poll(o.engine, longer, 30000, &ev) == BLUEVM_OK);
    REQUIRE(bluevm_cancel(o.engine, longer) == BLUEVM_OK);
    Finished f = drain(o.engine, longer);
    CHECK(f.reason == BLUEVM_FINISH_CANCELLED);
    CHECK(f.completion_tokens < 120);
    uint64_t after = request("The dog", 30);
    CHECK(drain(o.engine, after).text == alone[1]);
    bluevm_metrics m;
    REQUIRE(bluevm_engine_metrics(o.engine, &m) == BLUEVM_OK);
    CHECK(m.requests_cancelled == 1);
    CHECK(m.requests_finished == m.requests_total);
    CHECK(m.busy_instances == 0);
    CHECK(m.round_trips == 0);
    checkNoValidationErrors(o.model);
}

// A paged KV cache through the C API (kv_page, kv_pool; metrics API 14-15): a pool of 8 pages on
// one instance, six different stories one after another: the pages their prompts and answers
// publish stay cached until the pool needs them (evictions), the last story again maps its
// cached pages, and the metrics say so.
TEST_CASE("capi: a paged KV pool shares a repeated prompt's pages and counts its evictions") {
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 128;
    mo.kv_page = 16;
    mo.kv_pool = 128;
    Opened o;
    open(&o, mo, 1);
    const char* stories[] = {"Lily and Tom went to the park with their red ball and a big kite.",
                             "The little dog ran into the garden and dug a hole under the tree.",
                             "Once there was a bird who could not fly, so she sat and sang all day.",
                             "Ben had a new toy car. It was blue and fast, and he raced it home.",
                             "Mom baked a cake for Sue, and they ate it in the warm kitchen.",
                             "A small frog sat on a leaf in the pond and looked at the moon."};
    auto run = [&](const char* prompt) {
        bluevm_request r;
        bluevm_request_init(&r);
        r.prompt = prompt;
        r.max_tokens = 20;
        r.ignore_eos = 1;
        r.temperature = 0;
        uint64_t id = 0;
        REQUIRE_MESSAGE(bluevm_submit(o.engine, &r, &id) == BLUEVM_OK, bluevm_last_error());
        Finished f = drain(o.engine, id);
        bluevm_release(o.engine, id);
        return f;
    };
    std::vector<Finished> first;
    for (const char* p : stories) first.push_back(run(p));
    Finished again = run(stories[5]);
    CHECK(again.text == first[5].text);
    CHECK(again.cached_tokens == (first[5].prompt_tokens - 1) / 16 * 16);
    CHECK(again.cached_tokens >= 16);
    bluevm_metrics m;
    REQUIRE(bluevm_engine_metrics(o.engine, &m) == BLUEVM_OK);
    CHECK(m.kv_page == 16);
    CHECK(m.kv_pages == 8);
    CHECK(m.kv_pages_peak <= 8);
    CHECK(m.kv_evictions >= 1);
    CHECK(m.prefix_tokens == again.cached_tokens);
    CHECK(m.round_trips == 0);
    checkNoValidationErrors(o.model);
}

TEST_CASE("capi: misuse gets a status and a message") {
    bluevm_model* m = nullptr;
    CHECK(bluevm_model_open(nullptr, nullptr, &m) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(bluevm_model_open("/nonexistent/model.gguf", nullptr, &m) == BLUEVM_ERR_IO);
    CHECK(std::string(bluevm_last_error()) == "/nonexistent/model.gguf: no such file");
    CHECK(m == nullptr);
    // A file that is not GGUF.
    const std::string not_gguf = sourceDir() + "/README.md";
    CHECK(bluevm_model_open(not_gguf.c_str(), nullptr, &m) == BLUEVM_ERR_MODEL);
    CHECK(std::string(bluevm_last_error()).find("README.md") != std::string::npos);
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.device = "no-such-device-name";
    CHECK(bluevm_model_open(storiesPath().c_str(), &mo, &m) == BLUEVM_ERR_DEVICE);

    Opened o;
    open(&o, 1, 64, 1);
    bluevm_engine_options eo;
    bluevm_engine_options_init(&eo);
    eo.instances = 0;
    bluevm_engine* e = nullptr;
    CHECK(bluevm_engine_create(o.model, &eo, &e) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()) == "instances must be 1..4096, not 0");

    bluevm_request r;
    bluevm_request_init(&r);
    uint64_t id = 0;
    std::string long_prompt;
    for (int i = 0; i < 100; ++i) long_prompt += "Once upon a time ";
    r.prompt = long_prompt.c_str();
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_TOO_LONG);
    CHECK(std::string(bluevm_last_error()).find("the context holds 64") != std::string::npos);
    r.prompt = "Hi";
    r.top_p = 0;
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("top_p") != std::string::npos);
    r.top_p = 1;
    r.n_stop = 1;
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    r.n_stop = 0;
    const uint32_t bad_ids[] = {1, 99999};
    r.prompt_ids = bad_ids;
    r.n_prompt_ids = 2;
    CHECK(bluevm_submit(o.engine, &r, &id) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_last_error()).find("99999") != std::string::npos);
    r.prompt_ids = nullptr;
    CHECK(bluevm_poll(o.engine, 12345, 0, nullptr) == BLUEVM_ERR_INVALID_ARGUMENT);
    bluevm_event ev;
    CHECK(bluevm_poll(o.engine, 12345, 0, &ev) == BLUEVM_ERR_NOT_FOUND);
    CHECK(bluevm_cancel(o.engine, 12345) == BLUEVM_ERR_NOT_FOUND);
    CHECK(bluevm_release(o.engine, 12345) == BLUEVM_ERR_NOT_FOUND);
    // One instance, a queue of one: the third long request is refused while two are in.
    r.max_tokens = 50;
    r.ignore_eos = 1;
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(bluevm_submit(o.engine, &r, &a) == BLUEVM_OK);
    REQUIRE(bluevm_poll(o.engine, a, 30000, &ev) == BLUEVM_OK);  // a is on the instance
    REQUIRE(bluevm_submit(o.engine, &r, &b) == BLUEVM_OK);       // b waits
    CHECK(bluevm_submit(o.engine, &r, &c) == BLUEVM_ERR_QUEUE_FULL);
    CHECK(std::string(bluevm_last_error()).find("queue is full") != std::string::npos);
    CHECK(bluevm_poll(o.engine, b, 0, &ev) == BLUEVM_ERR_TIMEOUT);
    drain(o.engine, a);
    drain(o.engine, b);
    char* chat = nullptr;
    const char* roles[] = {"user"};
    const char* contents[] = {"Hello"};
    REQUIRE(bluevm_format_chat(o.model, roles, contents, 1, &chat) == BLUEVM_OK);
    CHECK(std::string(chat).find("Hello") != std::string::npos);
    bluevm_free(chat);
    CHECK(bluevm_format_chat(o.model, roles, contents, 0, &chat) == BLUEVM_ERR_INVALID_ARGUMENT);
    size_t count = 0;
    uint32_t ids[4];
    REQUIRE(bluevm_tokenize(o.model, "Once upon a time", 16, 1, ids, 4, &count) == BLUEVM_OK);
    CHECK(count > 1);
    CHECK(ids[0] == 1);  // BOS
    // Control-token text: a token with parse_special, text without; its piece only when rendered.
    REQUIRE(bluevm_tokenize_special(o.model, "</s>", 4, 0, 1, ids, 4, &count) == BLUEVM_OK);
    CHECK(count == 1);
    CHECK(ids[0] == 2);
    REQUIRE(bluevm_tokenize_special(o.model, "</s>", 4, 0, 0, ids, 4, &count) == BLUEVM_OK);
    CHECK(count > 1);
    const char* piece = nullptr;
    size_t piece_len = 0;
    REQUIRE(bluevm_token_piece_special(o.model, 2, 1, &piece, &piece_len) == BLUEVM_OK);
    CHECK(std::string(piece, piece_len) == "</s>");
    REQUIRE(bluevm_token_piece_special(o.model, 2, 0, &piece, &piece_len) == BLUEVM_OK);
    CHECK(piece_len == 0);
    CHECK(bluevm_token_piece_special(o.model, 2, 1, nullptr, &piece_len) == BLUEVM_ERR_INVALID_ARGUMENT);
    CHECK(std::string(bluevm_status_name(BLUEVM_ERR_QUEUE_FULL)) == "queue full");
    CHECK(bluevm_api_version() == BLUEVM_API_VERSION);
    checkNoValidationErrors(o.model);
}


// bluevm_generate's result as a vector and text; REQUIREs success.
struct Generated {
    std::vector<uint32_t> tokens;
    std::string text;
    bluevm_finish reason = BLUEVM_FINISH_NONE;
};

bluevm_status generate(bluevm_model* m, const bluevm_request& r, const char* load, const char* save, Generated* g) {
    bluevm_completion c;
    bluevm_status s = bluevm_generate(m, &r, load, save, &c);
    if (s != BLUEVM_OK) return s;
    g->tokens.assign(c.tokens, c.tokens + c.n_tokens);
    g->text.assign(c.text, c.text_len);
    g->reason = c.reason;
    bluevm_completion_free(&c);
    return s;
}

Generated mustGenerate(bluevm_model* m, const bluevm_request& r, const char* load = nullptr, const char* save = nullptr) {
    Generated g;
    bluevm_status s = generate(m, r, load, save, &g);
    REQUIRE_MESSAGE(s == BLUEVM_OK, bluevm_status_name(s), ": ", bluevm_last_error());
    return g;
}

std::vector<uint8_t> fileBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

TEST_CASE("capi: bluevm_generate saves and restores a conversation; continuing equals the uninterrupted run, greedy and seeded") {
    TempDir dir;
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 128;
    mo.validation = 1;
    bluevm_model* m = nullptr;
    REQUIRE_MESSAGE(bluevm_model_open(storiesPath().c_str(), &mo, &m) == BLUEVM_OK, bluevm_last_error());
    const std::string a = dir.path + "/a.kv", b = dir.path + "/b.kv";
    for (float temp : {0.0f, 0.9f}) {
        CAPTURE(temp);
        bluevm_request r;
        bluevm_request_init(&r);
        r.temperature = temp;
        r.seed = 11;
        r.ignore_eos = 1;
        r.prompt = "Once upon a time";
        r.max_tokens = 30;
        const Generated whole = mustGenerate(m, r);
        REQUIRE(whole.tokens.size() == 30);
        // 12 tokens and save; 18 more from the snapshot (empty prompt) and save again.
        r.max_tokens = 12;
        const Generated first = mustGenerate(m, r, nullptr, a.c_str());
        r.prompt = "";
        r.max_tokens = 18;
        const Generated second = mustGenerate(m, r, a.c_str(), b.c_str());
        std::vector<uint32_t> joined = first.tokens;
        joined.insert(joined.end(), second.tokens.begin(), second.tokens.end());
        CHECK(joined == whole.tokens);
        CHECK(first.text + second.text == whole.text);
        CHECK(second.reason == BLUEVM_FINISH_LENGTH);
        // A new turn appended to the saved conversation equals one run over the whole history.
        std::vector<uint32_t> history(64);
        size_t n = 0;
        REQUIRE(bluevm_tokenize(m, "Once upon a time", 16, 1, history.data(), history.size(), &n) == BLUEVM_OK);
        history.resize(n);
        history.insert(history.end(), whole.tokens.begin(), whole.tokens.end());
        const uint32_t turn[] = {365, 296, 265};
        r.prompt_ids = turn;
        r.n_prompt_ids = 3;
        r.max_tokens = 10;
        const Generated continued = mustGenerate(m, r, b.c_str(), nullptr);
        history.insert(history.end(), std::begin(turn), std::end(turn));
        r.prompt_ids = history.data();
        r.n_prompt_ids = history.size();
        CHECK(continued.tokens == mustGenerate(m, r).tokens);
        // The same file loaded and saved by one call grows by the turn and its answer.
        r.prompt_ids = turn;
        r.n_prompt_ids = 3;
        CHECK(mustGenerate(m, r, b.c_str(), b.c_str()).tokens == continued.tokens);
        CHECK(fileBytes(b).size() > fileBytes(a).size());
    }
    // A snapshot of BOS alone (no token generated) goes on as a run from BOS.
    bluevm_request r;
    bluevm_request_init(&r);
    r.temperature = 0;
    r.ignore_eos = 1;
    r.prompt = "";
    r.max_tokens = 0;
    CHECK(mustGenerate(m, r, nullptr, a.c_str()).tokens.empty());
    CHECK(fileBytes(a).size() == 64 + 4 + 10 * 32 * 2);  // 1 token; 5 layers of K and V, 32 F16 each
    r.max_tokens = 9;
    const Generated from_bos = mustGenerate(m, r);
    CHECK(mustGenerate(m, r, a.c_str(), nullptr).tokens == from_bos.tokens);
    const std::vector<uint32_t> greedy = expectedGreedyIds();
    CHECK(from_bos.tokens == std::vector<uint32_t>(greedy.begin(), greedy.begin() + 9));
    bluevm_model_info info;
    REQUIRE(bluevm_model_get_info(m, &info) == BLUEVM_OK);
    CHECK(info.validation_errors == 0u);
    bluevm_model_close(m);
}

TEST_CASE("capi: bluevm_generate refuses a missing, truncated, corrupt, wrong-version or too long snapshot") {
    TempDir dir;
    bluevm_model_options mo;
    bluevm_model_options_init(&mo);
    mo.ctx = 64;
    bluevm_model* m = nullptr;
    REQUIRE_MESSAGE(bluevm_model_open(storiesPath().c_str(), &mo, &m) == BLUEVM_OK, bluevm_last_error());
    const std::string good = dir.path + "/good.kv", bad = dir.path + "/bad.kv";
    bluevm_request r;
    bluevm_request_init(&r);
    r.temperature = 0;
    r.ignore_eos = 1;
    r.prompt = "Once upon a time";
    r.max_tokens = 40;
    mustGenerate(m, r, nullptr, good.c_str());
    const std::vector<uint8_t> bytes = fileBytes(good);
    REQUIRE(bytes.size() > 64);
    Generated g;
    auto refused = [&](const std::vector<uint8_t>& file, bluevm_status want, const std::string& part) {
        writeBytes(bad, file);
        r.prompt = "";
        r.max_tokens = 5;
        CHECK(generate(m, r, bad.c_str(), nullptr, &g) == want);
        CHECK_MESSAGE(std::string(bluevm_last_error()).find(part) != std::string::npos, bluevm_last_error());
    };
    refused(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100), BLUEVM_ERR_SNAPSHOT, "bad.kv: truncated: 100 bytes");
    std::vector<uint8_t> flipped = bytes;
    flipped[bytes.size() / 2] ^= 0x10;
    refused(flipped, BLUEVM_ERR_SNAPSHOT, "bad.kv: byte 64: payload checksum mismatch");
    std::vector<uint8_t> v9 = bytes;
    v9[8] = 9;
    refused(v9, BLUEVM_ERR_SNAPSHOT, "bad.kv: snapshot format version 9; this build reads version 1");
    refused({'h', 'i'}, BLUEVM_ERR_SNAPSHOT, "bad.kv: truncated: 2 bytes, shorter than the 64-byte snapshot header");
    refused(fileBytes(storiesPath()), BLUEVM_ERR_SNAPSHOT, "bad.kv: not a BlueVM KV snapshot (bad magic)");
    // Flipped bytes across the whole file: each is refused before anything runs.
    for (size_t at = 0; at < bytes.size(); at += bytes.size() / 61 + 1) {
        CAPTURE(at);
        std::vector<uint8_t> one = bytes;
        one[at] ^= 0x41;
        refused(one, BLUEVM_ERR_SNAPSHOT, "bad.kv: ");
    }
    CHECK(generate(m, r, (dir.path + "/none.kv").c_str(), nullptr, &g) == BLUEVM_ERR_IO);
    CHECK(std::string(bluevm_last_error()).find("none.kv: no such KV snapshot file") != std::string::npos);
    // 41 restored tokens and a 30-token turn do not fit 64 positions.
    std::vector<uint32_t> turn(30, 300);
    r.prompt_ids = turn.data();
    r.n_prompt_ids = turn.size();
    CHECK(generate(m, r, good.c_str(), nullptr, &g) == BLUEVM_ERR_TOO_LONG);
    CHECK(std::string(bluevm_last_error()) == "the prompt has 30 tokens after 45 restored ones; the context holds 64");
    r.prompt_ids = nullptr;
    // The model still works after every refusal.
    r.prompt = "";
    CHECK(mustGenerate(m, r, good.c_str(), nullptr).tokens.size() == 5);
    bluevm_model_close(m);
}
}  // namespace
}  // namespace blue::test
