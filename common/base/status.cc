#include "common/base/status.h"

namespace specloop {

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->msg : kEmpty;
}

std::string Status::ToString() const {
  switch (code()) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound: " + message();
    case Code::kCorruption: return "Corruption: " + message();
    case Code::kInvalidArgument: return "InvalidArgument: " + message();
    case Code::kIOError: return "IOError: " + message();
    case Code::kNotSupported: return "NotSupported: " + message();
  }
  return "Unknown: " + message();
}

Status Status::Annotate(const std::string& context) const {
  if (ok()) return *this;
  return Status(code(), context + ": " + message());
}

}  // namespace specloop
