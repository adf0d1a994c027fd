// OpenAI request parsing and response formats (see openai.h).
#include "host/server/openai.h"

#include "host/server/tools.h"

#include <cmath>

#include "vm/status.h"

namespace blue::server {

namespace {

using json = nlohmann::json;

ApiError bad(std::string param, std::string message) {
    ApiError e;
    e.param = std::move(param);
    e.message = std::move(message);
    return e;
}

// Reads an optional number field within [lo, hi].
std::optional<ApiError> number(const json& j, const char* key, double lo, double hi, float* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) return bad(key, strFormat("'%s' must be a number", key));
    double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
        return bad(key, strFormat("'%s' must be between %g and %g, not %g", key, lo, hi, v));
    }
    *out = float(v);
    return std::nullopt;
}

// Reads an optional integer field within [lo, hi].
std::optional<ApiError> integer(const json& j, const char* key, int64_t lo, int64_t hi,
                                int64_t* out, bool* given = nullptr) {
    auto it = j.find(key);
    if (given) *given = false;
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer()) {
        // 16.0 is an integer to most clients' JSON encoders.
        if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
            std::fabs(it->get<double>()) < 9e15) {
            *out = int64_t(it->get<double>());
        } else {
            return bad(key, strFormat("'%s' must be an integer", key));
        }
    } else {
        *out = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                   ? INT64_MAX
                   : it->get<int64_t>();
    }
    if (*out < lo || *out > hi) {
        return bad(key, strFormat("'%s' must be between %lld and %lld, not %lld", key,
                                  (long long)lo, (long long)hi, (long long)*out));
    }
    if (given) *given = true;
    return std::nullopt;
}

std::optional<ApiError> boolean(const json& j, const char* key, bool* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) return bad(key, strFormat("'%s' must be true or false", key));
    *out = it->get<bool>();
    return std::nullopt;
}

// Completions: `logprobs` an integer 0..20 (or null); chat: `logprobs` a boolean and
// `top_logprobs` an integer 0..20 that needs it.
std::optional<ApiError> parseLogprobs(Endpoint endpoint, const json& j, ApiRequest* r) {
    int64_t v = 0;
    bool given = false;
    if (endpoint == Endpoint::Completions) {
        if (auto it = j.find("logprobs"); it != j.end() && it->is_boolean()) {
            return bad("logprobs", strFormat("'logprobs' must be an integer between 0 and %u", kMaxTopLogprobs));
        }
        if (auto e = integer(j, "logprobs", 0, kMaxTopLogprobs, &v, &given)) return e;
        r->logprobs = given;
        r->top_logprobs = uint32_t(v);
        if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) {
            return bad("top_logprobs", "'top_logprobs' is a chat field: completions take 'logprobs': N");
        }
        return std::nullopt;
    }
    if (auto e = boolean(j, "logprobs", &r->logprobs)) return e;
    if (auto e = integer(j, "top_logprobs", 0, kMaxTopLogprobs, &v, &given)) return e;
    if (given && !r->logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = uint32_t(v);
    return std::nullopt;
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> contentText(const json& c, size_t index, std::string* out) {
    const std::string param = strFormat("messages[%zu].content", index);
    if (c.is_string()) {
        *out = c.get<std::string>();
        return std::nullopt;
    }
    if (c.is_null()) {
        out->clear();
        return std::nullopt;
    }
    if (!c.is_array()) return bad(param, "'" + param + "' must be a string or an array of text parts");
    out->clear();
    for (size_t k = 0; k < c.size(); ++k) {
        const json& part = c[k];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
            return bad(param, strFormat("'%s[%zu]' must be a {\"type\": \"text\", \"text\": ...} part "
                                        "(this model reads text only)", param.c_str(), k));
        }
        *out += part["text"].get<std::string>();
    }
    return std::nullopt;
}

// response_format, grammar and json_schema (structured output): their shape only; the grammar
// or schema itself is checked when it is compiled.
std::optional<ApiError> parseOutputFormat(const json& j, ApiRequest* r) {
    int given = 0;
    if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
        const json& f = *it;
        if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
            return bad("response_format", "'response_format' must be an object with a string 'type'");
        }
        const std::string type = f["type"].get<std::string>();
        if (type == "json_object") {
            r->json_object = true;
            ++given;
        } else if (type == "json_schema") {
            auto js = f.find("json_schema");
            if (js == f.end() || !js->is_object()) {
                return bad("response_format", "'response_format.json_schema' must be an object with a 'schema'");
            }
            auto schema = js->find("schema");
            if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
                return bad("response_format", "'response_format.json_schema.schema' must be a JSON schema object");
            }
            r->json_schema = schema->dump();
            ++given;
        } else if (type != "text") {
            return bad("response_format", "'response_format.type' must be 'text', 'json_object' or 'json_schema', not '" +
                                              type + "'");
        }
        r->format_param = "response_format";
    }
    if (auto it = j.find("json_schema"); it != j.end() && !it->is_null()) {
        if (!it->is_object()) return bad("json_schema", "'json_schema' must be a JSON schema object");
        r->json_schema = it->dump();
        r->format_param = "json_schema";
        ++given;
    }
    if (auto it = j.find("grammar"); it != j.end() && !it->is_null()) {
        if (!it->is_string()) return bad("grammar", "'grammar' must be a string (GBNF)");
        r->grammar = it->get<std::string>();
        if (!r->grammar.empty()) {
            r->format_param = "grammar";
            ++given;
        }
    }
    if (given > 1) {
        return bad(r->format_param, "at most one of 'response_format' (json_object, json_schema), 'json_schema' and 'grammar'");
    }
    return std::nullopt;
}

std::optional<ApiError> parseBody(Endpoint endpoint, const json& j, uint32_t max_context,
                                  ApiRequest* r) {
    if (!j.is_object()) return bad("", "the request body must be a JSON object");
    r->endpoint = endpoint;
    if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
        if (!it->is_string()) return bad("model", "'model' must be a string");
        r->model = it->get<std::string>();
    }
    if (endpoint == Endpoint::Completions) {
        auto it = j.find("prompt");
        if (it == j.end() || it->is_null()) return bad("prompt", "'prompt' is required");
        const json* p = &*it;
        // A batch of one prompt is accepted as that prompt.
        if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
            p = &(*p)[0];
        }
        if (p->is_string()) {
            r->prompt = p->get<std::string>();
        } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
            for (size_t k = 0; k < p->size(); ++k) {
                const json& t = (*p)[k];
                if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
                    return bad("prompt", strFormat("'prompt[%zu]' must be a token id", k));
                }
                r->prompt_ids.push_back(uint32_t(t.get<int64_t>()));
            }
            r->has_prompt_ids = true;
        } else if (p->is_array() && p->size() > 1) {
            return bad("prompt", "a batch of prompts is not supported: send one request per prompt");
        } else {
            return bad("prompt", "'prompt' must be a string or an array of token ids");
        }
        if (auto e = boolean(j, "echo", &r->echo)) return e;
        r->max_tokens = 16;  // the completions API's default
    } else {
        auto it = j.find("messages");
        if (it == j.end() || it->is_null()) return bad("messages", "'messages' is required");
        if (!it->is_array() || it->empty()) return bad("messages", "'messages' must be a non-empty array");
        for (size_t k = 0; k < it->size(); ++k) {
            const json& m = (*it)[k];
            const std::string param = strFormat("messages[%zu]", k);
            if (!m.is_object()) return bad(param, "'" + param + "' must be an object");
            if (!m.contains("role") || !m["role"].is_string()) {
                return bad(param + ".role", "'" + param + ".role' must be a string");
            }
            ApiRequest::Message msg;
            msg.role = m["role"].get<std::string>();
            const bool has_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
            if (has_calls) {
                if (auto e = messageCalls(m["tool_calls"], k, &msg.calls)) return e;  // the calls it made
            }
            if (auto e = contentText(m.contains("content") ? m["content"] : json(), k, &msg.content)) return e;
            if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) msg.tool_call_id = id->get<std::string>();
            r->messages.push_back(std::move(msg));
        }
    }
    if (auto e = boolean(j, "stream", &r->stream)) return e;
    if (auto e = boolean(j, "ignore_eos", &r->ignore_eos)) return e;
    if (auto e = boolean(j, "cache_prompt", &r->cache_prompt)) return e;
    if (auto it = j.find("session_id"); it != j.end() && !it->is_null()) {
        if (!it->is_string() || it->get_ref<const std::string&>().empty() || it->get_ref<const std::string&>().size() > 256) {
            return bad("session_id", "'session_id' must be a non-empty string of at most 256 bytes");
        }
        r->session_id = it->get<std::string>();
    }
    if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
        if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
        if (auto e = boolean(*it, "include_usage", &r->include_usage)) return e;
    }
    int64_t v = 0;
    bool given = false;
    const char* max_key = endpoint == Endpoint::Chat && j.contains("max_completion_tokens")
                              ? "max_completion_tokens"
                              : "max_tokens";
    if (auto e = integer(j, max_key, 1, max_context, &v, &given)) return e;
    if (given) r->max_tokens = uint32_t(v);
    if (auto e = integer(j, "n", 1, 1, &v)) {
        e->message = "'n' must be 1: one choice per request";
        return e;
    }
    if (auto e = number(j, "temperature", 0, 2, &r->temperature)) return e;
    if (auto e = number(j, "top_p", 0, 1, &r->top_p)) return e;
    if (j.contains("top_p") && !(r->top_p > 0)) return bad("top_p", "'top_p' must be more than 0");
    if (auto e = integer(j, "top_k", 0, 1 << 20, &v, &given)) return e;
    if (given) r->top_k = uint32_t(v);
    if (auto e = number(j, "min_p", 0, 1, &r->min_p)) return e;
    if (auto e = number(j, "repeat_penalty", 0.01, 100, &r->repeat_penalty)) return e;
    if (auto e = number(j, "presence_penalty", -2, 2, &r->presence_penalty)) return e;
    if (auto e = number(j, "frequency_penalty", -2, 2, &r->frequency_penalty)) return e;
    if (auto e = integer(j, "seed", INT64_MIN, INT64_MAX, &v, &r->seed_given)) return e;
    if (r->seed_given) r->seed = uint32_t(uint64_t(v));
    if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
        if (it->is_string()) {
            r->stop.push_back(it->get<std::string>());
        } else if (it->is_array() && it->size() <= 4) {
            for (size_t k = 0; k < it->size(); ++k) {
                if (!(*it)[k].is_string()) return bad("stop", strFormat("'stop[%zu]' must be a string", k));
                r->stop.push_back((*it)[k].get<std::string>());
            }
        } else {
            return bad("stop", "'stop' must be a string or an array of at most 4 strings");
        }
        for (const std::string& s : r->stop) {
            if (s.empty()) return bad("stop", "stop strings must not be empty");
        }
    }
    if (auto e = parseLogprobs(endpoint, j, r)) return e;
    if (auto e = parseOutputFormat(j, r)) return e;
    for (const char* unsupported : {"functions", "logit_bias",
                                    "best_of", "suffix"}) {
        auto it = j.find(unsupported);
        if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;
        return bad(unsupported, strFormat("'%s' is not supported by this server", unsupported));
    }
    return std::nullopt;
}

}  // namespace

std::optional<ApiError> parseRequest(Endpoint endpoint, const std::string& body,
                                     uint32_t max_context, ApiRequest* out) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded()) {
        // Re-parse with exceptions for the position and reason.
        try {
            json again = json::parse(body);
        } catch (const json::parse_error& e) {
            return bad("", std::string("invalid JSON: ") + e.what());
        }
        return bad("", "invalid JSON");
    }
    if (auto e = parseBody(endpoint, j, max_context, out)) return e;
    // Schemas again with their keys in the order the client wrote them (json sorts them):
    // properties are generated in the schema's order.
    nlohmann::ordered_json o = nlohmann::ordered_json::parse(body, nullptr, false);
    if (auto e = parseTools(j, o, out)) return e;
    if (!out->tools.empty() && out->tool_choice != "none" && !out->format_param.empty() &&
        (out->json_object || !out->json_schema.empty() || !out->grammar.empty())) {
        return bad("tools", "'tools' and '" + out->format_param + "': at most one (a tool call is JSON of its own)");
    }
    if (!out->json_schema.empty()) {
        const nlohmann::ordered_json* schema = nullptr;
        if (out->format_param == "json_schema") {
            schema = &o["json_schema"];
        } else {
            schema = &o["response_format"]["json_schema"]["schema"];
        }
        out->json_schema = schema->dump();
    }
    return std::nullopt;
}

std::string errorBody(const ApiError& e) {
    json err = {{"message", e.message}, {"type", e.type}};
    err["param"] = e.param.empty() ? json() : json(e.param);
    err["code"] = e.code.empty() ? json() : json(e.code);
    return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

json usageJson(const Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string dump(const json& j) {
    // Generated text may end inside a UTF-8 sequence cut by a stop string: replace, never throw.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json finishJson(const std::string& reason) {
    return reason.empty() ? json() : json(reason);
}

}  // namespace

json bytesJson(std::string_view s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

json logprobsJson(Endpoint endpoint, const std::vector<TokenLogprob>& tokens, size_t text_offset) {
    if (endpoint == Endpoint::Chat) {
        json content = json::array();
        for (const TokenLogprob& t : tokens) {
            json top = json::array();
            for (const auto& [text, lp] : t.top) {
                top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytesJson(text)}});
            }
            content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytesJson(t.token)},
                               {"top_logprobs", top}});
        }
        return {{"content", content}, {"refusal", nullptr}};
    }
    json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenLogprob& t : tokens) {
        texts.push_back(t.token);
        lps.push_back(t.logprob);
        json top = json::object();
        for (const auto& [text, lp] : t.top) {
            if (!top.contains(text)) top[text] = lp;  // texts that repeat keep the likeliest
        }
        tops.push_back(top);
        offsets.push_back(text_offset);
        text_offset += t.token.size();
    }
    return {{"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string responseBody(Endpoint endpoint, const std::string& id, int64_t created,
                         const std::string& model, const std::string& text,
                         const std::string& finish_reason, const Usage& usage,
                         const nlohmann::json& extra, const nlohmann::json& logprobs,
                         const nlohmann::json& tool_calls) {
    json choice = {{"index", 0}, {"finish_reason", finishJson(finish_reason)}, {"logprobs", logprobs}};
    if (endpoint == Endpoint::Chat && tool_calls.is_array()) {
        choice["message"] = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", tool_calls}};
    } else if (endpoint == Endpoint::Chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = text;
    }
    json j = {{"id", id},
              {"object", endpoint == Endpoint::Chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usageJson(usage)}};
    if (extra.is_object()) j.update(extra);
    return dump(j);
}

std::string streamChunk(Endpoint endpoint, const std::string& id, int64_t created,
                        const std::string& model, const std::string& text,
                        const std::string& finish_reason, bool role_chunk, const nlohmann::json& logprobs,
                        const nlohmann::json& tool_calls) {
    json choice = {{"index", 0}, {"finish_reason", finishJson(finish_reason)}, {"logprobs", logprobs}};
    if (endpoint == Endpoint::Chat && tool_calls.is_array()) {
        json calls = tool_calls;
        for (size_t i = 0; i < calls.size(); ++i) calls[i]["index"] = i;
        choice["delta"] = {{"tool_calls", calls}};
    } else if (endpoint == Endpoint::Chat) {
        json delta = json::object();
        if (role_chunk) delta["role"] = "assistant";
        if (role_chunk || !text.empty()) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    json j = {{"id", id},
              {"object", endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
    return "data: " + dump(j) + "\n\n";
}

std::string usageChunk(Endpoint endpoint, const std::string& id, int64_t created,
                       const std::string& model, const Usage& usage) {
    json j = {{"id", id},
              {"object", endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array()},
              {"usage", usageJson(usage)}};
    return "data: " + dump(j) + "\n\n";
}

}  // namespace blue::server
