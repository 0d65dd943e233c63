#include "common/tokenizer/hf_normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace specloop {

namespace {

using json = nlohmann::json;

// NFC of one stretch of text (utf8proc decomposes and recomposes every character).
std::string NfcSegment(std::string_view text) {
  // Code points below U+0300 (lead bytes below 0xCC) are already NFC and compose with nothing.
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0xCC; })) {
    return std::string(text);
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &dst,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);  // not valid UTF-8: callers pass valid text
  std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  free(dst);
  return out;
}

// The String of a pattern object ({"String": "..."}); NotSupported for a Regex.
Status StringPattern(const json& step, std::string* pattern) {
  const json& p = step.at("pattern");
  if (!p.is_object() || !p.contains("String") || !p["String"].is_string()) {
    return Status::NotSupported("normalizer Replace with a pattern other than a String");
  }
  *pattern = p["String"].get<std::string>();
  if (pattern->empty()) return Status::NotSupported("normalizer Replace of an empty string");
  return Status::OK();
}

}  // namespace

// ASCII characters are starters that nothing before them composes with, so only each run of
// non-ASCII characters, with the ASCII character before it (e + U+0301 composes to é), goes
// through utf8proc.
std::string Nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t done = 0;  // text[0, done) is in out
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t start = i > done ? i - 1 : i;  // the ASCII character before, if not yet out
    size_t end = i;
    while (end < text.size() && static_cast<unsigned char>(text[end]) >= 0x80) ++end;
    out.append(text, done, start - done);
    out += NfcSegment(text.substr(start, end - start));
    done = i = end;
  }
  out.append(text, done, std::string_view::npos);
  return out;
}

std::string ReplaceAll(std::string_view text, std::string_view pattern, std::string_view content) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t from = 0;
  for (size_t at; (at = text.find(pattern, from)) != std::string_view::npos;) {
    out.append(text, from, at - from);
    out += content;
    from = at + pattern.size();
  }
  out.append(text, from, std::string_view::npos);
  return out;
}

Status HfNormalizer::Parse(const json& normalizer, HfNormalizer* out) {
  *out = HfNormalizer();
  if (normalizer.is_null()) return Status::OK();
  out->present_ = true;
  std::vector<json> steps;
  if (normalizer.is_object() && normalizer.value("type", "") == "Sequence") {
    for (const json& n : normalizer.value("normalizers", json::array())) steps.push_back(n);
  } else {
    steps.push_back(normalizer);
  }
  for (const json& n : steps) {
    if (n.is_null()) continue;  // tokenizers.js skips a null step
    const std::string type = n.is_object() ? n.value("type", std::string("?")) : "?";
    Step step{Step::Kind::kNfc, "", ""};
    if (type == "NFC") {
      step.kind = Step::Kind::kNfc;
    } else if (type == "Prepend") {
      step.kind = Step::Kind::kPrepend;
      step.content = n.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      step.kind = Step::Kind::kReplace;
      SPECLOOP_RETURN_IF_ERROR(StringPattern(n, &step.pattern));
      step.content = n.value("content", "");
      if (step.content.find('$') != std::string::npos) {
        return Status::NotSupported("normalizer Replace content with \"$\": " + step.content);
      }
    } else {
      return Status::NotSupported("normalizer " + type);
    }
    out->steps_.push_back(std::move(step));
  }
  return Status::OK();
}

std::string HfNormalizer::Apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kNfc:
        s = Nfc(s);
        break;
      case Step::Kind::kPrepend:
        s.insert(0, step.content);
        break;
      case Step::Kind::kReplace:
        if (s.find(step.pattern) != std::string::npos) s = ReplaceAll(s, step.pattern, step.content);
        break;
    }
  }
  return s;
}

}  // namespace specloop
