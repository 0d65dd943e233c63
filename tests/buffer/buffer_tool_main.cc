// A host for `specloop buffer ...` alone (same AddBufferCommand as the specloop binary), so the
// CLI tests do not need the LibTorch build.
#include "cli/buffer_command.h"

int main(int argc, char** argv) {
  CLI::App app{"specloop buffer tools"};
  app.require_subcommand(1);
  int exit_code = 0;
  specloop::AddBufferCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
