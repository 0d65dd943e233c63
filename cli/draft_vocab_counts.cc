#include "cli/draft_vocab_counts.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "buffer/replay_reader.h"

namespace specloop {

namespace {

void Size(int vocab_size, TokenCounts* out) {
  if (out->counts.empty()) out->counts.assign(vocab_size, 0);
}

}  // namespace

Status CountTokensInTextFiles(const Tokenizer& tokenizer, const std::vector<std::string>& files,
                              int vocab_size, TokenCounts* out) {
  Size(vocab_size, out);
  for (const std::string& path : files) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return Status::InvalidArgument(path + ": a directory, not a text file (--counts-from)");
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::NotFound(path + ": cannot open (--counts-from)");
    std::ostringstream text;
    text << f.rdbuf();
    if (f.bad()) return Status::IOError(path + ": read failed");
    for (const int id : tokenizer.Encode(text.str())) {
      if (id < 0 || id >= vocab_size) {
        return Status::InvalidArgument(path + ": the tokenizer gives id " + std::to_string(id) +
                                       ", outside the target's vocabulary of " +
                                       std::to_string(vocab_size));
      }
      out->counts[id]++;
      out->tokens++;
    }
    out->sources++;
  }
  return Status::OK();
}

Status CountOutputTokensInBuffers(const std::vector<std::string>& dirs, int vocab_size,
                                  TokenCounts* out) {
  Size(vocab_size, out);
  for (const std::string& dir : dirs) {
    std::unique_ptr<ReplayReader> reader;
    SPECLOOP_RETURN_IF_ERROR(ReplayReader::Open(ReaderOptions(), {dir}, &reader).Annotate(dir));
    Status bad;
    const Status scanned = reader->Scan(ScanOptions(), [&](size_t, const Record& r) {
      for (size_t i = r.prompt_len; i < r.tokens.size(); ++i) {
        const int id = r.tokens[i];
        if (id < 0 || id >= vocab_size) {
          bad = Status::InvalidArgument(
              dir + ": record " + r.request_id + " (target " + r.target_id + ") holds id " +
              std::to_string(id) + ", outside the target's vocabulary of " +
              std::to_string(vocab_size) + " (a buffer of another target?)");
          return false;
        }
        out->counts[id]++;
        out->tokens++;
      }
      out->sources++;
      return true;
    });
    SPECLOOP_RETURN_IF_ERROR(bad);
    SPECLOOP_RETURN_IF_ERROR(scanned.Annotate(dir));
  }
  return Status::OK();
}

}  // namespace specloop
