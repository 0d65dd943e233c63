// The draft channel's parsers (common/channel/draft_channel.h): what a worker receives from the
// trainer's sockets. Each input goes through all three: an announcement's JSON, a version
// directory name, and a checkpoint bundle (unpacked into a scratch directory). What parses
// must round-trip: the announcement through ToJson, the version through VersionDirName, and
// the unpacked directory through PackCheckpointBundle.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/channel/draft_channel.h"
#include "tests/fuzz/fuzz_util.h"

using namespace specloop;

namespace {

// A scratch directory under $TMPDIR, removed at exit.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    path = std::string(tmp && *tmp ? tmp : "/tmp") + "/specloop-fuzz-XXXXXX";
    FUZZ_CHECK(mkdtemp(path.data()) != nullptr);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

bool IsLowerHex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);

  DraftAnnouncement a;
  if (DraftAnnouncement::FromJson(input, &a).ok()) {
    FUZZ_CHECK(a.version >= 1 && IsLowerHex64(a.sha256));
    DraftAnnouncement back;
    FUZZ_CHECK(DraftAnnouncement::FromJson(a.ToJson(), &back).ok());
    FUZZ_CHECK(back.version == a.version && back.sha256 == a.sha256 && back.bytes == a.bytes &&
               back.config_sha256 == a.config_sha256);
  }

  uint64_t version = 0;
  if (ParseVersionDirName(input, &version)) {
    uint64_t again = 0;
    FUZZ_CHECK(version >= 1 && ParseVersionDirName(VersionDirName(version), &again));
    FUZZ_CHECK(again == version);
  }

  static const ScratchDir scratch;
  const std::string dir = scratch.path + "/v000001";
  if (UnpackCheckpointBundle(input, dir).ok()) {
    std::string packed;
    FUZZ_CHECK(PackCheckpointBundle(dir, &packed).ok());
    FUZZ_CHECK(packed.size() <= input.size());
    FUZZ_CHECK(UnpackCheckpointBundle(packed, dir).ok());
  }
  return 0;
}
