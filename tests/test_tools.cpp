// Tool formats (host/server/tools.h) without a model: for each format, the tools' description,
// earlier calls and results as the family writes them, the constraint compiled to the byte
// automaton structured output runs (which texts it lets through), and the answer read back as
// tool_calls. The server tests drive the same code over HTTP with a real model.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "compiler/grammar/dfa.h"
#include "compiler/grammar/gbnf.h"
#include "compiler/grammar/json_schema.h"
#include "host/server/openai.h"
#include "host/server/tools.h"

namespace blue::test {
namespace {

using nlohmann::json;
using server::ApiRequest;
using server::ToolFormat;

const char* kBody = R"({
  "messages": [{"role": "user", "content": "Weather in Paris and 2 + 3?"}],
  "tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                     "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "add",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"], "additionalProperties": false}}}
  ]%s
})";

ApiRequest request(const std::string& extra = "") {
    char body[4096];
    std::snprintf(body, sizeof body, kBody, extra.c_str());
    ApiRequest r;
    std::optional<server::ApiError> e = server::parseRequest(server::Endpoint::Chat, body, 1024, &r);
    REQUIRE_MESSAGE(!e.has_value(), (e ? e->message : ""));
    return r;
}

// The byte automaton of the constraint for `r` in format `f` (a schema goes through the same
// GBNF conversion the engine uses).
ByteDfa constraintDfa(const ApiRequest& r, ToolFormat f) {
    std::string kind, text;
    REQUIRE_FALSE(server::toolConstraint(r, f, &kind, &text).has_value());
    std::string gbnf = text;
    if (kind == "json_schema") {
        Result<std::string> g = jsonSchemaToGbnf(nlohmann::ordered_json::parse(text));  // key order kept, as the engine does
        REQUIRE_MESSAGE(g.isOk(), g.message());
        gbnf = g.value();
    } else {
        REQUIRE(kind == "grammar");
    }
    Result<Grammar> g = parseGbnf(gbnf);
    REQUIRE_MESSAGE(g.isOk(), g.message() << "\n" << gbnf);
    Result<ByteDfa> d = buildDfa(g.value());
    REQUIRE_MESSAGE(d.isOk(), d.message());
    return std::move(d.value());
}

const std::string kWeather = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
const std::string kAdd = R"({"name": "add", "arguments": {"a": 2, "b": 3}})";
const std::string kLlamaAdd = R"({"name": "add", "parameters": {"a": 2, "b": 3}})";

}  // namespace

TEST_CASE("tools: formats by chat template family, and by name") {
    CHECK(server::toolFormatForTemplate("chatml") == ToolFormat::Hermes);
    CHECK(server::toolFormatForTemplate("llama3") == ToolFormat::Llama3);
    for (const char* other : {"llama2", "mistral-v1", "gemma", "phi3", "zephyr", "deepseek3", ""}) {
        CHECK(server::toolFormatForTemplate(other) == ToolFormat::Json);
    }
    for (const char* mistral : {"mistral-v3", "mistral-v3-tekken", "mistral-v7"}) {
        CHECK(server::toolFormatForTemplate(mistral) == ToolFormat::Mistral);
        CHECK(server::toolFormatFits(ToolFormat::Mistral, mistral));
    }
    // Mistral's turns exist only in its templates; the other formats go with any.
    CHECK_FALSE(server::toolFormatFits(ToolFormat::Mistral, "chatml"));
    CHECK_FALSE(server::toolFormatFits(ToolFormat::Mistral, "mistral-v1"));
    CHECK(server::toolFormatFits(ToolFormat::Hermes, "mistral-v3"));
    for (ToolFormat f : {ToolFormat::Json, ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral}) {
        CHECK(server::toolFormatFromName(server::toolFormatName(f)) == f);
    }
    CHECK_FALSE(server::toolFormatFromName("xml").has_value());
    // What an answer's first byte says: text, or maybe calls (held until the end).
    CHECK_FALSE(server::answerIsText(ToolFormat::Hermes, ""));
    CHECK_FALSE(server::answerIsText(ToolFormat::Hermes, "<tool_c"));
    CHECK(server::answerIsText(ToolFormat::Hermes, "{not a call here"));
    CHECK_FALSE(server::answerIsText(ToolFormat::Json, "["));
    CHECK_FALSE(server::answerIsText(ToolFormat::Json, "{"));
    CHECK(server::answerIsText(ToolFormat::Json, "<tool_call>"));
    CHECK(server::answerIsText(ToolFormat::Llama3, "["));
    CHECK_FALSE(server::answerIsText(ToolFormat::Llama3, "{"));
    CHECK_FALSE(server::answerIsText(ToolFormat::Mistral, "[TOOL_"));
    CHECK(server::answerIsText(ToolFormat::Mistral, " Paris"));
    CHECK(server::answerIsText(ToolFormat::Mistral, "{"));
}

TEST_CASE("tools: Hermes format: <tools> signatures, <tool_call> blocks, <tool_response> results") {
    ApiRequest r = request(R"(, "tool_choice": "required")");
    auto msgs = server::withTools(r, ToolFormat::Hermes);
    REQUIRE(msgs.size() == 2);
    CHECK(msgs[0].first == "system");
    const std::string& sys = msgs[0].second;
    CHECK(sys.find("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"") != std::string::npos);
    CHECK(sys.find("</tools>") != std::string::npos);
    CHECK(sys.find("<tool_call>") != std::string::npos);

    // Required: one or more blocks, nothing else.
    ByteDfa d = constraintDfa(r, ToolFormat::Hermes);
    const std::string one = "<tool_call>\n" + kWeather + "\n</tool_call>";
    const std::string two = one + "\n<tool_call>\n" + kAdd + "\n</tool_call>";
    CHECK(dfaAccepts(d, one));
    CHECK(dfaAccepts(d, two));
    std::string most = one;  // at most kMaxParallelCalls blocks
    for (uint32_t k = 1; k < server::kMaxParallelCalls; ++k) most += "\n<tool_call>\n" + kAdd + "\n</tool_call>";
    CHECK(dfaAccepts(d, most));
    CHECK_FALSE(dfaAccepts(d, most + "\n<tool_call>\n" + kAdd + "\n</tool_call>"));
    CHECK_FALSE(dfaAccepts(d, kWeather));                      // no tags
    CHECK_FALSE(dfaAccepts(d, "It is sunny."));                // text
    CHECK_FALSE(dfaAccepts(d, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
    // Without parallel calls: exactly one block.
    ByteDfa single = constraintDfa(request(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), ToolFormat::Hermes);
    CHECK(dfaAccepts(single, one));
    CHECK_FALSE(dfaAccepts(single, two));
    // Auto: calls, or text that does not start with '<'.
    ByteDfa aut = constraintDfa(request(), ToolFormat::Hermes);
    CHECK(dfaAccepts(aut, two));
    CHECK(dfaAccepts(aut, "It is sunny."));
    CHECK_FALSE(dfaAccepts(aut, "<tool_call>\nsunny"));

    // Read back: every block, ids numbered; anything else in the text makes it content.
    json calls = server::toolCallsOf(r.tools, ToolFormat::Hermes, two, "call_7");
    REQUIRE(calls.is_array());
    REQUIRE(calls.size() == 2);
    CHECK(calls[0]["id"] == "call_7_0");
    CHECK(calls[1]["id"] == "call_7_1");
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(json::parse(calls[0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}});
    CHECK(calls[1]["function"]["name"] == "add");
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Hermes, "It is sunny.", "c").is_null());
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Hermes, one + " and more", "c").is_null());
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Hermes, "<tool_call>\n" + kWeather, "c").is_null());  // unclosed
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Hermes,
                              "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", "c").is_null());

    // History: the assistant's calls as blocks, consecutive results in one user turn.
    ApiRequest h = request();
    h.messages.push_back({"assistant", "", {nlohmann::ordered_json::parse(kWeather), nlohmann::ordered_json::parse(kAdd)}});
    h.messages.push_back({"tool", "sunny", {}});
    h.messages.push_back({"tool", "5", {}});
    h.messages.push_back({"user", "Thanks", {}});
    msgs = server::withTools(h, ToolFormat::Hermes);
    REQUIRE(msgs.size() == 5);
    CHECK(msgs[2].first == "assistant");
    CHECK(msgs[2].second == "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":2,\"b\":3}}\n</tool_call>");
    CHECK(msgs[3].first == "user");
    CHECK(msgs[3].second == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n5\n</tool_response>");
    CHECK(msgs[4] == std::pair<std::string, std::string>("user", "Thanks"));
}

TEST_CASE("tools: Llama 3 format: {name, parameters}, one call, results from ipython") {
    ApiRequest r = request(R"(, "tool_choice": "required")");
    auto msgs = server::withTools(r, ToolFormat::Llama3);
    REQUIRE(msgs.size() == 2);
    CHECK(msgs[0].second.rfind("Environment: ipython\n", 0) == 0);
    CHECK(msgs[0].second.find("\"parameters\"") != std::string::npos);
    ByteDfa d = constraintDfa(r, ToolFormat::Llama3);
    CHECK(dfaAccepts(d, kLlamaAdd));
    CHECK_FALSE(dfaAccepts(d, kAdd));  // "arguments" is not the key this family writes
    CHECK_FALSE(dfaAccepts(d, "[" + kLlamaAdd + "]"));
    ByteDfa aut = constraintDfa(request(), ToolFormat::Llama3);
    CHECK(dfaAccepts(aut, kLlamaAdd));
    CHECK(dfaAccepts(aut, "Five."));
    CHECK_FALSE(dfaAccepts(aut, "{\"x\": 1}"));

    json calls = server::toolCallsOf(r.tools, ToolFormat::Llama3, kLlamaAdd, "call_1");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["function"]["name"] == "add");
    CHECK(json::parse(calls[0]["function"]["arguments"].get<std::string>()) == json{{"a", 2}, {"b", 3}});

    ApiRequest h = request();
    h.messages.push_back({"assistant", "", {nlohmann::ordered_json::parse(kAdd)}});
    h.messages.push_back({"tool", "5", {}});
    msgs = server::withTools(h, ToolFormat::Llama3);
    REQUIRE(msgs.size() == 4);
    CHECK(msgs[2].second == R"({"name":"add","parameters":{"a":2,"b":3}})");
    CHECK(msgs[3] == std::pair<std::string, std::string>("ipython", "5"));
}

TEST_CASE("tools: Mistral format: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] arrays, [TOOL_RESULTS]") {
    ApiRequest r = request(R"(, "tool_choice": "required")");
    r.messages.insert(r.messages.begin(), {"system", "Be brief.", {}});
    auto msgs = server::withTools(r, ToolFormat::Mistral);
    // The signatures as one array in their own turn, right before the (last) user message; the
    // system message stays as it was.
    REQUIRE(msgs.size() == 3);
    CHECK(msgs[0] == std::pair<std::string, std::string>("system", "Be brief."));
    CHECK(msgs[1].first == "available_tools");
    json tools = json::parse(msgs[1].second);
    REQUIRE(tools.size() == 2);
    CHECK(tools[0]["type"] == "function");
    CHECK(tools[0]["function"]["name"] == "get_weather");
    CHECK(tools[1]["function"]["parameters"]["required"] == json{"a", "b"});
    CHECK(msgs[2].first == "user");

    // Calls: the marker, then one array; several with parallel calls, at most kMaxParallelCalls.
    ByteDfa d = constraintDfa(r, ToolFormat::Mistral);
    CHECK(dfaAccepts(d, "[TOOL_CALLS] [" + kWeather + "]"));
    CHECK(dfaAccepts(d, "[TOOL_CALLS][" + kWeather + ", " + kAdd + "]"));
    std::string most = "[TOOL_CALLS][" + kAdd;
    for (uint32_t k = 1; k < server::kMaxParallelCalls; ++k) most += "," + kAdd;
    CHECK(dfaAccepts(d, most + "]"));
    CHECK_FALSE(dfaAccepts(d, most + "," + kAdd + "]"));
    CHECK_FALSE(dfaAccepts(d, "[" + kWeather + "]"));  // no marker
    CHECK_FALSE(dfaAccepts(d, "[TOOL_CALLS] " + kWeather));  // not an array
    CHECK_FALSE(dfaAccepts(d, "[TOOL_CALLS] []"));
    CHECK_FALSE(dfaAccepts(d, "It is sunny."));
    ByteDfa single = constraintDfa(request(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), ToolFormat::Mistral);
    CHECK(dfaAccepts(single, "[TOOL_CALLS] [" + kAdd + "]"));
    CHECK_FALSE(dfaAccepts(single, "[TOOL_CALLS] [" + kAdd + ", " + kAdd + "]"));
    ByteDfa aut = constraintDfa(request(), ToolFormat::Mistral);
    CHECK(dfaAccepts(aut, "[TOOL_CALLS] [" + kAdd + "]"));
    CHECK(dfaAccepts(aut, "Five."));
    CHECK_FALSE(dfaAccepts(aut, "[5]"));  // text cannot start the way calls do

    // Read back, with or without the marker (a decoder that hid it), spaces around it.
    json calls = server::toolCallsOf(r.tools, ToolFormat::Mistral, "[TOOL_CALLS] [" + kWeather + ", " + kAdd + "]", "call_2");
    REQUIRE(calls.size() == 2);
    CHECK(calls[0]["id"] == "call_2_0");
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(json::parse(calls[1]["function"]["arguments"].get<std::string>()) == json{{"a", 2}, {"b", 3}});
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Mistral, " [" + kAdd + "]", "c").size() == 1);
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Mistral, "It is sunny.", "c").is_null());
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Mistral, "[TOOL_CALLS] [" + kAdd, "c").is_null());  // unclosed
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Mistral, R"([TOOL_CALLS] [{"name": "mul", "arguments": {}}])", "c").is_null());

    // History: an assistant turn's calls (with their ids) as the array after the marker, each
    // result as {"content", "call_id"} (JSON results stay JSON, text becomes a string), the tools
    // before the last user message.
    ApiRequest h = request();
    nlohmann::ordered_json weather = nlohmann::ordered_json::parse(kWeather);
    weather["id"] = "a1b2c3d4e";
    h.messages.push_back({"assistant", "", {weather, nlohmann::ordered_json::parse(kAdd)}});
    h.messages.push_back({"tool", "sunny", {}, "a1b2c3d4e"});
    h.messages.push_back({"tool", R"({"sum": 5})", {}});
    h.messages.push_back({"user", "Thanks", {}});
    msgs = server::withTools(h, ToolFormat::Mistral);
    REQUIRE(msgs.size() == 6);
    CHECK(msgs[0].first == "user");
    CHECK(msgs[1].first == "assistant");
    CHECK(msgs[1].second == R"([TOOL_CALLS] [{"name":"get_weather","arguments":{"city":"Paris"},"id":"a1b2c3d4e"},)"
                            R"({"name":"add","arguments":{"a":2,"b":3}}])");
    CHECK(msgs[2] == std::pair<std::string, std::string>("tool", R"({"content":"sunny","call_id":"a1b2c3d4e"})"));
    CHECK(msgs[3] == std::pair<std::string, std::string>("tool", R"({"content":{"sum":5}})"));
    CHECK(msgs[4].first == "available_tools");
    CHECK(msgs[5] == std::pair<std::string, std::string>("user", "Thanks"));
}

TEST_CASE("tools: generic JSON format: an object, or an array of calls when parallel") {
    ApiRequest r = request(R"(, "tool_choice": "required")");
    ByteDfa d = constraintDfa(r, ToolFormat::Json);
    CHECK(dfaAccepts(d, kWeather));
    CHECK(dfaAccepts(d, "[" + kWeather + ", " + kAdd + "]"));
    CHECK_FALSE(dfaAccepts(d, "[]"));
    std::string most = "[" + kWeather;
    for (uint32_t k = 1; k < server::kMaxParallelCalls; ++k) most += ", " + kAdd;
    CHECK(dfaAccepts(d, most + "]"));
    CHECK_FALSE(dfaAccepts(d, most + ", " + kAdd + "]"));
    ByteDfa single = constraintDfa(request(R"(, "tool_choice": "required", "parallel_tool_calls": false)"), ToolFormat::Json);
    CHECK(dfaAccepts(single, kWeather));
    CHECK_FALSE(dfaAccepts(single, "[" + kWeather + "]"));
    // A named tool: only its calls.
    ByteDfa named = constraintDfa(request(R"(, "tool_choice": {"type": "function", "function": {"name": "add"}})"),
                                  ToolFormat::Json);
    CHECK(dfaAccepts(named, kAdd));
    CHECK_FALSE(dfaAccepts(named, kWeather));
    ByteDfa aut = constraintDfa(request(), ToolFormat::Json);
    CHECK(dfaAccepts(aut, "[" + kAdd + "]"));
    CHECK(dfaAccepts(aut, "Sunny."));
    CHECK_FALSE(dfaAccepts(aut, "[1, 2]"));

    json calls = server::toolCallsOf(r.tools, ToolFormat::Json, "[" + kWeather + ", " + kAdd + "]", "call_3");
    REQUIRE(calls.size() == 2);
    CHECK(calls[1]["id"] == "call_3_1");
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Json, "[" + kWeather + ", {\"name\": \"rm\", \"arguments\": {}}]", "c")
              .is_null());
    CHECK(server::toolCallsOf(r.tools, ToolFormat::Json, "[]", "c").is_null());

    ApiRequest h = request();
    h.messages.push_back({"assistant", "", {nlohmann::ordered_json::parse(kWeather), nlohmann::ordered_json::parse(kAdd)}});
    h.messages.push_back({"tool", "sunny", {}});
    auto msgs = server::withTools(h, ToolFormat::Json);
    REQUIRE(msgs.size() == 4);
    CHECK(json::parse(msgs[2].second) == json::array({json::parse(kWeather), json::parse(kAdd)}));
    CHECK(msgs[3].first == "tool");
}

TEST_CASE("tools: parallel_tool_calls and tool_calls history are checked") {
    ApiRequest r;
    std::optional<server::ApiError> e = server::parseRequest(
        server::Endpoint::Chat, R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "yes"})", 64, &r);
    REQUIRE(e.has_value());
    CHECK(e->param == "parallel_tool_calls");
    e = server::parseRequest(server::Endpoint::Chat,
                             R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "a"}}, {"type": "function"}]}]})",
                             64, &r);
    REQUIRE(e.has_value());
    CHECK(e->message.find("tool_calls[1]") != std::string::npos);
    // Every call of an assistant message is kept, with its text.
    r = ApiRequest();
    e = server::parseRequest(server::Endpoint::Chat,
                             R"({"messages": [{"role": "assistant", "content": "Let me see.", "tool_calls": [
                                  {"function": {"name": "a", "arguments": "{\"x\": 1}"}},
                                  {"function": {"name": "b", "arguments": {"y": 2}}}]}]})",
                             64, &r);
    REQUIRE_FALSE(e.has_value());
    REQUIRE(r.messages.size() == 1);
    CHECK(r.messages[0].content == "Let me see.");
    REQUIRE(r.messages[0].calls.size() == 2);
    CHECK(r.messages[0].calls[1]["arguments"]["y"] == 2);
}

}  // namespace blue::test
