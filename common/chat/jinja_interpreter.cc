// Rendering of a parsed chat template (jinja.h): scopes, statements, expressions, globals.
//
// Scopes as Jinja2's: the template's top level is one scope (with the context's variables);
// each for-loop iteration and each macro call gets its own, so a `set` inside them is not
// seen outside (namespace() is how a template carries a value out of a loop).
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "common/chat/jinja.h"
#include "common/chat/jinja_builtins.h"

namespace specloop {
namespace jinja {
namespace {

using Scope = std::unordered_map<std::string, Value>;

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, std::string* out) : limits_(limits), out_(out) {}
  // Namespaces share their items by reference, so one can hold itself (`set ns.a = ns`): a
  // cycle of shared pointers. Emptying every namespace of the render breaks them.
  ~Interpreter() {
    for (Value& ns : namespaces_) ns.mutable_object().items.clear();
  }

  void Run(const Body& body, const Value& context) {
    scopes_.emplace_back();
    Globals(&scopes_.back());
    if (context.is_object()) {
      for (const auto& [k, v] : context.object().items) scopes_.back()[k] = v;
    }
    Exec(body);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void Globals(Scope* s) {
    (*s)["raise_exception"] = Value::MakeFunction([](const std::vector<Value>& a, const Kwargs&) {
      throw Error(a.empty() ? std::string("raise_exception() called") : a[0].Str(), true);
      return Value();
    });
    (*s)["strftime_now"] = Value::MakeFunction([](const std::vector<Value>& a, const Kwargs&) {
      if (a.empty() || !a[0].is_string()) throw Error("strftime_now needs a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), a[0].as_string().c_str(), &tm);
      return Value::String(std::string(buf, n));
    });
    const int64_t max_items = limits_.max_iterations;
    (*s)["range"] = Value::MakeFunction([max_items](const std::vector<Value>& a, const Kwargs&) {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : a) {
        if (!v.is_int()) throw Error("range() takes integers");
      }
      if (a.size() == 1) {
        stop = a[0].as_int();
      } else if (a.size() >= 2) {
        start = a[0].as_int();
        stop = a[1].as_int();
        if (a.size() > 2) step = a[2].as_int();
      }
      if (step == 0) throw Error("range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= max_items) throw Error("range() too long");
        out.push_back(Value::Int(i));
      }
      return Value::MakeArray(std::move(out));
    });
    (*s)["namespace"] = Value::MakeFunction([this](const std::vector<Value>& a,
                                                   const Kwargs& kw) {
      Value ns = Value::MakeNamespace();
      namespaces_.push_back(ns);
      if (!a.empty()) {
        if (!a[0].is_dict()) throw Error("namespace() takes a dict or keyword arguments");
        for (const auto& [k, v] : a[0].object().items) ns.mutable_object().Set(k, v);
      }
      for (const auto& [k, v] : kw.items) ns.mutable_object().Set(k, v);
      return ns;
    });
    (*s)["dict"] = Value::MakeFunction([](const std::vector<Value>& a, const Kwargs& kw) {
      Value d = Value::MakeObject();
      if (!a.empty() && a[0].is_dict()) {
        for (const auto& [k, v] : a[0].object().items) d.mutable_object().Set(k, v);
      }
      for (const auto& [k, v] : kw.items) d.mutable_object().Set(k, v);
      return d;
    });
  }

  void Emit(const std::string& s) {
    out_->append(s);
    if (out_->size() > limits_.max_output_bytes) {
      throw Error("the rendered prompt exceeds " + std::to_string(limits_.max_output_bytes) +
                  " bytes");
    }
  }

  void Tick(int line) {
    if (++iterations_ > limits_.max_iterations) Fail(line, "too many loop iterations");
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  Flow Exec(const Body& body) {
    for (const NodePtr& n : body) {
      const Flow f = ExecNode(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow ExecNode(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText:
        Emit(n.text);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        Emit(Eval(*n.expr).Str());
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t i = 0; i < n.conditions.size(); ++i) {
          if (Eval(*n.conditions[i]).Truthy()) return Exec(n.bodies[i]);
        }
        return Exec(n.else_body);
      case Node::Kind::kFor:
        return ExecFor(n);
      case Node::Kind::kSet:
        ExecSet(n);
        return Flow::kNormal;
      case Node::Kind::kMacro:
        DefineMacro(n);
        return Flow::kNormal;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void Bind(const std::vector<std::string>& targets, const Value& v, int line, Scope* scope) {
    if (targets.size() == 1) {
      (*scope)[targets[0]] = v;
      return;
    }
    const Array items = Iterate(v, line);
    if (items.size() != targets.size()) {
      Fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) (*scope)[targets[i]] = items[i];
  }

  Flow ExecFor(const Node& n) {
    const Value seq = Eval(*n.expr);
    Array items = Iterate(seq, n.line);
    if (n.cond) {  // for x in xs if cond: filtered before the loop, so loop.length counts them
      Array kept;
      for (const Value& item : items) {
        Tick(n.line);
        scopes_.emplace_back();
        Bind(n.targets, item, n.line, &scopes_.back());
        const bool keep = Eval(*n.cond).Truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(n.else_body);  // a break there leaves an outer loop
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Tick(n.line);
      Value loop = Value::MakeObject();
      Object& o = loop.mutable_object();
      o.Set("index", Value::Int(i + 1));
      o.Set("index0", Value::Int(i));
      o.Set("revindex", Value::Int(len - i));
      o.Set("revindex0", Value::Int(len - i - 1));
      o.Set("first", Value::Bool(i == 0));
      o.Set("last", Value::Bool(i == len - 1));
      o.Set("length", Value::Int(len));
      o.Set("previtem", i > 0 ? items[i - 1] : Value());
      o.Set("nextitem", i + 1 < len ? items[i + 1] : Value());
      o.Set("cycle", Value::MakeFunction([i](const std::vector<Value>& a, const Kwargs&) {
        if (a.empty()) throw Error("loop.cycle() needs arguments");
        return a[static_cast<size_t>(i) % a.size()];
      }));
      scopes_.emplace_back();
      scopes_.back()["loop"] = loop;
      Bind(n.targets, items[i], n.line, &scopes_.back());
      const Flow f = Exec(n.body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void ExecSet(const Node& n) {
    Value v;
    if (n.expr) {
      v = Eval(*n.expr);
    } else {  // {% set x %}...{% endset %}
      std::string* saved = out_;
      std::string captured;
      out_ = &captured;
      Exec(n.body);
      out_ = saved;
      v = Value::String(std::move(captured));
    }
    if (n.attr_set) {
      const Value ns = Lookup(n.targets[0]);
      if (!ns.is_namespace()) {
        Fail(n.line, "cannot set an attribute of '" + n.targets[0] + "': not a namespace()");
      }
      ns.mutable_object().Set(n.targets[1], std::move(v));
      return;
    }
    Bind(n.targets, v, n.line, &scopes_.back());
  }

  void DefineMacro(const Node& n) {
    const Node* node = &n;
    scopes_.back()[n.name] = Value::MakeFunction(
        [this, node](const std::vector<Value>& args, const Kwargs& kwargs) {
          if (args.size() > node->params.size()) {
            Fail(node->line, "macro '" + node->name + "' takes " +
                                 std::to_string(node->params.size()) + " arguments");
          }
          if (++call_depth_ > limits_.max_call_depth) Fail(node->line, "macro calls nested too deeply");
          // The macro sees the template's top level and its own arguments.
          std::vector<Scope> saved;
          saved.swap(scopes_);
          scopes_.push_back(saved.front());
          scopes_.emplace_back();
          for (size_t i = 0; i < node->params.size(); ++i) {
            const auto& [pname, def] = node->params[i];
            const Value* kw = kwargs.Find(pname);
            scopes_.back()[pname] = i < args.size() ? args[i] : kw ? *kw : def ? Eval(*def) : Value();
          }
          std::string* saved_out = out_;
          std::string captured;
          out_ = &captured;
          try {
            Exec(node->body);
          } catch (...) {
            out_ = saved_out;
            scopes_.swap(saved);
            --call_depth_;
            throw;
          }
          out_ = saved_out;
          // Top-level sets made inside the macro do not leak out; restore the caller's scopes.
          scopes_.swap(saved);
          --call_depth_;
          return Value::String(std::move(captured));
        });
  }

  // ---- Expressions ----

  void EvalArgs(const Expr& e, std::vector<Value>* args, Kwargs* kwargs) {
    for (const ExprPtr& a : e.items) args->push_back(Eval(*a));
    for (const auto& [k, a] : e.kwargs) kwargs->items.emplace_back(k, Eval(*a));
  }

  Value Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Array items;
        for (const ExprPtr& x : e.items) items.push_back(Eval(*x));
        return Value::MakeArray(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::MakeObject();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value k = Eval(*e.items[i]);
          if (!k.is_string()) Fail(e.line, "dict keys must be strings");
          d.mutable_object().Set(k.as_string(), Eval(*e.items[i + 1]));
        }
        return d;
      }
      case Expr::Kind::kAttr:
        return GetAttr(Eval(*e.a), e.name);
      case Expr::Kind::kIndex:
        return GetItem(Eval(*e.a), Eval(*e.b), e.line);
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter: {
        const Value v = Eval(*e.a);
        std::vector<Value> args;
        Kwargs kwargs;
        EvalArgs(e, &args, &kwargs);
        return ApplyFilter(e.name, v, args, kwargs, e.line);
      }
      case Expr::Kind::kTest: {
        const Value v = Eval(*e.a);
        std::vector<Value> args;
        Kwargs kwargs;
        EvalArgs(e, &args, &kwargs);
        return Value::Bool(ApplyTest(e.name, v, args, e.line) != e.negate);
      }
      case Expr::Kind::kUnary: {
        const Value v = Eval(*e.a);
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (!v.is_number() && !v.is_bool()) {
          Fail(e.line, "bad operand for unary " + e.name + ": " + v.TypeName());
        }
        if (e.name == "+") return v.is_bool() ? Value::Int(v.as_bool()) : v;
        if (v.is_float()) return Value::Float(-v.as_number());
        return Value::Int(-(v.is_bool() ? int64_t{v.as_bool()} : v.as_int()));
      }
      case Expr::Kind::kBinary:
        return Binary(e);
      case Expr::Kind::kTernary:
        if (Eval(*e.b).Truthy()) return Eval(*e.a);
        return e.c ? Eval(*e.c) : Value();
    }
    return Value();
  }

  static Value GetAttr(const Value& obj, const std::string& name) {
    if (obj.is_object()) {
      const Value* f = obj.object().Find(name);
      return f ? *f : Value();
    }
    return Value();
  }

  static Value GetItem(const Value& obj, const Value& key, int line) {
    if (obj.is_object()) {
      if (!key.is_string()) return Value();
      const Value* f = obj.object().Find(key.as_string());
      return f ? *f : Value();
    }
    if (obj.is_array() || obj.is_string()) {
      if (!key.is_int()) {
        if (key.is_string()) return Value();  // e.g. a list's attribute: undefined
        Fail(line, std::string("indices must be integers, not ") + key.TypeName());
      }
      int64_t i = key.as_int();
      if (obj.is_array()) {
        const int64_t n = static_cast<int64_t>(obj.array().size());
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj.array()[i] : Value();
      }
      const std::vector<std::string> cps = CodePoints(obj.as_string());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? Value::String(cps[i]) : Value();
    }
    return Value();
  }

  Value Slice(const Expr& e) {
    const Value obj = Eval(*e.a);
    int64_t parts[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.items[k]) continue;
      const Value v = Eval(*e.items[k]);
      if (v.is_none() || v.is_undefined()) continue;
      if (!v.is_int()) Fail(e.line, "slice indices must be integers");
      parts[k] = v.as_int();
      given[k] = true;
    }
    const int64_t step = parts[2];
    if (step == 0) Fail(e.line, "slice step cannot be zero");
    Array items;
    const bool is_str = obj.is_string();
    if (is_str) {
      for (std::string& c : CodePoints(obj.as_string())) items.push_back(Value::String(std::move(c)));
    } else if (obj.is_array()) {
      items = obj.array();
    } else {
      Fail(e.line, std::string("cannot slice ") + obj.TypeName());
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // Python's slice.indices().
    auto clamp = [&](int64_t v, bool g, int64_t def) {
      if (!g) return def;
      if (v < 0) v += n;
      if (step > 0) return std::max<int64_t>(0, std::min(v, n));
      return std::max<int64_t>(-1, std::min(v, n - 1));
    };
    const int64_t start = clamp(parts[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(parts[1], given[1], step > 0 ? n : -1);
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[i]);
    if (!is_str) return Value::MakeArray(std::move(out), obj.is_tuple());
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value::String(std::move(s));
  }

  Value Call(const Expr& e) {
    std::vector<Value> args;
    Kwargs kwargs;
    if (e.a->kind == Expr::Kind::kAttr) {
      const Value obj = Eval(*e.a->a);
      const Value member = GetAttr(obj, e.a->name);
      EvalArgs(e, &args, &kwargs);
      if (member.is_function()) return member.function()(args, kwargs);
      Value out;
      if (CallMethod(obj, e.a->name, args, kwargs, e.line, &out)) return out;
      Fail(e.line, std::string("'") + obj.TypeName() + "' object has no method '" + e.a->name + "'");
    }
    const Value fn = Eval(*e.a);
    EvalArgs(e, &args, &kwargs);
    if (!fn.is_function()) {
      const std::string what = e.a->kind == Expr::Kind::kName ? "'" + e.a->name + "'" : "value";
      Fail(e.line, what + " is not callable (" + fn.TypeName() + ")");
    }
    try {
      return fn.function()(args, kwargs);
    } catch (const Error& err) {
      const std::string what = err.what();
      if (err.raised_by_template || what.rfind("line ", 0) == 0) throw;
      Fail(e.line, what);
    }
  }

  Value Binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = Eval(*e.a);
    if (op == "and") return a.Truthy() ? Eval(*e.b) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.b);
    const Value b = Eval(*e.b);
    if (op == "==") return Value::Bool(a.Equals(b));
    if (op == "!=") return Value::Bool(!a.Equals(b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) Fail(e.line, "'in <string>' needs a string on the left");
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_array()) {
        for (const Value& x : b.array()) found = found || x.Equals(a);
      } else if (b.is_object()) {
        found = a.is_string() && b.object().Find(a.as_string()) != nullptr;
      } else if (!b.is_undefined()) {
        Fail(e.line, std::string("argument of type '") + b.TypeName() + "' is not iterable");
      }
      return Value::Bool(found == (op == "in"));
    }
    if (op == "~") return Value::String(a.Str() + b.Str());
    const bool na = a.is_number() || a.is_bool(), nb = b.is_number() || b.is_bool();
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.as_string() + b.as_string());
      if (a.is_array() && b.is_array()) {
        Array items = a.array();
        items.insert(items.end(), b.array().begin(), b.array().end());
        return Value::MakeArray(std::move(items));
      }
      // Lenient like @huggingface/jinja: a string plus a number or boolean concatenates.
      if ((a.is_string() && nb) || (na && b.is_string())) {
        return Value::String(a.Str() + b.Str());
      }
    }
    if (op == "*" && ((a.is_string() && b.is_int()) || (a.is_int() && b.is_string()))) {
      const std::string& s = a.is_string() ? a.as_string() : b.as_string();
      const int64_t n = a.is_int() ? a.as_int() : b.as_int();
      if (n > 0 && s.size() * static_cast<size_t>(n) > limits_.max_output_bytes) {
        Fail(e.line, "string repetition too long");
      }
      std::string r;
      for (int64_t i = 0; i < n; ++i) r += s;
      return Value::String(r);
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c;
      if (na && nb) {
        const double x = a.is_bool() ? a.as_bool() : a.as_number();
        const double y = b.is_bool() ? b.as_bool() : b.as_number();
        c = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        c = a.as_string().compare(b.as_string());
      } else {
        Fail(e.line, "'" + op + "' not supported between " + a.TypeName() + " and " + b.TypeName());
      }
      return Value::Bool(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (!na || !nb) {
      Fail(e.line, "unsupported operand types for " + op + ": " + a.TypeName() + " and " +
                       b.TypeName());
    }
    const bool ints = !a.is_float() && !b.is_float();
    const int64_t ia = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t ib = b.is_bool() ? b.as_bool() : b.as_int();
    const double fa = a.is_bool() ? a.as_bool() : a.as_number();
    const double fb = b.is_bool() ? b.as_bool() : b.as_number();
    if (op == "+") return ints ? Value::Int(ia + ib) : Value::Float(fa + fb);
    if (op == "-") return ints ? Value::Int(ia - ib) : Value::Float(fa - fb);
    if (op == "*") return ints ? Value::Int(ia * ib) : Value::Float(fa * fb);
    if (op == "/" || op == "//" || op == "%") {
      if (fb == 0) Fail(e.line, "division by zero");
      if (op == "/") return Value::Float(fa / fb);
      if (ints) {
        int64_t q = ia / ib, r = ia % ib;
        if (r != 0 && ((r < 0) != (ib < 0))) {
          --q;
          r += ib;
        }
        return Value::Int(op == "//" ? q : r);
      }
      const double q = std::floor(fa / fb);
      return Value::Float(op == "//" ? q : fa - q * fb);
    }
    if (op == "**") {
      if (ints && ib >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < ib && i < 64; ++i) r *= ia;
        return Value::Int(r);
      }
      return Value::Float(std::pow(fa, fb));
    }
    Fail(e.line, "unknown operator " + op);
  }

  const RenderLimits limits_;
  std::string* out_;
  std::vector<Scope> scopes_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<Value> namespaces_;  // every namespace() of this render
};

}  // namespace

Status Template::Render(const Value& context, const RenderLimits& limits,
                        std::string* out) const {
  out->clear();
  try {
    Interpreter interp(limits, out);
    interp.Run(body_, context);
    return Status::OK();
  } catch (const Error& e) {
    if (e.raised_by_template) return Status::InvalidArgument(std::string("raised: ") + e.what());
    return Status::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("render failed: ") + e.what());
  }
}

}  // namespace jinja
}  // namespace specloop
