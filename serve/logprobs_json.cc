#include "serve/logprobs_json.h"

namespace specloop {

using json = nlohmann::json;

namespace {

// Characters a piece of UTF-8 starts: its bytes that are not continuation bytes.
int64_t Characters(const std::string& bytes) {
  int64_t n = 0;
  for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
  return n;
}

json ByteList(const std::string& bytes) {
  json list = json::array();
  for (unsigned char c : bytes) list.push_back(static_cast<int>(c));
  return list;
}

}  // namespace

LogprobsJson::LogprobsJson(const Tokenizer* tokenizer, int prev, Format format,
                           bool tokens_as_ids)
    : tokenizer_(tokenizer), prev_(prev), format_(format), tokens_as_ids_(tokens_as_ids) {}

std::string LogprobsJson::Bytes(int token, int prev) const {
  return tokenizer_->Decode({token}, prev);
}

std::string LogprobsJson::Text(int token, const std::string& bytes) const {
  return tokens_as_ids_ ? "token_id:" + std::to_string(token) : ToValidUtf8(bytes);
}

json LogprobsJson::Chunk(const std::vector<TokenLogprob>& entries) {
  if (format_ != Format::kCompletions) {
    const bool ids = format_ == Format::kGenerate;
    json content = json::array();
    for (const TokenLogprob& e : entries) {
      const std::string bytes = Bytes(e.token, prev_);
      json top = json::array();
      for (const TokenLogprob::Alternative& a : e.top) {
        const std::string alt = Bytes(a.token, prev_);
        top.push_back({{"token", Text(a.token, alt)},
                       {"logprob", a.logprob},
                       {"bytes", ByteList(alt)}});
        if (ids) top.back()["token_id"] = a.token;
      }
      content.push_back({{"token", Text(e.token, bytes)},
                         {"logprob", e.logprob},
                         {"bytes", ByteList(bytes)},
                         {"top_logprobs", std::move(top)}});
      if (ids) content.back()["token_id"] = e.token;
      prev_ = e.token;
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const TokenLogprob& e : entries) {
    const std::string bytes = Bytes(e.token, prev_);
    tokens.push_back(Text(e.token, bytes));
    logprobs.push_back(e.logprob);
    offsets.push_back(offset_);
    offset_ += Characters(bytes);
    json top = json::object();
    for (const TokenLogprob::Alternative& a : e.top) {  // best first: the first of a text wins
      const std::string key = Text(a.token, Bytes(a.token, prev_));
      if (!top.contains(key)) top[key] = a.logprob;
    }
    tops.push_back(std::move(top));
    prev_ = e.token;
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace specloop
