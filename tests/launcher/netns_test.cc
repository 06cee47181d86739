// Two nodes for real: two network namespaces joined by a veth pair, one
// ddprun per namespace, 2 ranks each, running a ddp program
// (allreduce_worker) that all_reduces over Gloo across the "nodes", and a
// short DistributedDataParallel training (ddp-train). Needs
// root and `ip netns`; skips with the reason otherwise. Also runs the same
// program as two nodes on the loopback, which needs neither.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include "launcher/launcher_fixture.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;

const char* ip_path() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "ip";
}

bool sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Namespaces <base>0 (10.77.0.1) and <base>1 (10.77.0.2) joined by a veth
// pair; removed (with the pair) in the destructor.
class NamespacePair {
 public:
  NamespacePair() : base_("ddpl" + std::to_string(getpid() % 100000) + "n") {
    if (geteuid() != 0) {
      why_not_ = "needs root to create network namespaces";
      return;
    }
    if (access(ip_path(), X_OK) != 0) {
      why_not_ = "the `ip` tool (iproute2) is not installed";
      return;
    }
    const std::string a = ns(0), b = ns(1), va = veth(0), vb = veth(1);
    bool ok = sh("ip netns add " + a) && sh("ip netns add " + b) &&
              sh("ip link add " + va + " type veth peer name " + vb) &&
              sh("ip link set " + va + " netns " + a) && sh("ip link set " + vb + " netns " + b) &&
              sh("ip -n " + a + " addr add 10.77.0.1/24 dev " + va) &&
              sh("ip -n " + b + " addr add 10.77.0.2/24 dev " + vb) &&
              sh("ip -n " + a + " link set " + va + " up") &&
              sh("ip -n " + b + " link set " + vb + " up") &&
              sh("ip -n " + a + " link set lo up") && sh("ip -n " + b + " link set lo up");
    if (!ok) why_not_ = "could not create two network namespaces joined by a veth pair";
  }
  ~NamespacePair() {
    sh("ip netns del " + ns(0));
    sh("ip netns del " + ns(1));
  }
  const std::string& why_not() const { return why_not_; }
  std::string ns(int i) const { return base_ + std::to_string(i); }
  std::string veth(int i) const { return base_ + "v" + std::to_string(i); }
  void cut() const { sh("ip -n " + ns(0) + " link set " + veth(0) + " down"); }

 private:
  std::string base_;
  std::string why_not_;
};

// Three hosts: namespaces <base>0..2 (10.78.0.1..3) whose veth ends meet on
// a bridge in a fourth namespace, <base>b; all removed in the destructor.
class NamespaceBridge {
 public:
  explicit NamespaceBridge(int hosts)
      : base_("ddpb" + std::to_string(getpid() % 100000) + "n"), hosts_(hosts) {
    if (geteuid() != 0) {
      why_not_ = "needs root to create network namespaces";
      return;
    }
    if (access(ip_path(), X_OK) != 0) {
      why_not_ = "the `ip` tool (iproute2) is not installed";
      return;
    }
    const std::string br = base_ + "b";
    bool ok = sh("ip netns add " + br) && sh("ip -n " + br + " link add br0 type bridge") &&
              sh("ip -n " + br + " link set br0 up");
    for (int i = 0; ok && i < hosts; ++i) {
      const std::string n = ns(i), v = base_ + "v" + std::to_string(i),
                        p = base_ + "p" + std::to_string(i);
      ok = sh("ip netns add " + n) && sh("ip link add " + v + " type veth peer name " + p) &&
           sh("ip link set " + v + " netns " + n) && sh("ip link set " + p + " netns " + br) &&
           sh("ip -n " + br + " link set " + p + " master br0") &&
           sh("ip -n " + br + " link set " + p + " up") &&
           sh("ip -n " + n + " addr add " + addr(i) + "/24 dev " + v) &&
           sh("ip -n " + n + " link set " + v + " up") && sh("ip -n " + n + " link set lo up");
    }
    if (!ok) why_not_ = "could not create three network namespaces on a bridge";
  }
  ~NamespaceBridge() {
    for (int i = 0; i < hosts_; ++i) sh("ip netns del " + ns(i));
    sh("ip netns del " + base_ + "b");
  }
  const std::string& why_not() const { return why_not_; }
  std::string ns(int i) const { return base_ + std::to_string(i); }
  static std::string addr(int i) { return "10.78.0." + std::to_string(i + 1); }

 private:
  std::string base_;
  int hosts_;
  std::string why_not_;
};

class NetnsTest : public LauncherTest {
 protected:
  // ddprun for node `node` of 2 (2 ranks each) running allreduce_worker;
  // inside namespace `ns` when given.
  std::vector<std::string> node(int node, const std::string& ns, const std::string& master,
                                int port, const std::vector<std::string>& args,
                                const std::string& keep_alive = "keep_alive_interval=1,"
                                                                "keep_alive_max_attempt=5",
                                const std::string& program = ALLREDUCE_WORKER_PATH) const {
    std::vector<std::string> argv;
    if (!ns.empty()) argv = {ip_path(), "netns", "exec", ns};
    for (std::string a : {std::string(DDPRUN_PATH), std::string("--nnodes=2"),
                          "--node-rank=" + std::to_string(node), std::string("--nproc-per-node=2"),
                          "--master-addr=" + master, "--master-port=" + std::to_string(port),
                          std::string("--grace-period=2"),
                          "--rdzv-conf=" + keep_alive, program}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // The same command line for every node (the c10d rendezvous at
  // `endpoint`, node ranks assigned), run inside namespace `ns`.
  std::vector<std::string> same_line(const std::string& ns, const std::string& endpoint,
                                     const std::vector<std::string>& args) const {
    std::vector<std::string> argv{ip_path(),
                                  "netns",
                                  "exec",
                                  ns,
                                  DDPRUN_PATH,
                                  "--nnodes=2",
                                  "--nproc-per-node=2",
                                  "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=" + endpoint,
                                  "--rdzv-id=netns-job",
                                  "--grace-period=2",
                                  "--rdzv-conf=join_timeout=60,keep_alive_interval=1",
                                  ALLREDUCE_WORKER_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

#ifdef DDP_TRAIN_PATH
  // One node of an elastic job (--nnodes `nnodes`, the c10d rendezvous at
  // `endpoint`) in namespace `ns`: 3 epochs of ddp-train --resume on
  // `samples` images into path("out").
  std::vector<std::string> elastic_training(const std::string& ns, const std::string& nnodes,
                                            const std::string& endpoint,
                                            const std::string& last_call,
                                            const std::string& samples) const {
    return {ip_path(), "netns", "exec", ns, DDPRUN_PATH, "--nnodes=" + nnodes,
            "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
            "--rdzv-id=elastic-job", "--grace-period=3",
            "--rdzv-conf=join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=5,"
            "last_call_timeout=" + last_call,
            DDP_TRAIN_PATH, "--resume", "--epochs", "3", "--train-samples", samples,
            "--test-samples", "512", "--no-plot", "--timeout", "20", "--log-every", "4",
            "--out-dir", path("out")};
  }
#endif

  // shm_ranks: the ranks sharing memory on each node (2: both paths, shared
  // memory on the node and Gloo between the nodes; 4: one host).
  static void expect_sums(const ProcessResult& r, int first_rank, int steps, int shm_ranks = 2) {
    for (int rank = first_rank; rank < first_rank + 2; ++rank) {
      EXPECT_THAT(r.out, HasSubstr("[rank" + std::to_string(rank) + "]:rank " +
                                   std::to_string(rank) + " shared memory ranks " +
                                   std::to_string(shm_ranks) + "\n"));
      for (int step = 1; step <= steps; ++step) {
        EXPECT_THAT(r.out, HasSubstr("[rank" + std::to_string(rank) + "]:rank " +
                                     std::to_string(rank) + " world 4 step " +
                                     std::to_string(step) + " sum 10\n"));
      }
    }
  }
};

TEST_F(NetnsTest, AllReduceOnTwoLoopbackNodes) {
  const int port = free_tcp_port();
  TestProcess n0(node(0, "", "127.0.0.1", port, {"3"}), env());
  TestProcess n1(node(1, "", "127.0.0.1", port, {"3"}), env());
  auto r0 = n0.wait(120);
  auto r1 = n1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  expect_sums(r0, 0, 3, 4);  // two launchers, one host: 4 ranks share memory
  expect_sums(r1, 2, 3, 4);
  expect_no_survivors();
}

TEST_F(NetnsTest, AllReduceAcrossTwoNamespaces) {
  NamespacePair net;
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  TestProcess n0(node(0, net.ns(0), "10.77.0.1", 29500, {"3"}), env());
  TestProcess n1(node(1, net.ns(1), "10.77.0.1", 29500, {"3"}), env());
  auto r0 = n0.wait(120);
  auto r1 = n1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  expect_sums(r0, 0, 3);
  expect_sums(r1, 2, 3);
  expect_no_survivors();
}

// torchrun's recipe: the same line on both hosts. The host whose address
// the endpoint names (10.77.0.1, namespace 0) hosts the rendezvous and is
// node 0 although it starts second; the other is given node rank 1.
TEST_F(NetnsTest, IdenticalCommandLinesAcrossTwoNamespaces) {
  NamespacePair net;
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  TestProcess n1(same_line(net.ns(1), "10.77.0.1:29500", {"3"}), env());
  TestProcess n0(same_line(net.ns(0), "10.77.0.1:29500", {"3"}), env());
  auto r0 = n0.wait(120);
  auto r1 = n1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  expect_sums(r0, 0, 3);
  expect_sums(r1, 2, 3);
  EXPECT_THAT(r0.err, HasSubstr("joined (node rank assigned at the rendezvous)"));
  expect_no_survivors();
}

TEST_F(NetnsTest, ShortTrainingAcrossTwoNamespaces) {
#ifndef DDP_TRAIN_PATH
  GTEST_SKIP() << "ddp-train is not built";
#else
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  NamespacePair net;
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  // DistributedDataParallel over 2 nodes x 2 ranks: 4 steps of 4 x 64
  // images; ddp-train checks that every rank ends with the same parameters.
  const std::vector<std::string> args{"--out-dir", path("out"), "--train-samples", "1024",
                                      "--test-samples", "256", "--epochs", "1", "--no-plot",
                                      "--timeout", "120"};
  const std::string keep_alive = "keep_alive_interval=1,keep_alive_max_attempt=10";
  TestProcess n0(node(0, net.ns(0), "10.77.0.1", 29500, args, keep_alive, DDP_TRAIN_PATH), env());
  TestProcess n1(node(1, net.ns(1), "10.77.0.1", 29500, args, keep_alive, DDP_TRAIN_PATH), env());
  auto r0 = n0.wait(240);
  auto r1 = n1.wait(240);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_EQ(lines_with(r0.out, "parameters identical on all 4 ranks").size(), 1u) << r0.out;
  expect_no_survivors();
#endif
}

// Issue 29's end to end: an elastic job (--nnodes 1:2) training on two
// namespace hosts loses one (launcher and workers SIGKILLed) in epoch 2; the
// other restarts its workers on the smaller world, resumes from the latest
// checkpoint and finishes, and its ranks end with identical parameters.
TEST_F(NetnsTest, ElasticTrainingSurvivesALostHost) {
#ifndef DDP_TRAIN_PATH
  GTEST_SKIP() << "ddp-train is not built";
#else
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  NamespacePair net;
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  auto line = [&](int i) {
    return elastic_training(net.ns(i), "1:2", "10.77.0.1:29500", "5", "4096");
  };
  TestProcess n0(line(0), env());
  ASSERT_TRUE(n0.wait_for_output("waiting on port", 30)) << n0.output_so_far();
  TestProcess n1(line(1), env());
  // In epoch 2 (16 steps at world 4), after epoch 1's checkpoint.
  ASSERT_TRUE(n0.wait_for_output("epoch 2/3 step 4/16", 240)) << n0.output_so_far();
  n1.send_signal(SIGKILL);  // the host's launcher; its workers die with it
  auto r1 = n1.wait(30);
  auto r0 = n0.wait(300);
  ASSERT_FALSE(r0.timed_out) << r0.out << r0.err;
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_THAT(r0.err, HasSubstr("round 0: 2 node(s), world size 4"));
  EXPECT_THAT(r0.err, HasSubstr("lost contact with node 1"));
  EXPECT_THAT(r0.err, HasSubstr("round 1: 1 node(s), world size 2"));
  EXPECT_THAT(r0.out, HasSubstr("ddp-train: resumed from "));
  EXPECT_THAT(r0.out, HasSubstr("--resume: world size 2 where the checkpoint's run had 4"));
  EXPECT_THAT(r0.out, HasSubstr("epoch 3/3: train loss"));
  EXPECT_EQ(lines_with(r0.out, "parameters identical on all 2 ranks").size(), 1u) << r0.out;
  expect_no_survivors();
#endif
}

// Three hosts with one command line, --nnodes 2:3: a host is SIGKILLed in
// epoch 2 and the other two go on as world 4 from the checkpoint; started
// again, it joins at the next round and the job ends on world 6 with every
// rank's parameters identical.
TEST_F(NetnsTest, ElasticTrainingOnThreeHostsLosesOneAndTakesItBack) {
#ifndef DDP_TRAIN_PATH
  GTEST_SKIP() << "ddp-train is not built";
#else
  if (!std::ifstream("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").good()) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  NamespaceBridge net(3);
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  auto line = [&](int i) {
    return elastic_training(net.ns(i), "2:3", NamespaceBridge::addr(0) + ":29500", "3", "6144");
  };
  TestProcess n0(line(0), env());
  ASSERT_TRUE(n0.wait_for_output("waiting on port", 30)) << n0.output_so_far();
  TestProcess n1(line(1), env());
  auto n2 = std::make_unique<TestProcess>(line(2), env());
  // World 6: 16 steps an epoch. Kill host 2 in epoch 2, after epoch 1's checkpoint.
  ASSERT_TRUE(n0.wait_for_output("epoch 2/3 step 4/16", 300)) << n0.output_so_far();
  n2->send_signal(SIGKILL);
  n2->wait(30);
  // World 4: 24 steps an epoch. Host 2 comes back a few steps into round 1.
  ASSERT_TRUE(n0.wait_for_output("/24 last 4 steps", 120)) << n0.output_so_far();
  n2 = std::make_unique<TestProcess>(line(2), env());
  auto r0 = n0.wait(400);
  auto r1 = n1.wait(60);
  auto r2 = n2->wait(60);
  ASSERT_FALSE(r0.timed_out) << r0.out << r0.err;
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_THAT(r0.err, HasSubstr("round 0: 3 node(s), world size 6"));
  EXPECT_THAT(r0.err, HasSubstr("lost contact with node "));  // 1 or 2: ranks follow arrival
  EXPECT_THAT(r0.err, HasSubstr("round 1: 2 node(s), world size 4"));
  EXPECT_THAT(r0.err, HasSubstr("joined the elastic job: the workers restart with 3 nodes"));
  EXPECT_THAT(r0.err, HasSubstr("round 2: 3 node(s), world size 6"));
  EXPECT_THAT(r0.out, HasSubstr("--resume: world size 4 where the checkpoint's run had 6"));
  EXPECT_THAT(r0.out, HasSubstr("epoch 3/3: train loss"));
  EXPECT_EQ(lines_with(r0.out, "parameters identical on all 6 ranks").size(), 1u) << r0.out;
  expect_no_survivors();
#endif
}

TEST_F(NetnsTest, CuttingTheLinkEndsTheJobOnBothNodes) {
  NamespacePair net;
  if (!net.why_not().empty()) GTEST_SKIP() << net.why_not();
  // A long run whose collectives time out after 3 s; the launchers' own
  // heartbeats give up after 12 s.
  const std::vector<std::string> args{"100000", "0.1", "3000"};
  const std::string slow = "keep_alive_interval=1,keep_alive_max_attempt=12";
  TestProcess n0(node(0, net.ns(0), "10.77.0.1", 29500, args, slow), env());
  TestProcess n1(node(1, net.ns(1), "10.77.0.1", 29500, args, slow), env());
  ASSERT_TRUE(n0.wait_for_output("rank 1 world 4 step 3 ", 120)) << n0.output_so_far();
  ASSERT_TRUE(n1.wait_for_output("rank 3 world 4 step 3 ", 120)) << n1.output_so_far();
  net.cut();
  auto r0 = n0.wait(120);
  auto r1 = n1.wait(120);
  ASSERT_FALSE(r0.timed_out || r1.timed_out);
  EXPECT_EQ(r0.exit_code, 1) << r0.err;
  EXPECT_EQ(r1.exit_code, 1) << r1.err;
  // Each launcher explains why: a rank of its own failed (its all_reduce
  // timed out), or it lost the other launcher. Both end their workers.
  // (Whether every rank reports its own timeout is up to the program and
  // ddp; the launchers end the job either way.)
  for (const auto* r : {&r0, &r1}) {
    const bool explained = r->err.find("Root cause (first observed failure)") != std::string::npos ||
                           r->err.find("lost contact with node") != std::string::npos;
    EXPECT_TRUE(explained) << r->err;
  }
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::testing
