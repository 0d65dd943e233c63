// The `specloop` subcommands. Each Add*Command registers its options on `app` and sets the
// callback that runs it; the callback leaves the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace specloop {

void AddGenerateCommand(CLI::App& app, int* exit_code);
void AddConvertCommand(CLI::App& app, int* exit_code);
// `specloop buffer stats|export|verify` (buffer/buffer_command.cc, library specloop_buffer_cli).
void AddBufferCommand(CLI::App& app, int* exit_code);
// `specloop serve` (serve/serve_command.cc, library specloop_serve).
void AddServeCommand(CLI::App& app, int* exit_code);
// `specloop train` (trainer/train_command.cc, library specloop_trainer_cli).
void AddTrainCommand(CLI::App& app, int* exit_code);
// `specloop up`: serve and train as supervised children (serve/up_command.cc).
void AddUpCommand(CLI::App& app, int* exit_code);
// `specloop tokenize` and `specloop detokenize` (serve/tokenize_command.cc).
void AddTokenizeCommand(CLI::App& app, int* exit_code);
// `specloop keygen DIR`: the trainer's CURVE key pair (serve/keygen_command.cc).
void AddKeygenCommand(CLI::App& app, int* exit_code);

}  // namespace specloop
