// JSON schema -> GBNF (see json_schema.h). A SchemaWriter walks the schema, returning a GBNF
// expression per subschema and adding named rules for objects, arrays and $ref targets; shared
// primitives (string, number, any value, ...) are appended once, when used.
#include "compiler/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace blue {
namespace {

using json = nlohmann::ordered_json;  // keeps the schema's property order

constexpr int64_t kMaxCount = 10000;   // lengths and item counts
constexpr int kMaxNesting = 64;        // subschemas inside subschemas
constexpr double kMaxIntBound = 1e15;  // integer minimum/maximum

// Primitive rules by name; "value" needs the others it names.
const std::map<std::string, std::string>& primitives() {
    static const std::map<std::string, std::string> p = {
        {"value", R"(object | array | string | any-number | "true" | "false" | "null")"},
        {"object", R"("{" ( "}" | member ( "," sp member )* "}" ))"},
        {"member", R"(string ":" sp value)"},
        {"array", R"("[" ( "]" | value ( "," sp value )* "]" ))"},
        {"string", R"("\"" char* "\"")"},
        {"char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex4 ))"},
        {"hex4", R"(( [0-9a-cA-Ce-fE-F] [0-9a-fA-F] | [dD] [0-7] ) [0-9a-fA-F]{2})"},
        {"number", R"(integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)"},
        {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"},
        // Any JSON value repeats its states per nesting context: unbounded mantissa digits keep
        // that small; two exponent digits keep values finite unless hundreds of digits are written.
        {"any-number", R"("-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]{1,2} )?)"},
        {"boolean", R"("true" | "false")"},
        {"null", R"("null")"},
        {"sp", R"(" "?)"},
    };
    return p;
}

const std::map<std::string, std::vector<std::string>>& primitiveDeps() {
    static const std::map<std::string, std::vector<std::string>> d = {
        {"value", {"object", "array", "string", "any-number"}},
        {"object", {"member", "sp"}},
        {"member", {"string", "value", "sp"}},
        {"array", {"value", "sp"}},
        {"string", {"char"}},
        {"char", {"hex4"}},
        {"number", {"integer"}},
    };
    return d;
}

// A GBNF string literal matching exactly the bytes of `s` (UTF-8 passes through).
std::string gbnfLiteral(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
        unsigned char c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20 || c == 0x7F) {
            out += strFormat("\\x%02X", c);
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

std::string pointerToken(std::string_view key) {
    std::string out;
    for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
}

const std::set<std::string, std::less<>>& annotations() {
    static const std::set<std::string, std::less<>> a = {
        "title",  "description", "examples", "$schema",   "$id",   "$comment",   "default",
        "format", "deprecated",  "readOnly", "writeOnly", "$defs", "definitions"};
    return a;
}

const std::set<std::string, std::less<>>& supported() {
    static const std::set<std::string, std::less<>> s = {
        "type",    "enum",        "const",    "properties", "required",  "additionalProperties",
        "items",   "prefixItems", "minItems", "maxItems",   "minLength", "maxLength",
        "minimum", "maximum",     "anyOf",    "oneOf",      "allOf",     "$ref"};
    return s;
}

bool typeMatches(const std::string& type, const json& v) {
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                         std::floor(v.get<double>()) == v.get<double>());
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    return v.is_array();
}

// Decimal strings of equal length with lo <= x <= hi, as a GBNF expression.
std::string sameLengthRange(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return "";
    size_t n = lo.size();
    if (lo[0] == hi[0]) {
        std::string rest = sameLengthRange(lo.substr(1), hi.substr(1));
        return strFormat("\"%c\"", lo[0]) + (rest.empty() ? "" : " " + rest);
    }
    std::string tail_any = n > 1 ? strFormat(" [0-9]{%zu}", n - 1) : "";
    if (lo.substr(1) == std::string(n - 1, '0') && hi.substr(1) == std::string(n - 1, '9'))
        return strFormat("[%c-%c]", lo[0], hi[0]) + tail_any;
    std::vector<std::string> alts;
    std::string first = sameLengthRange(lo.substr(1), std::string(n - 1, '9'));
    alts.push_back(strFormat("\"%c\"", lo[0]) + (first.empty() ? "" : " " + first));
    if (lo[0] + 1 <= hi[0] - 1)
        alts.push_back(strFormat("[%c-%c]", lo[0] + 1, hi[0] - 1) + tail_any);
    std::string last = sameLengthRange(std::string(n - 1, '0'), hi.substr(1));
    alts.push_back(strFormat("\"%c\"", hi[0]) + (last.empty() ? "" : " " + last));
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
    return out + " )";
}

// Non-negative decimals (no leading zeros) in lo..hi; hi < 0 means unbounded.
std::string naturalRange(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    std::string los = std::to_string(lo);
    for (size_t len = los.size(); len <= 17; ++len) {
        int64_t top = 1;
        for (size_t i = 0; i < len; ++i) top *= 10;
        int64_t bottom = len == 1 ? 0 : top / 10;
        int64_t a = std::max(lo, bottom), b = hi < 0 ? top - 1 : std::min(hi, top - 1);
        if (a <= b) alts.push_back(sameLengthRange(std::to_string(a), std::to_string(b)));
        if (hi >= 0 && top > hi) break;
        if (hi < 0 && len == los.size()) {  // every longer number
            alts.push_back(strFormat("[1-9] [0-9]{%zu,}", len));
            break;
        }
    }
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
    return out + " )";
}

class SchemaWriter {
  public:
    explicit SchemaWriter(const json& root) : root_(root) {}

    Result<std::string> run() {
        BLUE_TRY_ASSIGN(std::string top, gen(root_, ""));
        std::string out = "root ::= " + top + "\n";
        for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
        std::vector<std::string> work(used_.begin(), used_.end());
        while (!work.empty()) {
            std::string p = work.back();
            work.pop_back();
            auto it = primitiveDeps().find(p);
            if (it == primitiveDeps().end()) continue;
            for (const std::string& d : it->second)
                if (used_.insert(d).second) work.push_back(d);
        }
        for (const std::string& p : used_) out += p + " ::= " + primitives().at(p) + "\n";
        return out;
    }

  private:
    const json& root_;
    std::vector<std::pair<std::string, std::string>> rules_;
    std::map<std::string, std::string> ref_rules_;  // $ref -> rule name
    std::set<std::string> used_;                    // primitives
    int counter_ = 0;
    int depth_ = 0;  // subschemas being written

    std::string use(const std::string& primitive) {
        used_.insert(primitive);
        return primitive;
    }
    std::string newName(const char* prefix) { return strFormat("%s%d", prefix, ++counter_); }

    static Status fail(const std::string& path, const std::string& message) {
        return Status::error("schema at " + (path.empty() ? std::string("the root") : path) + ": " +
                             message);
    }

    Result<std::string> literal(const json& v, const std::string& path) {
        try {
            return gbnfLiteral(v.dump());
        } catch (const json::exception&) {
            return fail(path, "a value is not valid UTF-8");
        }
    }

    Result<int64_t> count(const json& s, const char* key, const std::string& path, int64_t dflt) {
        if (!s.contains(key)) return dflt;
        const json& v = s[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCount)
            return fail(path, strFormat("'%s' must be an integer from 0 to %lld", key,
                                        (long long)kMaxCount));
        return v.get<int64_t>();
    }

    Result<std::string> gen(const json& s, const std::string& path);
    Result<std::string> genRef(const json& s, const std::string& path);
    Result<std::string> genType(const std::string& type, const json& s, const std::string& path);
    Result<std::string> genInteger(const json& s, const std::string& path);
    Result<std::string> genObject(const json& s, const std::string& path);
    Result<std::string> genArray(const json& s, const std::string& path);
};

Result<std::string> SchemaWriter::gen(const json& s, const std::string& path) {
    struct Nest {
        int& depth;
        explicit Nest(int& d) : depth(++d) {}
        ~Nest() { --depth; }
    } nest(depth_);
    if (depth_ > kMaxNesting)
        return fail(path, strFormat("schemas nest deeper than %d", kMaxNesting));
    if (s.is_boolean()) {
        if (s.get<bool>()) return use("value");
        return fail(path, "the schema 'false' allows no value");
    }
    if (!s.is_object()) return fail(path, "a schema must be an object or a boolean");
    std::vector<std::string> validation;
    for (const auto& [key, v] : s.items()) {
        if (annotations().count(key) || key.rfind("x-", 0) == 0) continue;
        if (!supported().count(key)) return fail(path, "unsupported keyword '" + key + "'");
        validation.push_back(key);
    }
    for (const char* combiner : {"$ref", "allOf", "anyOf", "oneOf"}) {
        if (!s.contains(combiner)) continue;
        if (validation.size() > 1)
            return fail(path, strFormat("'%s' beside other keywords is not supported", combiner));
        std::string here = path + "/" + pointerToken(combiner);
        if (std::string_view(combiner) == "$ref") return genRef(s, path);
        const json& list = s[combiner];
        if (!list.is_array() || list.empty())
            return fail(path, strFormat("'%s' must be a non-empty array", combiner));
        if (std::string_view(combiner) == "allOf" && list.size() != 1)
            return fail(path, "'allOf' with more than one schema is not supported");
        std::string out = "(";
        for (size_t i = 0; i < list.size(); ++i) {
            BLUE_TRY_ASSIGN(std::string alt, gen(list[i], here + "/" + std::to_string(i)));
            out += (i ? " | " : " ") + alt;
        }
        return out + " )";
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
        const json& t = s["type"];
        if (t.is_string()) {
            types.push_back(t.get<std::string>());
        } else if (t.is_array() && !t.empty() &&
                   std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); })) {
            for (const json& x : t) types.push_back(x.get<std::string>());
        } else {
            return fail(path, "'type' must be a string or an array of strings");
        }
        static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean",
                                                     "null",   "object", "array"};
        for (const std::string& x : types)
            if (!kTypes.count(x)) return fail(path, "unknown type '" + x + "'");
    }
    if (s.contains("enum") || s.contains("const")) {
        json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
        if (!values.is_array() || values.empty())
            return fail(path, "'enum' must be a non-empty array");
        std::string out = "(";
        int n = 0;
        for (const json& v : values) {
            bool ok = types.empty() || std::any_of(types.begin(), types.end(),
                                                   [&](auto& t) { return typeMatches(t, v); });
            if (!ok) continue;
            BLUE_TRY_ASSIGN(std::string lit, literal(v, path));
            out += (n++ ? " | " : " ") + lit;
        }
        if (n == 0) return fail(path, "no 'enum' value has the schema's type");
        return out + " )";
    }
    if (types.empty()) {  // infer from the keywords; outputs then are a subset of what is valid
        if (s.contains("properties") || s.contains("required") ||
            s.contains("additionalProperties"))
            types.push_back("object");
        else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                 s.contains("maxItems"))
            types.push_back("array");
        else if (s.contains("minLength") || s.contains("maxLength"))
            types.push_back("string");
        else if (s.contains("minimum") || s.contains("maximum"))
            types.push_back("integer");
        else
            return use("value");
    }
    std::string out;
    for (size_t i = 0; i < types.size(); ++i) {
        BLUE_TRY_ASSIGN(std::string alt, genType(types[i], s, path));
        out += (i ? " | " : "") + alt;
    }
    return types.size() == 1 ? out : "( " + out + " )";
}

Result<std::string> SchemaWriter::genRef(const json& s, const std::string& path) {
    const json& ref = s["$ref"];
    if (!ref.is_string()) return fail(path, "'$ref' must be a string");
    std::string r = ref.get<std::string>();
    auto it = ref_rules_.find(r);
    if (it != ref_rules_.end()) return it->second;
    const json* target = nullptr;
    std::string target_path;
    if (r == "#") {
        target = &root_;
    } else {
        for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
            std::string_view p = prefix;
            if (r.rfind(p, 0) != 0) continue;
            std::string name;
            std::string_view rest = std::string_view(r).substr(p.size());
            for (size_t i = 0; i < rest.size(); ++i) {  // unescape ~0 ~1
                if (rest[i] == '~' && i + 1 < rest.size() &&
                    (rest[i + 1] == '0' || rest[i + 1] == '1'))
                    name += rest[++i] == '0' ? '~' : '/';
                else
                    name += rest[i];
            }
            std::string defs(p.substr(2, p.size() - 3));
            if (root_.is_object() && root_.contains(defs) && root_[defs].is_object() &&
                root_[defs].contains(name)) {
                target = &root_[defs][name];
                target_path = "/" + defs + "/" + pointerToken(name);
            }
        }
        if (!target) return fail(path, "'$ref' '" + r + "' names no definition");
    }
    std::string name = newName("def");
    ref_rules_[r] = name;
    size_t slot = rules_.size();
    rules_.push_back({name, ""});
    BLUE_TRY_ASSIGN(std::string body, gen(*target, target_path));
    rules_[slot].second = body;
    return name;
}

Result<std::string> SchemaWriter::genType(const std::string& type, const json& s,
                                          const std::string& path) {
    if (type == "null") return use("null");
    if (type == "boolean") return use("boolean");
    if (type == "object") return genObject(s, path);
    if (type == "array") return genArray(s, path);
    if (type == "integer") return genInteger(s, path);
    if (type == "number") {
        if (s.contains("minimum") || s.contains("maximum"))
            return fail(path, "'minimum'/'maximum' are supported on integers only");
        return use("number");
    }
    BLUE_TRY_ASSIGN(int64_t lo, count(s, "minLength", path, 0));
    BLUE_TRY_ASSIGN(int64_t hi, count(s, "maxLength", path, -1));
    if (hi >= 0 && hi < lo) return fail(path, "'maxLength' is below 'minLength'");
    if (lo == 0 && hi < 0) return use("string");
    std::string reps = hi < 0 ? strFormat("{%lld,}", (long long)lo)
                              : strFormat("{%lld,%lld}", (long long)lo, (long long)hi);
    return "\"\\\"\" " + use("char") + reps + " \"\\\"\"";
}

Result<std::string> SchemaWriter::genInteger(const json& s, const std::string& path) {
    if (!s.contains("minimum") && !s.contains("maximum")) return use("integer");
    double lo = -kMaxIntBound, hi = kMaxIntBound;
    for (const char* key : {"minimum", "maximum"}) {
        if (!s.contains(key)) continue;
        const json& v = s[key];
        if (!v.is_number() || !(std::fabs(v.get<double>()) <= kMaxIntBound))
            return fail(path, strFormat("'%s' must be a number within +-1e15", key));
        (key[1] == 'i' ? lo : hi) =
            key[1] == 'i' ? std::ceil(v.get<double>()) : std::floor(v.get<double>());
    }
    if (hi < lo) return fail(path, "'maximum' is below 'minimum'");
    bool lo_open = !s.contains("minimum"), hi_open = !s.contains("maximum");
    auto a = int64_t(lo), b = int64_t(hi);
    std::vector<std::string> alts;
    if (a < 0)  // negatives: "-" then |x| in [max(1, -b), -a]
        alts.push_back("\"-\" " + naturalRange(std::max<int64_t>(1, -b), lo_open ? -1 : -a));
    if (b >= 0) alts.push_back(naturalRange(std::max<int64_t>(0, a), hi_open ? -1 : b));
    return alts.size() == 1 ? alts[0] : "( " + alts[0] + " | " + alts[1] + " )";
}

Result<std::string> SchemaWriter::genObject(const json& s, const std::string& path) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) return fail(path, "'properties' must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
        const json& r = s["required"];
        if (!r.is_array()) return fail(path, "'required' must be an array of strings");
        for (const json& x : r) {
            if (!x.is_string()) return fail(path, "'required' must be an array of strings");
            if (!props.contains(x.get<std::string>()))
                return fail(path, "required property '" + x.get<std::string>() +
                                      "' is not in 'properties'");
            required.insert(x.get<std::string>());
        }
    }
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean())
        return fail(path, "'additionalProperties' must be true or false");
    // Absent or true additionalProperties still produce only the listed properties (a subset).
    // Rules a<i> (nothing written yet) and b<i> (something written) for properties i.. n - 1.
    std::string base = newName("obj");
    size_t n = props.size();
    auto a = [&](size_t i) {
        return i == n ? std::string("\"}\"") : strFormat("%s-a%zu", base.c_str(), i);
    };
    auto b = [&](size_t i) {
        return i == n ? std::string("\"}\"") : strFormat("%s-b%zu", base.c_str(), i);
    };
    size_t i = 0;
    for (const auto& [key, sub] : props.items()) {
        BLUE_TRY_ASSIGN(std::string value, gen(sub, path + "/properties/" + pointerToken(key)));
        BLUE_TRY_ASSIGN(std::string name, literal(json(key), path));
        std::string kv = name + " \":\" " + use("sp") + " " + value;
        bool req = required.count(key) > 0;
        rules_.push_back({a(i), kv + " " + b(i + 1) + (req ? "" : " | " + a(i + 1))});
        rules_.push_back(
            {b(i), (req ? "\",\" sp " + kv : "( \",\" sp " + kv + " )?") + " " + b(i + 1)});
        ++i;
    }
    return "\"{\" " + a(0);
}

Result<std::string> SchemaWriter::genArray(const json& s, const std::string& path) {
    BLUE_TRY_ASSIGN(int64_t lo, count(s, "minItems", path, 0));
    BLUE_TRY_ASSIGN(int64_t hi, count(s, "maxItems", path, -1));
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
        const json& p = s["prefixItems"];
        if (!p.is_array()) return fail(path, "'prefixItems' must be an array");
        for (size_t i = 0; i < p.size(); ++i) {
            BLUE_TRY_ASSIGN(std::string e, gen(p[i], path + "/prefixItems/" + std::to_string(i)));
            prefix.push_back(e);
        }
    }
    std::string item;  // empty: no items after the prefix
    const json& items = s.contains("items") ? s["items"] : json(true);
    if (!(items.is_boolean() && !items.get<bool>())) {
        BLUE_TRY_ASSIGN(item, gen(items, path + "/items"));
    }
    auto k = int64_t(prefix.size());
    if (item.empty()) hi = hi < 0 ? k : std::min(hi, k);
    if (hi >= 0 && hi < lo) return fail(path, "the array's item counts allow no value");
    use("sp");
    std::string tail;  // items beyond the prefix, each after ","
    if (!item.empty() && (hi < 0 || hi > k)) {
        int64_t extra_min = std::max<int64_t>(0, lo - k);
        tail = "( \",\" sp " + item + " )" +
               (hi < 0 ? strFormat("{%lld,}", (long long)extra_min)
                       : strFormat("{%lld,%lld}", (long long)extra_min, (long long)(hi - k)));
    }
    std::string body;
    if (k > 0) {  // prefix positions from the last one used back to the first; j is optional when j
                  // >= lo
        body = tail;
        for (int64_t j = (hi < 0 ? k : std::min(hi, k)) - 1; j >= 0; --j) {
            std::string head = j == 0 ? prefix[0] : "\",\" sp " + prefix[size_t(j)];
            std::string here = head + (body.empty() ? "" : " " + body);
            body = j >= lo ? "( " + here + " )?" : here;
        }
    } else if (!item.empty() && hi != 0) {
        std::string reps = hi < 0
                               ? strFormat("{%lld,}", (long long)std::max<int64_t>(0, lo - 1))
                               : strFormat("{%lld,%lld}", (long long)std::max<int64_t>(0, lo - 1),
                                           (long long)(hi - 1));
        std::string here = item + " ( \",\" sp " + item + " )" + reps;
        body = lo == 0 ? "( " + here + " )?" : here;
    }
    std::string name = newName("arr");
    rules_.push_back({name, "\"[\" " + body + " \"]\""});
    return name;
}

}  // namespace

Result<std::string> jsonSchemaToGbnf(const nlohmann::ordered_json& schema) {
    return SchemaWriter(schema).run();
}

Result<std::string> jsonSchemaToGbnf(const nlohmann::json& schema) {
    return SchemaWriter(nlohmann::ordered_json(schema)).run();
}

std::string jsonObjectGbnf() {
    std::string out = "root ::= object\n";
    for (const char* p :
         {"value", "object", "member", "array", "string", "char", "hex4", "any-number", "sp"})
        out += std::string(p) + " ::= " + primitives().at(p) + "\n";
    return out;
}

}  // namespace blue
