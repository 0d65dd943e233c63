// The serving process's `specloop` subcommands (this folder's). Each Add*Command registers its
// options on `app` and sets the callback that runs it; the callback leaves the process exit
// code in *exit_code. Other folders declare their own: buffer/buffer_command.h,
// trainer/train_command.h; serve/main.cc composes them.
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
// `specloop serve` (serve/serve_command.cc, library specloop_serve).
void AddServeCommand(CLI::App& app, int* exit_code);
// `specloop up`: serve and train as supervised children (serve/up_command.cc).
void AddUpCommand(CLI::App& app, int* exit_code);
// `specloop proxy`: one port in front of serving workers (serve/proxy_command.cc).
void AddProxyCommand(CLI::App& app, int* exit_code);
// `specloop tokenize` and `specloop detokenize` (serve/tokenize_command.cc).
void AddTokenizeCommand(CLI::App& app, int* exit_code);
// `specloop keygen DIR`: the trainer's CURVE key pair (serve/keygen_command.cc).
void AddKeygenCommand(CLI::App& app, int* exit_code);
// `specloop draft init|export|import`: EAGLE-3 feature drafts (serve/draft_command.cc).
void AddDraftCommand(CLI::App& app, int* exit_code);

}  // namespace specloop
