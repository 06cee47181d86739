// record_error and the terminate handler (include/ddp/error.h): the
// TORCHELASTIC_ERROR_FILE protocol shared by torchrun and ddprun.
#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
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
#include "ddp/logging.h"
#include "env_names.h"
#include "error_signs.h"
#include "flight/flight_recorder.h"
#include "last_words.h"

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

// How an error follows another rank's failure (ddprun's Note [Root cause]),
// by the texts ddp puts on such errors (error_signs.h): a clause for
// ddprun's summary, or "" when it does not.
std::string consequence_of(const std::string& message) {
  for (const char* sign : detail::kLostPeerSigns) {
    if (message.find(sign) != std::string::npos) return "it lost its connection to a failed rank";
  }
  if (message.find(detail::kReportedByAnotherRank) != std::string::npos) {
    return "it reported the error of the rank that failed";
  }
  return "";
}

bool write_error_file(const std::string& message, const std::string& detail) {
  // Read here, at the failure, not with the launch environment: a program
  // may set it after its start, and a failure must not depend on the other
  // launch variables being well-formed.
  const char* path = std::getenv(env_names::kErrorFile);
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
  // ddprun's (Note [Root cause]); torchrun ignores them.
  j["message"]["extraInfo"]["ddp_timestamp_us"] =
      std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now).count());
  const std::string consequence = consequence_of(message);
  j["message"]["extraInfo"]["ddp_lost_peer"] = consequence.empty() ? "0" : "1";
  j["message"]["extraInfo"]["ddp_consequence"] = consequence;
  return write_atomically(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::terminate_handler previous_handler = nullptr;

// Gloo checks on its transport thread that a peer's message fits the
// operation it was posted for; a mismatch throws there, where nothing can
// catch it, and terminates the process. Its text names sizes, not the cause.
// Newer Gloo says "collective mismatch" or "size doesn't match"; the Gloo
// of Debian's libtorch 1.13 enforces "op.preamble.length <= op.nbytes" (a
// peer's message longer than the buffer posted for it).
bool is_gloo_size_mismatch(const std::string& type, const std::string& what) {
  return type.rfind("gloo::", 0) == 0 &&
         (what.find("collective mismatch") != std::string::npos ||
          what.find("size doesn't match") != std::string::npos ||
          what.find("op.preamble.length <= op.nbytes") != std::string::npos);
}

std::string out_of_step_message(const std::string& gloo_text) {
  return "the ranks are out of step: they issued different collectives (or one "
         "collective with different sizes), so a peer's data does not fit this "
         "rank's operation. Typically one rank left the training loop early "
         "(uneven data) and went on to other collectives. Use ddp::join(model, "
         "loop) for uneven inputs, and run with DDP_DEBUG=1 to have every rank "
         "name the first collective that differs. (Gloo: " + gloo_text + ")";
}

[[noreturn]] void record_and_terminate() {
  if (std::exception_ptr in_flight = std::current_exception()) {
    try {
      std::rethrow_exception(in_flight);
    } catch (const std::exception& e) {
      const std::string type = type_name(e);
      const std::string what = compat::what_without_backtrace(e);
      if (is_gloo_size_mismatch(type, what)) {
        const std::string message = out_of_step_message(what);
        log(LogLevel::kError, "ddp: " + message);
        record_error_message("ddp::MismatchError: " + message);
        // The flight record first: publishing goes through the store.
        flight::note_event_everywhere(("terminate: " + message.substr(0, 300)).c_str());
        detail::publish_last_words(message);  // Note [Last words]
      } else {
        record_error(e);
        detail::publish_last_words(type + ": " + what);
      }
    } catch (...) {
      record_error_message("terminate called after an exception of unknown type");
    }
    // The event is noted (record_error: kept only when a collective did not
    // complete, Note [Kept flight records]); the SIGABRT below adds none.
    flight::abort_follows();
  }
  if (previous_handler != nullptr) previous_handler();
  std::abort();
}

}  // namespace

bool record_error(const std::exception& e) noexcept {
  try {
    const std::string what = compat::what_without_backtrace(e);
    const std::string message = type_name(e) + ": " + what;
    // A failure the program reports keeps its flight records (a ring
    // without an event is removed with its group).
    flight::note_event_everywhere(("error: " + message.substr(0, 300)).c_str(), false,
                                  flight::Keep::kIfUnfinishedCollective);
    return write_error_file(message, message);
  } catch (...) {
    return false;
  }
}

bool record_error_message(const std::string& message) noexcept {
  try {
    flight::note_event_everywhere(("error: " + message.substr(0, 300)).c_str(), false,
                                  flight::Keep::kIfUnfinishedCollective);
    return write_error_file(message, message);
  } catch (...) {
    return false;
  }
}

namespace detail {
namespace {
std::atomic<LastWordsPublisher> g_last_words{nullptr};
}  // namespace

void set_last_words_publisher(LastWordsPublisher publisher) noexcept {
  g_last_words.store(publisher);
}

void publish_last_words(const std::string& message) noexcept {
  if (LastWordsPublisher publish = g_last_words.load()) publish(message);
}
}  // namespace detail

void install_error_file_handler() noexcept {
  static std::once_flag once;
  std::call_once(once, [] { previous_handler = std::set_terminate(record_and_terminate); });
}

}  // namespace ddp
