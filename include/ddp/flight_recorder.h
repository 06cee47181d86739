// The flight recorder: which rank stopped where, after the fact
// (docs/flight_recorder.md).
//
// Every process group of every rank keeps a ring of its last N collectives
// (PyTorch's flight recorder, TORCH_FR_BUFFER_SIZE, for every backend): the
// group's sequence number, the operation, shapes and dtypes, the state
// (started, completed, failed, timed out), start and end times, and the
// DistributedDataParallel step and gradient bucket that issued it. It is on
// by default; its cost is about a microsecond per collective
// (BENCHMARKS.md, "Flight recorder").
//
// Where the rings go:
//   DDP_FLIGHT_RECORDER_DIR set (ddprun sets it to its run directory for
//     every worker): each ring is a file there, mapped into memory and so
//     current at every moment, even for a rank killed with SIGKILL, stopped
//     or hung. A group destroyed without an event removes its file (an
//     error the program reports with record_error() is an event).
//   unset: the ring lives in memory and is written at an event, when a
//     collective is involved (an error or std::terminate with every
//     collective of the ring completed is not; a fatal signal needs one
//     collective in the ring; a dump asked for always writes), to
//     ~/.local/state/ddp/flight/<UTC date-time>_pid<P>/ ($XDG_STATE_HOME/ddp/
//     flight when that is set), never the working directory; the path is
//     printed on stderr.
// Events: a collective timed out, failed, or waited past the stall warning;
// std::terminate (Gloo's aborts); SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT
// (then the signal's default action, so the exit status is unchanged);
// SIGUSR1 from the user (`kill -USR1 <pid>`: the process goes on); and
// dump_flight_recorder(). Signals whose handlers the program installed
// itself are left alone.
// Files: "ddp_flight_<group>_rank<R>.bin". Read them with ddp-trace (a few
// lines: which rank is behind, on which collective, what the others wait
// for; --json for every entry). ddprun prints the same verdict when an
// attempt fails (or is interrupted) and, when a collective is involved,
// keeps the files: in its kept run directory with --log-dir, -r or -t, else
// copied to ~/.local/state/ddp/flight/<run directory>_attempt_<K>/ (the same
// home as above), and prints where.
//
// Environment: DDP_FLIGHT_RECORDER_ENTRIES (ring size, default 2000; 0 turns
// the recorder off), DDP_FLIGHT_RECORDER_DIR (above). Read when a process
// group is created; a bad value throws InvalidArgument naming the variable.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// Notes `reason` as an event on every live process group of this process and
// writes the rings that live in memory to their files (the mapped ones are
// always current). Returns the path of every ring's file. Thread-safe; never
// throws for an unwritable file (that file is simply not complete: check
// with ddp-trace).
std::vector<std::string> dump_flight_recorder(const std::string& reason = "dump requested");

}  // namespace ddp
