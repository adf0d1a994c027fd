// The C API's one-shot generation with KV persistence (bluevm_generate, host/bluevm.h): one
// request on one instance through Engine::run, with a snapshot restored before it and saved
// after it (host/memory/kv_snapshot.h).
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "host/bluevm.h"
#include "host/capi_internal.h"

using namespace blue::capi;

extern "C" {

bluevm_status bluevm_generate(bluevm_model* model, const bluevm_request* request,
                              const char* kv_load, const char* kv_save, bluevm_completion* out) {
    return guarded([&] {
        if (!model || !request || !out) {
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "model, request and out must not be NULL");
        }
        *out = bluevm_completion{};
        if (request->n_stop)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "bluevm_generate takes no stop strings");
        if (request->session && *request->session)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "bluevm_generate keeps no sessions (submit the request to an engine)");
        if (request->embed)
            return failWith(BLUEVM_ERR_INVALID_ARGUMENT, "bluevm_generate does not embed (submit the request to an engine)");
        blue::Engine& e = *model->engine;
        blue::KvSnapshot restore, saved;
        blue::KvRun kv;
        if (kv_load) {
            std::error_code ec;
            if (!std::filesystem::is_regular_file(kv_load, ec)) {
                return failWith(BLUEVM_ERR_IO, std::string(kv_load) + ": no such KV snapshot file");
            }
            auto snap = e.readKv(kv_load);
            if (!snap) return failWith(BLUEVM_ERR_SNAPSHOT, snap.message());
            restore = std::move(snap.value());
            kv.restore = &restore;
        }
        if (kv_save) kv.save = &saved;
        blue::GenerationRequest r;
        if (request->prompt_ids) {
            r.prompt.assign(request->prompt_ids, request->prompt_ids + request->n_prompt_ids);
        } else {
            std::string text = request->prompt ? request->prompt : "";
            if (kv_load) {
                r.prompt = e.continuationTokens(text, request->parse_special != 0);
            } else {
                r.prompt = request->parse_special ? e.specialTokens(text) : e.promptTokens(text);
            }
        }
        setRequestParams(*request, &r);
        bool too_large = false;
        if (blue::Status c = setRequestConstraint(*request, e, &r, &too_large); !c) {
            return failWith(too_large ? BLUEVM_ERR_GRAMMAR_TOO_LARGE : BLUEVM_ERR_INVALID_ARGUMENT, c.message());
        }
        const uint64_t restored = kv_load ? restore.tokens.size() : 0;
        if (restored + r.prompt.size() >= e.contextLength()) {
            return failWith(
                BLUEVM_ERR_TOO_LONG,
                blue::strFormat(
                    "the prompt has %zu tokens after %llu restored ones; the context holds %u",
                    r.prompt.size(), (unsigned long long)restored, e.contextLength()));
        }
        blue::clearVkFailure();
        auto results = e.run({r}, {}, kv);
        if (!results) {
            blue::VkFailure f = blue::lastVkFailure();
            return failWith(f.result != VK_SUCCESS ? deviceStatus() : BLUEVM_ERR_INVALID_ARGUMENT,
                            results.message());
        }
        if (kv_save) {
            if (blue::Status s = e.writeKv(saved, kv_save); !s)
                return failWith(BLUEVM_ERR_IO, s.message());
        }
        const blue::Completion& c = results.value()[0];
        bluevm_completion o{};
        o.text = static_cast<char*>(std::malloc(c.text.size() + 1));
        o.tokens = static_cast<uint32_t*>(std::malloc(c.tokens.size() * 4 + 4));
        if (!o.text || !o.tokens) {
            std::free(o.text);
            std::free(o.tokens);
            return failWith(BLUEVM_ERR_INTERNAL, "out of host memory");
        }
        std::memcpy(o.text, c.text.c_str(), c.text.size() + 1);
        if (!c.tokens.empty()) std::memcpy(o.tokens, c.tokens.data(), c.tokens.size() * 4);
        o.text_len = c.text.size();
        o.n_tokens = c.tokens.size();
        o.prompt_tokens = uint32_t(r.prompt.size());
        o.reason = c.tokens.size() >= r.max_new ? BLUEVM_FINISH_LENGTH : BLUEVM_FINISH_STOP;
        *out = o;
        return ok();
    });
}

void bluevm_completion_free(bluevm_completion* c) {
    if (!c) return;
    std::free(c->text);
    std::free(c->tokens);
    *c = bluevm_completion{};
}

}  // extern "C"
