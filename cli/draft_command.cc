// `specloop draft init|export|import`: an EAGLE-3 feature draft grown from a target alone, and
// moved between specloop and the servers that run such heads (vLLM, SGLang).
//
//   draft init   --target DIR --out DIR [--kind eagle3] [--aux-layers a,b,c] [--draft-vocab N]
//                [--counts-from FILE... | --buffer DIR...] [--seed S] [--warmup-tokens N]
//                [--threads N]
//   draft export --draft HEAD --target DIR --out DIR [--dtype float16|bfloat16|float32]
//                [--with-embedding]
//   draft import --from DIR --target DIR --out DIR
//
// init warms the head up on text the target samples itself (trainer/head_warmup.h) before
// writing it. init and import write the native layout in float32 (for training); export writes
// what vLLM and SGLang load (cli/eagle3_interchange.h). Results go to standard output,
// warnings and errors to standard error.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "common/model/eagle3_config.h"
#include "common/model/eagle3_head.h"
#include "common/model/llama_model.h"
#include "common/model/threads.h"
#include "common/tokenizer/tokenizer.h"
#include "cli/commands.h"
#include "cli/draft_vocab_counts.h"
#include "cli/eagle3_interchange.h"
#include "trainer/head_warmup.h"

namespace specloop {

namespace {

constexpr int kDefaultDraftVocab = 32000;  // as EAGLE-3's and SpecForge's published heads

Status LoadTarget(const std::string& dir, std::unique_ptr<LlamaModel>* out) {
  LoadOptions options;
  options.dtype = "float32";
  return LlamaModel::Load(dir, options, out).Annotate("--target " + dir);
}

std::string Join(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s;
}

// `--aux-layers a,b,c`: three target layers (their inputs are the features), ascending, each in
// 1 .. layers - 1 (layer 0's input is the embedding, which the servers do not capture).
Status ParseAuxLayers(const std::string& text, int layers, std::vector<int>* out) {
  std::vector<int> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) {
      return Status::InvalidArgument("--aux-layers " + text + ": \"" + item +
                                     "\" is not a layer number");
    }
    ids.push_back(id);
  }
  if (ids.size() != 3) {
    return Status::InvalidArgument("--aux-layers " + text +
                                   ": an EAGLE-3 head fuses exactly 3 target layers");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 1 || ids[i] >= layers) {
      return Status::InvalidArgument("--aux-layers " + text + ": layer " +
                                     std::to_string(ids[i]) + " outside 1.." +
                                     std::to_string(layers - 1) + " (the target has " +
                                     std::to_string(layers) + " layers; 0 is the embedding)");
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return Status::InvalidArgument("--aux-layers " + text +
                                     ": the layers must be distinct and ascending");
    }
  }
  *out = std::move(ids);
  return Status::OK();
}

int64_t ParameterCount(const Eagle3Head& head) {
  int64_t n = 0;
  for (const auto& [name, t] : head.NamedWeights()) {
    if (t.is_floating_point()) n += t.numel();
  }
  return n;
}

std::string FileBytes(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? "?" : std::to_string(size);
}

// What a written head holds, one line each.
void PrintHead(const Eagle3Head& head, const std::string& dir, const std::string& dtype,
               std::ostream& out) {
  const Eagle3Config& c = head.config();
  out << "  aux layers: " << Join(c.aux_layers) << " (inputs of those layers of the target's "
      << head.target().config().num_hidden_layers << ")\n"
      << "  draft vocabulary: " << c.draft_vocab_size << " of " << c.layer.vocab_size << " ids\n"
      << "  parameters: " << ParameterCount(head)
      << " (fc, midlayer, norm, lm_head; the embedding is the target's)\n"
      << "  bytes: " << FileBytes(dir + "/model.safetensors") << " (model.safetensors, " << dtype
      << ")\n";
}

struct InitArgs {
  std::string target, out, kind = "eagle3", aux_layers;
  int draft_vocab = 0;
  std::vector<std::string> counts_from, buffers;
  uint64_t seed = 1;
  int64_t warmup_tokens = trainer::kDefaultWarmupTokens;
  int threads = 1;
};

Status RunInit(const InitArgs& a, std::ostream& out, std::ostream& err) {
  if (a.kind != "eagle3") {
    return Status::InvalidArgument("--kind " + a.kind +
                                   ": the only kind is eagle3 (an EAGLE-3 feature head)");
  }
  if (a.warmup_tokens < 0) {
    return Status::InvalidArgument("--warmup-tokens " + std::to_string(a.warmup_tokens) +
                                   ": a number of tokens (0: no warm-up)");
  }
  if (a.threads < 1) {
    return Status::InvalidArgument("--threads " + std::to_string(a.threads) + ": at least 1");
  }
  SPECLOOP_RETURN_IF_ERROR(CheckHeadOutputDir(a.out));
  std::unique_ptr<LlamaModel> target;
  SPECLOOP_RETURN_IF_ERROR(LoadTarget(a.target, &target));
  const ModelConfig& t = target->config();
  Eagle3Head::InitOptions options;
  options.seed = a.seed;
  if (!a.aux_layers.empty()) {
    SPECLOOP_RETURN_IF_ERROR(ParseAuxLayers(a.aux_layers, t.num_hidden_layers, &options.aux_layers));
  } else if (DefaultAuxLayers(t.num_hidden_layers).empty()) {
    return Status::NotSupported("--target " + a.target + " has " +
                                std::to_string(t.num_hidden_layers) +
                                " layers: an EAGLE-3 head reads 3 distinct layers 1..L-1");
  }
  const int V = t.vocab_size;
  if (a.draft_vocab != 0 && (a.draft_vocab < 1 || a.draft_vocab > V)) {
    return Status::InvalidArgument("--draft-vocab " + std::to_string(a.draft_vocab) +
                                   " outside 1.." + std::to_string(V) +
                                   " (the target's vocabulary)");
  }
  options.draft_vocab_size = a.draft_vocab ? a.draft_vocab : std::min(V, kDefaultDraftVocab);
  const int Vd = options.draft_vocab_size;

  TokenCounts counts;
  std::string counted;
  if (!a.counts_from.empty()) {
    std::unique_ptr<Tokenizer> tokenizer;
    SPECLOOP_RETURN_IF_ERROR(Tokenizer::Load(a.target, &tokenizer).Annotate("--target tokenizer"));
    SPECLOOP_RETURN_IF_ERROR(CountTokensInTextFiles(*tokenizer, a.counts_from, V, &counts));
    counted = std::to_string(counts.tokens) + " tokens of " + std::to_string(counts.sources) +
              " file(s)";
  } else if (!a.buffers.empty()) {
    SPECLOOP_RETURN_IF_ERROR(CountOutputTokensInBuffers(a.buffers, V, &counts));
    counted = std::to_string(counts.tokens) + " output tokens of " +
              std::to_string(counts.sources) + " buffer record(s)";
  }
  if (Vd < V) {
    if (counted.empty()) {
      err << "warning: a draft vocabulary of " << Vd << " of " << V
          << " ids and no counts (--counts-from or --buffer): the " << Vd
          << " lowest ids\n";
    } else if (counts.tokens == 0) {
      err << "warning: " << counted << " counted: the " << Vd << " lowest ids\n";
    } else {
      options.token_counts = counts.counts;
    }
  } else if (!counted.empty()) {
    err << "note: the draft vocabulary is the target's whole vocabulary: the counts are unused\n";
  }

  std::unique_ptr<Eagle3Head> head;
  SPECLOOP_RETURN_IF_ERROR(Eagle3Head::InitFromTarget(*target, options, &head));
  trainer::HeadWarmupOptions warmup;
  warmup.tokens = a.warmup_tokens;
  warmup.seed = a.seed;
  trainer::HeadWarmupReport report;
  if (warmup.tokens > 0) {
    out << "warming the head up on " << warmup.tokens
        << " tokens the target samples (--warmup-tokens)" << std::endl;
  }
  SPECLOOP_RETURN_IF_ERROR(
      trainer::WarmUpHead(*target, head.get(), warmup, &report).Annotate("--warmup-tokens"));
  SPECLOOP_RETURN_IF_ERROR(head->Save(a.out, "float32").Annotate("--out " + a.out));
  out << "wrote " << a.out << ": an EAGLE-3 head for " << a.target
      << " (LlamaForCausalLMEagle3, initialized from the target"
      << (report.tokens ? ", warmed up on text it sampled" : "") << ")\n";
  if (report.tokens) {
    out << "  warm-up: " << report.tokens << " tokens in " << report.sequences
        << " sequences sampled from the target, " << report.steps << " training steps, loss "
        << std::fixed << std::setprecision(4) << report.first_loss << " -> " << report.last_loss
        << std::setprecision(1) << " (" << report.sample_seconds << " s sampling, "
        << report.train_seconds << " s training)\n"
        << std::defaultfloat;
  }
  PrintHead(*head, a.out, "float32", out);
  if (!options.token_counts.empty()) {
    int64_t covered = 0;
    for (const int id : head->draft_to_target()) covered += counts.counts[id];
    out << "  the most frequent ids of " << counted << ", covering " << std::fixed
        << std::setprecision(2) << 100.0 * covered / counts.tokens << "% of them\n";
  }
  return Status::OK();
}

struct ExportArgs {
  std::string draft, target, out, dtype = "float16";
  bool with_embedding = false;
};

Status RunExport(const ExportArgs& a, std::ostream& out) {
  std::unique_ptr<LlamaModel> target;
  SPECLOOP_RETURN_IF_ERROR(LoadTarget(a.target, &target));
  std::unique_ptr<Eagle3Head> head;
  LoadOptions load;
  load.dtype = "float32";
  SPECLOOP_RETURN_IF_ERROR(
      Eagle3Head::Load(a.draft, *target, load, &head).Annotate("--draft " + a.draft));
  Eagle3ExportOptions options;
  options.dtype = a.dtype;
  options.with_embedding = a.with_embedding;
  SPECLOOP_RETURN_IF_ERROR(ExportEagle3Head(*head, a.out, options).Annotate("--out " + a.out));
  out << "wrote " << a.out << ": " << a.draft
      << " in the LlamaForCausalLMEagle3 layout vLLM and SGLang load"
      << (a.with_embedding ? ", with the target's embedding (embed_tokens.weight)" : "") << "\n";
  PrintHead(*head, a.out, a.dtype, out);
  return Status::OK();
}

struct ImportArgs {
  std::string from, target, out;
};

Status RunImport(const ImportArgs& a, std::ostream& out) {
  std::error_code ec;
  if (std::filesystem::equivalent(a.from, a.out, ec)) {
    return Status::InvalidArgument("--out " + a.out + " is --from: write the import elsewhere");
  }
  SPECLOOP_RETURN_IF_ERROR(CheckHeadOutputDir(a.out));
  std::unique_ptr<LlamaModel> target;
  SPECLOOP_RETURN_IF_ERROR(LoadTarget(a.target, &target));
  std::unique_ptr<Eagle3Head> head;
  Eagle3ImportReport report;
  SPECLOOP_RETURN_IF_ERROR(ImportEagle3Head(a.from, *target, &head, &report));
  SPECLOOP_RETURN_IF_ERROR(head->Save(a.out, "float32").Annotate("--out " + a.out));
  out << "imported " << a.from << " -> " << a.out << " (float32, for training)\n"
      << "  read: weights " << report.weights_dtype << "; aux layer ids "
      << report.aux_ids_form << "; names " << report.names_form << "; embed_tokens "
      << report.embedding << "; vocabulary map " << report.vocabulary_map << "\n";
  PrintHead(*head, a.out, "float32", out);
  return Status::OK();
}

void Finish(const char* what, const Status& s, int* exit_code) {
  if (!s.ok()) {
    std::cerr << "specloop draft " << what << ": " << s.ToString() << "\n";
    *exit_code = 1;
  }
}

}  // namespace

void AddDraftCommand(CLI::App& app, int* exit_code) {
  auto* draft = app.add_subcommand("draft", "EAGLE-3 feature drafts: init, export, import");
  draft->require_subcommand(1);

  auto init_args = std::make_shared<InitArgs>();
  auto* init = draft->add_subcommand(
      "init", "write an EAGLE-3 head initialized from the target alone (float32)");
  init->add_option("--target", init_args->target, "target model directory")->required();
  init->add_option("--out", init_args->out, "output directory")->required();
  init->add_option("--kind", init_args->kind, "draft kind (only eagle3)")
      ->capture_default_str();
  init->add_option("--aux-layers", init_args->aux_layers,
                   "a,b,c: the target layers whose inputs are the features (default: vLLM's "
                   "(2, L/2, L-3), or (1, L/2, L-1) below 7 layers)");
  init->add_option("--draft-vocab", init_args->draft_vocab,
                   "draft vocabulary size (default: the target's up to 32000)");
  auto* counts = init->add_option("--counts-from", init_args->counts_from,
                                  "text files whose tokens choose the draft vocabulary");
  auto* buffer = init->add_option("--buffer", init_args->buffers,
                                  "replay buffer(s) whose output tokens choose it");
  counts->excludes(buffer);
  init->add_option("--seed", init_args->seed, "seed of the initial noise and of the warm-up")
      ->capture_default_str();
  init->add_option("--warmup-tokens", init_args->warmup_tokens,
                   "tokens the target samples to train the head on before it is written "
                   "(self-distillation; 0: none)")
      ->capture_default_str();
  init->add_option("--threads", init_args->threads, "compute threads of the warm-up")
      ->capture_default_str();
  init->callback([init_args, exit_code] {
    SetComputeThreads(std::max(1, init_args->threads));  // (below 1: refused by RunInit)
    Finish("init", RunInit(*init_args, std::cout, std::cerr), exit_code);
  });

  auto export_args = std::make_shared<ExportArgs>();
  auto* exp = draft->add_subcommand(
      "export", "write a head in the layout vLLM and SGLang load (LlamaForCausalLMEagle3)");
  exp->add_option("--draft", export_args->draft, "the head's directory")->required();
  exp->add_option("--target", export_args->target, "its target model directory")->required();
  exp->add_option("--out", export_args->out, "output directory")->required();
  exp->add_option("--dtype", export_args->dtype, "float16, bfloat16 or float32")
      ->capture_default_str();
  exp->add_flag("--with-embedding", export_args->with_embedding,
                "also write the target's embedding as embed_tokens.weight");
  exp->callback([export_args, exit_code] {
    Finish("export", RunExport(*export_args, std::cout), exit_code);
  });

  auto import_args = std::make_shared<ImportArgs>();
  auto* imp = draft->add_subcommand(
      "import", "read a published EAGLE-3 head (vLLM's or SGLang's form) for training");
  imp->add_option("--from", import_args->from, "the published head's directory")->required();
  imp->add_option("--target", import_args->target, "its target model directory")->required();
  imp->add_option("--out", import_args->out, "output directory")->required();
  imp->callback([import_args, exit_code] {
    Finish("import", RunImport(*import_args, std::cout), exit_code);
  });
}

}  // namespace specloop
