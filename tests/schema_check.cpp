// schemaViolation (see schema_check.h): a direct recursive check of a value against a schema.
#include "tests/schema_check.h"

#include <cmath>

namespace blue {
namespace {

using nlohmann::json;

size_t codePoints(const std::string& s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
}

bool isType(const std::string& type, const json& v) {
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer") {
        if (v.is_number_integer()) return true;
        if (!v.is_number_float()) return false;
        double d = v.get<double>();
        return std::isfinite(d) && std::floor(d) == d;
    }
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    return false;
}

std::string token(const std::string& key) {
    std::string out;
    for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
}

class Checker {
  public:
    explicit Checker(const json& root) : root_(root) {}

    std::string check(const json& s, const json& v, const std::string& at, int depth = 0) {
        if (depth > 200) return at + ": schema recursion too deep";
        if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
        if (!s.is_object()) return at + ": schema is not an object";
        if (s.contains("$ref")) {
            const json* t = resolve(s["$ref"].get<std::string>());
            if (!t) return at + ": unresolved $ref";
            if (auto e = check(*t, v, at, depth + 1); !e.empty()) return e;
        }
        if (s.contains("type")) {
            const json& t = s["type"];
            bool ok = false;
            if (t.is_string()) ok = isType(t.get<std::string>(), v);
            for (const json& x : t.is_array() ? t : json::array())
                ok |= isType(x.get<std::string>(), v);
            if (!ok) return at + ": " + v.dump() + " does not have type " + t.dump();
        }
        if (s.contains("const") && s["const"] != v)
            return at + ": " + v.dump() + " is not the const";
        if (s.contains("enum")) {
            bool found = false;
            for (const json& x : s["enum"]) found |= x == v;
            if (!found) return at + ": " + v.dump() + " is not in enum";
        }
        if (auto e = combiners(s, v, at, depth); !e.empty()) return e;
        if (v.is_number()) {
            double d = v.get<double>();
            if (s.contains("minimum") && d < s["minimum"].get<double>())
                return at + ": " + v.dump() + " is below minimum";
            if (s.contains("maximum") && d > s["maximum"].get<double>())
                return at + ": " + v.dump() + " is above maximum";
        }
        if (v.is_string()) {
            size_t n = codePoints(v.get<std::string>());
            if (s.contains("minLength") && n < s["minLength"].get<size_t>())
                return at + ": string too short";
            if (s.contains("maxLength") && n > s["maxLength"].get<size_t>())
                return at + ": string too long";
        }
        if (v.is_object()) return object(s, v, at, depth);
        if (v.is_array()) return array(s, v, at, depth);
        return "";
    }

  private:
    const json& root_;

    const json* resolve(const std::string& ref) const {
        if (ref == "#") return &root_;
        for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
            if (ref.rfind(prefix, 0) != 0) continue;
            std::string defs = prefix.substr(2, prefix.size() - 3);
            std::string name;
            for (size_t i = prefix.size(); i < ref.size(); ++i) {
                if (ref[i] == '~' && i + 1 < ref.size()) {
                    name += ref[++i] == '0' ? '~' : '/';
                } else {
                    name += ref[i];
                }
            }
            if (root_.contains(defs) && root_[defs].contains(name)) return &root_[defs][name];
        }
        return nullptr;
    }

    std::string combiners(const json& s, const json& v, const std::string& at, int depth) {
        if (s.contains("allOf"))
            for (const json& sub : s["allOf"])
                if (auto e = check(sub, v, at, depth + 1); !e.empty()) return e;
        for (const char* key : {"anyOf", "oneOf"}) {
            if (!s.contains(key)) continue;
            size_t matches = 0;
            for (const json& sub : s[key]) matches += check(sub, v, at, depth + 1).empty();
            if (matches == 0) return at + ": matches no " + key + " branch";
            if (std::string(key) == "oneOf" && matches > 1)
                return at + ": matches several oneOf branches";
        }
        return "";
    }

    std::string object(const json& s, const json& v, const std::string& at, int depth) {
        if (s.contains("required"))
            for (const json& r : s["required"])
                if (!v.contains(r.get<std::string>()))
                    return at + ": missing required property " + r.dump();
        const json props = s.contains("properties") ? s["properties"] : json::object();
        for (const auto& [key, x] : v.items()) {
            std::string here = at + "/" + token(key);
            if (props.contains(key)) {
                if (auto e = check(props[key], x, here, depth + 1); !e.empty()) return e;
            } else if (s.contains("additionalProperties")) {
                if (auto e = check(s["additionalProperties"], x, here, depth + 1); !e.empty())
                    return e;
            }
        }
        return "";
    }

    std::string array(const json& s, const json& v, const std::string& at, int depth) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>())
            return at + ": too few items";
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>())
            return at + ": too many items";
        size_t k = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
        for (size_t i = 0; i < v.size(); ++i) {
            std::string here = at + "/" + std::to_string(i);
            const json* sub = i < k                 ? &s["prefixItems"][i]
                              : s.contains("items") ? &s["items"]
                                                    : nullptr;
            if (sub)
                if (auto e = check(*sub, v[i], here, depth + 1); !e.empty()) return e;
        }
        return "";
    }
};

}  // namespace

std::string schemaViolation(const nlohmann::json& schema, const nlohmann::json& value) {
    std::string e = Checker(schema).check(schema, value, "");
    if (!e.empty() && e[0] == ':') e = "(root)" + e;
    return e;
}

}  // namespace blue
