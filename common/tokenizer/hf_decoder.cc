#include "common/tokenizer/hf_decoder.h"

#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_normalizer.h"

namespace specloop {

namespace {

using json = nlohmann::json;

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards, in byte order.
std::vector<int> ByteToCodePoint() {
  std::vector<int> map(256, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? b : next++;
  }
  return map;
}

// The code points of valid UTF-8 `s`.
std::vector<int> CodePoints(std::string_view s) {
  std::vector<int> cps;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t pos = 0;
  const auto n = static_cast<utf8proc_ssize_t>(s.size());
  while (pos < n) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(p + pos, n - pos, &cp);
    if (len <= 0) return {};
    cps.push_back(cp);
    pos += len;
  }
  return cps;
}

int HexDigit(int cp) {
  if (cp >= '0' && cp <= '9') return cp - '0';
  if (cp >= 'a' && cp <= 'f') return cp - 'a' + 10;
  if (cp >= 'A' && cp <= 'F') return cp - 'A' + 10;
  return -1;
}

// A String pattern ({"String": "..."}) of decoder step `d`; NotSupported otherwise.
Status StringPattern(const json& d, std::string* pattern) {
  const json& p = d.value("pattern", json());
  if (!p.is_object() || !p.contains("String") || !p["String"].is_string()) {
    return Status::NotSupported("decoder Replace with a pattern other than a String");
  }
  *pattern = p["String"].get<std::string>();
  if (pattern->empty()) return Status::NotSupported("decoder Replace of an empty string");
  return Status::OK();
}

}  // namespace

bool IsJsWhiteSpace(int cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

bool ByteLevelToBytes(const std::string& piece, std::string* bytes) {
  static const std::vector<int> code_point_to_byte = [] {
    std::vector<int> inv(324, -1);
    const std::vector<int> fwd = ByteToCodePoint();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = b;
    return inv;
  }();
  bytes->clear();
  const auto* s = reinterpret_cast<const utf8proc_uint8_t*>(piece.data());
  utf8proc_ssize_t pos = 0;
  const auto n = static_cast<utf8proc_ssize_t>(piece.size());
  while (pos < n) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t len = utf8proc_iterate(s + pos, n - pos, &cp);
    if (len <= 0 || cp < 0 || cp >= static_cast<int>(code_point_to_byte.size()) ||
        code_point_to_byte[cp] < 0) {
      return false;
    }
    bytes->push_back(static_cast<char>(code_point_to_byte[cp]));
    pos += len;
  }
  return true;
}

int ByteFallbackValue(std::string_view token) {
  if (token.size() < 6 || token.substr(0, 3) != "<0x" || token.back() != '>') return -1;
  const std::vector<int> mid = CodePoints(token.substr(3, token.size() - 4));
  size_t units = 0;
  for (int cp : mid) units += cp >= 0x10000 ? 2 : 1;
  if (units != 2) return -1;
  // parseInt(mid, 16): whitespace, a sign, an optional "0x", then the longest run of hex digits.
  size_t i = 0;
  while (i < mid.size() && IsJsWhiteSpace(mid[i])) ++i;
  int sign = 1;
  if (i < mid.size() && (mid[i] == '+' || mid[i] == '-')) sign = mid[i++] == '-' ? -1 : 1;
  if (i + 1 < mid.size() && mid[i] == '0' && (mid[i + 1] == 'x' || mid[i + 1] == 'X')) i += 2;
  int value = 0, digits = 0;
  for (; i < mid.size() && HexDigit(mid[i]) >= 0; ++i, ++digits) value = value * 16 + HexDigit(mid[i]);
  if (digits == 0) return -1;
  return ((sign * value) % 256 + 256) % 256;  // Uint8Array stores the value mod 256
}

Status HfDecoder::Parse(const json& decoder, bool byte_level, HfDecoder* out) {
  *out = HfDecoder();
  const std::string type =
      decoder.is_object() ? decoder.value("type", std::string("?")) : decoder.is_null() ? "" : "?";
  if (byte_level) {
    if (!type.empty() && type != "ByteLevel") return Status::NotSupported("decoder " + type);
    out->byte_level_ = true;
    return Status::OK();
  }
  if (type.empty()) return Status::NotSupported("no decoder (tokenizers.js joins tokens with spaces)");
  if (type == "ByteLevel") {
    return Status::NotSupported("decoder ByteLevel without a ByteLevel pre-tokenizer");
  }
  std::vector<json> steps;
  if (type == "Sequence") {
    for (const json& d : decoder.value("decoders", json::array())) steps.push_back(d);
  } else {
    steps.push_back(decoder);
  }
  bool fused = false;
  for (const json& d : steps) {
    const std::string t = d.is_object() ? d.value("type", std::string("?")) : "?";
    const bool after_bytes = out->byte_fallback_ || fused;
    if (t == "Replace" || t == "Metaspace") {
      if (after_bytes) return Status::NotSupported("decoder " + t + " after ByteFallback or Fuse");
      ReplaceStep r;
      if (t == "Replace") {
        SPECLOOP_RETURN_IF_ERROR(StringPattern(d, &r.pattern));
        r.content = d.value("content", "");
        if (r.content.find('$') != std::string::npos) {
          return Status::NotSupported("decoder Replace content with \"$\": " + r.content);
        }
      } else {  // tokenizers.js's Metaspace decoder drops the first token's leading space always
        r = {d.value("replacement", "\xE2\x96\x81"), " "};
        if (r.pattern.empty()) return Status::NotSupported("decoder Metaspace without a replacement");
        out->strip_leading_space_ = true;
      }
      out->replace_.push_back(std::move(r));
    } else if (t == "ByteFallback") {
      if (after_bytes) return Status::NotSupported("decoder ByteFallback twice or after Fuse");
      out->byte_fallback_ = true;
    } else if (t == "Fuse") {
      fused = true;
    } else if (t == "Strip") {
      const std::string content = d.value("content", "");
      const int start = d.value("start", 0), stop = d.value("stop", 0);
      if (start == 0 && stop == 0) continue;  // strips nothing
      if (!fused || content != " " || start != 1 || stop != 0) {
        return Status::NotSupported("decoder Strip \"" + content + "\" " + std::to_string(start) +
                                    " " + std::to_string(stop) +
                                    (fused ? "" : " before Fuse (on every token)"));
      }
      out->strip_leading_space_ = true;
    } else {
      return Status::NotSupported("decoder " + t);
    }
  }
  return Status::OK();
}

std::string HfDecoder::Surface(const std::string& token) const {
  if (byte_level_) {
    std::string bytes;
    return ByteLevelToBytes(token, &bytes) ? bytes : token;  // else it decodes as spelled
  }
  std::string s = Replace(token);
  if (byte_fallback_) {
    const int byte = ByteFallbackValue(s);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
  }
  return s;
}

std::string HfDecoder::Replace(std::string_view text) const {
  std::string s(text);
  for (const ReplaceStep& r : replace_) {
    if (s.find(r.pattern) != std::string::npos) s = ReplaceAll(s, r.pattern, r.content);
  }
  return s;
}

}  // namespace specloop
