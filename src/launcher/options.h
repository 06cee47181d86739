// ddprun's command line: torchrun's flags (both the --nproc-per-node and the
// --nproc_per_node spellings, and PET_* environment defaults, as torchrun),
// parsed with CLI11 into one LaunchOptions value.
//
// Thread safety: plain functions over values; parse_command_line writes to
// the streams it is given.
#pragma once

#include <iosfwd>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp::launcher {

// Which of a worker's standard streams a -r/--redirects or -t/--tee setting
// names; the values are torchrun's (Std): 0 none, 1 stdout, 2 stderr, 3 both.
enum StdStreams : int { kStdNone = 0, kStdOut = 1, kStdErr = 2, kStdAll = 3 };

// A -r or -t value: "3" (every local rank) or "0:1,1:2" (per local rank;
// ranks not named get 0, as in torchrun).
struct StdSpec {
  int all = kStdNone;
  std::map<int, int> per_rank;  // local rank -> StdStreams
  bool is_mapping = false;

  int for_rank(int local_rank) const;  // the StdStreams of one local rank
  bool any() const;                    // whether any rank gets any stream
};

// Parses a -r/-t value. Throws ddp::InvalidArgument naming `flag` when the
// text is neither a digit 0..3 nor a list of local_rank:digit pairs.
StdSpec parse_std_spec(const std::string& text, const std::string& flag);

// Parses --local-ranks-filter: "0", "0,2". Throws InvalidArgument naming the
// flag on anything but comma-separated non-negative integers.
std::set<int> parse_rank_list(const std::string& text, const std::string& flag);

// Resolves --nproc-per-node: a positive integer, "cpu" (online CPUs), "gpu"
// (CUDA_VISIBLE_DEVICES entries if set, else /dev/nvidia<N> devices) or
// "auto" (gpu if there is one, else cpu), as torchrun. Throws InvalidArgument
// naming the flag for other text, zero, or "gpu" without a GPU.
int resolve_nproc_per_node(const std::string& text);

struct LaunchOptions {
  int nproc_per_node = 1;  // workers on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;          // nodes in the job
  int node_rank = 0;       // this node, in [0, nnodes) (GROUP_RANK)
  std::string master_addr = "127.0.0.1";  // host of global rank 0
  int master_port = 29500;  // rank 0's store; with nnodes > 1 also the
                            // launchers' own rendezvous (docs/launcher.md)
  bool standalone = false;  // one node, a free port on 127.0.0.1
  int max_restarts = 0;     // restarts of the whole worker group
  double monitor_interval = 5.0;  // seconds; upper bound between checks
  double grace_period = 5.0;      // seconds between SIGTERM and SIGKILL
  std::string log_dir;            // empty: no log files unless -r/-t
  StdSpec redirects;              // streams that go to files only
  StdSpec tee;                    // streams that go to files and console
  std::optional<std::set<int>> local_ranks_filter;  // console: these only
  std::string run_id = "none";    // TORCHELASTIC_RUN_ID
  std::string role = "default";   // ROLE_NAME
  // torch.distributed.launch without --use-env: append --local_rank=N.
  bool legacy_local_rank_arg = false;
  // Multi-node rendezvous of the launchers (torchrun's --rdzv-conf keys).
  double join_timeout = 600.0;       // seconds for every node to join
  double keep_alive_interval = 5.0;  // seconds between heartbeats
  int keep_alive_max_attempt = 3;    // missed heartbeats before giving up
  std::vector<std::string> program;  // the program and its arguments

  int world_size() const { return nnodes * nproc_per_node; }
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
