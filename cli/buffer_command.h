// `specloop buffer stats|export|verify` (buffer_command.cc): registered on the specloop binary
// by cli/main.cc. The callback leaves the process exit code in *exit_code.
#pragma once

#include <CLI/CLI.hpp>

namespace specloop {

void AddBufferCommand(CLI::App& app, int* exit_code);

}  // namespace specloop
