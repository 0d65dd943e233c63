// Value: what a Jinja expression evaluates to inside the chat-template interpreter (jinja.h).
// Internal to common/chat; the public interface is chat_template.h.
//
// Python semantics, as Hugging Face transformers renders chat templates with Jinja2: arrays,
// tuples, dicts and namespaces are shared by reference (a namespace is the only thing a
// template may mutate), strings are UTF-8 and index by code point, `none` prints "None",
// booleans "True"/"False", lists as Python's repr. Dict keys keep their insertion order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace specloop {
namespace jinja {

// A template error: syntax, a type error while rendering, or the template's own
// raise_exception(). Thrown inside the interpreter, turned into a Status at its boundary.
struct Error : std::runtime_error {
  Error(const std::string& what, bool raised = false)
      : std::runtime_error(what), raised_by_template(raised) {}
  bool raised_by_template;  // raise_exception() in the template: a message for the user
};

// Throws Error("line N: msg").
[[noreturn]] inline void Fail(int line, const std::string& msg) {
  throw Error("line " + std::to_string(line) + ": " + msg);
}

class Value;
using Array = std::vector<Value>;
struct Object;
// A call's keyword arguments, in call order (Find: the first of a name).
using Kwargs = Object;
using Function = std::function<Value(const std::vector<Value>& args, const Kwargs& kwargs)>;

class Value {
 public:
  enum class Type : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction
  };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeArray(Array items, bool tuple = false);
  static Value MakeObject();               // an empty dict
  static Value MakeNamespace();            // an empty namespace()
  static Value MakeFunction(Function fn);
  // JSON to Value: objects become dicts (in nlohmann's key order), numbers ints or floats.
  static Value FromJson(const nlohmann::json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_tuple() const { return type_ == Type::kArray && tuple_; }
  bool is_object() const { return type_ == Type::kObject; }  // dict or namespace
  bool is_dict() const { return type_ == Type::kObject && !namespace_; }
  bool is_namespace() const { return type_ == Type::kObject && namespace_; }
  bool is_function() const { return type_ == Type::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return type_ == Type::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& as_string() const { return s_; }
  const Array& array() const { return *a_; }
  const Object& object() const { return *o_; }
  Object& mutable_object() const { return *o_; }  // namespaces only (set ns.x = ...)
  const Function& function() const { return *fn_; }

  // Python truthiness: empty strings, containers, 0, none and undefined are false.
  bool Truthy() const;
  // Python ==: numbers by value (True == 1), containers element-wise.
  bool Equals(const Value& other) const;
  // str(value) as Jinja prints it: "" for undefined, "None", "True", 1.0, ['a', 1].
  std::string Str() const;
  // repr(value): strings quoted. Throws Error past 256 levels of nesting (a namespace can
  // hold itself: `set ns.a = ns`).
  std::string Repr() const;
  // The type's name in error messages ("string", "list", ...).
  const char* TypeName() const;

 private:
  std::string Repr(int depth) const;

  Type type_ = Type::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<Function> fn_;
};

// A dict (or namespace): keys in insertion order.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value v);
};

// json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...), as
// transformers' tojson filter: indent < 0 means none; separators default to (", ", ": "), or
// (",", ": ") with an indent.
std::string ToJson(const Value& v, int indent, const std::string& item_sep,
                   const std::string& key_sep, bool sort_keys);
// Python's repr of a float: shortest round-trip digits, "1.0", "1e+20", "inf", "nan".
std::string FloatRepr(double f);

// UTF-8 helpers. Decodes the code point at s[*i] and advances *i past it; an invalid byte
// is returned as itself (its value, 0x80-0xff) and advances *i by one.
uint32_t NextCodePoint(const std::string& s, size_t* i);
// Code points of `s` (invalid bytes pass as single units).
std::vector<std::string> CodePoints(const std::string& s);
// True for the code points Python's str.isspace() accepts.
bool IsSpaceCodePoint(uint32_t cp);
// str.strip / lstrip / rstrip: `chars` null strips whitespace (str.isspace), else any of the
// code points in *chars.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace jinja
}  // namespace specloop
