#include "common/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <deque>
#include <queue>

#include <nlohmann/json.hpp>

#include "common/model_config.h"

namespace specloop {

namespace {

using json = nlohmann::json;

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

std::string Nfc(std::string_view text) {
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
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  int max_id = -1;
  for (const auto& [piece, id_json] : model["vocab"].items()) max_id = std::max(max_id, id_json.get<int>());
  for (const json& a : j.value("added_tokens", json::array())) max_id = std::max(max_id, a.value("id", -1));
  pieces_.assign(max_id + 1, "");
  surfaces_.assign(max_id + 1, "");
  special_.assign(max_id + 1, false);
  vocab_.reserve(model["vocab"].size());
  std::string bytes;
  for (const auto& [piece, id_json] : model["vocab"].items()) {
    const int id = id_json.get<int>();
    if (id < 0) return Status::Corruption("negative id for " + piece);
    pieces_[id] = piece;
    if (!ByteLevelToBytes(piece, &bytes)) bytes = piece;  // not byte-level: decodes as spelled
    surfaces_[id] = bytes;
    vocab_.emplace(bytes, id);
    if (bytes.size() == 1) byte_ids_[static_cast<unsigned char>(bytes[0])] = id;
  }
  const json& merges = model["merges"];
  merges_.reserve(merges.size());
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
    if (!ByteLevelToBytes(a, &left) || !ByteLevelToBytes(b, &right)) continue;
    const auto l = vocab_.find(left), r = vocab_.find(right), joined = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || joined == vocab_.end()) continue;
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    merges_.emplace(key, Merge{static_cast<int>(rank), joined->second});  // lowest rank wins
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_id_ = it->second;
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
    (added_[i].normalized && !j.value("normalizer", json()).is_null() ? normalized_added_
                                                                       : raw_added_)
        .push_back(static_cast<int>(i));
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
void HfTokenizer::SplitAdded(std::string_view text, const std::vector<int>& set,
                             bool parse_special, OnText on_text, OnToken on_token) const {
  // Pass 1: the matches, leftmost-longest.
  std::vector<std::pair<size_t, const AddedToken*>> found;
  for (size_t i = 0; i < text.size() && !set.empty();) {
    const AddedToken* match = nullptr;
    for (int k : set) {
      const AddedToken& t = added_[k];
      if ((parse_special || !t.special) && t.content[0] == text[i] &&
          text.compare(i, t.content.size(), t.content) == 0) {
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
  SplitAdded(text, raw_added_, parse_special, [&](std::string_view section) {
    if (!nfc_) {
      EncodeSection(section, parse_special, &ids);
      return;
    }
    const std::string normalized = Nfc(section);
    SplitAdded(normalized, normalized_added_, parse_special,
               [&](std::string_view s) { EncodeSection(s, parse_special, &ids); }, add_id);
  }, add_id);
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
  if (piece.empty()) return;
  if (piece.size() == 1 || ignore_merges_) {
    const auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // One symbol per byte, linked; a min-heap of mergeable adjacent pairs by (rank, position).
  struct Symbol {
    int id, prev, next;
  };
  struct Candidate {
    int rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int n = static_cast<int>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0 || symbols[pos].id < 0 || symbols[next].id < 0) return;
    const uint64_t key =
        (static_cast<uint64_t>(symbols[pos].id) << 32) | static_cast<uint32_t>(symbols[next].id);
    const auto it = merges_.find(key);
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, symbols[pos].id, symbols[next].id, it->second.id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  constexpr int kMerged = -2;  // the right half of a merge: gone
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = symbols[c.pos];
    if (s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;  // stale
    symbols[s.next].id = kMerged;
    s.id = c.merged;
    s.next = symbols[s.next].next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0) {
      ids->push_back(symbols[i].id);
    } else if (unk_id_ >= 0) {
      ids->push_back(unk_id_);  // a byte without a token
    }
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
