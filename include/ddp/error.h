// ddp's error policy, in one place (see docs/errors.md).
//
// Every failure that ddp detects is thrown as an exception derived from
// ddp::Error (itself a std::runtime_error). Nothing is reported through return
// codes, and nothing is swallowed. Each message names
//   - the thing at fault: the flag, environment variable, option field,
//     parameter name, rank, file or address;
//   - what was expected and what was found;
//   - a way out ("set MASTER_PORT", "pass find_unused_parameters=true", ...).
// Errors raised by libtorch or Gloo inside a collective are caught at the
// boundary and rethrown as one of the types below, with the collective, its
// sequence number and the rank prepended; the original text is kept.
//
// Thread safety: the exception types are plain values.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Base class of every exception ddp throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the user: a flag, an environment variable, an option, a file
// that is missing or corrupt; or a usage rule broken (a parameter that got no
// gradient without find_unused_parameters, a backward that did not come from
// DistributedDataParallel's forward, a model changed after wrapping). Raised
// before any collective is started where possible, on the rank that saw the
// bad input; the unused-parameter error identically on every rank.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A collective, rendezvous or store operation did not complete within its
// timeout. The message names the operation, the timeout in seconds and, where
// known, the ranks that had not arrived. After a timeout the process group
// is unusable (as in PyTorch): destroy it and exit or re-initialise.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The ranks disagree: different models (parameter count, name, shape, dtype),
// different collectives in the same step (debug mode, or tensors of
// different sizes), different metrics. Raised on every rank involved, each
// naming the first difference and the ranks' values.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// The communication backend failed: a peer closed its connection (crashed or
// was killed), a transport error, a backend that is not compiled in.
class CommError : public Error {
 public:
  using Error::Error;
};

// --- Telling the launcher why a rank failed --------------------------------
//
// torchrun and ddprun give each worker a file path in TORCHELASTIC_ERROR_FILE
// and show what the worker wrote there in their failure summary (the root
// cause; torchrun picks the earliest timestamp). record_error writes
//   {"message": {"message": "<exception type>: <what()>",
//                "extraInfo": {"py_callstack": "<the same>", "timestamp": "<unix s>"}}}
// as PyTorch's @record does for Python programs. It replaces the file
// atomically, returns true when written and false when the variable is
// unset or the file cannot be written; it never throws. It also notes the
// error in the flight records of the process's groups, which keeps them
// (ddp/flight_recorder.h).
//
// Programs need not call it: init_process_group() installs a
// std::terminate handler that records an exception escaping main(), then
// hands over to the previous handler (which aborts). Call it yourself where
// you catch an error and exit with a status instead.
bool record_error(const std::exception& e) noexcept;

// The same with a message of your own (no exception type prepended).
bool record_error_message(const std::string& message) noexcept;

// Installs the std::terminate handler described above; idempotent and
// thread-safe. init_process_group() calls it.
void install_error_file_handler() noexcept;

}  // namespace ddp
