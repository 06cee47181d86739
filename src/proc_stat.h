// Fields of /proc/PID/stat: whether a process still runs (the peers of the
// shared-memory all_reduce) and which process a pid was (ddprun's run
// directories, whose owner's pid may be reused). Linux only, libtorch-free;
// compiled once for both libddp and ddp_launcher (src/CMakeLists.txt).
//
// Thread safety: plain functions; each call reads the file afresh.
#pragma once

#include <sys/types.h>

#include <string>

namespace ddp::detail {

// Field `field` of /proc/PID/stat, numbered from 1 as in proc(5) (3: the
// state, like "S" or "Z"; 22: the start time in clock ticks since boot), or
// "" when there is no such process, the file cannot be read or the field is
// missing. Fields are counted after the last ')': the command (field 2) may
// itself hold spaces and parentheses. `field` must be 3 or more.
std::string proc_stat_field(pid_t pid, int field);

}  // namespace ddp::detail
