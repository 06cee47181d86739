// The usage errors of ddp's programs (ddprun, ddp-train, ddp-trace), with
// CLI11: one form, "<program>: error: <what>; did you mean --x? (see
// <program> --help)", exit status 2. Header-only: each program includes it.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace ddp::cli {

// Edit distance (insertions, deletions, substitutions) of two short names.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The long flag of `app` closest to `given` ("--epoch" -> "--epochs",
// "--nprocs" -> "--nproc-per-node"), "" when none is close: one that starts
// with it, else the longest shared start of at least 4 letters, else one
// within two edits. Hyphens and underscores count alike; a hyphenated
// spelling is preferred.
inline std::string closest_flag(const CLI::App& app, std::string given) {
  auto plain = [](std::string s) {
    while (!s.empty() && s.front() == '-') s.erase(s.begin());
    std::replace(s.begin(), s.end(), '_', '-');
    return s.substr(0, s.find('='));
  };
  given = plain(given);
  if (given.empty()) return "";
  std::string best;
  size_t best_score = 0;  // higher is better
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& raw : opt->get_lnames()) {
      const std::string name = plain(raw);
      size_t shared = 0;
      while (shared < name.size() && shared < given.size() && name[shared] == given[shared]) {
        ++shared;
      }
      size_t score = 0;
      if (name.rfind(given, 0) == 0 && given.size() >= 3) {
        score = 1000 - name.size();  // the shortest completion
      } else if (shared >= 4) {
        score = 500 + shared;
      } else if (edit_distance(name, given) <= 2) {
        score = 100 - edit_distance(name, given);
      }
      if (score > best_score) {
        best_score = score;
        best = "--" + name;
      }
    }
  }
  return best;
}

// The unknown flags among `args` (as given, in order).
inline std::vector<std::string> unknown_flags(const CLI::App& app,
                                              const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (a.size() < 2 || a[0] != '-' || a == "--") continue;
    if (std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.') continue;  // "-3": a value
    const std::string name = a.substr(0, a.find('='));
    std::string spelled = name;
    if (spelled.rfind("--", 0) == 0) std::replace(spelled.begin(), spelled.end(), '_', '-');
    if (app.get_option_no_throw(name) == nullptr && app.get_option_no_throw(spelled) == nullptr &&
        name != "--help" && name != "-h") {
      out.push_back(name);
    }
  }
  return out;
}

// The line for a CLI11 parse error (not help): unknown flags are named in
// the order given, with the closest known flag.
inline std::string usage_error(const std::string& program, const CLI::App& app,
                               const CLI::ParseError& e, const std::vector<std::string>& args) {
  std::string what = e.what();
  const std::vector<std::string> unknown = unknown_flags(app, args);
  if (!unknown.empty()) {
    what.clear();
    for (const std::string& flag : unknown) {
      if (!what.empty()) what += "; ";
      what += "unknown flag " + flag;
      const std::string near = closest_flag(app, flag);
      if (!near.empty()) what += " (did you mean " + near + "?)";
    }
  }
  return program + ": error: " + what + " (see " + program + " --help)";
}

// Exit status of a usage error, as argparse's (torchrun's) and the docs say.
inline constexpr int kUsageExit = 2;

}  // namespace ddp::cli
