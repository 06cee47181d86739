#include "proc_stat.h"

#include <fstream>

namespace ddp::detail {

std::string proc_stat_field(pid_t pid, int field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return "";
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return "";
  const std::string rest = stat.substr(paren + 2);  // field 3 onwards
  std::string::size_type pos = 0;
  for (int f = 3; f < field && pos != std::string::npos; ++f) {
    pos = rest.find(' ', pos);
    if (pos != std::string::npos) ++pos;
  }
  if (pos == std::string::npos) return "";
  return rest.substr(pos, rest.find(' ', pos) - pos);
}

}  // namespace ddp::detail
