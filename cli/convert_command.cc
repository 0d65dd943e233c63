// `specloop convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR`
#include <iostream>

#include "common/model/llama2c_convert.h"
#include "cli/commands.h"

namespace specloop {

void AddConvertCommand(CLI::App& app, int* exit_code) {
  auto* convert = app.add_subcommand("convert", "convert models to Hugging Face layout");
  convert->require_subcommand(1);
  auto* l2c = convert->add_subcommand("llama2c", "llama2.c checkpoint + tokenizer.bin");
  struct Args {
    std::string checkpoint, tokenizer, out_dir;
  };
  auto args = std::make_shared<Args>();
  l2c->add_option("checkpoint", args->checkpoint, "llama2.c checkpoint (.bin)")->required();
  l2c->add_option("tokenizer", args->tokenizer, "llama2.c tokenizer (.bin)")->required();
  l2c->add_option("out_dir", args->out_dir, "output directory")->required();
  l2c->callback([args, exit_code] {
    Status s = ConvertLlama2c(args->checkpoint, args->tokenizer, args->out_dir);
    if (!s.ok()) {
      std::cerr << "specloop convert: " << s.ToString() << "\n";
      *exit_code = 1;
      return;
    }
    std::cerr << "wrote " << args->out_dir << "\n";
  });
}

}  // namespace specloop
