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

// Mistral's marker before its calls: a control token whose text decoding shows (Tokenizer::hidden).
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";

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

// The key of a call's arguments in format `f`.
const char* argumentsKey(ToolFormat f) { return f == ToolFormat::Llama3 ? "parameters" : "arguments"; }

// The bytes a call can start with in format `f`; with "auto", text starts with none of them.
std::string_view callFirstBytes(ToolFormat f) {
    switch (f) {
        case ToolFormat::Hermes: return "<";  // <tool_call>
        case ToolFormat::Json: return "{[";   // a call, or an array of them
        case ToolFormat::Llama3: return "{";
        case ToolFormat::Mistral: return "[";  // [TOOL_CALLS]
    }
    return "{";
}

// A call as format `f` writes it: {"name", "arguments"} (Llama 3: "parameters").
ordered callObject(ToolFormat f, const ordered& call) {
    return ordered{{"name", call["name"]}, {argumentsKey(f), call["arguments"]}};
}

// An assistant turn's calls as the text the model would have written.
std::string callsText(ToolFormat f, const std::vector<ordered>& calls) {
    std::string out;
    switch (f) {
        case ToolFormat::Json:
            return calls.size() == 1 ? callObject(f, calls[0]).dump() : [&] {
                ordered a = ordered::array();
                for (const ordered& c : calls) a.push_back(callObject(f, c));
                return a.dump();
            }();
        case ToolFormat::Hermes:
            for (const ordered& c : calls) {
                out += (out.empty() ? "" : "\n") + std::string("<tool_call>\n") + callObject(f, c).dump() + "\n</tool_call>";
            }
            return out;
        case ToolFormat::Llama3:
            for (const ordered& c : calls) out += (out.empty() ? "" : "\n") + callObject(f, c).dump();
            return out;
        case ToolFormat::Mistral: {
            ordered a = ordered::array();
            for (const ordered& c : calls) {
                ordered o = callObject(f, c);
                if (c.contains("id")) o["id"] = c["id"];
                a.push_back(std::move(o));
            }
            return std::string(kMistralCalls) + " " + a.dump();
        }
    }
    return out;
}

// The tools' description for the system message, in the format's words and markers.
std::string toolsText(const ApiRequest& r, ToolFormat f) {
    std::string text;
    auto signature = [](const ApiRequest::Tool& t) {
        return ordered{{"type", "function"},
                       {"function", {{"name", t.name}, {"description", t.description}, {"parameters", ordered::parse(t.parameters)}}}}
            .dump();
    };
    switch (f) {
        case ToolFormat::Json:
            text = "You can call tools. To call one, answer with a JSON object and nothing else: "
                   "{\"name\": the tool's name, \"arguments\": an object valid against its parameters}.";
            if (r.parallel_tool_calls) text += " To call several at once, answer with a JSON array of such objects.";
            text += " After a call, its result comes back in a tool message. The tools, one a line:\n";
            for (const ApiRequest::Tool& t : r.tools) {
                text += ordered{{"name", t.name}, {"description", t.description}, {"parameters", ordered::parse(t.parameters)}}.dump() + "\n";
            }
            return text;
        case ToolFormat::Hermes:
            text = "# Tools\n\nYou can call functions to help with the request. Their signatures are inside "
                   "<tools></tools>, one a line:\n<tools>\n";
            for (const ApiRequest::Tool& t : r.tools) text += signature(t) + "\n";
            text += "</tools>\n\nTo call a function, write its name and arguments as a JSON object inside "
                    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                    "<args-json-object>}\n</tool_call>";
            text += r.parallel_tool_calls ? "\nTo call several functions, write one such block for each."
                                          : "\nCall at most one function in an answer.";
            return text;
        case ToolFormat::Mistral:  // the signatures alone: the turn's markers say what they are
            for (const ApiRequest::Tool& t : r.tools) text += (text.empty() ? "[" : ", ") + signature(t);
            return text + "]";
        case ToolFormat::Llama3:
            text = "Environment: ipython\n\nYou can call functions. To call one, answer with nothing but a JSON "
                   "object {\"name\": the function's name, \"parameters\": an object of its arguments' names "
                   "and values}. A call's result comes back from ipython. The functions:\n\n";
            for (const ApiRequest::Tool& t : r.tools) text += signature(t) + "\n\n";
            return text;
    }
    return text;
}

// The JSON schema of one call of the tools `tool_choice` allows, in format `f`.
ordered callSchema(const ApiRequest& r, ToolFormat f) {
    ordered calls = ordered::array(), defs = ordered::object();
    for (size_t k = 0; k < r.tools.size(); ++k) {
        const ApiRequest::Tool& t = r.tools[k];
        if (r.tool_choice != "auto" && r.tool_choice != "required" && r.tool_choice != t.name) continue;
        ordered params = hoistDefinitions(ordered::parse(t.parameters), k, &defs);
        const char* args = argumentsKey(f);
        calls.push_back({{"type", "object"},
                         {"properties", {{"name", {{"const", t.name}}}, {args, params}}},
                         {"required", {"name", args}}});
    }
    ordered schema = calls.size() == 1 ? calls[0] : ordered{{"anyOf", calls}};
    if (!defs.empty()) schema["$defs"] = defs;
    return schema;
}

// A call read back: {"name", "arguments"} of an offered tool, or null.
ordered readCall(const std::vector<ApiRequest::Tool>& offered, ToolFormat f, const ordered& call) {
    const char* args = argumentsKey(f);
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return nullptr;
    if (!call.contains(args) && !call.contains("arguments")) return nullptr;
    const std::string name = call["name"];
    bool known = false;
    for (const ApiRequest::Tool& t : offered) known = known || t.name == name;
    if (!known) return nullptr;
    return ordered{{"name", name}, {"arguments", call.contains(args) ? call[args] : call["arguments"]}};
}

bool isSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

std::string_view toolFormatName(ToolFormat f) {
    switch (f) {
        case ToolFormat::Json: return "json";
        case ToolFormat::Hermes: return "hermes";
        case ToolFormat::Llama3: return "llama3";
        case ToolFormat::Mistral: return "mistral";
    }
    return "json";
}

std::optional<ToolFormat> toolFormatFromName(std::string_view name) {
    for (ToolFormat f : {ToolFormat::Json, ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral}) {
        if (toolFormatName(f) == name) return f;
    }
    return std::nullopt;
}

ToolFormat toolFormatForTemplate(std::string_view chat_template) {
    if (chat_template == "chatml") return ToolFormat::Hermes;
    if (chat_template == "llama3") return ToolFormat::Llama3;
    if (toolFormatFits(ToolFormat::Mistral, chat_template)) return ToolFormat::Mistral;
    return ToolFormat::Json;
}

bool toolFormatFits(ToolFormat f, std::string_view chat_template) {
    if (f != ToolFormat::Mistral) return true;
    return chat_template == "mistral-v3" || chat_template == "mistral-v3-tekken" || chat_template == "mistral-v7";
}

bool answerIsText(ToolFormat f, std::string_view text) {
    return !text.empty() && callFirstBytes(f).find(text[0]) == std::string_view::npos;
}

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
    if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
        if (!p->is_boolean()) return badTool("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
        r->parallel_tool_calls = p->get<bool>();
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

std::optional<ApiError> messageCalls(const json& calls, size_t index, std::vector<ordered>* out) {
    const std::string p = strFormat("messages[%zu].tool_calls", index);
    if (!calls.is_array() || calls.empty()) {
        return badTool(p, "'" + p + "' must be a non-empty array of {\"function\": {\"name\": ..., \"arguments\": ...}}");
    }
    out->clear();
    for (size_t k = 0; k < calls.size(); ++k) {
        const json& c = calls[k];
        const std::string pk = strFormat("%s[%zu]", p.c_str(), k);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
            !c["function"]["name"].is_string()) {
            return badTool(p, "'" + pk + "' must be {\"function\": {\"name\": ..., \"arguments\": ...}}");
        }
        const json& f = c["function"];
        ordered args = ordered::object();
        if (f.contains("arguments") && f["arguments"].is_string()) {
            args = ordered::parse(f["arguments"].get<std::string>(), nullptr, false);
            if (args.is_discarded()) return badTool(p, "'" + pk + ".function.arguments' must be JSON text");
        } else if (f.contains("arguments") && f["arguments"].is_object()) {
            args = ordered::parse(f["arguments"].dump());
        }
        ordered call{{"name", f["name"]}, {"arguments", args}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        out->push_back(std::move(call));
    }
    return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> withTools(const ApiRequest& r, ToolFormat f) {
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 0; i < r.messages.size(); ++i) {
        const ApiRequest::Message& m = r.messages[i];
        if (f == ToolFormat::Mistral && !m.calls.empty()) {
            out.emplace_back(m.role, callsText(f, m.calls));  // the calls alone, as Mistral's templates write them
            continue;
        }
        std::string content = m.content;
        if (!m.calls.empty()) content += (content.empty() ? "" : "\n") + callsText(f, m.calls);
        if (m.role == "tool" && f == ToolFormat::Mistral) {
            // {"content": the result (as JSON where it is JSON text), "call_id": its call's id}.
            ordered result = ordered::parse(content, nullptr, false);
            ordered turn{{"content", result.is_discarded() ? ordered(content) : result}};
            if (!m.tool_call_id.empty()) turn["call_id"] = m.tool_call_id;
            out.emplace_back("tool", turn.dump());
            continue;
        }
        if (m.role == "tool" && f == ToolFormat::Hermes) {
            // Results go back in a user turn, one <tool_response> block each; results that follow
            // one another share the turn.
            const std::string block = "<tool_response>\n" + content + "\n</tool_response>";
            if (i > 0 && r.messages[i - 1].role == "tool") {
                out.back().second += "\n" + block;
            } else {
                out.emplace_back("user", block);
            }
            continue;
        }
        out.emplace_back(m.role == "tool" && f == ToolFormat::Llama3 ? "ipython" : m.role, std::move(content));
    }
    if (!toolsOffered(r)) return out;
    const std::string text = toolsText(r, f);
    if (f == ToolFormat::Mistral) {  // before the last user message
        size_t at = out.size();
        while (at > 0 && out[at - 1].first != "user") --at;
        out.insert(out.begin() + std::ptrdiff_t(at > 0 ? at - 1 : 0), {"available_tools", text});
        return out;
    }
    if (!out.empty() && out[0].first == "system") {
        out[0].second += "\n\n" + text;
    } else {
        out.insert(out.begin(), {"system", text});
    }
    return out;
}

std::optional<ApiError> toolConstraint(const ApiRequest& r, ToolFormat f, std::string* kind, std::string* text) {
    kind->clear();
    text->clear();
    if (!toolsOffered(r)) return std::nullopt;
    ordered schema = callSchema(r, f);
    const bool several = r.parallel_tool_calls && f != ToolFormat::Llama3;
    if (f == ToolFormat::Json && several) {
        // One call, or an array of one or more.
        ordered array = {{"type", "array"}, {"items", schema}, {"minItems", 1}, {"maxItems", kMaxParallelCalls}};
        if (schema.contains("$defs")) {
            array["items"].erase("$defs");
            schema = ordered{{"anyOf", {array["items"], array}}, {"$defs", schema["$defs"]}};
        } else {
            schema = ordered{{"anyOf", {schema, array}}};
        }
    }
    const bool required = r.tool_choice != "auto";
    if (required && f != ToolFormat::Hermes && f != ToolFormat::Mistral) {
        *kind = "json_schema";
        *text = schema.dump();
        return std::nullopt;
    }
    Result<std::string> g = jsonSchemaToGbnf(schema);
    if (!g) return badTool("tools", "tools: " + g.message());
    std::string calls;
    if (f == ToolFormat::Hermes) {
        calls = "tool-calls ::= tool-block";
        if (several) calls += strFormat(" ( \"\\n\" tool-block ){0,%u}", kMaxParallelCalls - 1);
        calls += "\ntool-block ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n";
    } else if (f == ToolFormat::Mistral) {
        // The control token's text (it has bytes for the automaton: tokenBytesTable), then an array.
        calls = strFormat("tool-calls ::= \"%s\" \" \"? \"[\" tool-call", std::string(kMistralCalls).c_str());
        if (several) calls += strFormat(" ( \",\" \" \"? tool-call ){0,%u}", kMaxParallelCalls - 1);
        calls += " \"]\"\n";
    } else {
        calls = "tool-calls ::= tool-call\n";
    }
    // "auto": text whose first byte no call starts with.
    std::string free_text = "free-text ::= [^";
    for (char c : callFirstBytes(f)) free_text += strFormat("\\x%02X", unsigned(c));
    free_text += "] [^\\x00]*\n";
    *kind = "grammar";
    *text = std::string(required ? "root ::= tool-calls\n" : "root ::= tool-calls | free-text\n" + free_text) + calls +
            renameRule(g.value(), "root", "tool-call");
    return std::nullopt;
}

json toolCallsOf(const std::vector<ApiRequest::Tool>& offered, ToolFormat f, const std::string& text,
                 const std::string& id) {
    if (offered.empty()) return nullptr;
    std::vector<ordered> calls;
    size_t at = 0;
    while (at < text.size() && isSpace(text[at])) ++at;
    if (f == ToolFormat::Hermes) {
        static const std::string open = "<tool_call>", close = "</tool_call>";
        while (at < text.size()) {
            if (text.compare(at, open.size(), open) != 0) return nullptr;
            const size_t end = text.find(close, at + open.size());
            if (end == std::string::npos) return nullptr;
            ordered call = ordered::parse(text.substr(at + open.size(), end - at - open.size()), nullptr, false);
            if (call.is_discarded()) return nullptr;
            calls.push_back(std::move(call));
            at = end + close.size();
            while (at < text.size() && isSpace(text[at])) ++at;
        }
    } else {
        if (f == ToolFormat::Mistral) {  // [TOOL_CALLS] (when the decoder shows it), then an array
            if (std::string_view(text).substr(at).starts_with(kMistralCalls)) at += kMistralCalls.size();
            while (at < text.size() && isSpace(text[at])) ++at;
        }
        if (at == text.size() || callFirstBytes(f).find(text[at]) == std::string_view::npos) return nullptr;
        ordered v = ordered::parse(text.substr(at), nullptr, false);
        if (v.is_discarded()) return nullptr;
        if (v.is_array()) {
            for (ordered& c : v) calls.push_back(std::move(c));
        } else {
            calls.push_back(std::move(v));
        }
    }
    if (calls.empty()) return nullptr;
    json out = json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
        ordered call = readCall(offered, f, calls[k]);
        if (call.is_null()) return nullptr;
        out.push_back({{"id", id + "_" + std::to_string(k)},
                       {"type", "function"},
                       {"function", {{"name", call["name"].get<std::string>()}, {"arguments", call["arguments"].dump()}}}});
    }
    return out;
}

}  // namespace blue::server
