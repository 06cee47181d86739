// Helpers of the worker group (worker_group.h): where each stream goes, the
// files of an attempt, and finding what workers left behind.
//
// Thread safety: plain functions; kill_stray_children() acts on the whole
// launcher process.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/relay.h"

namespace ddp::launcher {

// Where stream `which` (kStdOut or kStdErr) of `local_rank` goes: the
// console unless redirected (-r) or filtered out (--local-ranks-filter),
// prefixed "[rankN]:" when `prefix`; dir/stdout.log or dir/stderr.log when
// logged (log_all_streams, -r or -t); stderr keeps its last lines for the
// failure summary.
// torchrun's --log-line-prefix-template with its macros substituted for
// one worker: ${role_name}, ${local_rank}, ${rank}, ${hostname}.
std::string line_prefix(const std::string& templ, const LaunchOptions& options, int local_rank);

StreamRoute stream_route(const LaunchOptions& options, int local_rank, int which,
                         bool prefix, const std::string& dir,
                         bool log_all_streams);

// mkdir -p. Throws ddp::InvalidArgument naming the path on failure.
void make_directories(const std::string& path);

// attempt_dir/<local_rank>/error.json if the worker wrote it (non-empty),
// else "".
std::string existing_error_file(const std::string& attempt_dir, int local_rank);

// Seconds since the epoch, for the summary's times.
double wall_clock_seconds();

// Whether any process is still in one of these process groups.
bool any_group_alive(const std::vector<pid_t>& groups);

// SIGKILLs and reaps the launcher's remaining children: helpers that left
// their worker's process group and were handed to ddprun (a child
// subreaper) when their parent died. Waits at most ~2 s.
void kill_stray_children();

}  // namespace ddp::launcher
