// tefl_status (the C error object) and tefl::Status (its C++ face).
#include <string>

#include "tefl/tefl.hpp"

struct tefl_status {
  int32_t code;
  std::string message;
};

extern "C" {

namespace {
// Returned when allocating an error status fails: never freed, so an error
// never turns into success (NULL) for lack of memory.
tefl_status* OutOfMemoryStatus() {
  static tefl_status* status = new tefl_status{TEFL_RUNTIME_ERROR, "out of memory while reporting an error"};
  return status;
}
}  // namespace

tefl_status* tefl_status_new(int32_t code, const char* message) {
  if (code == TEFL_OK) return nullptr;
  try {
    // A code this host does not know (a plugin built against a later minor
    // that appended one, or a plain mistake) is still a failure: it becomes
    // RUNTIME_ERROR, the number kept in the message, so that every status
    // carries a code the host's callers can switch on.
    if (code < TEFL_UNSUPPORTED || code > TEFL_ABI_MISMATCH)
      return new tefl_status{TEFL_RUNTIME_ERROR,
                             "(unknown status code " + std::to_string(code) + ") " + (message ? message : "")};
    return new tefl_status{code, message ? message : ""};
  } catch (...) {
    return OutOfMemoryStatus();
  }
}

int32_t tefl_status_code_of(const tefl_status* status) { return status ? status->code : TEFL_OK; }

const char* tefl_status_message(const tefl_status* status) { return status ? status->message.c_str() : ""; }

void tefl_status_free(tefl_status* status) {
  if (status != OutOfMemoryStatus()) delete status;
}

}  // extern "C"

namespace tefl {

Status::Status(int32_t code, std::string message) {
  if (code != TEFL_OK) state_ = std::make_shared<const State>(State{code, std::move(message)});
}

Status Status::FromC(tefl_status* status) {
  if (status == nullptr) return Status();
  Status out(status->code, status->message);
  tefl_status_free(status);
  return out;
}

tefl_status* Status::ToC() const { return ok() ? nullptr : tefl_status_new(state_->code, state_->message.c_str()); }

int32_t Status::code() const { return state_ ? state_->code : TEFL_OK; }

const std::string& Status::message() const {
  static const std::string empty;
  return state_ ? state_->message : empty;
}

const char* StatusCodeName(int32_t code) {
  switch (code) {
    case TEFL_OK:
      return "OK";
    case TEFL_UNSUPPORTED:
      return "UNSUPPORTED";
    case TEFL_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case TEFL_NOT_FOUND:
      return "NOT_FOUND";
    case TEFL_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case TEFL_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case TEFL_RUNTIME_ERROR:
      return "RUNTIME_ERROR";
    case TEFL_INTERNAL:
      return "INTERNAL";
    case TEFL_ABI_MISMATCH:
      return "ABI_MISMATCH";
    default:
      return "UNKNOWN";
  }
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code())) + ": " + message();
}

}  // namespace tefl
