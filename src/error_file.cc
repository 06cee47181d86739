// record_error and the terminate handler (include/ddp/error.h): the
// TORCHELASTIC_ERROR_FILE protocol shared by torchrun and ddprun.
#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <typeinfo>

#include "compat/torch_compat.h"
#include "ddp/error.h"

namespace ddp {
namespace {

std::string type_name(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name ? name.get() : mangled;
}

// Writes `text` to `path` through a temporary file and rename(), so a
// launcher never reads half a file.
bool write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = done == text.size() && ::close(fd) == 0;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool write_error_file(const std::string& message, const std::string& detail) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return false;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json j;
  j["message"]["message"] = message;
  // torchrun's summary prints py_callstack (as the failure's "traceback"),
  // not the message; a C++ program has no Python stack, so it holds the
  // message with the exception's type.
  j["message"]["extraInfo"]["py_callstack"] = detail;
  j["message"]["extraInfo"]["timestamp"] =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count());
  return write_atomically(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::terminate_handler previous_handler = nullptr;

[[noreturn]] void record_and_terminate() {
  if (std::exception_ptr in_flight = std::current_exception()) {
    try {
      std::rethrow_exception(in_flight);
    } catch (const std::exception& e) {
      record_error(e);
    } catch (...) {
      record_error_message("terminate called after an exception of unknown type");
    }
  }
  if (previous_handler != nullptr) previous_handler();
  std::abort();
}

}  // namespace

bool record_error(const std::exception& e) noexcept {
  try {
    const std::string what = compat::what_without_backtrace(e);
    const std::string message = type_name(e) + ": " + what;
    return write_error_file(message, message);
  } catch (...) {
    return false;
  }
}

bool record_error_message(const std::string& message) noexcept {
  try {
    return write_error_file(message, message);
  } catch (...) {
    return false;
  }
}

void install_error_file_handler() noexcept {
  static std::once_flag once;
  std::call_once(once, [] { previous_handler = std::set_terminate(record_and_terminate); });
}

}  // namespace ddp
