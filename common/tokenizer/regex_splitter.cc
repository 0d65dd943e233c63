#include "common/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

namespace specloop {

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
};

RegexSplitter::~RegexSplitter() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

std::string TranslateOnigurumaPattern(const std::string& p) {
  std::string out;
  std::vector<bool> groups;  // open groups: true for a (?i:...) group
  int caseless = 0;          // open (?i:...) groups
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's' || e == 'S') {
        out += e == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
        ++i;
      } else if ((e == 'p' || e == 'P' || e == 'x') && i + 2 < p.size() && p[i + 2] == '{') {
        const size_t close = p.find('}', i);
        const size_t end = close == std::string::npos ? p.size() : close + 1;
        out.append(p, i, end - i);
        i = end - 1;
      } else {
        out.append(p, i, 2);
        ++i;
      }
      continue;
    }
    if (in_class) {
      out += c;
      if (c == ']') {
        in_class = false;
        if (caseless > 0) out += ')';
      }
      continue;
    }
    if (c == '[') {
      in_class = true;
      // A class keeps PCRE2's caseless matching (ranges cannot be folded letter by letter).
      if (caseless > 0) out += "(?i:";
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ']' first
    } else if (c == '(') {
      const bool ci = p.compare(i, 4, "(?i:") == 0;
      groups.push_back(ci);
      if (ci) {
        ++caseless;
        out += "(?:";
        i += 3;
      } else {
        out += c;
      }
    } else if (c == ')') {
      if (!groups.empty()) {
        if (groups.back()) --caseless;
        groups.pop_back();
      }
      out += c;
    } else if (caseless > 0 && std::isalpha(static_cast<unsigned char>(c))) {
      out += '[';
      out += c;
      out += static_cast<char>(std::islower(c) ? std::toupper(c) : std::tolower(c));
      out += ']';
    } else {
      out += c;
    }
  }
  return out;
}

Status RegexSplitter::Compile(const std::string& pattern, bool literal,
                              std::unique_ptr<RegexSplitter>* out) {
  const std::string translated = literal ? pattern : TranslateOnigurumaPattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument("regex " + pattern + ": " +
                                   reinterpret_cast<const char*>(message) + " at offset " +
                                   std::to_string(offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) it interprets
  std::unique_ptr<RegexSplitter> r(new RegexSplitter());
  r->impl_ = std::make_unique<Impl>();
  r->impl_->code = code;
  *out = std::move(r);
  return Status::OK();
}

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. the JIT stack ran out: interpret
      rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a resource limit): the rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // an empty match: step over one code point
      if (start >= text.size()) break;
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > last) pieces->push_back(text.substr(last, start - last));
    pieces->push_back(text.substr(start, end - start));
    last = pos = end;
  }
  if (last < text.size()) pieces->push_back(text.substr(last));
  pcre2_match_data_free(md);
}

}  // namespace specloop
