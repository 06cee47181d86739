// ddprun's command line: torchrun's flags (both the --nproc-per-node and the
// --nproc_per_node spellings, and PET_* environment defaults, as torchrun),
// parsed with CLI11 into one LaunchOptions value.
//
// Thread safety: plain functions over values; parse_command_line writes to
// the streams it is given.
#pragma once

#include <csignal>
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/option_values.h"

namespace ddp::launcher {

// LaunchOptions::node_rank before the c10d rendezvous assigned it.
inline constexpr int kNodeRankAtRendezvous = -1;

struct LaunchOptions {
  int nproc_per_node = 1;  // workers on this node (LOCAL_WORLD_SIZE)
  // Nodes in the job; with --nnodes MIN:MAX, those of the current round
  // (set by the rendezvous before each start, control.h).
  int nnodes = 1;
  // --nnodes MIN:MAX (both equal to nnodes for a fixed count). Elastic when
  // they differ: needs --rdzv-backend c10d, node ranks are assigned anew at
  // every round (Note [Elastic rounds] in control.h).
  int min_nnodes = 1;
  int max_nnodes = 1;
  // This node, in [0, nnodes) (GROUP_RANK); kNodeRankAtRendezvous with
  // --rdzv-backend c10d and no --node-rank: assigned as nodes arrive (the
  // node hosting the rendezvous is 0), as torchrun's c10d rendezvous does.
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // host of global rank 0
  // --rdzv-conf is_host: whether this node may host the c10d rendezvous
  // (unset: when --rdzv-endpoint's host is one of this machine's addresses).
  std::optional<bool> rdzv_is_host;
  // --rdzv-backend c10d (messages then name --rdzv-endpoint and --rdzv-id
  // rather than --master-addr/--master-port).
  bool rdzv_c10d = false;
  int master_port = 29500;  // rank 0's store; with nnodes > 1 also the
                            // launchers' own rendezvous (docs/launcher.md)
  bool standalone = false;  // one node, a free port on 127.0.0.1
  int max_restarts = 0;     // restarts of the whole worker group
  double monitor_interval = 5.0;  // seconds; upper bound between checks
  double grace_period = 5.0;      // seconds between SIGTERM and SIGKILL
  // Signals that stop the job and are forwarded (--signals-to-handle).
  std::vector<int> stop_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  // --virtual-local-rank: LOCAL_RANK=0, one CUDA_VISIBLE_DEVICES each.
  bool virtual_local_rank = false;
  std::string log_dir;            // empty: no log files unless -r/-t
  StdSpec redirects;              // streams that go to files only
  StdSpec tee;                    // streams that go to files and console
  std::optional<std::set<int>> local_ranks_filter;  // console: these only
  std::string run_id = "none";    // TORCHELASTIC_RUN_ID
  std::string role = "default";   // ROLE_NAME
  // --log-line-prefix-template (torchrun 2.14): the console prefix with
  // ${role_name}, ${local_rank}, ${rank} and ${hostname} substituted; empty:
  // "[rankN]:" when more than one rank shares the console.
  std::string log_line_prefix_template;
  // --local-addr: an address of this machine; the workers' Gloo binds it
  // (DDP_LOCAL_ADDR) unless GLOO_SOCKET_IFNAME names an interface, and the
  // other launchers see it as this node's address. Empty: the address that
  // routes to the master.
  std::string local_addr;
  // torch.distributed.launch without --use-env: append --local_rank=N.
  bool legacy_local_rank_arg = false;
  // Multi-node rendezvous of the launchers (torchrun's --rdzv-conf keys).
  double join_timeout = 600.0;       // seconds for every node to join
  // Elastic: seconds to wait for more nodes (up to max_nnodes) once
  // min_nnodes are in, before a round starts (torchrun's default).
  double last_call_timeout = 30.0;
  double keep_alive_interval = 5.0;  // seconds between heartbeats
  int keep_alive_max_attempt = 3;    // missed heartbeats before giving up
  std::vector<std::string> program;  // the program and its arguments

  // Node ranks come from the c10d rendezvous (no --node-rank): the job
  // runs in rounds even with a fixed --nnodes N, which is torchrun's N:N.
  bool rendezvous_ranks = false;

  int world_size() const { return nnodes * nproc_per_node; }
  // Runs in rounds (Note [Elastic rounds]): --nnodes MIN:MAX, or a fixed
  // count of several nodes ranked by the c10d rendezvous.
  bool elastic() const {
    return min_nnodes != max_nnodes || (rendezvous_ranks && max_nnodes > 1);
  }
  // "N", or "MIN:MAX" for a range: --nnodes as given.
  std::string nnodes_spec() const {
    return min_nnodes != max_nnodes
               ? std::to_string(min_nnodes) + ":" + std::to_string(max_nnodes)
               : std::to_string(max_nnodes);
  }
  // Global rank of a local rank: node_rank * nproc_per_node + local_rank.
  int global_rank(int local_rank) const {
    return node_rank * nproc_per_node + local_rank;
  }
};

// Parses argv. Returns the exit code to leave with when the command line was
// --help, --version or an error (the text written to `out` or `err`), and
// nullopt when `options` holds a job to run. Launcher flags come first; the
// first argument that is not a flag (or everything after "--") is the
// program, and every later argument belongs to it.
std::optional<int> parse_command_line(int argc, const char* const* argv,
                                      LaunchOptions& options, std::ostream& out,
                                      std::ostream& err);

}  // namespace ddp::launcher
