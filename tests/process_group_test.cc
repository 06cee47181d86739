// Process groups with ranks as threads: tcp://, file:// and memory://
// rendezvous, the default group and its guard, and every rendezvous error
// with its message. Multi-process cases (env://, SLURM, Open MPI, torchrun,
// duplicate ranks, crashing ranks) are in process_group_processes_test.cc.
#include "ddp/process_group.h"

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "compat/torch_compat.h"
#include "ddp/collectives.h"
#include "ddp/error.h"
#include "support/scoped_env.h"
#include "support/thread_world.h"
#include "process_group_test_util.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using testing::free_port;
using testing::is_a;
using testing::message_of;
using testing::Stopwatch;

// Runs one new_process_group(options with rank r) per rank on threads,
// then fn(rank, group) on the ranks whose group was created. Returns each
// rank's exception. Every rank keeps its group until all are done.
std::vector<std::exception_ptr> run_group(
    const InitOptions& base, const std::vector<int>& ranks,
    const std::function<void(int, const ProcessGroupPtr&)>& fn = {}) {
  std::vector<std::exception_ptr> errors(ranks.size());
  std::vector<ProcessGroupPtr> groups(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        InitOptions o = base;
        o.rank = ranks[i];
        groups[i] = new_process_group(o);
        if (fn) fn(ranks[i], groups[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// all_reduce of rank+1 on `group`; the sum must be W(W+1)/2.
void expect_all_reduce_sum(const ProcessGroupPtr& group) {
  CollectiveOptions co;
  co.group = group;
  at::Tensor t = at::full({8}, static_cast<double>(group->rank() + 1), at::kFloat);
  all_reduce(t, ReduceOp::SUM, co);
  const int w = group->size();
  EXPECT_TRUE(t.eq(w * (w + 1) / 2.0).all().item<bool>())
      << "rank " << group->rank() << " got " << t[0].item<float>();
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_FALSE(errors[i]) << "rank " << i << ": " << message_of(errors[i]);
  }
}

TEST(ProcessGroup, TcpRanksAsThreads) {
  const int port = free_port();
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  o.world_size = 3;
  o.timeout = 20s;
  auto errors = run_group(o, {0, 1, 2}, [&](int r, const ProcessGroupPtr& g) {
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->size(), 3);
    EXPECT_EQ(g->backend(), "gloo");
    EXPECT_EQ(g->address(), "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(g->timeout(), 20s);
    expect_all_reduce_sum(g);
  });
  expect_no_errors(errors);
}

// ddprun --local-addr: Gloo binds DDP_LOCAL_ADDR (127.0.0.2 is a loopback
// address Linux can bind; 192.0.2.7, TEST-NET-1, is none of this machine's).
TEST(ProcessGroup, GlooBindsTheLocalAddrItIsGiven) {
  testing::ScopedEnv shm("DDP_SHM", "0");
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(free_port());
  o.world_size = 2;
  o.timeout = 20s;
  {
    testing::ScopedEnv local("DDP_LOCAL_ADDR", "127.0.0.2");
    expect_no_errors(
        run_group(o, {0, 1}, [](int, const ProcessGroupPtr& g) { expect_all_reduce_sum(g); }));
  }
  testing::ScopedEnv local("DDP_LOCAL_ADDR", "192.0.2.7");
  o.init_method = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto errors = run_group(o, {0, 1}, [](int, const ProcessGroupPtr&) {});
  for (size_t i = 0; i < errors.size(); ++i) {
    ASSERT_TRUE(errors[i]) << "rank " << i << " bound an address that is not this machine's";
    const std::string m = message_of(errors[i]);
    EXPECT_NE(m.find("local address '192.0.2.7' (DDP_LOCAL_ADDR, ddprun --local-addr)"),
              std::string::npos)
        << m;
  }
}

TEST(ProcessGroup, TcpLocalhostName) {
  InitOptions o;
  o.init_method = "tcp://localhost:" + std::to_string(free_port());
  o.world_size = 2;
  o.timeout = 20s;
  expect_no_errors(run_group(o, {0, 1}, [](int, const ProcessGroupPtr& g) { expect_all_reduce_sum(g); }));
}

TEST(ProcessGroup, FileRanksAsThreadsAndTheFileIsRemovedAfterwards) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/store";
  InitOptions o;
  o.init_method = "file://" + path;
  o.world_size = 2;
  o.timeout = 20s;
  auto errors = run_group(o, {0, 1}, [&](int, const ProcessGroupPtr& g) {
    EXPECT_EQ(g->address(), path);
    expect_all_reduce_sum(g);
  });
  expect_no_errors(errors);
  // c10d's FileStore deletes the file when its last user closes it, so the
  // next job with the same path starts clean.
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ProcessGroup, MemoryWorldsOfOneAndFour) {
  for (int w : {1, 4}) {
    InitOptions o;
    o.init_method = testing::unique_memory_url();
    o.world_size = w;
    o.timeout = 20s;
    std::vector<int> ranks;
    for (int r = 0; r < w; ++r) ranks.push_back(r);
    expect_no_errors(run_group(o, ranks, [](int, const ProcessGroupPtr& g) { expect_all_reduce_sum(g); }));
  }
}

TEST(ProcessGroup, GroupsWithDistinctNamesShareOneStore) {
  InitOptions o;
  o.init_method = testing::unique_memory_url();
  o.world_size = 3;
  o.timeout = 20s;
  auto errors = run_group(o, {0, 1, 2}, [&](int r, const ProcessGroupPtr& first) {
    InitOptions other = o;
    other.rank = r;
    other.group_name = "other";
    ProcessGroupPtr second = new_process_group(other);
    expect_all_reduce_sum(second);
    expect_all_reduce_sum(first);
    expect_all_reduce_sum(second);
    // The same name again on the same store: a fresh rendezvous, not the
    // old group's keys (as after a restart on torchrun's agent store).
    // Barriers: nobody closes a group that a peer still reads from.
    CollectiveOptions on_first;
    on_first.group = first;
    barrier(on_first);
    second.reset();
    ProcessGroupPtr again = new_process_group(other);
    expect_all_reduce_sum(again);
    barrier(on_first);
  });
  expect_no_errors(errors);
}

struct BadOptions {
  std::function<void(InitOptions&)> change;
  std::string expected;
};

TEST(ProcessGroup, BadOptionsAreInvalidArgumentsNamingTheProblem) {
  const std::vector<BadOptions> cases = {
      {[](InitOptions& o) { o.backend = "mpi"; }, "unknown backend 'mpi': expected 'gloo' or 'nccl'"},
      {[](InitOptions& o) { o.init_method = "http://x:1"; },
       "unknown init_method 'http://x:1': expected env://, tcp://host:port"},
      {[](InitOptions& o) { o.rank = 2; }, "needs InitOptions::rank in [0, 2) (got 2)"},
      {[](InitOptions& o) { o.rank = -1; }, "needs InitOptions::rank in [0, 2) (got -1)"},
      {[](InitOptions& o) { o.world_size = -1; }, "needs InitOptions::world_size >= 1 (got -1)"},
      {[](InitOptions& o) { o.init_method = "tcp://127.0.0.1"; }, "has no port: expected tcp://host:port"},
      {[](InitOptions& o) { o.init_method = "tcp://127.0.0.1:"; }, "has no port"},
      {[](InitOptions& o) { o.init_method = "tcp://127.0.0.1:0"; }, "invalid port '0': expected 1..65535"},
      {[](InitOptions& o) { o.init_method = "tcp://127.0.0.1:70000"; }, "invalid port '70000'"},
      {[](InitOptions& o) { o.init_method = "tcp://127.0.0.1:80x"; }, "invalid port '80x'"},
      {[](InitOptions& o) { o.init_method = "file://"; }, "init_method 'file://' needs a path"},
      {[](InitOptions& o) { o.init_method = "file:///tmp/x"; o.world_size = 0; },
       "init_method 'file:///tmp/x' needs InitOptions::world_size >= 1 (got 0)"},
      {[](InitOptions& o) { o.init_method = "memory://x"; o.rank = 5; },
       "init_method 'memory://x' needs InitOptions::rank in [0, 2) (got 5)"},
      {[](InitOptions& o) { o.timeout = 0ms; }, "InitOptions::timeout must be > 0 (got 0 ms)"},
      {[](InitOptions& o) { o.gloo_threads = 0; }, "InitOptions::gloo_threads must be >= 1 (got 0)"},
  };
  Stopwatch watch;
  for (const BadOptions& c : cases) {
    InitOptions o;
    o.init_method = "tcp://127.0.0.1:1";  // never reached: checks come first
    o.rank = 0;
    o.world_size = 2;
    o.timeout = 30s;
    c.change(o);
    try {
      new_process_group(o);
      ADD_FAILURE() << "no error; expected: " << c.expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos)
          << "'" << e.what() << "' lacks '" << c.expected << "'";
    }
  }
  EXPECT_LT(watch.seconds(), 10.0) << "argument checks must not wait for anything";
}

TEST(ProcessGroup, NcclWithoutSupportNamesWhatIsMissing) {
  InitOptions o;
  o.backend = "nccl";
  o.init_method = testing::unique_memory_url();
  o.rank = 0;
  o.world_size = 1;
  o.timeout = 5s;
  try {
    ProcessGroupPtr g = new_process_group(o);
    // Only a ddp built with -DDDP_WITH_NCCL=ON against a CUDA libtorch.
    EXPECT_EQ(g->backend(), "nccl");
  } catch (const CommError& e) {
    const std::string what = e.what();
    if (compat::nccl_compiled()) {  // a CUDA libtorch on a machine without a GPU
      EXPECT_NE(what.find("backend 'nccl' needs a CUDA device"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("backend 'nccl' is not available"), std::string::npos) << what;
      EXPECT_NE(what.find("without CUDA/NCCL support"), std::string::npos) << what;
    }
    EXPECT_NE(what.find("Use backend 'gloo'"), std::string::npos) << what;
  }
}

TEST(ProcessGroup, PortInUseIsNamedWithinSeconds) {
  testing::ListeningSocket busy;  // another program holds the port
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(busy.port());
  o.rank = 0;
  o.world_size = 2;
  o.timeout = 60s;
  Stopwatch watch;
  try {
    new_process_group(o);
    ADD_FAILURE() << "rank 0 hosted a store on a busy port";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("could not host the rendezvous store on port " +
                        std::to_string(busy.port())),
              std::string::npos) << what;
    EXPECT_NE(what.find("set MASTER_PORT to a free port"), std::string::npos) << what;
    // This process holds it: named with its pid.
    EXPECT_NE(what.find("The port is held by pid " + std::to_string(::getpid()) + " ("),
              std::string::npos) << what;
  }
  EXPECT_LT(watch.seconds(), 15.0) << "a busy port must fail fast, not after the timeout";
}

// A world of one needs no TCP store: a single process whose MASTER_PORT is
// busy (another single-process run on the machine) still starts.
TEST(ProcessGroup, AWorldOfOneUsesNoPort) {
  testing::ListeningSocket busy;
  InitOptions o;
  o.timeout = 10s;
  ProcessGroupPtr g;
  {
    testing::ScopedEnv port("MASTER_PORT", std::to_string(busy.port()));
    try {
      g = new_process_group(o);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
  ASSERT_TRUE(g);
  EXPECT_EQ(g->size(), 1);
  at::Tensor t = at::ones({3});
  CollectiveOptions co;
  co.group = g;
  all_reduce(t, ReduceOp::SUM, co);
  EXPECT_TRUE(t.eq(1).all().item<bool>());
}

TEST(ProcessGroup, RankThatNeverArrivesTimesOutNamingIt) {
  const int port = free_port();
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  o.world_size = 4;
  o.timeout = 1500ms;
  Stopwatch watch;
  auto errors = run_group(o, {0, 2});  // ranks 1 and 3 never come
  EXPECT_LT(watch.seconds(), 15.0);
  for (size_t i = 0; i < errors.size(); ++i) {
    ASSERT_TRUE(is_a<TimeoutError>(errors[i])) << i << ": " << message_of(errors[i]);
    const std::string what = message_of(errors[i]);
    EXPECT_NE(what.find("rendezvous at 127.0.0.1:" + std::to_string(port) + " timed out after 1.5 s"),
              std::string::npos) << what;
    EXPECT_NE(what.find("2 of 4 ranks arrived, 2 missing (ranks 1, 3)"), std::string::npos) << what;
    EXPECT_NE(what.find("Start all WORLD_SIZE=4 processes"), std::string::npos) << what;
  }
}

// A rank started alone says whom it waits for at the stall warning's
// interval, rather than nothing until its timeout: rank 0 (the store's
// host) names the missing ranks, another rank the store it cannot reach.
TEST(ProcessGroup, ARankWaitingForItsPeersSaysSoAtTheStallWarningInterval) {
  const int port = free_port();
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  o.world_size = 2;
  o.timeout = 2500ms;
  o.stall_warning = 1000ms;
  for (int rank : {0, 1}) {
    o.rank = rank;
    ::testing::internal::CaptureStderr();
    EXPECT_THROW(new_process_group(o), TimeoutError) << "rank " << rank;
    const std::string err = ::testing::internal::GetCapturedStderr();
    const std::string want =
        rank == 0 ? fmt::format("rendezvous: rank 0 is waiting for 1 of 2 ranks (rank 1) at "
                                "127.0.0.1:{} for 1 s; it gives up after 2.5 s",
                                port)
                  : fmt::format("rendezvous: rank 1 is waiting for rank 0's store at "
                                "127.0.0.1:{} for ",
                                port);
    EXPECT_NE(err.find(want), std::string::npos) << "rank " << rank << ":\n" << err;
    EXPECT_NE(err.find("WARNING"), std::string::npos) << err;
  }
}

TEST(ProcessGroup, MemoryRankThatNeverArrivesTimesOut) {
  InitOptions o;
  o.init_method = testing::unique_memory_url();
  o.world_size = 3;
  o.timeout = 1s;
  Stopwatch watch;
  auto errors = run_group(o, {1});
  EXPECT_LT(watch.seconds(), 10.0);
  ASSERT_TRUE(is_a<TimeoutError>(errors[0])) << message_of(errors[0]);
  EXPECT_NE(message_of(errors[0]).find("1 of 3 ranks arrived, 2 missing (ranks 0, 2)"),
            std::string::npos) << message_of(errors[0]);
}

TEST(ProcessGroup, ClientWhoseServerNeverComesNamesTheAddress) {
  const int port = free_port();
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  o.rank = 1;
  o.world_size = 2;
  o.timeout = 1500ms;
  Stopwatch watch;
  try {
    new_process_group(o);
    ADD_FAILURE() << "rank 1 joined without rank 0";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 could not reach the rendezvous store at 127.0.0.1:" +
                        std::to_string(port) + " within 1.5 s"),
              std::string::npos) << what;
    EXPECT_NE(what.find("Is rank 0 running"), std::string::npos) << what;
  }
  // The timeout is honoured (c10d's client alone gives up at once on
  // timeouts under ~2 s) and bounds the wait.
  EXPECT_GE(watch.seconds(), 1.0);
  EXPECT_LT(watch.seconds(), 15.0);
}

TEST(ProcessGroup, PortOfAProgramThatNeverAnswersTimesOut) {
  testing::ListeningSocket silent;  // accepts connections, never replies
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(silent.port());
  o.rank = 1;
  o.world_size = 2;
  o.timeout = 1500ms;
  Stopwatch watch;
  try {
    new_process_group(o);
    ADD_FAILURE() << "rank 1 joined a store that never answered";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: no rendezvous store answered at 127.0.0.1:" +
                                         std::to_string(silent.port()) + " within 1.5 s"),
              std::string::npos) << e.what();
  }
  EXPECT_LT(watch.seconds(), 15.0);
}

TEST(ProcessGroup, ClientThatStartsBeforeItsServerWaitsForIt) {
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(free_port());
  o.world_size = 2;
  o.timeout = 10000ms;  // well above the server's delay, even on a loaded machine
  std::exception_ptr errors[2];
  ProcessGroupPtr groups[2];  // released after both threads are done
  auto rank = [&](int r, std::chrono::milliseconds delay) {
    return std::thread([&, r, delay] {
      std::this_thread::sleep_for(delay);
      try {
        InitOptions mine = o;
        mine.rank = r;
        groups[r] = new_process_group(mine);
        expect_all_reduce_sum(groups[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  };
  std::thread client = rank(1, 0ms), late_server = rank(0, 1200ms);
  client.join();
  late_server.join();
  EXPECT_FALSE(errors[0]) << message_of(errors[0]);
  EXPECT_FALSE(errors[1]) << message_of(errors[1]);
}

TEST(ProcessGroup, DefaultGroupLifecycle) {
  ASSERT_FALSE(is_initialized());
  EXPECT_TRUE(is_main_process());
  for (auto call : {+[] { get_rank(); }, +[] { get_world_size(); }, +[] { default_group(); }}) {
    try {
      call();
      ADD_FAILURE() << "no error without a group";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("no default process group: call "
                                           "ddp::init_process_group() first"),
                std::string::npos) << e.what();
    }
  }
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(free_port());
  o.rank = 0;
  o.world_size = 1;
  o.timeout = 10s;
  // Twice in one process on the same port: destroy releases the store.
  for (int round = 0; round < 2; ++round) {
    ProcessGroupPtr g = init_process_group(o);
    EXPECT_TRUE(is_initialized());
    EXPECT_EQ(default_group(), g);
    EXPECT_EQ(get_rank(), 0);
    EXPECT_EQ(get_world_size(), 1);
    EXPECT_TRUE(is_main_process());
    try {
      init_process_group(o);
      ADD_FAILURE() << "init_process_group twice";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("init_process_group() called twice"),
                std::string::npos) << e.what();
    }
    EXPECT_EQ(default_group(), g) << "the failed second call must keep the first group";
    at::Tensor t = at::full({2}, 5.0, at::kFloat);
    all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 5.0f);
    g.reset();
    destroy_process_group();
    EXPECT_FALSE(is_initialized());
    destroy_process_group();  // no-op
  }
}

TEST(ProcessGroup, TcpThreadsReinitialiseOnTheSamePort) {
  InitOptions o;
  o.init_method = "tcp://127.0.0.1:" + std::to_string(free_port());
  o.world_size = 2;
  o.timeout = 20s;
  for (int round = 0; round < 3; ++round) {
    expect_no_errors(run_group(o, {0, 1}, [](int, const ProcessGroupPtr& g) { expect_all_reduce_sum(g); }));
  }
}

TEST(ProcessGroup, DefaultGroupGuardsNestPerThread) {
  auto make = [](int w) {
    InitOptions o;
    o.init_method = testing::unique_memory_url();
    o.rank = 0;
    o.world_size = w;
    return new_process_group(o);
  };
  ProcessGroupPtr a = make(1), b = make(1);
  ASSERT_FALSE(is_initialized());
  {
    DefaultGroupGuard outer(a);
    EXPECT_TRUE(is_initialized());
    EXPECT_EQ(default_group(), a);
    {
      DefaultGroupGuard inner(b);
      EXPECT_EQ(default_group(), b);
      // Another thread does not see this thread's guards.
      std::thread([] { EXPECT_FALSE(is_initialized()); }).join();
    }
    EXPECT_EQ(default_group(), a);
  }
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW(default_group(), InvalidArgument);
  // A guard wins over the process's default group, which comes back after.
  InitOptions o;
  o.init_method = testing::unique_memory_url();
  o.rank = 0;
  o.world_size = 1;
  ProcessGroupPtr process_default = init_process_group(o);
  {
    DefaultGroupGuard guard(a);
    EXPECT_EQ(default_group(), a);
  }
  EXPECT_EQ(default_group(), process_default);
  destroy_process_group();
}

}  // namespace
}  // namespace ddp
