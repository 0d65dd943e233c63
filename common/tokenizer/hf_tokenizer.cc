#include "common/tokenizer/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <deque>
#include <unordered_set>

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

// lstrip / rstrip trim what JavaScript's trimStart / trimEnd do (IsJsWhiteSpace).
std::string_view TrimStart(std::string_view s) {
  while (!s.empty()) {
    utf8proc_int32_t cp;
    const auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &cp);
    if (len <= 0 || !IsJsWhiteSpace(cp)) break;
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
    if (len <= 0 || !IsJsWhiteSpace(cp)) break;
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
  for (const char* key : {"remove_space", "do_lowercase_and_remove_accent"}) {
    if (cfg.value(key, json()) == json(true)) {
      return Status::NotSupported(std::string("tokenizer_config.json ") + key);
    }
  }
  const json& model = j["model"];
  if (model.value("type", "BPE") != "BPE") {
    return Status::NotSupported("model type " + model.value("type", "") + " (only BPE)");
  }
  SPECLOOP_RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json())));
  if (byte_level_ && model.value("byte_fallback", false)) {
    return Status::NotSupported("BPE byte_fallback with a ByteLevel pre-tokenizer");
  }
  SPECLOOP_RETURN_IF_ERROR(HfNormalizer::Parse(j.value("normalizer", json()), &normalizer_));
  SPECLOOP_RETURN_IF_ERROR(HfDecoder::Parse(j.value("decoder", json()), byte_level_, &decoder_));
  const json& added = j.value("added_tokens", json::array());
  SPECLOOP_RETURN_IF_ERROR(ParseModel(model, added));
  SPECLOOP_RETURN_IF_ERROR(ParseAddedTokens(added, cfg));

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
  bos_id_ = prefix_ids_.empty() ? -1 : prefix_ids_[0];
  drop_leading_space_ = decoder_.strips_leading_space();
  return Status::OK();
}

Status HfTokenizer::ParsePreTokenizer(const json& pre) {
  std::vector<json> pres;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const json& p : pre.value("pretokenizers", json::array())) {
      if (!p.is_null()) pres.push_back(p);
    }
  } else if (!pre.is_null()) {
    pres.push_back(pre);
  }
  bool metaspace = false;
  byte_level_ = false;
  for (const json& p : pres) {
    const std::string type = p.is_object() ? p.value("type", std::string("?")) : "?";
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
      byte_level_ = true;
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) pattern = kGpt2Pattern;
    } else if (type == "Metaspace") {
      metaspace = step.metaspace = true;
      step.replacement = p.value("replacement", "\xE2\x96\x81");
      step.str_rep = p.value("str_rep", "");
      if (step.str_rep.empty()) step.str_rep = step.replacement;  // `str_rep || replacement`
      if (step.replacement.empty()) return Status::NotSupported("Metaspace with no replacement");
      const std::string scheme = p.value("prepend_scheme", "always");
      if (scheme == "always") {
        step.prepend = PreTokenizerStep::Prepend::kAlways;
      } else if (scheme == "first") {
        step.prepend = PreTokenizerStep::Prepend::kFirst;
      } else if (scheme == "never") {
        step.prepend = PreTokenizerStep::Prepend::kNever;
      } else {
        return Status::NotSupported("Metaspace prepend_scheme " + scheme);
      }
    } else {
      return Status::NotSupported("pre-tokenizer " + type);
    }
    if (!pattern.empty()) {
      SPECLOOP_RETURN_IF_ERROR(RegexSplitter::Compile(pattern, literal, &step.splitter));
    }
    pre_tokenizer_.push_back(std::move(step));
  }
  if (byte_level_ && metaspace) return Status::NotSupported("Metaspace with ByteLevel");
  return Status::OK();
}

Status HfTokenizer::ParseModel(const json& model, const json& added) {
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return Status::NotSupported(std::string("BPE ") + key);
    }
  }
  const bool byte_fallback = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array()) {
    return Status::Corruption("model has no vocab or merges");
  }
  int max_id = -1;
  for (const auto& [piece, id] : model["vocab"].items()) max_id = std::max(max_id, id.get<int>());
  for (const json& a : added) max_id = std::max(max_id, a.value("id", -1));
  if (max_id >= kMaxVocabulary) return Status::Corruption("token id " + std::to_string(max_id));
  pieces_.assign(max_id + 1, "");
  surfaces_.assign(max_id + 1, "");
  special_.assign(max_id + 1, false);
  for (const auto& [piece, id_json] : model["vocab"].items()) {
    const int id = id_json.get<int>();
    if (id < 0) return Status::Corruption("negative id for " + piece);
    pieces_[id] = piece;
  }
  // The rules as string pairs: ["a", "b"], or "a b" read as JavaScript's split(" ", 2).
  const json& merges = model["merges"];
  std::vector<std::pair<std::string, std::string>> rules;
  rules.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    if (m.is_array() && m.size() == 2) {
      rules.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return Status::Corruption("merge without a space: " + s);
      rules.emplace_back(s.substr(0, sp), s.substr(sp + 1, s.find(' ', sp + 1) - sp - 1));
    } else {
      return Status::Corruption("merge " + std::to_string(rank) + " is malformed");
    }
  }
  const std::string unk = model.contains("unk_token") && model["unk_token"].is_string()
                              ? model["unk_token"].get<std::string>()
                              : "";
  if (!byte_level_) {
    // tokens_to_ids: the vocabulary, then the added tokens' contents over it.
    std::vector<std::pair<std::string, int>> tokens;
    tokens.reserve(model["vocab"].size() + added.size());
    for (const auto& [piece, id] : model["vocab"].items()) tokens.emplace_back(piece, id.get<int>());
    for (const json& a : added) {
      tokens.emplace_back(a.at("content").get<std::string>(), a.at("id").get<int>());
    }
    SpBpe::Options options;
    options.byte_fallback = byte_fallback;
    options.ignore_merges = ignore_merges_;
    options.fuse_unk = model.value("fuse_unk", false);
    for (const auto& [piece, id] : tokens) {
      if (!unk.empty() && piece == unk) options.unk_id = id;  // the last entry wins
    }
    return SpBpe::Build(tokens, rules, options, &sp_bpe_);
  }

  // Byte-level: the model over bytes.
  std::vector<std::string> tokens(max_id + 1);  // model tokens as bytes
  for (int id = 0; id <= max_id; ++id) {
    if (!ByteLevelToBytes(pieces_[id], &tokens[id])) tokens[id] = pieces_[id];
  }
  bpe_ = ByteBpe(std::move(tokens));
  std::vector<ByteBpe::Rule> byte_rules;
  byte_rules.reserve(rules.size());
  std::string left, right;
  for (const auto& [a, b] : rules) {
    // A rule whose parts or result are not tokens can never apply; it keeps its rank slot.
    ByteBpe::Rule rule{-1, -1, -1};
    if (ByteLevelToBytes(a, &left) && ByteLevelToBytes(b, &right)) {
      rule = {bpe_.Find(left), bpe_.Find(right), bpe_.Find(left + right)};
    }
    if (rule.left < 0 || rule.right < 0 || rule.merged < 0) rule = {-1, -1, -1};
    byte_rules.push_back(rule);
  }
  bpe_.SetRules(byte_rules);
  if (!unk.empty()) unk_id_ = bpe_.Find(unk);
  return Status::OK();
}

Status HfTokenizer::ParseAddedTokens(const json& added, const json& cfg) {
  for (const json& a : added) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", !t.special);  // tokenizers.js's default
    if (t.content.empty() || t.id < 0) return Status::Corruption("empty added token");
    t.match = t.normalized && normalizer_.present() ? normalizer_.Apply(t.content) : t.content;
    pieces_[t.id] = t.content;
    special_[t.id] = t.special;
    added_.push_back(std::move(t));
  }
  // tokenizers.js's added_tokens_map: content, then normalized content, later tokens winning.
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    for (const std::string* key : {&t.content, &t.match}) {
      added_by_text_[*key] = static_cast<int>(i);
      longest_added_ = std::max(longest_added_, key->size());
    }
  }
  // The splitters' sets, longest first so that the first match at a position is the longest.
  std::vector<int> order(added_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return added_[x].match.size() > added_[y].match.size();
  });
  for (int i : order) {
    const AddedToken& t = added_[i];
    if (t.match.empty()) continue;  // normalized away: never matched
    AddedSet& set = t.normalized && normalizer_.present() ? normalized_added_ : raw_added_;
    set.by_first_byte[static_cast<unsigned char>(t.match[0])].push_back(i);
  }

  // What each id decodes to. tokenizers.js skips (skip_special_tokens) every token spelled as a
  // special added token or a string of tokenizer_config.json's additional_special_tokens.
  std::unordered_set<std::string> skipped;
  for (const AddedToken& t : added_) {
    if (t.special) skipped.insert(t.content);
  }
  for (const json& s : cfg.value("additional_special_tokens", json::array())) {
    if (s.is_string()) skipped.insert(s.get<std::string>());
  }
  std::vector<bool> is_added(pieces_.size(), false);
  for (const AddedToken& t : added_) is_added[t.id] = true;
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const std::string& piece = pieces_[id];
    if (skipped.count(piece) != 0) {
      surfaces_[id] = "";
    } else if (is_added[id] && byte_level_) {
      surfaces_[id] = piece;  // added tokens are text, not byte-level characters
    } else {
      surfaces_[id] = decoder_.Surface(piece);
    }
  }
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

const HfTokenizer::AddedToken* HfTokenizer::FindAdded(std::string_view s,
                                                      bool parse_special) const {
  if (s.size() > longest_added_) return nullptr;
  const auto it = added_by_text_.find(s);
  if (it == added_by_text_.end()) return nullptr;
  const AddedToken& t = added_[it->second];
  return parse_special || !t.special ? &t : nullptr;
}

template <typename OnText, typename OnToken>
void HfTokenizer::SplitAdded(std::string_view text, const AddedSet& set, bool parse_special,
                             OnText on_text, OnToken on_token) const {
  // Pass 1: the sections, text and matches (leftmost-longest) in order, as tokenizers.js's
  // DictionarySplitter cuts them (no empty text sections).
  std::vector<std::string_view> sections;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    for (int k : set.by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = added_[k];
      if ((parse_special || !t.special) && text.compare(i, t.match.size(), t.match) == 0) {
        match = &t;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back(text.substr(start, i - start));
    sections.push_back(text.substr(i, match->match.size()));
    start = i += match->match.size();
  }
  if (start < text.size()) sections.push_back(text.substr(start));
  // Pass 2: beside a section that is (still) an added token's text, lstrip / rstrip trim the
  // neighbours; then each section is a token, or text (empty ones dropped).
  for (size_t i = 0; i < sections.size(); ++i) {
    const AddedToken* t = FindAdded(sections[i], parse_special);
    if (t == nullptr) continue;
    if (t->lstrip && i > 0) sections[i - 1] = TrimEnd(sections[i - 1]);
    if (t->rstrip && i + 1 < sections.size()) sections[i + 1] = TrimStart(sections[i + 1]);
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].empty()) continue;
    if (const AddedToken* t = FindAdded(sections[i], parse_special)) {
      on_token(t->id);
    } else {
      on_text(sections[i], static_cast<int>(i));
    }
  }
}

std::vector<int> HfTokenizer::Encode(const std::string& raw, bool parse_special) const {
  const std::string text = ToValidUtf8(raw);
  std::vector<int> ids;
  auto add_id = [&](int id) { ids.push_back(id); };
  auto normalize_then_encode = [&](std::string_view section, int index) {
    if (!normalizer_.present()) return EncodeSection(section, index, &ids);
    const std::string normalized = normalizer_.Apply(section);
    SplitAdded(
        normalized, normalized_added_, parse_special,
        [&](std::string_view sub, int) { EncodeSection(sub, index, &ids); }, add_id);
  };
  SplitAdded(text, raw_added_, parse_special, normalize_then_encode, add_id);
  return ids;
}

void HfTokenizer::EncodeSection(std::string_view text, int section_index,
                                std::vector<int>* ids) const {
  std::vector<std::string_view> pieces = {text}, next;
  std::deque<std::string> owned;  // pieces rewritten by a step (stable addresses)
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    if (step.add_prefix_space) {
      for (std::string_view& p : pieces) {
        if (!p.empty() && p[0] != ' ') p = owned.emplace_back(" " + std::string(p));
      }
    }
    if (step.metaspace) {
      const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                           (step.prepend == PreTokenizerStep::Prepend::kFirst && section_index == 0);
      for (std::string_view& p : pieces) {
        std::string s = ReplaceAll(p, " ", step.str_rep);
        if (prepend && s.compare(0, step.replacement.size(), step.replacement) != 0) {
          s.insert(0, step.str_rep);
        }
        p = owned.emplace_back(std::move(s));
      }
    }
    if (step.splitter == nullptr) continue;
    next.clear();
    for (std::string_view p : pieces) step.splitter->Split(p, &next);
    pieces.swap(next);
  }
  if (!byte_level_) return sp_bpe_.Encode(pieces, ids);
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
  std::string s = normalizer_.Apply(text);
  if (byte_level_) return s;
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    if (!step.metaspace) continue;
    s = ReplaceAll(s, " ", step.str_rep);
    if (step.prepend != PreTokenizerStep::Prepend::kNever &&
        s.compare(0, step.replacement.size(), step.replacement) != 0) {
      s.insert(0, step.str_rep);
    }
  }
  s = decoder_.Replace(s);
  if (drop_leading_space_ && !s.empty() && s[0] == ' ') s.erase(0, 1);
  return s;
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
