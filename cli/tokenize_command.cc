// `specloop tokenize` and `specloop detokenize`: how a model directory's tokenizer splits text,
// and the text of ids. No model weights are read.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "cli/commands.h"

namespace specloop {

namespace {

struct TokenizeArgs {
  std::string model, text, file, ids;
  bool ids_only = false, no_special = false, add_special = false;
};

// The text named by --text or --file ("-": standard input).
Status ReadInput(const std::string& text, const std::string& file, std::string* out) {
  if (file.empty()) {
    *out = text;
    return Status::OK();
  }
  if (file == "-") {
    *out = std::string(std::istreambuf_iterator<char>(std::cin), {});
    return Status::OK();
  }
  return ReadFileToString(file, out);
}

// The ids of the text, with the options' special-token handling.
Status Encode(const TokenizeArgs& a, const Tokenizer& tok, const std::string& text,
              std::vector<int>* ids) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tok);
  if (a.no_special && hf == nullptr) {
    return Status::InvalidArgument("--no-special applies to tokenizer.json tokenizers only");
  }
  *ids = hf ? hf->Encode(text, hf->parse_special_by_default() && !a.no_special) : tok.Encode(text);
  if (!a.add_special) return Status::OK();
  if (hf) {
    ids->insert(ids->begin(), hf->prefix_ids().begin(), hf->prefix_ids().end());
    ids->insert(ids->end(), hf->suffix_ids().begin(), hf->suffix_ids().end());
    return Status::OK();
  }
  ModelConfig c;
  SPECLOOP_RETURN_IF_ERROR(ModelConfig::FromDir(a.model, &c));
  if (c.add_bos_token) ids->insert(ids->begin(), c.bos_token_id);
  return Status::OK();
}

int RunTokenize(const TokenizeArgs& a) {
  std::string text;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int> ids;
  Status s = ReadInput(a.text, a.file, &text);
  if (s.ok()) s = Tokenizer::Load(a.model, &tok);
  if (s.ok()) s = Encode(a, *tok, text, &ids);
  if (!s.ok()) {
    std::cerr << "specloop tokenize: " << s.ToString() << "\n";
    return 1;
  }
  if (a.ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
  }
  // One line per token: the id and its text as a JSON string (spaces and newlines visible;
  // a token that ends inside a UTF-8 character shows U+FFFD).
  const auto* hf = dynamic_cast<const HfTokenizer*>(tok.get());
  for (int id : ids) {
    const std::string piece = hf && hf->IsSpecial(id) ? hf->Piece(id) : tok->Decode({id});
    std::cout << id << "\t"
              << nlohmann::json(ToValidUtf8(piece)).dump() << "\n";
  }
  std::cout << ids.size() << " tokens, " << text.size() << " bytes\n";
  return 0;
}

int RunDetokenize(const TokenizeArgs& a) {
  std::string input;
  std::unique_ptr<Tokenizer> tok;
  Status s = ReadInput(a.ids, a.file, &input);
  if (s.ok()) s = Tokenizer::Load(a.model, &tok);
  if (!s.ok()) {
    std::cerr << "specloop detokenize: " << s.ToString() << "\n";
    return 1;
  }
  // Ids separated by spaces, commas or newlines; brackets are ignored (a JSON array works).
  for (char& c : input) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream in(input);
  std::vector<int> ids;
  for (std::string word; in >> word;) {
    size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || id < 0 || id >= tok->vocab_size()) {
      std::cerr << "specloop detokenize: \"" << word << "\" is not an id below "
                << tok->vocab_size() << "\n";
      return 2;
    }
    ids.push_back(id);
  }
  std::cout << tok->Decode(ids);  // exactly the text: no newline added
  return 0;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* t = app.add_subcommand("tokenize", "the tokens of a text under a model's tokenizer");
  t->add_option("--model", args->model, "model or tokenizer directory")->required();
  auto* text = t->add_option("--text", args->text, "the text");
  auto* file = t->add_option("--file", args->file, "read the text from a file (- for stdin)");
  text->excludes(file);
  t->add_flag("--ids", args->ids_only, "print only the ids, space-separated");
  t->add_flag("--no-special", args->no_special,
              "special-token strings in the text are plain text (tokenizer.json)");
  t->add_flag("--add-special", args->add_special, "add the BOS/EOS the tokenizer adds");
  t->callback([args, exit_code, text, file] {
    if (text->count() == 0 && file->count() == 0) {
      std::cerr << "specloop tokenize: give --text or --file\n";
      *exit_code = 2;
      return;
    }
    *exit_code = RunTokenize(*args);
  });

  CLI::App* d = app.add_subcommand("detokenize", "the text of token ids (tokenize's inverse)");
  d->add_option("--model", args->model, "model or tokenizer directory")->required();
  auto* ids = d->add_option("--ids", args->ids, "ids separated by spaces or commas");
  auto* ids_file = d->add_option("--file", args->file, "read the ids from a file (- for stdin)");
  ids->excludes(ids_file);
  d->callback([args, exit_code, ids, ids_file] {
    if (ids->count() == 0 && ids_file->count() == 0) {
      std::cerr << "specloop detokenize: give --ids or --file\n";
      *exit_code = 2;
      return;
    }
    *exit_code = RunDetokenize(*args);
  });
}

}  // namespace specloop
