#include "common/tokenizer/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <deque>

#include <nlohmann/json.hpp>

#include "common/tokenizer/model_config.h"

namespace specloop {

namespace {

using json = nlohmann::json;

// Ids at or above this are a corrupt file (the largest vocabularies hold ~260k tokens).
constexpr int kMaxVocabulary = 1 << 24;

// GPT-2's pattern, used by the ByteLevel pre-tokenizer when use_regex is set.
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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

// The bytes a vocabulary spelling stands for; false when it has a character outside the map.
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

// NFC of valid UTF-8. ASCII characters are starters that nothing before them composes with,
// so only each run of non-ASCII characters, with the ASCII character before it (e + U+0301
// composes to é), goes through utf8proc.
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

// Unicode White_Space, the set lstrip/rstrip trim.
bool IsWhiteSpace(int cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string_view TrimStart(std::string_view s) {
  while (!s.empty()) {
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &cp);
    if (len <= 0 || !IsWhiteSpace(cp)) break;
    s.remove_prefix(len);
  }
  return s;
}

std::string_view TrimEnd(std::string_view s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + start),
                                      static_cast<utf8proc_ssize_t>(s.size() - start), &cp);
    if (len <= 0 || !IsWhiteSpace(cp)) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}

// The token text of a tokenizer_config.json entry ("<s>" or {"content": "<s>", ...}).
std::string ConfigTokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// The ids a TemplateProcessing post-processor (alone or in a Sequence) puts around a single
// sequence.
void TemplateIds(const json& post, std::vector<int>* prefix, std::vector<int>* suffix) {
  if (!post.is_object()) return;
  const std::string type = post.value("type", "");
  if (type == "Sequence" && post.contains("processors")) {
    for (const json& p : post["processors"]) TemplateIds(p, prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing" || !post.contains("single")) return;
  bool after = false;
  for (const json& item : post["single"]) {
    if (item.contains("Sequence")) {
      after = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", "");
      const json& specials = post.value("special_tokens", json::object());
      if (!specials.contains(name)) continue;
      for (const json& id : specials[name].value("ids", json::array())) {
        (after ? suffix : prefix)->push_back(id.get<int>());
      }
    }
  }
}

}  // namespace

Status HfTokenizer::Open(const std::string& dir, std::unique_ptr<HfTokenizer>* out) {
  std::string text, config;
  SPECLOOP_RETURN_IF_ERROR(ReadFileToString(dir + "/tokenizer.json", &text));
  if (!ReadFileToString(dir + "/tokenizer_config.json", &config).ok()) config = "{}";
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  Status s;
  try {
    s = t->Parse(text, config);
  } catch (const json::exception& e) {
    s = Status::Corruption(std::string("bad field: ") + e.what());
  }
  SPECLOOP_RETURN_IF_ERROR(s.Annotate(dir + "/tokenizer.json"));
  *out = std::move(t);
  return Status::OK();
}

Status HfTokenizer::Parse(const std::string& json_text, const std::string& config_text) {
  const json j = json::parse(json_text, nullptr, false);
  if (!j.is_object() || !j.contains("model")) return Status::Corruption("not a tokenizer.json");
  json cfg = json::parse(config_text, nullptr, false);
  if (!cfg.is_object()) cfg = json::object();

  // The model: byte-level BPE.
  const json& model = j["model"];
  if (model.value("type", "BPE") != "BPE") {
    return Status::NotSupported("model type " + model.value("type", "") + " (only BPE)");
  }
  if (model.value("byte_fallback", false)) return Status::NotSupported("BPE byte_fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return Status::NotSupported(std::string("BPE ") + key);
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges")) {
    return Status::Corruption("model has no vocab or merges");
  }
  int max_id = -1;
  for (const auto& [piece, id] : model["vocab"].items()) max_id = std::max(max_id, id.get<int>());
  for (const json& a : j.value("added_tokens", json::array())) {
    max_id = std::max(max_id, a.value("id", -1));
  }
  if (max_id >= kMaxVocabulary) return Status::Corruption("token id " + std::to_string(max_id));
  pieces_.assign(max_id + 1, "");
  surfaces_.assign(max_id + 1, "");
  special_.assign(max_id + 1, false);
  std::vector<std::string> tokens(max_id + 1);  // model tokens as bytes
  for (const auto& [piece, id_json] : model["vocab"].items()) {
    const int id = id_json.get<int>();
    if (id < 0) return Status::Corruption("negative id for " + piece);
    pieces_[id] = piece;
    if (!ByteLevelToBytes(piece, &tokens[id])) tokens[id] = piece;  // decodes as spelled
    surfaces_[id] = tokens[id];
  }
  bpe_ = ByteBpe(std::move(tokens));
  const json& merges = model["merges"];
  std::vector<ByteBpe::Rule> rules;
  rules.reserve(merges.size());
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return Status::Corruption("merge without a space: " + s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1, s.find(' ', sp + 1) - sp - 1);
    } else {
      return Status::Corruption("merge " + std::to_string(rank) + " is malformed");
    }
    // A rule whose parts or result are not tokens can never apply; it keeps its rank slot.
    ByteBpe::Rule rule{-1, -1, -1};
    if (ByteLevelToBytes(a, &left) && ByteLevelToBytes(b, &right)) {
      rule = {bpe_.Find(left), bpe_.Find(right), bpe_.Find(left + right)};
    }
    if (rule.left < 0 || rule.right < 0 || rule.merged < 0) rule = {-1, -1, -1};
    rules.push_back(rule);
  }
  bpe_.SetRules(rules);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    unk_id_ = bpe_.Find(model["unk_token"].get<std::string>());
  }

  // Added tokens.
  for (const json& a : j.value("added_tokens", json::array())) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", false);
    if (t.content.empty() || t.id < 0) return Status::Corruption("empty added token");
    pieces_[t.id] = t.content;
    surfaces_[t.id] = t.special ? "" : t.content;
    special_[t.id] = t.special;
    added_.push_back(t);
  }
  // Longest first, so the first match at a position is the longest.
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < added_.size(); ++i) {
    AddedSet& set = added_[i].normalized && !j.value("normalizer", json()).is_null()
                        ? normalized_added_
                        : raw_added_;
    set.by_first_byte[static_cast<unsigned char>(added_[i].content[0])].push_back(
        static_cast<int>(i));
  }

  // The normalizer: none or NFC.
  const json& norm = j.value("normalizer", json());
  std::vector<json> norms;
  if (norm.is_object() && norm.value("type", "") == "Sequence") {
    for (const json& n : norm["normalizers"]) norms.push_back(n);
  } else if (!norm.is_null()) {
    norms.push_back(norm);
  }
  for (const json& n : norms) {
    if (n.value("type", "") != "NFC") {
      return Status::NotSupported("normalizer " + n.value("type", std::string("?")));
    }
    nfc_ = true;
  }

  // The pre-tokenizers, flattened.
  std::vector<json> pres;
  const json& pre = j.value("pre_tokenizer", json());
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const json& p : pre["pretokenizers"]) pres.push_back(p);
  } else if (!pre.is_null()) {
    pres.push_back(pre);
  }
  bool byte_level = false;
  for (const json& p : pres) {
    const std::string type = p.value("type", "");
    PreTokenizerStep step;
    std::string pattern;
    bool literal = false;
    if (type == "Split") {
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
        return Status::NotSupported("Split behavior " + p.value("behavior", std::string("?")) +
                                    (p.value("invert", false) ? " inverted" : ""));
      }
      const json& pat = p.at("pattern");
      literal = pat.contains("String");
      pattern = pat.at(literal ? "String" : "Regex").get<std::string>();
    } else if (type == "Digits") {
      pattern = p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+";
    } else if (type == "ByteLevel") {
      byte_level = true;
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) pattern = kGpt2Pattern;
    } else {
      return Status::NotSupported("pre-tokenizer " + type);
    }
    if (!pattern.empty()) {
      SPECLOOP_RETURN_IF_ERROR(RegexSplitter::Compile(pattern, literal, &step.splitter));
    }
    pre_tokenizer_.push_back(std::move(step));
  }
  if (!byte_level) return Status::NotSupported("BPE without a ByteLevel pre-tokenizer");
  const json& decoder = j.value("decoder", json());
  if (decoder.is_object() && decoder.value("type", "") != "ByteLevel") {
    return Status::NotSupported("decoder " + decoder.value("type", std::string("?")));
  }

  // BOS/EOS around a text, and whether user text may name special tokens.
  TemplateIds(j.value("post_processor", json()), &prefix_ids_, &suffix_ids_);
  auto config_id = [&](const char* key) {
    const std::string text = cfg.contains(key) ? ConfigTokenText(cfg[key]) : "";
    for (const AddedToken& t : added_) {
      if (t.content == text) return t.id;
    }
    return -1;
  };
  if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    prefix_ids_.clear();
    if (cfg["add_bos_token"].get<bool>() && config_id("bos_token") >= 0) {
      prefix_ids_.push_back(config_id("bos_token"));
    }
  }
  if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
    suffix_ids_.clear();
    if (cfg["add_eos_token"].get<bool>() && config_id("eos_token") >= 0) {
      suffix_ids_.push_back(config_id("eos_token"));
    }
  }
  if (cfg.contains("split_special_tokens") && cfg["split_special_tokens"].is_boolean()) {
    parse_special_by_default_ = !cfg["split_special_tokens"].get<bool>();
  }
  if (!prefix_ids_.empty()) bos_id_ = prefix_ids_[0];
  drop_leading_space_ = false;
  return Status::OK();
}

std::vector<int> HfTokenizer::Encode(const std::string& text) const {
  return Encode(text, parse_special_by_default_);
}

std::vector<int> HfTokenizer::EncodeWithSpecialTokens(const std::string& text) const {
  std::vector<int> ids = prefix_ids_;
  const std::vector<int> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

template <typename OnText, typename OnToken>
void HfTokenizer::SplitAdded(std::string_view text, const AddedSet& set, bool parse_special,
                             OnText on_text, OnToken on_token) const {
  // Pass 1: the matches, leftmost-longest.
  std::vector<std::pair<size_t, const AddedToken*>> found;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (int k : set.by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = added_[k];
      if ((parse_special || !t.special) && text.compare(i, t.content.size(), t.content) == 0) {
        match = &t;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    found.emplace_back(i, match);
    i += match->content.size();
  }
  // Pass 2: the text between them, trimmed beside lstrip/rstrip tokens.
  size_t start = 0;
  for (size_t k = 0; k <= found.size(); ++k) {
    const size_t end = k < found.size() ? found[k].first : text.size();
    std::string_view between = text.substr(start, end - start);
    if (k > 0 && found[k - 1].second->rstrip) between = TrimStart(between);
    if (k < found.size() && found[k].second->lstrip) between = TrimEnd(between);
    if (!between.empty()) on_text(between);
    if (k < found.size()) {
      on_token(found[k].second->id);
      start = end + found[k].second->content.size();
    }
  }
}

std::vector<int> HfTokenizer::Encode(const std::string& raw, bool parse_special) const {
  const std::string text = ToValidUtf8(raw);
  std::vector<int> ids;
  auto add_id = [&](int id) { ids.push_back(id); };
  auto encode_section = [&](std::string_view s) { EncodeSection(s, parse_special, &ids); };
  auto normalize_then_encode = [&](std::string_view section) {
    if (!nfc_) return encode_section(section);
    const std::string normalized = Nfc(section);
    SplitAdded(normalized, normalized_added_, parse_special, encode_section, add_id);
  };
  SplitAdded(text, raw_added_, parse_special, normalize_then_encode, add_id);
  return ids;
}

void HfTokenizer::EncodeSection(std::string_view text, bool parse_special,
                                std::vector<int>* ids) const {
  std::vector<std::string_view> pieces = {text}, next;
  std::deque<std::string> prefixed;  // pieces with a space added (stable addresses)
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    if (step.add_prefix_space) {
      for (std::string_view& p : pieces) {
        if (!p.empty() && p[0] != ' ') p = prefixed.emplace_back(" " + std::string(p));
      }
    }
    if (step.splitter == nullptr) continue;
    next.clear();
    for (std::string_view p : pieces) step.splitter->Split(p, &next);
    pieces.swap(next);
  }
  for (std::string_view p : pieces) EncodePiece(p, ids);
}

void HfTokenizer::EncodePiece(std::string_view piece, std::vector<int>* ids) const {
  if (ignore_merges_) {
    const int id = bpe_.Find(piece);
    if (id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
  if (lock.owns_lock()) {
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
    lock.unlock();
  }
  const size_t start = ids->size();
  bpe_.Encode(piece, unk_id_, ids);
  if (lock.try_lock() && cache_.size() < kPieceCacheSize && cache_.count(piece) == 0) {
    cache_.emplace(cache_keys_.emplace_back(piece),
                   std::vector<int>(ids->begin() + start, ids->end()));
  }
}

std::string HfTokenizer::Normalize(std::string_view text) const {
  return nfc_ ? Nfc(text) : std::string(text);
}

std::string HfTokenizer::Piece(int id) const {
  return id >= 0 && id < static_cast<int>(pieces_.size()) ? pieces_[id] : "";
}

bool HfTokenizer::IsSpecial(int id) const {
  return id >= 0 && id < static_cast<int>(special_.size()) && special_[id];
}

Status HfTokenizerAddsBos(const std::string& dir, bool* adds_bos) {
  std::string text, config;
  if (!ReadFileToString(dir + "/tokenizer.json", &text).ok()) {
    return Status::NotFound(dir + ": no tokenizer.json");
  }
  if (ReadFileToString(dir + "/tokenizer_config.json", &config).ok()) {
    const json cfg = json::parse(config, nullptr, false);
    if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      *adds_bos = cfg["add_bos_token"].get<bool>();
      return Status::OK();
    }
  }
  // Only the post-processor matters: skip the vocabulary and merges while parsing.
  const json j = json::parse(
      text,
      [](int depth, json::parse_event_t event, json& parsed) {
        return !(depth == 1 && event == json::parse_event_t::key &&
                 (parsed == "model" || parsed == "added_tokens"));
      },
      false);
  std::vector<int> prefix, suffix;
  if (j.is_object()) TemplateIds(j.value("post_processor", json()), &prefix, &suffix);
  *adds_bos = !prefix.empty();
  return Status::OK();
}

}  // namespace specloop
