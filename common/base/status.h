// Status: the result of an operation that can fail, in the shape of leveldb::Status.
//
// An OK status costs nothing but a null pointer; a failed one carries a code and a message.
// Functions at module boundaries return Status (results through out-parameters); exceptions
// thrown by LibTorch, ZeroMQ or httplib are caught at those boundaries and converted.
#pragma once

#include <memory>
#include <string>
#include <utility>

namespace specloop {

class [[nodiscard]] Status {
 public:
  enum class Code { kOk, kNotFound, kCorruption, kInvalidArgument, kIOError, kNotSupported };

  Status() = default;
  Status(const Status& s) : rep_(s.rep_ ? std::make_unique<Rep>(*s.rep_) : nullptr) {}
  Status& operator=(const Status& s) {
    rep_ = s.rep_ ? std::make_unique<Rep>(*s.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status NotSupported(std::string msg) {
    return Status(Code::kNotSupported, std::move(msg));
  }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  bool IsNotFound() const { return code() == Code::kNotFound; }
  bool IsCorruption() const { return code() == Code::kCorruption; }
  bool IsInvalidArgument() const { return code() == Code::kInvalidArgument; }
  bool IsIOError() const { return code() == Code::kIOError; }

  // The message alone ("" when OK).
  const std::string& message() const;
  // "OK", or the code's name, ": ", and the message.
  std::string ToString() const;

  // Prefixes the message with context ("loading model: " + message); OK stays OK.
  Status Annotate(const std::string& context) const;

 private:
  struct Rep {
    Code code;
    std::string msg;
  };
  Status(Code code, std::string msg) : rep_(std::make_unique<Rep>(Rep{code, std::move(msg)})) {}
  std::unique_ptr<Rep> rep_;
};

}  // namespace specloop

// Returns from the enclosing function when `expr` is not OK.
#define SPECLOOP_RETURN_IF_ERROR(expr)        \
  do {                                        \
    ::specloop::Status _st = (expr);          \
    if (!_st.ok()) return _st;                \
  } while (0)
