// specloop built with -DSPECLOOP_GPU_HARNESS=ON (cmake/gpu_harness.cmake): the subcommands that
// need the engine alone. The full binary's main is main.cc.
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"specloop (GPU harness build: engine commands only)"};
  app.require_subcommand(1);
  int exit_code = 0;
  specloop::AddGenerateCommand(app, &exit_code);
  specloop::AddConvertCommand(app, &exit_code);
  specloop::AddTokenizeCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
