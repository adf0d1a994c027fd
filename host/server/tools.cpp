// Tool calling (see tools.h).
#include "host/server/tools.h"

#include <cctype>
#include <functional>

#include "compiler/grammar/json_schema.h"
#include "vm/status.h"

namespace blue::server {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

namespace {

ApiError badTool(const std::string& param, const std::string& message) {
    ApiError e;
    e.message = message;
    e.param = param;
    return e;
}

bool validName(const std::string& s) {
    if (s.empty() || s.size() > 64) return false;
    for (unsigned char c : s) {
        if (!std::isalnum(c) && c != '_' && c != '-') return false;
    }
    return true;
}

// GBNF `text` with its rule `from` renamed `to` (names outside literals and classes only).
std::string renameRule(const std::string& text, const std::string& from, const std::string& to) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
        char c = text[i];
        if (c == '"' || c == '[') {  // a literal or a class: copied as is, escapes included
            const char close = c == '"' ? '"' : ']';
            size_t j = i + 1;
            while (j < text.size() && text[j] != close) j += text[j] == '\\' ? 2 : 1;
            out.append(text, i, j + 1 - i);
            i = j + 1;
            continue;
        }
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
            size_t j = i;
            while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '-' || text[j] == '_')) ++j;
            std::string word = text.substr(i, j - i);
            out += word == from ? to : word;
            i = j;
            continue;
        }
        out += c;
        ++i;
    }
    return out;
}

// Tool k's parameters as a subschema of the call schema, with its definitions moved out to
// `defs` (the call schema's root "$defs"): a tool's "$defs"/"definitions" entry X becomes
// "t<k>-X", and every "$ref" to it ("#/$defs/X", "#/definitions/X") and to the parameters
// themselves ("#", which then adds the parameters as "t<k>") is rewritten to match, so
// references keep resolving once the parameters sit inside the call, and two tools' definitions
// of the same name stay apart.
ordered hoistDefinitions(ordered params, size_t k, ordered* defs) {
    const std::string tag = "t" + std::to_string(k);
    bool self_ref = false;
    std::function<void(ordered&)> rewrite = [&](ordered& v) {
        if (v.is_array()) {
            for (ordered& e : v) rewrite(e);
            return;
        }
        if (!v.is_object()) return;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (it.key() == "$ref" && it.value().is_string()) {
                const std::string ref = it.value().get<std::string>();
                if (ref == "#") {
                    it.value() = "#/$defs/" + tag;
                    self_ref = true;
                    continue;
                }
                for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
                    if (ref.rfind(prefix, 0) == 0) it.value() = "#/$defs/" + tag + "-" + ref.substr(prefix.size());
                }
                continue;
            }
            rewrite(it.value());
        }
    };
    rewrite(params);
    for (const char* key : {"$defs", "definitions"}) {
        if (!params.is_object() || !params.contains(key)) continue;
        if (params[key].is_object()) {
            for (auto it = params[key].begin(); it != params[key].end(); ++it) (*defs)[tag + "-" + it.key()] = it.value();
        }
        params.erase(key);
    }
    if (self_ref) (*defs)[tag] = params;  // the target of "#"
    return params;
}

}  // namespace

bool toolsOffered(const ApiRequest& r) { return !r.tools.empty() && r.tool_choice != "none"; }

std::optional<ApiError> parseTools(const json& body, const ordered& ordered_body, ApiRequest* r) {
    auto it = body.find("tools");
    const bool has_tools = it != body.end() && !it->is_null();
    if (has_tools) {
        if (r->endpoint != Endpoint::Chat) return badTool("tools", "'tools' is a chat field");
        if (!it->is_array()) return badTool("tools", "'tools' must be an array");
        for (size_t k = 0; k < it->size(); ++k) {
            const json& t = (*it)[k];
            const std::string p = strFormat("tools[%zu]", k);
            if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
                !t["function"].is_object()) {
                return badTool("tools", "'" + p + "' must be {\"type\": \"function\", \"function\": {...}}");
            }
            const json& f = t["function"];
            if (!f.contains("name") || !f["name"].is_string() || !validName(f["name"].get<std::string>())) {
                return badTool("tools", "'" + p + ".function.name' must be 1 to 64 letters, digits, '_' or '-'");
            }
            ApiRequest::Tool tool;
            tool.name = f["name"].get<std::string>();
            for (const ApiRequest::Tool& other : r->tools) {
                if (other.name == tool.name) return badTool("tools", "'" + p + "': a second tool named '" + tool.name + "'");
            }
            if (f.contains("description") && f["description"].is_string()) tool.description = f["description"];
            const ordered& of = ordered_body["tools"][k]["function"];
            if (f.contains("parameters") && !f["parameters"].is_null()) {
                if (!f["parameters"].is_object()) {
                    return badTool("tools", "'" + p + ".function.parameters' must be a JSON schema object");
                }
                tool.parameters = of["parameters"].dump();
            } else {
                tool.parameters = R"({"type": "object", "properties": {}})";
            }
            r->tools.push_back(std::move(tool));
        }
    }
    auto c = body.find("tool_choice");
    if (c == body.end() || c->is_null()) {
        r->tool_choice = r->tools.empty() ? "" : "auto";
        return std::nullopt;
    }
    if (!has_tools || r->tools.empty()) return badTool("tool_choice", "'tool_choice' needs 'tools'");
    if (c->is_string()) {
        std::string s = c->get<std::string>();
        if (s != "none" && s != "auto" && s != "required") {
            return badTool("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", ...}");
        }
        r->tool_choice = s;
        return std::nullopt;
    }
    if (!c->is_object() || !c->contains("function") || !(*c)["function"].is_object() ||
        !(*c)["function"].contains("name") || !(*c)["function"]["name"].is_string()) {
        return badTool("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    std::string name = (*c)["function"]["name"];
    for (const ApiRequest::Tool& t : r->tools) {
        if (t.name == name) {
            r->tool_choice = name;
            return std::nullopt;
        }
    }
    return badTool("tool_choice", "'tool_choice' names '" + name + "', which is not among 'tools'");
}

std::optional<ApiError> toolCallsText(const json& calls, size_t index, std::string* out) {
    const std::string p = strFormat("messages[%zu].tool_calls", index);
    if (!calls.is_array() || calls.empty() || !calls[0].is_object() || !calls[0].contains("function") ||
        !calls[0]["function"].is_object() || !calls[0]["function"].contains("name") ||
        !calls[0]["function"]["name"].is_string()) {
        return badTool(p, "'" + p + "' must be an array of {\"function\": {\"name\": ..., \"arguments\": ...}}");
    }
    const json& f = calls[0]["function"];
    json args = json::object();
    if (f.contains("arguments") && f["arguments"].is_string()) {
        args = json::parse(f["arguments"].get<std::string>(), nullptr, false);
        if (args.is_discarded()) return badTool(p, "'" + p + "[0].function.arguments' must be JSON text");
    } else if (f.contains("arguments") && f["arguments"].is_object()) {
        args = f["arguments"];
    }
    *out = ordered{{"name", f["name"]}, {"arguments", args}}.dump();
    return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> withTools(const ApiRequest& r) {
    std::vector<std::pair<std::string, std::string>> out = r.messages;
    if (!toolsOffered(r)) return out;
    std::string text =
        "You can call tools. To call one, answer with a JSON object and nothing else: "
        "{\"name\": the tool's name, \"arguments\": an object valid against its parameters}. "
        "After a call, its result comes back in a tool message. The tools, one a line:\n";
    for (const ApiRequest::Tool& t : r.tools) {
        ordered line = {{"name", t.name}, {"description", t.description}, {"parameters", ordered::parse(t.parameters)}};
        text += line.dump() + "\n";
    }
    if (!out.empty() && out[0].first == "system") {
        out[0].second += "\n\n" + text;
    } else {
        out.insert(out.begin(), {"system", text});
    }
    return out;
}

std::optional<ApiError> toolConstraint(const ApiRequest& r, std::string* kind, std::string* text) {
    kind->clear();
    text->clear();
    if (!toolsOffered(r)) return std::nullopt;
    ordered calls = ordered::array(), defs = ordered::object();
    for (size_t k = 0; k < r.tools.size(); ++k) {
        const ApiRequest::Tool& t = r.tools[k];
        if (r.tool_choice != "auto" && r.tool_choice != "required" && r.tool_choice != t.name) continue;
        ordered params = hoistDefinitions(ordered::parse(t.parameters), k, &defs);
        ordered call = {{"type", "object"},
                        {"properties", {{"name", {{"const", t.name}}}, {"arguments", params}}},
                        {"required", {"name", "arguments"}}};
        calls.push_back(call);
    }
    ordered schema = calls.size() == 1 ? calls[0] : ordered{{"anyOf", calls}};
    if (!defs.empty()) schema["$defs"] = defs;
    if (r.tool_choice != "auto") {
        *kind = "json_schema";
        *text = schema.dump();
        return std::nullopt;
    }
    // "auto": a call, or text that does not start with '{'.
    Result<std::string> g = jsonSchemaToGbnf(schema);
    if (!g) return badTool("tools", "tools: " + g.message());
    *kind = "grammar";
    *text = "root ::= tool-call | free-text\nfree-text ::= [^{] [^\\x00]*\n" + renameRule(g.value(), "root", "tool-call");
    return std::nullopt;
}

json toolCallsOf(const std::vector<ApiRequest::Tool>& offered, const std::string& text, const std::string& id) {
    if (offered.empty() || text.empty() || text[0] != '{') return nullptr;
    ordered call = ordered::parse(text, nullptr, false);
    if (call.is_discarded() || !call.is_object() || !call.contains("name") || !call["name"].is_string() ||
        !call.contains("arguments")) {
        return nullptr;
    }
    const std::string name = call["name"];
    bool known = false;
    for (const ApiRequest::Tool& t : offered) known = known || t.name == name;
    if (!known) return nullptr;
    return json::array({{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", call["arguments"].dump()}}}}});
}

}  // namespace blue::server
