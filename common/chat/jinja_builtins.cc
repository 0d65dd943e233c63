#include "common/chat/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace specloop {
namespace jinja {
namespace {

// The i-th positional argument, else the keyword `key`, else null.
const Value* Arg(const std::vector<Value>& args, const Kwargs& kwargs, size_t i,
                 const char* key) {
  if (i < args.size()) return &args[i];
  return kwargs.Find(key);
}

const std::string& StringArg(const Value* v, const char* what, int line) {
  if (v == nullptr || !v->is_string()) Fail(line, std::string(what) + " must be a string");
  return v->as_string();
}

bool BoolArg(const Value* v, bool def) { return v == nullptr ? def : v->Truthy(); }

int64_t IntArg(const Value* v, int64_t def, const char* what, int line) {
  if (v == nullptr || v->is_none() || v->is_undefined()) return def;
  if (v->is_bool()) return v->as_bool();
  if (!v->is_int()) Fail(line, std::string(what) + " must be an integer");
  return v->as_int();
}

std::string AsciiMap(const std::string& s, bool upper) {
  std::string out = s;
  for (char& c : out) {
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = AsciiMap(s, false);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) {
      if (word_start && c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
      if (!word_start && c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    word_start = !alpha && !(static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

// Whether the one code point `cp` (an element of CodePoints) is whitespace, as str.isspace().
bool IsSpace(const std::string& cp) {
  size_t i = 0;
  return IsSpaceCodePoint(NextCodePoint(cp, &i));
}

// Python's str.split(sep, maxsplit).
Array Split(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  Array out;
  if (sep == nullptr || sep->is_none()) {
    size_t i = 0;
    const std::vector<std::string> cps = CodePoints(s);
    auto is_space = [&](size_t k) { return IsSpace(cps[k]); };
    while (i < cps.size()) {
      while (i < cps.size() && is_space(i)) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        std::string rest;
        for (size_t k = i; k < cps.size(); ++k) rest += cps[k];
        out.push_back(Value::String(rest));
        return out;
      }
      std::string word;
      while (i < cps.size() && !is_space(i)) word += cps[i++];
      out.push_back(Value::String(word));
    }
    return out;
  }
  const std::string& d = StringArg(sep, "split's separator", line);
  if (d.empty()) Fail(line, "split: empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
    const size_t p = s.find(d, start);
    if (p == std::string::npos) break;
    out.push_back(Value::String(s.substr(start, p - start)));
    start = p + d.size();
  }
  out.push_back(Value::String(s.substr(start)));
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (count == 0) return s;
  std::string out;
  if (from.empty()) {  // Python inserts `to` between code points (and at both ends)
    const std::vector<std::string> cps = CodePoints(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + to;
    start = p + from.size();
    ++n;
  }
  return out + s.substr(start);
}

bool Affix(const std::string& s, const Value& pattern, bool prefix, int line) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) Fail(line, "startswith/endswith takes a string or a tuple of strings");
    const std::string& x = p.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (pattern.is_array()) {
    for (const Value& p : pattern.array()) {
      if (one(p)) return true;
    }
    return false;
  }
  return one(pattern);
}

// Python ordering for sort: numbers by value, strings (optionally case-folded) by code point.
int Compare(const Value& a, const Value& b, bool case_sensitive, int line) {
  const bool na = a.is_number() || a.is_bool(), nb = b.is_number() || b.is_bool();
  if (na && nb) {
    const double x = a.is_bool() ? a.as_bool() : a.as_number();
    const double y = b.is_bool() ? b.as_bool() : b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : AsciiMap(a.as_string(), false);
    const std::string y = case_sensitive ? b.as_string() : AsciiMap(b.as_string(), false);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  Fail(line, std::string("cannot compare ") + a.TypeName() + " with " + b.TypeName());
}

// item[attribute] with dotted paths ("function.name") and integer parts.
Value Attribute(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    if (v.is_object()) {
      const Value* f = v.object().Find(part);
      if (f == nullptr) return Value();
      v = *f;
    } else if (v.is_array() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const size_t i = std::strtoul(part.c_str(), nullptr, 10);
      if (i >= v.array().size()) return Value();
      v = v.array()[i];
    } else {
      return Value();
    }
    start = dot + 1;
  }
  return v;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Escapes every non-ASCII code point of JSON text as \uXXXX (surrogate pairs past U+FFFF).
std::string EnsureAscii(const std::string& json) {
  std::string out;
  for (size_t i = 0; i < json.size();) {
    const size_t start = i;
    uint32_t c = NextCodePoint(json, &i);
    if (i - start == 1) {
      if (c < 0x80) {
        out += static_cast<char>(c);
        continue;
      }
      c = 0xfffd;  // an invalid byte
    }
    char buf[16];
    if (c >= 0x10000) {
      c -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
    }
    out += buf;
  }
  return out;
}

}  // namespace

Array Iterate(const Value& value, int line) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kArray:
      return value.array();
    case Value::Type::kObject: {
      if (value.is_namespace()) Fail(line, "a namespace is not iterable");
      Array keys;
      for (const auto& kv : value.object().items) keys.push_back(Value::String(kv.first));
      return keys;
    }
    case Value::Type::kString: {
      Array chars;
      for (std::string& cp : CodePoints(value.as_string())) {
        chars.push_back(Value::String(std::move(cp)));
      }
      return chars;
    }
    default:
      Fail(line, std::string("'") + value.TypeName() + "' object is not iterable");
  }
}

bool ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args,
               int line) {
  auto arg0 = [&]() -> const Value& {
    if (args.empty()) Fail(line, "test '" + name + "' needs an argument");
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_dict();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int()) Fail(line, "test '" + name + "' needs an integer");
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    const int64_t d = IntArg(&arg0(), 1, "divisibleby's argument", line);
    if (d == 0) Fail(line, "divisibleby(0)");
    return v.as_int() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(arg0());
  if (name == "ne" || name == "!=") return !v.Equals(arg0());
  if (name == "sameas") return v.type() == arg0().type() && v.Equals(arg0());
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(v, arg0(), true, line) < 0;
  if (name == "le" || name == "<=") return Compare(v, arg0(), true, line) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(v, arg0(), true, line) > 0;
  if (name == "ge" || name == ">=") return Compare(v, arg0(), true, line) >= 0;
  if (name == "in") {
    const Value& c = arg0();
    if (c.is_string() && v.is_string()) return c.as_string().find(v.as_string()) != std::string::npos;
    if (c.is_array()) {
      for (const Value& x : c.array()) {
        if (x.Equals(v)) return true;
      }
      return false;
    }
    if (c.is_object() && v.is_string()) return c.object().Find(v.as_string()) != nullptr;
    Fail(line, "test 'in' needs a container");
  }
  if (name == "lower") return v.is_string() && AsciiMap(v.as_string(), false) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiMap(v.as_string(), true) == v.as_string();
  Fail(line, "unknown test '" + name + "'");
}

Value ApplyFilter(const std::string& name, const Value& v, const std::vector<Value>& args,
                  const Kwargs& kwargs, int line) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) {
      Fail(line, "filter '" + name + "' needs " + what + ", got " + v.TypeName());
    }
  };
  if (name == "safe" || (name == "string" && v.is_string())) return v;
  if (name == "string") return Value::String(v.Str());
  if (name == "tojson") {
    const Value* indent = Arg(args, kwargs, 0, "indent");
    const int64_t ind = IntArg(indent, -1, "tojson's indent", line);
    std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
    if (const Value* sep = kwargs.Find("separators"); sep != nullptr && !sep->is_none()) {
      if (!sep->is_array() || sep->array().size() != 2 || !sep->array()[0].is_string() ||
          !sep->array()[1].is_string()) {
        Fail(line, "tojson: separators must be two strings");
      }
      item_sep = sep->array()[0].as_string();
      key_sep = sep->array()[1].as_string();
    }
    std::string out = ToJson(v, static_cast<int>(std::min<int64_t>(ind, 64)), item_sep, key_sep,
                             BoolArg(kwargs.Find("sort_keys"), false));
    if (BoolArg(kwargs.Find("ensure_ascii"), false)) out = EnsureAscii(out);
    return Value::String(std::move(out));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::Int(static_cast<int64_t>(CodePoints(v.as_string()).size()));
    if (v.is_array()) return Value::Int(static_cast<int64_t>(v.array().size()));
    if (v.is_object()) return Value::Int(static_cast<int64_t>(v.object().items.size()));
    if (v.is_undefined()) return Value::Int(0);
    need(false, "a string, list or dict");
  }
  if (name == "default" || name == "d") {
    const Value* def = Arg(args, kwargs, 0, "default_value");
    const bool boolean = BoolArg(Arg(args, kwargs, 1, "boolean"), false);
    if (v.is_undefined() || (boolean && !v.Truthy())) return def ? *def : Value::String("");
    return v;
  }
  if (name == "trim") {
    need(v.is_string(), "a string");
    const Value* chars = Arg(args, kwargs, 0, "chars");
    const std::string* c = chars && !chars->is_none() ? &StringArg(chars, "trim's chars", line)
                                                     : nullptr;
    return Value::String(Strip(v.as_string(), c, true, true));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    need(v.is_string(), "a string");
    const std::string& s = v.as_string();
    return Value::String(name == "upper" ? AsciiMap(s, true) : name == "lower" ? AsciiMap(s, false)
                         : name == "capitalize" ? Capitalize(s) : Title(s));
  }
  if (name == "e" || name == "escape") return Value::String(HtmlEscape(v.Str()));
  if (name == "replace") {
    need(v.is_string(), "a string");
    const std::string& from = StringArg(Arg(args, kwargs, 0, "old"), "replace's old", line);
    const std::string& to = StringArg(Arg(args, kwargs, 1, "new"), "replace's new", line);
    return Value::String(Replace(v.as_string(), from, to,
                                 IntArg(Arg(args, kwargs, 2, "count"), -1, "count", line)));
  }
  if (name == "indent") {
    need(v.is_string(), "a string");
    const Value* w = Arg(args, kwargs, 0, "width");
    const std::string pad = w && w->is_string() ? w->as_string()
                          : std::string(IntArg(w, 4, "indent's width", line), ' ');
    const bool first = BoolArg(Arg(args, kwargs, 1, "first"), false);
    const bool blank = BoolArg(Arg(args, kwargs, 2, "blank"), false);
    const Value newline = Value::String("\n");
    const Array lines = Split(v.as_string(), &newline, -1, line);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i].as_string();
      if (i) out += "\n";
      if ((i > 0 || first) && (blank || !l.empty())) out += pad;
      out += l;
    }
    return Value::String(out);
  }
  if (name == "int") {
    const Value* def = Arg(args, kwargs, 0, "default");
    if (v.is_int()) return v;
    if (v.is_bool()) return Value::Int(v.as_bool());
    if (v.is_float()) return Value::Int(static_cast<int64_t>(v.as_number()));
    if (v.is_string()) {
      const std::string s = Strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return Value::Int(i);
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0' && std::isfinite(f)) return Value::Int(static_cast<int64_t>(f));
    }
    return def ? *def : Value::Int(0);
  }
  if (name == "float") {
    const Value* def = Arg(args, kwargs, 0, "default");
    if (v.is_number() || v.is_bool()) return Value::Float(v.is_bool() ? v.as_bool() : v.as_number());
    if (v.is_string()) {
      const std::string s = Strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return Value::Float(f);
    }
    return def ? *def : Value::Float(0.0);
  }
  if (name == "abs") {
    need(v.is_number(), "a number");
    return v.is_int() ? Value::Int(std::llabs(v.as_int())) : Value::Float(std::fabs(v.as_number()));
  }
  if (name == "round") {
    need(v.is_number(), "a number");
    const int64_t prec = IntArg(Arg(args, kwargs, 0, "precision"), 0, "precision", line);
    const double m = std::pow(10.0, static_cast<double>(prec));
    return Value::Float(std::round(v.as_number() * m) / m);
  }
  if (name == "items" || name == "dictsort") {
    need(v.is_dict() || v.is_undefined(), "a dict");
    Array items;
    if (v.is_dict()) {
      for (const auto& [k, x] : v.object().items) {
        items.push_back(Value::MakeArray({Value::String(k), x}, true));
      }
    }
    if (name == "dictsort") {
      const bool cs = BoolArg(Arg(args, kwargs, 0, "case_sensitive"), false);
      const Value* by = Arg(args, kwargs, 1, "by");
      const size_t idx = by && by->is_string() && by->as_string() == "value" ? 1 : 0;
      const bool rev = BoolArg(Arg(args, kwargs, 2, "reverse"), false);
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        const int c = Compare(a.array()[idx], b.array()[idx], cs, line);
        return rev ? c > 0 : c < 0;
      });
    }
    return Value::MakeArray(std::move(items));
  }
  if (name == "list") return Value::MakeArray(Iterate(v, line));
  if (name == "first" || name == "last") {
    const Array items = Iterate(v, line);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    Array items = Iterate(v, line);
    std::reverse(items.begin(), items.end());
    if (v.is_string()) {
      std::string s;
      for (const Value& c : items) s += c.as_string();
      return Value::String(s);
    }
    return Value::MakeArray(std::move(items));
  }
  if (name == "join") {
    const Value* sep = Arg(args, kwargs, 0, "d");
    const std::string d = sep ? StringArg(sep, "join's separator", line) : "";
    const Value* attr = Arg(args, kwargs, 1, "attribute");
    std::string out;
    const Array items = Iterate(v, line);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += d;
      out += (attr ? Attribute(items[i], attr->Str()) : items[i]).Str();
    }
    return Value::String(out);
  }
  if (name == "unique") {
    Array out;
    for (const Value& x : Iterate(v, line)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return y.Equals(x); })) {
        out.push_back(x);
      }
    }
    return Value::MakeArray(std::move(out));
  }
  if (name == "sort") {
    Array items = Iterate(v, line);
    const bool rev = BoolArg(Arg(args, kwargs, 0, "reverse"), false);
    const bool cs = BoolArg(Arg(args, kwargs, 1, "case_sensitive"), false);
    const Value* attr = Arg(args, kwargs, 2, "attribute");
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const int c = attr ? Compare(Attribute(a, attr->Str()), Attribute(b, attr->Str()), cs, line)
                         : Compare(a, b, cs, line);
      return rev ? c > 0 : c < 0;
    });
    return Value::MakeArray(std::move(items));
  }
  if (name == "min" || name == "max" || name == "sum") {
    const Array items = Iterate(v, line);
    const Value* attr = kwargs.Find("attribute");
    if (name == "sum") {
      Value acc = kwargs.Find("start") ? *kwargs.Find("start") : Value::Int(0);
      for (const Value& x0 : items) {
        const Value x = attr ? Attribute(x0, attr->Str()) : x0;
        if (!x.is_number() || !acc.is_number()) Fail(line, "sum needs numbers");
        acc = acc.is_int() && x.is_int() ? Value::Int(acc.as_int() + x.as_int())
                                         : Value::Float(acc.as_number() + x.as_number());
      }
      return acc;
    }
    if (items.empty()) return Value();
    Value best = items[0];
    for (const Value& x : items) {
      const int c = Compare(attr ? Attribute(x, attr->Str()) : x,
                            attr ? Attribute(best, attr->Str()) : best, false, line);
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }
  if (name == "map") {
    Array out;
    if (const Value* attr = kwargs.Find("attribute")) {
      const Value* def = kwargs.Find("default");
      for (const Value& x : Iterate(v, line)) {
        Value a = Attribute(x, attr->Str());
        out.push_back(a.is_undefined() && def ? *def : a);
      }
    } else {
      if (args.empty() || !args[0].is_string()) Fail(line, "map needs a filter name or attribute=");
      const std::vector<Value> rest(args.begin() + 1, args.end());
      for (const Value& x : Iterate(v, line)) {
        out.push_back(ApplyFilter(args[0].as_string(), x, rest, Kwargs(), line));
      }
    }
    return Value::MakeArray(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr_form = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    size_t a = 0;
    std::string attr;
    if (attr_form) {
      if (args.empty()) Fail(line, name + " needs an attribute name");
      attr = args[0].Str();
      a = 1;
    }
    Array out;
    for (const Value& x : Iterate(v, line)) {
      const Value subject = attr_form ? Attribute(x, attr) : x;
      bool pass;
      if (args.size() > a) {
        if (!args[a].is_string()) Fail(line, name + ": the test name must be a string");
        pass = ApplyTest(args[a].as_string(), subject,
                         std::vector<Value>(args.begin() + a + 1, args.end()), line);
      } else {
        pass = subject.Truthy();
      }
      if (pass == keep_if) out.push_back(x);
    }
    return Value::MakeArray(std::move(out));
  }
  if (name == "attr") {
    const std::string& key = StringArg(Arg(args, kwargs, 0, "name"), "attr's name", line);
    return Attribute(v, key);
  }
  if (name == "wordcount") {
    need(v.is_string(), "a string");
    return Value::Int(static_cast<int64_t>(Split(v.as_string(), nullptr, -1, line).size()));
  }
  Fail(line, "unknown filter '" + name + "'");
}

bool CallMethod(const Value& v, const std::string& name, const std::vector<Value>& args,
                const Kwargs& kwargs, int line, Value* out) {
  if (v.is_string()) {
    const std::string& s = v.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = Arg(args, kwargs, 0, "chars");
      const std::string* c = chars && !chars->is_none() ? &StringArg(chars, "chars", line) : nullptr;
      *out = Value::String(Strip(s, c, name != "rstrip", name != "lstrip"));
    } else if (name == "split") {
      *out = Value::MakeArray(Split(s, Arg(args, kwargs, 0, "sep"),
                                    IntArg(Arg(args, kwargs, 1, "maxsplit"), -1, "maxsplit", line),
                                    line));
    } else if (name == "startswith" || name == "endswith") {
      if (args.empty()) Fail(line, name + "() needs an argument");
      *out = Value::Bool(Affix(s, args[0], name == "startswith", line));
    } else if (name == "replace") {
      *out = ApplyFilter("replace", v, args, kwargs, line);
    } else if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
      *out = ApplyFilter(name, v, {}, Kwargs(), line);
    } else if (name == "find" || name == "count") {
      const std::string& sub = StringArg(Arg(args, kwargs, 0, "sub"), name.c_str(), line);
      if (name == "find") {
        const size_t p = s.find(sub);
        *out = Value::Int(p == std::string::npos ? -1
                          : static_cast<int64_t>(CodePoints(s.substr(0, p)).size()));
      } else {
        int64_t n = 0;
        if (sub.empty()) {
          n = static_cast<int64_t>(CodePoints(s).size()) + 1;
        } else {
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        }
        *out = Value::Int(n);
      }
    } else if (name == "join") {
      if (args.empty()) Fail(line, "join() needs an argument");
      std::string r;
      const Array items = Iterate(args[0], line);
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string()) Fail(line, "str.join needs strings");
        if (i) r += s;
        r += items[i].as_string();
      }
      *out = Value::String(r);
    } else if (name == "isspace" || name == "isdigit" || name == "isalpha") {
      bool all = !s.empty();
      for (const std::string& cp : CodePoints(s)) {
        const char c = cp[0];
        const bool ok = name == "isspace" ? IsSpace(cp)
                        : name == "isdigit" ? (cp.size() == 1 && c >= '0' && c <= '9')
                                            : (cp.size() == 1 && ((c >= 'a' && c <= 'z') ||
                                                                  (c >= 'A' && c <= 'Z')));
        all = all && ok;
      }
      *out = Value::Bool(all);
    } else {
      return false;
    }
    return true;
  }
  if (v.is_dict()) {
    if (name == "get") {
      if (args.empty() || !args[0].is_string()) Fail(line, "get() needs a string key");
      const Value* found = v.object().Find(args[0].as_string());
      *out = found ? *found : args.size() > 1 ? args[1] : Value::None();
    } else if (name == "items") {
      *out = ApplyFilter("items", v, {}, Kwargs(), line);
    } else if (name == "keys" || name == "values") {
      Array a;
      for (const auto& [k, x] : v.object().items) {
        a.push_back(name == "keys" ? Value::String(k) : x);
      }
      *out = Value::MakeArray(std::move(a));
    } else {
      return false;
    }
    return true;
  }
  return false;
}

}  // namespace jinja
}  // namespace specloop
