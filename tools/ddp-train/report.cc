#include "report.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/error.h"
#include "ddp/logging.h"

namespace ddp::train {
namespace {

std::string clock_text(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

}  // namespace

Progress::Progress(bool terminal, int log_every, int epoch, int epochs, int64_t steps_in_epoch,
                   int64_t first_step)
    : terminal_(terminal),
      log_every_(log_every),
      epoch_(epoch),
      epochs_(epochs),
      steps_(steps_in_epoch),
      start_(std::chrono::steady_clock::now()),
      start_step_(first_step) {}

bool Progress::due(int64_t step) const {
  // A bar is redrawn often, lines every log_every steps; the last step
  // always shows.
  int every = terminal_ ? 10 : log_every_;
  return step % every == 0 || step == steps_;
}

void Progress::show(int64_t step, int64_t window, double loss, double accuracy,
                    double samples_per_s) {
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double per_step = step > start_step_ ? elapsed / double(step - start_step_) : 0.0;
  std::string eta = per_step > 0 ? clock_text(per_step * double(steps_ - step)) : "?";
  std::string numbers =
      fmt::format("last {} step{}: loss {:.4f} acc {:.2f} % | {:.0f} samples/s | ETA {}", window,
                  window == 1 ? "" : "s", loss, accuracy * 100, samples_per_s, eta);
  if (terminal_) {
    const int width = 30;
    int filled = steps_ > 0 ? static_cast<int>(width * step / steps_) : width;
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    std::fprintf(stdout, "\repoch %d/%d [%s] %lld/%lld %s   ", epoch_, epochs_, bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(steps_), numbers.c_str());
    std::fflush(stdout);
  } else {
    ddp::print0(fmt::format("epoch {}/{} step {}/{} {}", epoch_, epochs_, step, steps_, numbers));
  }
}

void Progress::finish() {
  if (terminal_) {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
}

bool stdout_reaches_terminal(const LaunchEnv& launch) {
  return ::isatty(STDOUT_FILENO) != 0 || launch.stdout_reaches_terminal;
}

std::string directory_problem(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("{} '{}' cannot be created: {}", flag, dir, ec.message());
  const std::string probe = fmt::format("{}/.ddp-train-probe.{}", dir, ::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return fmt::format("{} '{}' cannot be written: {}", flag, dir, std::strerror(errno));
  }
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) {
    return fmt::format("{} '{}' cannot be written: {}", flag, dir, std::strerror(write_errno));
  }
  return "";
}

void append_metrics(const std::string& path, const EpochRecord& r) {
  nlohmann::json j = {{"epoch", r.epoch},
                      {"steps", r.steps},
                      {"train_loss", r.train_loss},
                      {"train_accuracy", r.train_accuracy},
                      {"test_loss", r.test_loss},
                      {"test_accuracy", r.test_accuracy},
                      {"test_images", r.test_images},
                      {"samples_per_s", r.samples_per_s},
                      {"epoch_time_s", r.epoch_time_s},
                      {"wall_time_s", r.wall_time_s},
                      {"world_size", r.world_size},
                      {"global_batch", r.global_batch}};
  std::string line = j.dump() + "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    throw InvalidArgument(
        fmt::format("ddp-train: cannot append to {}: {} (check --out-dir)", path, std::strerror(err)));
  }
}

bool plot_metrics(const std::string& jsonl, const std::string& png) {
  std::ifstream in(jsonl);
  std::string dat = png + ".dat";
  int last_epoch = 1;
  {
    std::ofstream out(dat);
    out << "# epoch train_loss test_loss train_accuracy test_accuracy\n";
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;
      out << j["epoch"] << " " << j["train_loss"] << " " << j["test_loss"] << " "
          << 100 * j.value("train_accuracy", 0.0) << " " << 100 * j.value("test_accuracy", 0.0)
          << "\n";
      last_epoch = std::max(last_epoch, j.value("epoch", 0));
    }
  }
  std::string script = png + ".gp";
  {
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 1000,420 noenhanced\n"
       << "set output '" << png << "'\n"
       << "set multiplot layout 1,2 title 'ddp-train: Fashion-MNIST'\n"
       // Whole epochs on the axis, with room around the first and last
       // (a one-epoch run's point sits inside the frame).
       << "set xlabel 'epoch'\nset xtics 1\nset xrange [0.5:" << last_epoch << ".5]\n"
       << "set offsets 0, 0, graph 0.05, graph 0.05\nset grid\nset key top right\n"
       << "set title 'loss'\nplot '" << dat << "' u 1:2 w lp t 'train', '' u 1:3 w lp t 'test'\n"
       << "set key bottom right\nset title 'accuracy (%)'\nset format y '%g %%'\n"
       << "plot '" << dat << "' u 1:4 w lp t 'train', '' u 1:5 w lp t 'test'\n"
       << "unset multiplot\n";
  }
  std::string cmd = "gnuplot '" + script + "' >/dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  std::filesystem::remove(script);
  std::filesystem::remove(dat);
  if (rc != 0) {
    ddp::log0(LogLevel::kWarning,
              "ddp-train: could not draw " + png +
                  " (is gnuplot installed? apt-get install gnuplot-nox); metrics.jsonl is complete");
    return false;
  }
  return true;
}

}  // namespace ddp::train
