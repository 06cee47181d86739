// One rank of process_group_test's multi-process tests.
//
//   process_group_worker <init_method> <rank> <world_size> <timeout_ms>
//                        <action> [backend [collective_timeout_ms]]
//
// Joins a group (rank/world_size -1: from the environment, for env://),
// prints "joined rank R world W local_rank L source S agent_store A restart
// N" (A, N: TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT as
// read), then does <action>:
//   allreduce  all_reduce of a tensor holding rank+1 (bounded by
//              collective_timeout_ms when given); prints "sum X"
//   exit       leaves at once without a collective (a rank that crashed)
//   sleep      sleeps 60 s without taking part (a rank that hangs)
//   mismatch   all_reduce of 1000 floats on rank 0 and 3 on the others:
//              ranks out of step (Gloo terminates the receiving process)
//   uncaught   throws ddp::InvalidArgument("rank R: deliberate uncaught
//              error") out of main(): the terminate handler installed by
//              init_process_group writes TORCHELASTIC_ERROR_FILE, then aborts
//   fail-first rank 0 records an error (TORCHELASTIC_ERROR_FILE), leaves the
//              group (its peers, in an all_reduce, see it go) and exits
//              only 3 s later (a slow exit); the others fail at once
//              (ddprun's Note [Root cause])
//   segv       the all_reduce, then rank 1 raises SIGSEGV (the flight
//              recorder's fatal-signal event); the others go on to barrier
// then, for allreduce, a barrier and destroy_process_group().
// Errors go to stderr as "error <Type>: <message>"; the exit code says the
// type: 2 InvalidArgument, 3 TimeoutError, 4 CommError, 5 other,
// 6 MismatchError.
#include <ATen/ops/full.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddp/collectives.h"
#include "ddp/env.h"
#include "ddp/error.h"
#include "ddp/process_group.h"

namespace {

int fail(const char* type, int code, const std::exception& e) {
  std::fprintf(stderr, "error %s: %s\n", type, e.what());
  ddp::record_error(e);  // as a ddp program does (for its launcher's summary)
  return code;
}

int run(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s init_method rank world_size timeout_ms action [backend]\n",
                 argv[0]);
    return 64;
  }
  ddp::InitOptions options;
  options.init_method = argv[1];
  options.rank = std::atoi(argv[2]);
  options.world_size = std::atoi(argv[3]);
  options.timeout = std::chrono::milliseconds(std::atol(argv[4]));
  const std::string action = argv[5];
  if (argc > 6) options.backend = argv[6];
  ddp::CollectiveOptions collective;
  if (argc > 7) collective.timeout = std::chrono::milliseconds(std::atol(argv[7]));

  ddp::init_process_group(options);
  const int rank = ddp::get_rank();
  const int world = ddp::get_world_size();
  const ddp::LaunchEnv env = ddp::read_launch_env();
  std::printf("joined rank %d world %d local_rank %d source %s agent_store %d restart %d\n",
              rank, world, ddp::get_local_rank(), ddp::to_string(env.source),
              env.use_agent_store ? 1 : 0, env.restart_count);
  std::fflush(stdout);
  if (action == "exit") std::_Exit(0);
  if (action == "uncaught") {
    throw ddp::InvalidArgument("rank " + std::to_string(rank) + ": deliberate uncaught error");
  }
  if (action == "fail-first" && rank == 0) {
    ddp::record_error(ddp::InvalidArgument("rank 0: the first failure"));
    std::fprintf(stderr, "rank 0: the first failure\n");
    std::fflush(stderr);
    ddp::destroy_process_group();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    return 7;
  }
  if (action == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  const int64_t n = action == "mismatch" ? (rank == 0 ? 1000 : 3) : 4;
  at::Tensor t = at::full({n}, static_cast<double>(rank + 1), at::kFloat);
  ddp::all_reduce(t, ddp::ReduceOp::SUM, collective);
  std::printf("sum %g\n", t[0].item<double>());
  std::fflush(stdout);
  if (action == "segv" && rank == 1) ::raise(SIGSEGV);
  if (action == "stop" && rank == 1) {  // stopped shortly after a collective
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::raise(SIGSTOP);
  }
  ddp::barrier();  // rank 0 hosts the store: nobody leaves before the others
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 5 && std::string(argv[5]) == "uncaught") return run(argc, argv);
  try {
    return run(argc, argv);
  } catch (const ddp::InvalidArgument& e) {
    return fail("InvalidArgument", 2, e);
  } catch (const ddp::TimeoutError& e) {
    return fail("TimeoutError", 3, e);
  } catch (const ddp::CommError& e) {
    return fail("CommError", 4, e);
  } catch (const ddp::MismatchError& e) {
    return fail("MismatchError", 6, e);
  } catch (const std::exception& e) {
    return fail("other", 5, e);
  }
}
