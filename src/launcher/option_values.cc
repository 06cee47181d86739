#include "launcher/option_values.h"

#include <fmt/format.h>
#include <glob.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "ddp/error.h"
#include "env_names.h"

namespace ddp::launcher {
namespace {

int count_gpus() {
  if (const char* visible = std::getenv(env_names::kCudaVisibleDevices)) {
    std::string v(visible);
    return v.empty() ? 0 : static_cast<int>(split(v, ',').size());
  }
  glob_t g{};
  int n = 0;
  if (glob("/dev/nvidia[0-9]*", 0, nullptr, &g) == 0) n = static_cast<int>(g.gl_pathc);
  globfree(&g);
  return n;
}

}  // namespace

std::optional<long> parse_long(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> parse_double(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

int StdSpec::for_rank(int local_rank) const {
  if (!is_mapping) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? kStdNone : it->second;
}

bool StdSpec::any() const {
  if (!is_mapping) return all != kStdNone;
  for (const auto& [rank, streams] : per_rank) {
    if (streams != kStdNone) return true;
  }
  return false;
}

StdSpec parse_std_spec(const std::string& text, const std::string& flag) {
  auto bad = [&]() {
    return InvalidArgument(fmt::format(
        "{} '{}' is not valid: expected 0 (none), 1 (stdout), 2 (stderr) or 3 "
        "(both), or per local rank like 0:1,1:2",
        flag, text));
  };
  auto digit = [&](const std::string& s) {
    auto v = parse_long(s);
    if (!v || *v < 0 || *v > 3) throw bad();
    return static_cast<int>(*v);
  };
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = digit(text);
    return spec;
  }
  spec.is_mapping = true;
  for (const std::string& item : split(text, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) throw bad();
    auto rank = parse_long(item.substr(0, colon));
    if (!rank || *rank < 0) throw bad();
    spec.per_rank[static_cast<int>(*rank)] = digit(item.substr(colon + 1));
  }
  return spec;
}

std::set<int> parse_rank_list(const std::string& text, const std::string& flag) {
  std::set<int> ranks;
  for (const std::string& item : split(text, ',')) {
    auto v = parse_long(item);
    if (!v || *v < 0) {
      throw InvalidArgument(fmt::format(
          "{} '{}' is not valid: expected local ranks like 0 or 0,2", flag, text));
    }
    ranks.insert(static_cast<int>(*v));
  }
  return ranks;
}

int resolve_nproc_per_node(const std::string& text) {
  if (auto v = parse_long(text)) {
    if (*v < 1 || *v > 4096) {
      throw InvalidArgument(fmt::format(
          "--nproc-per-node {} is out of range: expected 1..4096, cpu, gpu or "
          "auto",
          text));
    }
    return static_cast<int>(*v);
  }
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (text == "cpu") return cpus;
  if (text == "gpu" || text == "auto") {
    int gpus = count_gpus();
    if (gpus > 0) return gpus;
    if (text == "auto") return cpus;
    throw InvalidArgument(
        "--nproc-per-node gpu: no GPU found (no /dev/nvidia<N>, "
        "CUDA_VISIBLE_DEVICES empty or unset): pass a number or cpu");
  }
  throw InvalidArgument(fmt::format(
      "--nproc-per-node '{}' is not valid: expected a number, cpu, gpu or auto",
      text));
}

}  // namespace ddp::launcher
