// Lexer and parser of the chat-template Jinja subset (jinja.h). Whitespace follows Jinja2 with
// trim_blocks and lstrip_blocks, as transformers renders chat templates:
//   - one trailing newline of the template is dropped;
//   - "{%-" / "{{-" / "{#-" strip the whitespace before the tag, "-%}" / "-}}" / "-#}" the
//     whitespace after it;
//   - trim_blocks: the first newline after a "%}" or "#}" is dropped;
//   - lstrip_blocks: spaces and tabs from the start of a line up to a "{%" or "{#" are dropped
//     ("{%+" keeps them).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "common/chat/jinja.h"

namespace specloop {
namespace jinja {
namespace {

struct Token {
  enum class Type { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kInt, kFloat,
                    kString, kOp, kEof };
  Type type;
  std::string text;
  int line;
};

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Appends the UTF-8 bytes of code point cp.
void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    if (!src_.empty() && src_.back() == '\n') {
      src_.pop_back();
      if (!src_.empty() && src_.back() == '\r') src_.pop_back();
    }
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    std::string text;
    bool strip_next = false, trim_newline = false;
    while (pos < src_.size()) {
      size_t open = src_.find('{', pos);
      while (open != std::string::npos && open + 1 < src_.size() &&
             src_[open + 1] != '{' && src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open != std::string::npos && open + 1 >= src_.size()) open = std::string::npos;
      const size_t text_end = open == std::string::npos ? src_.size() : open;
      text = src_.substr(pos, text_end - pos);
      if (trim_newline) {
        if (text.rfind("\r\n", 0) == 0) {
          text.erase(0, 2);
        } else if (!text.empty() && (text[0] == '\n' || text[0] == '\r')) {
          text.erase(0, 1);
        }
      }
      if (strip_next) text = Strip(text, nullptr, true, false);
      strip_next = trim_newline = false;
      if (open == std::string::npos) {
        PushText(std::move(text), LineAt(src_, pos));
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        text = Strip(text, nullptr, false, true);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: the tag starts its line (after spaces and tabs) in the source.
        size_t j = open;
        while (j > 0 && (src_[j - 1] == ' ' || src_[j - 1] == '\t')) --j;
        if (j == 0 || src_[j - 1] == '\n' || src_[j - 1] == '\r') {
          const size_t n = std::min(open - j, text.size());
          text.erase(text.size() - n);
        }
      }
      PushText(std::move(text), LineAt(src_, pos));
      const int line = LineAt(src_, open);
      pos = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos);
        if (close == std::string::npos) Fail(line, "unterminated comment");
        strip_next = close > pos && src_[close - 1] == '-';
        trim_newline = !strip_next && !(close > pos && src_[close - 1] == '+');
        pos = close + 2;
        continue;
      }
      const bool block = kind == '%';
      tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", line});
      pos = LexTag(pos, block, &strip_next);
      trim_newline = block && !strip_next && !plus_end_;
    }
    tokens_.push_back({Token::Type::kEof, "", LineAt(src_, src_.size())});
    return std::move(tokens_);
  }

 private:
  void PushText(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({Token::Type::kText, std::move(text), line});
  }

  // Tokens of one tag from `pos` to its end marker; returns the position after it.
  size_t LexTag(size_t pos, bool block, bool* strip_after) {
    const char* end = block ? "%}" : "}}";
    int depth = 0;  // brackets open: "}}" inside a dict literal is not the end
    plus_end_ = false;
    while (true) {
      while (pos < src_.size() && (src_[pos] == ' ' || src_[pos] == '\t' || src_[pos] == '\n' ||
                                   src_[pos] == '\r')) {
        ++pos;
      }
      const int line = LineAt(src_, pos);
      if (pos >= src_.size()) Fail(line, block ? "missing %}" : "missing }}");
      const char c = src_[pos];
      if (depth == 0 && (c == '-' || c == '+') && src_.compare(pos + 1, 2, end) == 0) {
        *strip_after = c == '-';
        plus_end_ = c == '+';
        tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", line});
        return pos + 3;
      }
      if (depth == 0 && src_.compare(pos, 2, end) == 0) {
        *strip_after = false;
        tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", line});
        return pos + 2;
      }
      if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        tokens_.push_back({Token::Type::kName, src_.substr(pos, e - pos), line});
        pos = e;
        continue;
      }
      if (IsDigit(c)) {
        size_t e = pos;
        while (e < src_.size() && (IsDigit(src_[e]) || src_[e] == '_')) ++e;
        bool is_float = false;
        const bool after_dot = !tokens_.empty() && tokens_.back().type == Token::Type::kOp &&
                               tokens_.back().text == ".";
        if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
          is_float = true;
          ++e;
          while (e < src_.size() && IsDigit(src_[e])) ++e;
        }
        if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && IsDigit(src_[f])) {
            is_float = true;
            e = f;
            while (e < src_.size() && IsDigit(src_[e])) ++e;
          }
        }
        std::string num;
        for (size_t k = pos; k < e; ++k) {
          if (src_[k] != '_') num += src_[k];
        }
        tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, num, line});
        pos = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        pos = LexString(pos, line);
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{",
                                   "}", ",", ".", ":", "|", "=", "<", ">", "+", "-", "*", "/",
                                   "%", "~"};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src_.compare(pos, n, op) == 0) {
          if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
          if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
          tokens_.push_back({Token::Type::kOp, op, line});
          pos += n;
          matched = true;
          break;
        }
      }
      if (!matched) Fail(line, std::string("unexpected character '") + c + "'");
    }
  }

  // A string literal with Python's escapes; returns the position after its closing quote.
  size_t LexString(size_t pos, int line) {
    const char q = src_[pos++];
    std::string s;
    while (true) {
      if (pos >= src_.size()) Fail(line, "unterminated string literal");
      const char c = src_[pos++];
      if (c == q) break;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos >= src_.size()) Fail(line, "unterminated string literal");
      const char e = src_[pos++];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'v': s += '\v'; break;
        case '0': s += '\0'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos + n > src_.size()) Fail(line, "bad escape in string literal");
          const std::string hex = src_.substr(pos, n);
          char* endp = nullptr;
          const unsigned long cp = std::strtoul(hex.c_str(), &endp, 16);
          if (endp != hex.c_str() + n || cp > 0x10ffff) {
            Fail(line, "bad escape \\" + std::string(1, e) + hex);
          }
          AppendUtf8(static_cast<uint32_t>(cp), &s);
          pos += n;
          break;
        }
        default:  // Python keeps unknown escapes as written
          s += '\\';
          s += e;
      }
    }
    tokens_.push_back({Token::Type::kString, std::move(s), line});
    return pos;
  }

  // The 1-based line of src_[pos]; positions asked for grow, so the count moves forward.
  int LineAt(const std::string& s, size_t pos) {
    if (pos < line_pos_) line_pos_ = 0, line_ = 1;
    for (; line_pos_ < pos && line_pos_ < s.size(); ++line_pos_) line_ += s[line_pos_] == '\n';
    return line_;
  }

  std::string src_;
  std::vector<Token> tokens_;
  bool plus_end_ = false;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---- Parser ----------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body ParseTemplate() {
    Body body = ParseBody({});
    if (Peek().type != Token::Type::kEof) Fail(Peek().line, "unexpected token");
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return t_[std::min(i_ + ahead, t_.size() - 1)];
  }
  Token Next() {
    Token tok = Peek();
    if (i_ < t_.size() - 1) ++i_;
    return tok;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == Token::Type::kName && Peek(ahead).text == name;
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(Peek().line, std::string("expected '") + op + "'" + Got());
    Next();
  }
  std::string ExpectName() {
    if (Peek().type != Token::Type::kName) Fail(Peek().line, "expected a name" + Got());
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().type != Token::Type::kBlockEnd) Fail(Peek().line, "expected %}" + Got());
    Next();
  }
  std::string Got() const {
    const Token& t = Peek();
    switch (t.type) {
      case Token::Type::kEof: return ", got the end of the template";
      case Token::Type::kBlockEnd: return ", got %}";
      case Token::Type::kVarEnd: return ", got }}";
      case Token::Type::kText: return ", got text";
      default: return ", got '" + t.text + "'";
    }
  }
  void Enter() {
    if (++depth_ > 200) Fail(Peek().line, "template nested too deeply");
  }

  // Nodes until a block tag whose keyword is in `stops` (left unconsumed) or the end.
  Body ParseBody(const std::set<std::string>& stops) {
    Enter();
    Body body;
    while (true) {
      const Token& tok = Peek();
      if (tok.type == Token::Type::kEof) {
        if (!stops.empty()) {
          Fail(tok.line, "missing {% " + *stops.rbegin() + " %} (the template ended first)");
        }
        break;
      }
      if (tok.type == Token::Type::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = tok.line;
        n->text = Next().text;
        body.push_back(std::move(n));
        continue;
      }
      if (tok.type == Token::Type::kVarBegin) {
        Next();
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tok.line;
        n->expr = ParseTupleOrExpr();
        if (Peek().type != Token::Type::kVarEnd) Fail(Peek().line, "expected }}" + Got());
        Next();
        body.push_back(std::move(n));
        continue;
      }
      if (tok.type != Token::Type::kBlockBegin) Fail(tok.line, "unexpected token" + Got());
      if (Peek(1).type == Token::Type::kName && stops.count(Peek(1).text)) break;
      Next();
      NodePtr n = ParseStatement();
      if (n) body.push_back(std::move(n));
    }
    --depth_;
    return body;
  }

  // After "{%": one statement through its end tag. Null for tags that render nothing.
  NodePtr ParseStatement() {
    const int line = Peek().line;
    const std::string kw = ExpectName();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      n->conditions.push_back(ParseExpr());
      ExpectBlockEnd();
      n->bodies.push_back(ParseBody({"elif", "else", "endif"}));
      while (true) {
        Next();  // {%
        const std::string k = ExpectName();
        if (k == "elif") {
          n->conditions.push_back(ParseExpr());
          ExpectBlockEnd();
          n->bodies.push_back(ParseBody({"elif", "else", "endif"}));
        } else if (k == "else") {
          ExpectBlockEnd();
          n->else_body = ParseBody({"endif"});
        } else {  // endif
          ExpectBlockEnd();
          break;
        }
      }
    } else if (kw == "for") {
      n->kind = Node::Kind::kFor;
      n->targets.push_back(ExpectName());
      while (IsOp(",")) {
        Next();
        n->targets.push_back(ExpectName());
      }
      if (!IsName("in")) Fail(Peek().line, "expected 'in' in a for loop" + Got());
      Next();
      n->expr = ParseOr();
      if (IsOp(",")) {  // for x in a, b
        auto tup = std::make_unique<Expr>();
        tup->kind = Expr::Kind::kTuple;
        tup->line = line;
        tup->items.push_back(std::move(n->expr));
        while (IsOp(",")) {
          Next();
          tup->items.push_back(ParseOr());
        }
        n->expr = std::move(tup);
      }
      if (IsName("if")) {
        Next();
        n->cond = ParseOr();
      }
      if (IsName("recursive")) Fail(Peek().line, "recursive loops are not supported");
      ExpectBlockEnd();
      n->body = ParseBody({"else", "endfor"});
      Next();
      if (ExpectName() == "else") {
        ExpectBlockEnd();
        n->else_body = ParseBody({"endfor"});
        Next();
        ExpectName();
      }
      ExpectBlockEnd();
    } else if (kw == "set") {
      n->kind = Node::Kind::kSet;
      n->targets.push_back(ExpectName());
      if (IsOp(".")) {
        Next();
        n->attr_set = true;
        n->targets.push_back(ExpectName());
      } else {
        while (IsOp(",")) {
          Next();
          n->targets.push_back(ExpectName());
        }
      }
      if (IsOp("=")) {
        Next();
        n->expr = ParseTupleOrExpr();
        ExpectBlockEnd();
      } else {
        if (n->targets.size() != 1 || n->attr_set) Fail(line, "a block set takes one name");
        ExpectBlockEnd();
        n->body = ParseBody({"endset"});
        Next();
        ExpectName();
        ExpectBlockEnd();
      }
    } else if (kw == "macro") {
      n->kind = Node::Kind::kMacro;
      n->name = ExpectName();
      ExpectOp("(");
      while (!IsOp(")")) {
        std::string p = ExpectName();
        ExprPtr def;
        if (IsOp("=")) {
          Next();
          def = ParseExpr();
        }
        n->params.emplace_back(std::move(p), std::move(def));
        if (!IsOp(",")) break;
        Next();
      }
      ExpectOp(")");
      ExpectBlockEnd();
      n->body = ParseBody({"endmacro"});
      Next();
      ExpectName();
      if (Peek().type == Token::Type::kName) Next();  // {% endmacro name %}
      ExpectBlockEnd();
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      ExpectBlockEnd();
    } else if (kw == "generation" || kw == "endgeneration") {
      // transformers' assistant-mask markers: they render nothing.
      ExpectBlockEnd();
      return nullptr;
    } else {
      Fail(line, "unsupported statement '" + kw + "'");
    }
    return n;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // expr or "a, b, ..." (a tuple without parentheses).
  ExprPtr ParseTupleOrExpr() {
    ExprPtr first = ParseExpr();
    if (!IsOp(",")) return first;
    ExprPtr tup = Make(Expr::Kind::kTuple, first->line);
    tup->items.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().type == Token::Type::kBlockEnd || Peek().type == Token::Type::kVarEnd) break;
      tup->items.push_back(ParseExpr());
    }
    return tup;
  }

  ExprPtr ParseExpr() {
    Enter();
    ExprPtr e = ParseOr();
    if (IsName("if")) {
      ExprPtr t = Make(Expr::Kind::kTernary, e->line);
      Next();
      t->a = std::move(e);
      t->b = ParseOr();
      if (IsName("else")) {
        Next();
        t->c = ParseExpr();
      }
      e = std::move(t);
    }
    --depth_;
    return e;
  }

  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(Expr::Kind::kBinary, a->line);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      Next();
      e = Binary("or", std::move(e), ParseAnd());
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      Next();
      e = Binary("and", std::move(e), ParseNot());
    }
    return e;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      ExprPtr e = Make(Expr::Kind::kUnary, Next().line);
      e->name = "not";
      Enter();
      e->a = ParseNot();
      --depth_;
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    ExprPtr e = ParseMath1();
    while (true) {
      std::string op;
      if (Peek().type == Token::Type::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return e;
      }
      e = Binary(op, std::move(e), ParseMath1());
    }
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Next().text;
      e = Binary(op, std::move(e), ParseConcat());
    }
    return e;
  }

  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      Next();
      e = Binary("~", std::move(e), ParseMath2());
    }
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Next().text;
      e = Binary(op, std::move(e), ParsePow());
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      Next();
      e = Binary("**", std::move(e), ParseUnary(true));
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(Expr::Kind::kUnary, Peek().line);
      e->name = Next().text;
      Enter();
      e->a = ParseUnary(false);
      --depth_;
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    if (with_filter) return ParseFilters(std::move(e));
    return e;
  }

  // Call arguments after "(": positional into *items, name=value into *kwargs.
  void ParseArgs(std::vector<ExprPtr>* items, std::vector<std::pair<std::string, ExprPtr>>* kwargs) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (Peek().type == Token::Type::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        kwargs->emplace_back(std::move(key), ParseExpr());
      } else {
        if (!kwargs->empty()) Fail(Peek().line, "positional argument after keyword argument");
        items->push_back(ParseExpr());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        Next();
        const Token tok = Next();
        if (tok.type == Token::Type::kInt) {  // a.0 is a[0]
          ExprPtr idx = Make(Expr::Kind::kIndex, tok.line);
          idx->a = std::move(e);
          idx->b = Make(Expr::Kind::kLiteral, tok.line);
          idx->b->value = Value::Int(std::strtoll(tok.text.c_str(), nullptr, 10));
          e = std::move(idx);
          continue;
        }
        if (tok.type != Token::Type::kName) Fail(tok.line, "expected a name after '.'");
        ExprPtr attr = Make(Expr::Kind::kAttr, tok.line);
        attr->a = std::move(e);
        attr->name = tok.text;
        e = std::move(attr);
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        int colons = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            Next();
            if (++colons > 2) Fail(line, "a slice takes at most 3 parts");
            continue;
          }
          if (parts[colons]) Fail(line, "expected ':' or ']'" + Got());
          parts[colons] = ParseExpr();
        }
        Next();
        if (colons == 0) {
          if (!parts[0]) Fail(line, "empty subscript");
          ExprPtr idx = Make(Expr::Kind::kIndex, line);
          idx->a = std::move(e);
          idx->b = std::move(parts[0]);
          e = std::move(idx);
        } else {
          ExprPtr s = Make(Expr::Kind::kSlice, line);
          s->a = std::move(e);
          for (auto& p : parts) s->items.push_back(std::move(p));
          e = std::move(s);
        }
      } else if (IsOp("(")) {
        ExprPtr call = Make(Expr::Kind::kCall, Peek().line);
        call->a = std::move(e);
        ParseArgs(&call->items, &call->kwargs);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  bool StartsTestArgument() const {
    const Token& t = Peek();
    if (t.type == Token::Type::kString || t.type == Token::Type::kInt ||
        t.type == Token::Type::kFloat) {
      return true;
    }
    if (t.type == Token::Type::kOp) return t.text == "[" || t.text == "{";
    if (t.type != Token::Type::kName) return false;
    static const std::set<std::string> kStop = {"and", "or", "else", "if", "in", "not", "is"};
    return kStop.count(t.text) == 0;
  }

  ExprPtr ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        ExprPtr f = Make(Expr::Kind::kFilter, line);
        f->name = ExpectName();
        f->a = std::move(e);
        if (IsOp("(")) ParseArgs(&f->items, &f->kwargs);
        e = std::move(f);
      } else if (IsName("is")) {
        const int line = Next().line;
        ExprPtr t = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          Next();
          t->negate = true;
        }
        t->name = ExpectName();
        t->a = std::move(e);
        if (IsOp("(")) {
          ParseArgs(&t->items, &t->kwargs);
        } else if (StartsTestArgument()) {
          t->items.push_back(ParsePostfix(ParsePrimary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParsePrimary() {
    const Token tok = Next();
    switch (tok.type) {
      case Token::Type::kName: {
        ExprPtr e = Make(Expr::Kind::kLiteral, tok.line);
        if (tok.text == "true" || tok.text == "True") {
          e->value = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          e->value = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          e->value = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = tok.text;
        }
        return e;
      }
      case Token::Type::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, tok.line);
        errno = 0;
        const long long v = std::strtoll(tok.text.c_str(), nullptr, 10);
        if (errno == ERANGE) Fail(tok.line, "integer literal out of range");
        e->value = Value::Int(v);
        return e;
      }
      case Token::Type::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, tok.line);
        e->value = Value::Float(std::strtod(tok.text.c_str(), nullptr));
        return e;
      }
      case Token::Type::kString: {
        std::string s = tok.text;
        while (Peek().type == Token::Type::kString) s += Next().text;  // "a" "b"
        ExprPtr e = Make(Expr::Kind::kLiteral, tok.line);
        e->value = Value::String(std::move(s));
        return e;
      }
      case Token::Type::kOp:
        if (tok.text == "(") {
          if (IsOp(")")) {
            Next();
            return Make(Expr::Kind::kTuple, tok.line);
          }
          ExprPtr first = ParseExpr();
          if (IsOp(")")) {
            Next();
            return first;
          }
          ExprPtr tup = Make(Expr::Kind::kTuple, tok.line);
          tup->items.push_back(std::move(first));
          while (IsOp(",")) {
            Next();
            if (IsOp(")")) break;
            tup->items.push_back(ParseExpr());
          }
          ExpectOp(")");
          return tup;
        }
        if (tok.text == "[") {
          ExprPtr list = Make(Expr::Kind::kList, tok.line);
          while (!IsOp("]")) {
            list->items.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("]");
          return list;
        }
        if (tok.text == "{") {
          ExprPtr dict = Make(Expr::Kind::kDict, tok.line);
          while (!IsOp("}")) {
            dict->items.push_back(ParseExpr());
            ExpectOp(":");
            dict->items.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("}");
          return dict;
        }
        break;
      default:
        break;
    }
    i_ = i_ > 0 ? i_ - 1 : 0;
    Fail(tok.line, "expected an expression" + Got());
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Status Template::Parse(const std::string& source, std::unique_ptr<Template>* out) {
  try {
    Lexer lexer(source);
    Parser parser(lexer.Run());
    auto t = std::make_unique<Template>();
    t->body_ = parser.ParseTemplate();
    *out = std::move(t);
    return Status::OK();
  } catch (const Error& e) {
    return Status::InvalidArgument(e.what());
  } catch (const std::exception& e) {  // e.g. bad_alloc on an absurd template
    return Status::InvalidArgument(std::string("parse failed: ") + e.what());
  }
}

}  // namespace jinja
}  // namespace specloop
