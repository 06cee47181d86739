// A worker program for ddprun's tests: no libtorch, behaviour chosen by
// flags. It runs --steps steps of --step-seconds each, printing
// "rank R step S" to stdout, and can: fail with an exit code or a signal at a
// step (on one rank), fail only the first time (a marker file), resume from
// a per-rank checkpoint, write a torchelastic error file, print its
// environment, arguments or many lines, start helper processes, ignore
// SIGTERM/SIGINT (or abort on SIGTERM), and announce that it is up with a
// file.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    auto eq = s.find('=');
    if (eq != std::string::npos) {
      a[s.substr(2, eq - 2)] = s.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      a[s.substr(2)] = argv[++i];
    } else {
      a[s.substr(2)] = "1";
    }
  }
  return a;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void print_env() {
  const char* names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                         "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                         "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                         "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
                         "DDP_RENDEZVOUS_FILE"};
  std::string out;
  for (const char* n : names) {
    const char* v = std::getenv(n);
    out += std::string("env ") + n + "=" + (v ? v : "<unset>") + "\n";
  }
  std::cout << out << std::flush;
}

// A child that sleeps, and a grandchild in its own session (escaping the
// worker's process group): both must still die with the job.
void spawn_helpers() {
  if (fork() == 0) {
    if (fork() == 0) {
      setsid();
      execlp("sleep", "sleep", "300", nullptr);
      _exit(127);
    }
    execlp("sleep", "sleep", "300", nullptr);
    _exit(127);
  }
}

void print_lines(int rank, int n, std::size_t width) {
  std::string pad(width, 'x');
  for (int i = 0; i < n; ++i) {
    std::printf("line %d of rank %d %s\n", i, rank, pad.c_str());
    std::fprintf(stderr, "err %d of rank %d\n", i, rank);
  }
  std::fflush(stdout);
}

[[noreturn]] void fail(const std::map<std::string, std::string>& a, int rank, int step) {
  std::fprintf(stderr, "rank %d failing at step %d\n", rank, step);
  if (a.count("error-message")) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    write_file(path, "{\"message\": {\"message\": \"" + a.at("error-message") +
                         "\", \"extraInfo\": {\"py_callstack\": \"frame one\\nframe two\", "
                         "\"timestamp\": \"0\"}}}");
  }
  std::fflush(nullptr);
  if (a.count("signal")) {
    int sig = std::atoi(a.at("signal").c_str());
    rlimit no_core{0, 0};  // SIGSEGV and SIGABRT: no core file in the build
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(sig, SIG_DFL);
    ::kill(getpid(), sig);
  }
  std::_Exit(a.count("exit-code") ? std::atoi(a.at("exit-code").c_str()) : 1);
}

}  // namespace

int main(int argc, char** argv) {
  auto a = parse(argc, argv);
  const int rank = env_int("RANK");
  if (a.count("abort-on-stop")) {
    // Dies of its own signal while ddprun stops it.
    std::signal(SIGTERM, [](int) {
      rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      std::signal(SIGABRT, SIG_DFL);
      ::raise(SIGABRT);
    });
  }
  if (a.count("ignore-stop")) {
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
  }
  if (a.count("print-args")) {
    std::string out = "rank " + std::to_string(rank) + " args:";
    for (int i = 1; i < argc; ++i) out += std::string(" ") + argv[i];
    std::cout << out << std::endl;
  }
  if (a.count("print-env")) print_env();
  if (a.count("lines")) {
    print_lines(rank, std::atoi(a["lines"].c_str()),
                a.count("width") ? std::strtoul(a["width"].c_str(), nullptr, 10) : 0);
  }
  if (a.count("helpers")) spawn_helpers();
  int steps = a.count("steps") ? std::atoi(a["steps"].c_str()) : 1;
  // --long-from-rank R --long-steps N: ranks >= R run N steps instead.
  if (a.count("long-from-rank") && rank >= std::atoi(a["long-from-rank"].c_str())) {
    steps = std::atoi(a["long-steps"].c_str());
  }
  const double step_s = a.count("step-seconds") ? std::atof(a["step-seconds"].c_str()) : 0.01;
  const int fail_rank = a.count("fail-rank") ? std::atoi(a["fail-rank"].c_str()) : -1;
  const int fail_step = a.count("fail-step") ? std::atoi(a["fail-step"].c_str()) : 1;
  std::string checkpoint = a.count("checkpoint") ? a["checkpoint"] + "." + std::to_string(rank) : "";
  int first = 1;
  if (!checkpoint.empty() && exists(checkpoint)) {
    std::ifstream(checkpoint) >> first;
    ++first;
    std::cout << "rank " << rank << " resumed from checkpoint at step " << first << std::endl;
  }
  if (a.count("ready")) write_file(a["ready"] + "." + std::to_string(rank), "up");
  for (int step = first; step <= steps; ++step) {
    bool once = a.count("fail-once");
    if (rank == fail_rank && step == fail_step && (!once || !exists(a["fail-once"]))) {
      if (once) write_file(a["fail-once"], "failed once");
      fail(a, rank, step);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
    std::cout << "rank " << rank << " step " << step << " restart "
              << env_int("TORCHELASTIC_RESTART_COUNT") << std::endl;
    if (!checkpoint.empty()) write_file(checkpoint, std::to_string(step));
  }
  return 0;
}
