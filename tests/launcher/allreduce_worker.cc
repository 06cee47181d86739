// A ddp program for ddprun's multi-node tests: joins the job from the
// environment (ddp::init_process_group, env://), then for each step
// all_reduces ones*(rank+1) and checks the sum, printing
// "rank R world W step S sum X". Arguments: steps, seconds per step,
// timeout of each all_reduce in ms. With ALLREDUCE_WORKER_PRINT_LISTENING=1
// it also prints, once joined, every TCP socket this process listens on
// ("listening loopback|NOT-LOOPBACK <hex address>").
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/zeros.h>
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "ddp/collectives.h"
#include "ddp/process_group.h"

namespace {

// Inodes of the sockets among this process's open files.
std::set<std::string> own_socket_inodes() {
  std::set<std::string> inodes;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return inodes;
  while (dirent* e = readdir(dir)) {
    char target[256];
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    std::string t(target, static_cast<size_t>(n));
    if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
  }
  closedir(dir);
  return inodes;
}

// /proc/net/tcp{,6}: local address in hex, state 0A = LISTEN, inode column 10.
void print_listening() {
  const std::set<std::string> own = own_socket_inodes();
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !own.count(inode)) continue;
      const std::string addr = local.substr(0, local.find(':'));
      const bool loopback = addr == "0100007F" ||
                            addr == "00000000000000000000000001000000" ||
                            addr == "0000000000000000FFFF00000100007F";
      std::printf("listening %s %s\n", loopback ? "loopback" : "NOT-LOOPBACK", local.c_str());
    }
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  const double step_s = argc > 2 ? std::atof(argv[2]) : 0.05;
  const long timeout_ms = argc > 3 ? std::atol(argv[3]) : 60000;
  try {
    // The rendezvous waits for every rank to start (slow on a loaded
    // machine); only the collectives get the test's short timeout.
    ddp::InitOptions options;
    options.timeout = std::chrono::minutes(2);
    ddp::init_process_group(options);
    const char* print = std::getenv("ALLREDUCE_WORKER_PRINT_LISTENING");
    if (print && std::string(print) == "1") print_listening();
    ddp::CollectiveOptions collective;
    collective.timeout = std::chrono::milliseconds(timeout_ms);
    const int rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    // Which path all_reduce takes (Note [Shared-memory all-reduce]).
    std::printf("rank %d shared memory ranks %d\n", rank,
                ddp::default_group()->shared_memory_ranks());
    const float expected = world * (world + 1) / 2.0f;
    for (int step = 1; step <= steps; ++step) {
      at::Tensor t = at::ones({4}) * static_cast<float>(rank + 1);
      ddp::all_reduce(t, ddp::ReduceOp::SUM, collective);
      const float got = t.min().item<float>();
      if (got != expected || t.max().item<float>() != expected) {
        std::fprintf(stderr, "rank %d step %d: all_reduce gave %f, expected %f\n", rank, step,
                     got, expected);
        return 2;
      }
      // Arbitrary floats, 300001 of them (two-shot on each host, then among
      // the hosts): the exact sum within rounding.
      at::Tensor idx = at::arange(300001, at::kDouble);
      at::Tensor mine = at::sin(idx * (rank + 1)).to(at::kFloat);
      at::Tensor exact = at::zeros({300001}, at::kDouble);
      for (int r = 0; r < world; ++r) exact += at::sin(idx * (r + 1)).to(at::kFloat).to(at::kDouble);
      ddp::all_reduce(mine, ddp::ReduceOp::SUM, collective);
      const double err = (mine.to(at::kDouble) - exact).abs().max().item<double>();
      if (err > 1e-5) {
        std::fprintf(stderr, "rank %d step %d: float all_reduce off by %g\n", rank, step, err);
        return 2;
      }
      std::printf("rank %d world %d step %d sum %g\n", rank, world, step, got);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(step_s));
    }
    ddp::barrier();  // rank 0 hosts the store: nobody leaves early
    ddp::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_worker: %s\n", e.what());
    std::fflush(nullptr);
    // Not `return`: after a failed collective the process group's
    // destructor can block on a dead peer (Gloo threads stuck in send).
    std::_Exit(1);
  }
  return 0;
}
