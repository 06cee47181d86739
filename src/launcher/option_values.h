// The values of ddprun's flags that CLI11 does not convert itself: the
// numbers inside flag text, torchrun's stream selections (-r/-t), local rank
// lists, and --nproc-per-node names.
//
// Thread safety: plain functions over values.
#pragma once

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

// The whole of `text` as a base-10 integer (strtol's form: leading blanks
// and a sign allowed), or nullopt when it is empty, has anything after the
// number, or is out of long's range. Callers word their own messages: each
// names its flag and what it expects.
std::optional<long> parse_long(const std::string& text);

// The whole of `text` as a number (strtod's forms: 1.5, 30, 1e3), or nullopt
// when it is empty, has anything after the number, or is out of range.
std::optional<double> parse_double(const std::string& text);

// Splits `s` at every `sep`, keeping empty fields ("a,,b" -> a, "", b;
// "" -> one empty field), so that callers can name an empty item.
std::vector<std::string> split(const std::string& s, char sep);

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

}  // namespace ddp::launcher
