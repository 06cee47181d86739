#include "launcher/launcher.h"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "ddp/error.h"
#include "env_names.h"
#include "flight/flight_home.h"
#include "launcher/control.h"
#include "launcher/flight_report.h"
#include "launcher/group_support.h"
#include "launcher/net.h"
#include "launcher/relay.h"
#include "launcher/run_dir.h"
#include "launcher/spawn.h"
#include "launcher/summary.h"
#include "launcher/worker_group.h"

extern char** environ;

namespace ddp::launcher {
namespace {

struct Job {
  const LaunchOptions& o;
  std::string program;  // resolved path
  RunDir& dir;
  SignalWatch& signals;

  // `round` numbers the attempt's directory: the restart count, but an
  // elastic job also starts a round when its nodes change.
  GroupSpec spec(const AttemptInfo& attempt, int round) const {
    GroupSpec s;
    s.options = &o;
    s.attempt = attempt;
    s.program_path = program;
    s.attempt_dir = dir.attempt_dir(round);
    s.attempt.flight_dir = flight_dir_of_attempt(s.attempt_dir);
    s.log_all_streams = !o.log_dir.empty();
    return s;
  }
};

int exit_code_for(int interrupt_signal) {
  return interrupt_signal != 0 ? 128 + interrupt_signal : kExitFailure;
}

bool restart_allowed(const LaunchOptions& o, int restart_count) {
  if (restart_count >= o.max_restarts) return false;
  launcher_message(fmt::format("restarting the worker group (restart {} of {})",
                               restart_count + 1, o.max_restarts));
  return true;
}

// The flight recorder's verdict over this node's ranks (flight_report.h).
// The rings are in the user's DDP_FLIGHT_RECORDER_DIR, or in the attempt's
// directory, copied to <flight::records_home()>/<run directory>_attempt_<K>
// (~/.local/state/ddp/flight/...) when the run directory is temporary.
void report_flight_records(const Job& job, int restart_count,
                           const std::vector<WorkerResult>& local, int interrupt_signal) {
  const char* own = std::getenv(env_names::kFlightRecorderDir);
  std::string dir, copy_to;
  if (own != nullptr && *own != '\0') {
    dir = own;
  } else {
    dir = flight_dir_of_attempt(job.dir.attempt_dir(restart_count));
    if (!job.dir.kept()) {
      const std::string& run = job.dir.path();
      copy_to = fmt::format("{}/{}_attempt_{}", flight::records_home(),
                            run.substr(run.rfind('/') + 1), restart_count);
    }
  }
  // A directory of the user's may hold other runs' rings: only this
  // attempt's workers' count. The attempt's own directory holds nothing else
  // (and a worker started through a wrapper that forks has another pid).
  std::vector<int> pids;
  if (copy_to.empty() && own != nullptr && *own != '\0') {
    for (const WorkerResult& w : local) pids.push_back(static_cast<int>(w.pid));
  }
  // What ddprun saw, which the rings cannot say (flight_verdict.h).
  flight::AttemptFacts facts;
  facts.interrupt_signal = interrupt_signal;
  for (const WorkerResult& w : local) {
    facts.endings.push_back({static_cast<int>(w.pid), w.end == WorkerEnd::kFailed,
                             w.end == WorkerEnd::kStopped, w.exit_code, w.signal});
  }
  bool copy_failed = false;
  const std::string text = flight_report(dir, copy_to, pids, facts, &copy_failed);
  if (copy_failed) job.dir.keep();  // the text names it
  if (!text.empty()) write_all(STDERR_FILENO, "ddprun: " + text);
}

void print_summary(const Job& job, const FailureReport& root,
                   const std::vector<WorkerResult>& local,
                   std::vector<std::string> notes, int restart_count, int round,
                   int interrupt_signal) {
  std::string title = fmt::format("{} failed (attempt {} of {})", job.o.program[0],
                                  restart_count + 1, job.o.max_restarts + 1);
  write_all(STDERR_FILENO, format_summary(title, root, local, notes));
  report_flight_records(job, round, local, interrupt_signal);
}

int single_node(const Job& job) {
  const LaunchOptions& o = job.o;
  for (int k = 0;; ++k) {
    AttemptInfo a{k, o.master_addr, o.standalone ? pick_free_port() : o.master_port};
    if (o.standalone) a.store_file = job.dir.attempt_dir(k) + "/rendezvous.store";
    if (!o.standalone) check_master_port(a.master_port);
    GroupResult g = run_worker_group(job.spec(a, k), job.signals);
    if (g.outcome == GroupOutcome::kSucceeded) return kExitSuccess;
    if (g.outcome == GroupOutcome::kFailed) {
      print_summary(job, make_failure_report(g.workers[g.root_cause], o.node_rank),
                    g.workers, {}, k, k, g.interrupt_signal);
      if (g.interrupt_signal == 0 && restart_allowed(o, k)) continue;
    } else {
      report_flight_records(job, k, g.workers, g.interrupt_signal);  // interrupted
    }
    return exit_code_for(g.interrupt_signal);
  }
}

// `live` is the launcher's options, which job.o refers to: in an elastic job
// the coordinator sets the node count of each round there.
int coordinate(const Job& job, LaunchOptions& live, int listener) {
  const LaunchOptions& o = job.o;
  Coordinator c(live, job.signals);
  c.join(listener);
  for (int k = 0, round = 0;; ++round) {
    GroupResult g;
    try {
      if (!o.elastic()) check_master_port(o.master_port);
      const int store_port = c.start_attempt(k, round);
      g = run_worker_group(job.spec({k, o.master_addr, store_port}, round), job.signals, &c);
    } catch (const std::exception& e) {
      c.finish_job(kExitFailure, fmt::format("node 0 could not start its workers: {}", e.what()));
      throw;
    }
    AttemptOutcome a = c.finish_attempt(g);
    if (a.succeeded) {
      c.finish_job(kExitSuccess, "");
      return kExitSuccess;
    }
    if (a.membership_changed) {  // Note [Elastic rounds]: no restart used up
      launcher_message(fmt::format("round {} ended: {}; forming the next round", round, a.reason));
      for (const std::string& note : a.notes) launcher_message(note);
      c.join();
      continue;
    }
    if (a.root) {
      print_summary(job, *a.root, g.workers, a.notes, k, round, a.interrupt_signal);
    } else {
      launcher_message("the job failed: " + a.reason);
      for (const std::string& note : a.notes) launcher_message(note);
      report_flight_records(job, round, g.workers, a.interrupt_signal);
    }
    if (a.restartable && restart_allowed(o, k)) {
      ++k;
      continue;
    }
    c.finish_job(kExitFailure, a.root            ? root_cause_line(*a.root)
                               : a.reason.empty() ? "a node failed"
                                                  : a.reason);
    return exit_code_for(a.interrupt_signal);
  }
}

// `live`: as in coordinate(); each start order sets this node's rank and
// the node count of the round there.
int follow(const Job& job, LaunchOptions& live, Agent& agent) {
  const LaunchOptions& o = job.o;
  while (true) {
    Order order = agent.next_order();
    if (order.kind == Order::kLost) {
      launcher_message(order.reason);
      return kExitFailure;
    }
    if (order.kind == Order::kDone) {
      if (order.exit_code != 0) launcher_message("the job failed: " + order.reason);
      return order.exit_code == 0 ? kExitSuccess : kExitFailure;
    }
    const int k = order.restart_count;
    const int round = order.round;
    live.node_rank = order.node_rank;
    live.nnodes = order.nnodes;
    GroupResult g;
    try {
      g = run_worker_group(job.spec({k, o.master_addr, order.master_port}, round), job.signals,
                           &agent);
    } catch (const std::exception&) {
      GroupResult failed;
      failed.outcome = GroupOutcome::kFailed;
      agent.report_exit(round, failed);
      throw;
    }
    agent.report_exit(round, g);
    if (g.outcome == GroupOutcome::kFailed) {
      print_summary(job, make_failure_report(g.workers[g.root_cause], o.node_rank),
                    g.workers, {}, k, round, g.interrupt_signal);
    } else if (g.outcome == GroupOutcome::kStopped) {
      launcher_message(fmt::format("stopped this node's workers: {}", g.stop_reason));
      // This node's part of the picture.
      report_flight_records(job, round, g.workers, g.interrupt_signal);
    }
    if (g.interrupt_signal != 0) return exit_code_for(g.interrupt_signal);
  }
}

// The c10d rendezvous without --node-rank (torchrun's is_host): a node whose
// address the endpoint names hosts it if it can bind the port first; the
// others (and a second launcher on that host) join it. Returns the
// listening socket of the host, -1 for the others.
int claim_rendezvous(LaunchOptions& o) {
  if (o.node_rank != kNodeRankAtRendezvous) return -1;
  if (!o.rdzv_is_host.value_or(is_local_host(o.master_addr))) return -1;
  const int fd = try_listen_on(o.master_port);
  if (fd >= 0) o.node_rank = 0;
  return fd;
}

}  // namespace

int run_launcher(const LaunchOptions& given) {
  LaunchOptions o = given;  // the node rank may come from the rendezvous
  try {
    // Helpers that leave their worker's process group are handed to us when
    // their parent dies, so that nothing outlives the job (group_support.h).
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    const std::string program = resolve_program(o.program[0]);
    set_stop_signals(o.stop_signals);
    SignalWatch signals;
    if (sets_omp_num_threads(o, environ)) {
      launcher_message(fmt::format(
          "setting OMP_NUM_THREADS=1 for each of the {} workers (it was unset) so "
          "that they do not overload the CPUs; set it yourself to tune",
          o.nproc_per_node));
    }
    RunDir dir(o);
    Job job{o, program, dir, signals};
    if (o.nnodes == 1) return single_node(job);
    const int listener = claim_rendezvous(o);
    if (o.node_rank == 0) return coordinate(job, o, listener);
    Agent agent(o, signals);
    o.node_rank = agent.join();  // job and agent see it: they refer to o
    return follow(job, o, agent);
  } catch (const Interrupted& i) {
    return exit_code_for(i.signal);
  } catch (const std::exception& e) {
    launcher_message(fmt::format("error: {}", e.what()));
    return kExitFailure;
  }
}

}  // namespace ddp::launcher
