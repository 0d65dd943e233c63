// specloop: one binary, one subcommand per process or tool (DESIGN.md section 1).
#include <cstdio>

#include "cli/buffer_command.h"
#include "cli/commands.h"
#include "cli/train_command.h"
#include "common/base/malloc_policy.h"

int main(int argc, char** argv) {
  // Before any thread starts: serve, train and up's children run for weeks, and large
  // transient tensors must not stay in the heap (common/base/malloc_policy.h).
  specloop::ApplyMallocPolicy();
  CLI::App app{"specloop: online adaptive speculative decoding"};
  app.require_subcommand(1);
  int exit_code = 0;
  specloop::AddGenerateCommand(app, &exit_code);
  specloop::AddConvertCommand(app, &exit_code);
  specloop::AddBufferCommand(app, &exit_code);
  specloop::AddServeCommand(app, &exit_code);
  specloop::AddTrainCommand(app, &exit_code);
  specloop::AddUpCommand(app, &exit_code);
  specloop::AddProxyCommand(app, &exit_code);
  specloop::AddTokenizeCommand(app, &exit_code);
  specloop::AddKeygenCommand(app, &exit_code);
  specloop::AddDraftCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
