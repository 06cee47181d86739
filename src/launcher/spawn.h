// Starting one worker: fork + exec with its own process group, its stdout
// and stderr on pipes read by the launcher (relay.h), and death tied to the
// launcher's.
//
// Why a process group per worker: ddprun stops a worker by signalling its
// whole group (kill(-pgid)), which reaches the helpers the worker started
// (data loader processes, shells). Why PR_SET_PDEATHSIG: if the launcher
// itself is killed (SIGKILL, OOM killer) its workers die too instead of
// holding ports and GPUs.
//
// Thread safety: call from the launcher's main thread only (the death signal
// is tied to the thread that forks).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp::launcher {

struct WorkerCommand {
  std::string path;               // absolute or relative path to execute
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // complete environment, "KEY=VALUE"
  bool stdin_null = false;        // /dev/null as stdin instead of ours
};

struct SpawnedWorker {
  pid_t pid = -1;     // also the worker's process group id
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec; owned by
  int stderr_fd = -1;  // the caller
};

// Finds `program` as execvp would: a name with a '/' is used as is, others
// are looked up in PATH. Throws ddp::InvalidArgument naming the program
// when it does not exist or is not executable, with a way out.
std::string resolve_program(const std::string& program);

// Starts the worker. Returns once exec has succeeded. Throws
// ddp::InvalidArgument with exec's reason (naming the program) when exec
// fails, ddp::Error when fork or pipe fails; nothing is left running then.
SpawnedWorker spawn_worker(const WorkerCommand& command);

}  // namespace ddp::launcher
