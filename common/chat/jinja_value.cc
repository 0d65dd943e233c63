#include "common/chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace specloop {
namespace jinja {

const Value* Object::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::None() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.type_ = Type::kFloat;
  v.f_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.s_ = std::move(s);
  return v;
}

Value Value::MakeArray(Array items, bool tuple) {
  Value v;
  v.type_ = Type::kArray;
  v.tuple_ = tuple;
  v.a_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::MakeObject() {
  Value v;
  v.type_ = Type::kObject;
  v.o_ = std::make_shared<Object>();
  return v;
}

Value Value::MakeNamespace() {
  Value v = MakeObject();
  v.namespace_ = true;
  return v;
}

Value Value::MakeFunction(Function fn) {
  Value v;
  v.type_ = Type::kFunction;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return None();
    case nlohmann::json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u))
                                                  : Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(FromJson(e));
      return MakeArray(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Value o = MakeObject();
      for (auto it = j.begin(); it != j.end(); ++it) {
        o.o_->items.emplace_back(it.key(), FromJson(it.value()));
      }
      return o;
    }
    default:
      return Value();  // binary, discarded
  }
}

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return b_;
    case Type::kInt:
      return i_ != 0;
    case Type::kFloat:
      return f_ != 0;
    case Type::kString:
      return !s_.empty();
    case Type::kArray:
      return !a_->empty();
    case Type::kObject:
      return namespace_ || !o_->items.empty();
    case Type::kFunction:
      return true;
  }
  return false;
}

namespace {
constexpr int kMaxNesting = 256;  // as tojson's
}  // namespace

bool Value::Equals(const Value& other) const {
  const bool num_a = is_number() || is_bool(), num_b = other.is_number() || other.is_bool();
  if (num_a && num_b) {
    if (is_float() || other.is_float()) {
      const double a = is_bool() ? b_ : as_number(), b = other.is_bool() ? other.b_
                                                                          : other.as_number();
      return a == b;
    }
    const int64_t a = is_bool() ? b_ : i_, b = other.is_bool() ? other.b_ : other.i_;
    return a == b;
  }
  if (type_ != other.type_) return false;
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return true;
    case Type::kString:
      return s_ == other.s_;
    case Type::kArray: {
      if (a_ == other.a_) return true;
      if (a_->size() != other.a_->size()) return false;
      for (size_t i = 0; i < a_->size(); ++i) {
        if (!(*a_)[i].Equals((*other.a_)[i])) return false;
      }
      return true;
    }
    case Type::kObject: {
      if (o_ == other.o_) return true;
      if (namespace_ || other.namespace_) return false;
      if (o_->items.size() != other.o_->items.size()) return false;
      for (const auto& [k, v] : o_->items) {
        const Value* w = other.o_->Find(k);
        if (w == nullptr || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Type::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // The shortest %.Ne that reads back as f: its digits and decimal exponent.
  char buf[40];
  for (int prec = 0; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string mant = s.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent form here
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else {
    if (digits.size() <= static_cast<size_t>(exp) + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

std::string PyQuote(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          *out += b;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void ToJsonRec(const Value& v, int indent, const std::string& item_sep,
               const std::string& key_sep, bool sort_keys, int depth, std::string* out) {
  if (depth > 256) throw Error("tojson: value nested too deeply");
  const std::string pad = indent >= 0 ? "\n" + std::string(indent * depth, ' ') : "";
  const std::string child_pad = indent >= 0 ? "\n" + std::string(indent * (depth + 1), ' ') : "";
  switch (v.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      *out += "null";
      return;
    case Value::Type::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      *out += std::to_string(v.as_int());
      return;
    case Value::Type::kFloat: {
      const double f = v.as_number();
      *out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                                                    : FloatRepr(f);
      return;
    }
    case Value::Type::kString:
      JsonString(v.as_string(), out);
      return;
    case Value::Type::kArray: {
      const Array& a = v.array();
      if (a.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) *out += item_sep;
        *out += child_pad;
        ToJsonRec(a[i], indent, item_sep, key_sep, sort_keys, depth + 1, out);
      }
      *out += pad + "]";
      return;
    }
    case Value::Type::kObject: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.object().items) items.push_back(&kv);
      if (items.empty()) {
        *out += "{}";
        return;
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        *out += child_pad;
        JsonString(items[i]->first, out);
        *out += key_sep;
        ToJsonRec(items[i]->second, indent, item_sep, key_sep, sort_keys, depth + 1, out);
      }
      *out += pad + "}";
      return;
    }
    case Value::Type::kFunction:
      throw Error("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& v, int indent, const std::string& item_sep,
                   const std::string& key_sep, bool sort_keys) {
  std::string out;
  ToJsonRec(v, indent, item_sep, key_sep, sort_keys, 0, &out);
  return out;
}

std::string Value::Repr() const { return Repr(0); }

std::string Value::Repr(int depth) const {
  if (depth > kMaxNesting) throw Error("value nested too deeply");
  switch (type_) {
    case Type::kString:
      return PyQuote(s_);
    case Type::kUndefined:
      return "";
    default:
      break;
  }
  if (type_ == Type::kArray) {
    std::string out = tuple_ ? "(" : "[";
    for (size_t i = 0; i < a_->size(); ++i) {
      if (i) out += ", ";
      out += (*a_)[i].Repr(depth + 1);
    }
    if (tuple_ && a_->size() == 1) out += ",";
    return out + (tuple_ ? ")" : "]");
  }
  if (type_ == Type::kObject) {
    std::string out = namespace_ ? "<Namespace {" : "{";
    for (size_t i = 0; i < o_->items.size(); ++i) {
      if (i) out += ", ";
      out += PyQuote(o_->items[i].first) + ": " + o_->items[i].second.Repr(depth + 1);
    }
    return out + (namespace_ ? "}>" : "}");
  }
  return Str();
}

std::string Value::Str() const {
  switch (type_) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return b_ ? "True" : "False";
    case Type::kInt:
      return std::to_string(i_);
    case Type::kFloat:
      return FloatRepr(f_);
    case Type::kString:
      return s_;
    case Type::kFunction:
      return "<function>";
    default:
      return Repr();
  }
}

const char* Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined: return "undefined";
    case Type::kNone: return "none";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "string";
    case Type::kArray: return tuple_ ? "tuple" : "list";
    case Type::kObject: return namespace_ ? "namespace" : "dict";
    case Type::kFunction: return "function";
  }
  return "?";
}

uint32_t NextCodePoint(const std::string& s, size_t* i) {
  const unsigned char c = s[*i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) {
    ++*i;
    return c;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    const unsigned char d = s[*i + k];
    if ((d >> 6) != 2) {
      ++*i;
      return c;
    }
    cp = (cp << 6) | (d & 0x3f);
  }
  *i += len;
  return cp;
}

std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    NextCodePoint(s, &i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

bool IsSpaceCodePoint(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
         cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars != nullptr) {
    for (size_t i = 0; i < chars->size();) set.push_back(NextCodePoint(*chars, &i));
  }
  auto strip_it = [&](uint32_t cp) {
    return chars == nullptr ? IsSpaceCodePoint(cp)
                            : std::find(set.begin(), set.end(), cp) != set.end();
  };
  // Code point boundaries, then trim from both ends.
  std::vector<std::pair<size_t, uint32_t>> cps;  // start byte, code point
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    cps.emplace_back(start, NextCodePoint(s, &i));
  }
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b].second)) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1].second)) --e;
  }
  const size_t from = b < cps.size() ? cps[b].first : s.size();
  const size_t to = e < cps.size() ? cps[e].first : s.size();
  return s.substr(from, to - from);
}

}  // namespace jinja
}  // namespace specloop
