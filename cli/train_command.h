// `specloop train` (train_command.cc): registered on the specloop binary by cli/main.cc.
#pragma once

#include <CLI/CLI.hpp>

namespace specloop {

void AddTrainCommand(CLI::App& app, int* exit_code);

}  // namespace specloop
