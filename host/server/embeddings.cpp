// /v1/embeddings bodies and responses (see embeddings.h).
#include "host/server/embeddings.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "vm/status.h"

namespace blue::server {

namespace {

ApiError bad(const std::string& message, const char* param) {
    return ApiError{400, message, "invalid_request_error", param, ""};
}

// An array of token ids, or nullopt with *error set (`where` names it in messages).
std::optional<std::vector<uint32_t>> tokenIds(const nlohmann::json& a, uint32_t n_vocab, const std::string& where,
                                              ApiError* error) {
    std::vector<uint32_t> ids;
    for (size_t k = 0; k < a.size(); ++k) {
        const nlohmann::json& t = a[k];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= int64_t(n_vocab)) {
            *error = bad(strFormat("'%s[%zu]' (%s) is not a token id of this model's vocabulary (%u)", where.c_str(), k,
                                   t.dump().c_str(), n_vocab),
                         "input");
            return std::nullopt;
        }
        ids.push_back(uint32_t(t.get<int64_t>()));
    }
    return ids;
}

}  // namespace

std::optional<ApiError> parseEmbeddingRequest(const std::string& body, uint32_t n_embd, uint32_t n_vocab,
                                              EmbeddingRequest* out) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object()) return bad("the body is not a JSON object", "");
    *out = EmbeddingRequest{};
    if (j.contains("model")) {
        if (!j["model"].is_string()) return bad("'model' must be a string", "model");
        out->model = j["model"].get<std::string>();
    }
    if (!j.contains("input")) return bad("'input' is required: a string, an array of strings or of token ids", "input");
    const nlohmann::json& in = j["input"];
    ApiError error;
    auto addText = [&](const nlohmann::json& s, const std::string& where) -> bool {
        if (s.get_ref<const std::string&>().empty()) {
            error = bad("'" + where + "' is empty: an embedding needs text", "input");
            return false;
        }
        out->inputs.push_back({s.get<std::string>(), {}, false});
        return true;
    };
    auto addIds = [&](const nlohmann::json& a, const std::string& where) -> bool {
        if (a.empty()) {
            error = bad("'" + where + "' is empty: an embedding needs tokens", "input");
            return false;
        }
        auto ids = tokenIds(a, n_vocab, where, &error);
        if (!ids) return false;
        out->inputs.push_back({"", std::move(*ids), true});
        return true;
    };
    if (in.is_string()) {
        if (!addText(in, "input")) return error;
    } else if (in.is_array() && !in.empty() && in[0].is_number()) {
        if (!addIds(in, "input")) return error;
    } else if (in.is_array()) {
        if (in.empty()) return bad("'input' is an empty array", "input");
        if (in.size() > kMaxEmbeddingInputs) {
            return bad(strFormat("'input' has %zu items; at most %zu per request", in.size(), kMaxEmbeddingInputs), "input");
        }
        for (size_t i = 0; i < in.size(); ++i) {
            const std::string where = strFormat("input[%zu]", i);
            if (!in[i].is_string() && !in[i].is_array()) {
                return bad("'" + where + "' must be a string or an array of token ids", "input");
            }
            if (!(in[i].is_string() ? addText(in[i], where) : addIds(in[i], where))) return error;
        }
    } else {
        return bad("'input' must be a string, an array of strings or of token ids", "input");
    }
    if (j.contains("encoding_format")) {
        const nlohmann::json& f = j["encoding_format"];
        if (!f.is_string() || (f != "float" && f != "base64")) {
            return bad("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
        }
        out->base64 = f == "base64";
    }
    if (j.contains("dimensions") && !j["dimensions"].is_null()) {
        const nlohmann::json& d = j["dimensions"];
        if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > int64_t(n_embd)) {
            return bad(strFormat("'dimensions' must be an integer from 1 to %u (the model's embedding size)", n_embd),
                       "dimensions");
        }
        out->dimensions = uint32_t(d.get<int64_t>());
    }
    if (j.contains("user") && !j["user"].is_string()) return bad("'user' must be a string", "user");
    return std::nullopt;
}

std::vector<float> finishEmbedding(const std::vector<float>& pooled, uint32_t dimensions) {
    std::vector<float> v(pooled.begin(), dimensions && dimensions < pooled.size() ? pooled.begin() + dimensions : pooled.end());
    double sq = 0;
    for (float x : v) sq += double(x) * x;
    if (sq > 0) {
        const double inv = 1.0 / std::sqrt(sq);
        for (float& x : v) x = float(x * inv);
    }
    return v;
}

std::string base64Floats(const std::vector<float>& v) {
    static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
        uint32_t u = std::bit_cast<uint32_t>(v[i]);
        for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = uint8_t(u >> (8 * b));
    }
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t w = uint32_t(bytes[i]) << 16 | (n > 1 ? uint32_t(bytes[i + 1]) << 8 : 0) | (n > 2 ? bytes[i + 2] : 0);
        for (size_t c = 0; c < 4; ++c) out += c <= n ? kAlphabet[(w >> (18 - 6 * c)) & 63] : '=';
    }
    return out;
}

nlohmann::json embeddingResponse(const std::vector<std::vector<float>>& vectors, bool base64,
                                 const std::string& model, uint64_t prompt_tokens) {
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < vectors.size(); ++i) {
        nlohmann::json e = {{"object", "embedding"}, {"index", i}};
        if (base64) {
            e["embedding"] = base64Floats(vectors[i]);
        } else {
            e["embedding"] = vectors[i];
        }
        data.push_back(std::move(e));
    }
    return {{"object", "list"},
            {"data", std::move(data)},
            {"model", model},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace blue::server
