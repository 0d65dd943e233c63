// `specloop keygen DIR`: a CURVE key pair for the trainer (README "Operating specloop safely").
// Writes DIR/trainer.key (the secret key, mode 0600: for `specloop train
// --curve-secret-key-file`) and DIR/trainer.pub (for `specloop serve --trainer-public-key`),
// and prints the public key. Refuses to overwrite an existing key.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "common/channel/draft_channel.h"
#include "cli/commands.h"

namespace specloop {

namespace {

// Creates `path` with `mode` (failing if it exists) and writes `text` + "\n".
Status WriteNewFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
  if (fd < 0) return Status::IOError("cannot create " + path + ": " + std::strerror(errno));
  const std::string line = text + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  return close(fd) == 0 && ok ? Status::OK() : Status::IOError("cannot write " + path);
}

int RunKeygen(const std::string& dir) {
  std::string public_key, secret_key;
  Status s = GenerateCurveKeyPair(&public_key, &secret_key);
  if (s.ok() && mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    s = Status::IOError("cannot create " + dir);
  }
  if (s.ok()) s = WriteNewFile(dir + "/trainer.key", secret_key, 0600);
  if (s.ok()) s = WriteNewFile(dir + "/trainer.pub", public_key, 0644);
  if (!s.ok()) {
    std::cerr << "specloop keygen: " << s.ToString() << "\n";
    return 1;
  }
  std::printf("%s\n", public_key.c_str());
  std::fprintf(stderr,
               "specloop keygen: secret key in %s/trainer.key (train --curve-secret-key-file), "
               "public key above and in %s/trainer.pub (serve --trainer-public-key)\n",
               dir.c_str(), dir.c_str());
  return 0;
}

}  // namespace

void AddKeygenCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("keygen", "CURVE key pair authenticating the trainer to workers");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("DIR", *dir, "directory for trainer.key and trainer.pub")->required();
  cmd->callback([dir, exit_code] { *exit_code = RunKeygen(*dir); });
}

}  // namespace specloop
