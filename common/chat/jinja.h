// A small Jinja interpreter for chat templates: the subset the chat templates of Llama 3.x,
// Qwen2/3, Mistral/Mixtral, SmolLM, TinyLlama and their kind use, with Jinja2's semantics as
// Hugging Face transformers configures it (trim_blocks, lstrip_blocks, one trailing newline
// dropped). Internal to common/chat: the public interface is chat_template.h, whose header
// comment lists what is and is not supported.
//
// Parse once, render many times; a parsed Template is immutable and Render is thread-safe.
// Errors never escape as exceptions: Parse and Render return Status.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/chat/jinja_value.h"

namespace specloop {
namespace jinja {

// ---- The syntax tree ----------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // items
    kTuple,     // items
    kDict,      // items: key, value, key, value, ...
    kAttr,      // a.name
    kIndex,     // a[b]
    kSlice,     // a[items[0] : items[1] : items[2]] (null parts omitted)
    kCall,      // a(items..., kwargs...)
    kFilter,    // a | name(items..., kwargs...)
    kTest,      // a is [not] name(items...)
    kUnary,     // name in {"not", "-", "+"} applied to a
    kBinary,    // a name b: + - * / // % ** ~ == != < <= > >= in "not in" and or
    kTernary,   // a if b else c (c null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 1;
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr a, b, c;
  bool negate = false;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (conditions[i] -> bodies[i]); else_body
    kFor,       // for targets in expr [if cond]: body; else_body
    kSet,       // set targets = expr | set ns.attr = expr | set name %}body{% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;
  ExprPtr expr, cond;
  std::vector<std::string> targets;  // for / set names; set ns.attr: {ns, attr} with attr_set
  bool attr_set = false;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
  std::string name;                                     // macro
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

// ---- Parsing and rendering -----------------------------------------------------------------

struct RenderLimits {
  // Longest output, in bytes. Default: 16 MiB.
  size_t max_output_bytes = 16 << 20;
  // Loop iterations over the whole render. Default: 1,000,000.
  int64_t max_iterations = 1000000;
  // Nested macro calls. Default: 64.
  int max_call_depth = 64;
};

class Template {
 public:
  // Parses `source`. InvalidArgument "line N: ..." on a syntax error or a statement outside the
  // supported subset.
  static Status Parse(const std::string& source, std::unique_ptr<Template>* out);

  // Renders with `context` (a dict of variables; the globals namespace(), range(),
  // raise_exception(), strftime_now() and the constants are added). On error *out is
  // unspecified and the Status is InvalidArgument: "raised: MESSAGE" for the template's own
  // raise_exception(MESSAGE), else "line N: ...".
  Status Render(const Value& context, const RenderLimits& limits, std::string* out) const;

  const Body& body() const { return body_; }

 private:
  Body body_;
};

}  // namespace jinja
}  // namespace specloop
