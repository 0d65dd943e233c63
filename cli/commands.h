// `specloop` subcommands. Each Add*Command registers its options on `app` and sets the callback
// that runs it; the callback leaves the process exit code in *exit_code. `buffer` and `train`
// are declared in cli/buffer_command.h and cli/train_command.h; cli/main.cc composes them all.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace specloop {

void AddGenerateCommand(CLI::App& app, int* exit_code);
// `--tree B0,B1,...` (generate and serve): children per node at each depth, each in [1, 16],
// at most 16 levels. False (out untouched) on anything else.
bool ParseTreeBranching(const std::string& text, std::vector<int>* out);
void AddConvertCommand(CLI::App& app, int* exit_code);
// `specloop serve` (cli/serve_command.cc; the serving process is serve/'s).
void AddServeCommand(CLI::App& app, int* exit_code);
// `specloop up`: serve and train as supervised children (cli/up_command.cc).
void AddUpCommand(CLI::App& app, int* exit_code);
// `specloop proxy`: one port in front of serving workers (cli/proxy_command.cc).
void AddProxyCommand(CLI::App& app, int* exit_code);
// `specloop tokenize` and `specloop detokenize` (cli/tokenize_command.cc).
void AddTokenizeCommand(CLI::App& app, int* exit_code);
// `specloop keygen DIR`: the trainer's CURVE key pair (cli/keygen_command.cc).
void AddKeygenCommand(CLI::App& app, int* exit_code);
// `specloop draft init|export|import`: EAGLE-3 feature drafts (cli/draft_command.cc).
void AddDraftCommand(CLI::App& app, int* exit_code);

}  // namespace specloop
