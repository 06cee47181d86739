// The c10d rendezvous of ddprun (launcher.cc's claim_rendezvous,
// coordinator.cc, agent.cc): identical command lines on every node, node
// ranks assigned as nodes arrive, torchrun's is_host rule, and the errors of
// a mismatched --rdzv-id and an endpoint nobody hosts. Launchers as real
// processes on this machine's loopback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <set>

#include "launcher/launcher_fixture.h"
#include "launcher/net.h"

namespace ddp::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class C10dRendezvousTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    port_ = free_tcp_port();
  }

  // The same command line for every node; `extra` goes before the program.
  std::vector<std::string> launcher(int nnodes, const std::string& endpoint_host,
                                    std::vector<std::string> extra) const {
    std::vector<std::string> argv{DDPRUN_PATH, "--nnodes", std::to_string(nnodes),
                                  "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                                  "--rdzv-endpoint", endpoint_host + ":" + std::to_string(port_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(TEST_WORKER_PATH);
    argv.push_back("--print-env");
    return argv;
  }

  int port_ = 0;
};

TEST_F(C10dRendezvousTest, IdenticalCommandLinesGetEveryNodeRankOnce) {
  const auto argv = launcher(3, "127.0.0.1", {"--rdzv-id", "job42", "--rdzv-conf",
                                              "join_timeout=60,keep_alive_interval=0.5"});
  std::vector<std::unique_ptr<TestProcess>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(std::make_unique<TestProcess>(argv, env()));
  std::set<int> group_ranks;
  std::string hosted;
  for (auto& n : nodes) {
    auto r = n->wait(90);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Each node's two ranks: consecutive global ranks, one GROUP_RANK.
    for (int g = 0; g < 3; ++g) {
      const std::string p = "[rank" + std::to_string(2 * g) + "]:env GROUP_RANK=" +
                            std::to_string(g) + "\n";
      if (r.out.find(p) == std::string::npos) continue;
      EXPECT_TRUE(group_ranks.insert(g).second) << "node rank " << g << " twice";
      EXPECT_THAT(r.out, HasSubstr("[rank" + std::to_string(2 * g + 1) + "]:env GROUP_RANK=" +
                                   std::to_string(g) + "\n"));
      EXPECT_THAT(r.out, HasSubstr("[rank" + std::to_string(2 * g) + "]:env WORLD_SIZE=6\n"));
      EXPECT_THAT(r.out, HasSubstr("]:env TORCHELASTIC_RUN_ID=job42\n"));
      if (g == 0) hosted = r.err;
    }
  }
  EXPECT_EQ(group_ranks, (std::set<int>{0, 1, 2}));
  EXPECT_THAT(hosted, HasSubstr("node 1 ("));
  EXPECT_THAT(hosted, HasSubstr("node 2 ("));
  EXPECT_THAT(hosted, HasSubstr("joined (node rank assigned at the rendezvous)"));
  expect_no_survivors();
}

TEST_F(C10dRendezvousTest, AMismatchedRdzvIdIsNamedWithBothIds) {
  TestProcess host(launcher(2, "127.0.0.1", {"--rdzv-id", "jobA", "--rdzv-conf",
                                             "join_timeout=4"}),
                   env());
  // is_host=false: this one must join, even though the endpoint is local.
  TestProcess other(launcher(2, "127.0.0.1", {"--rdzv-id", "jobB", "--rdzv-conf",
                                              "is_host=false,join_timeout=30"}),
                    env());
  auto r = other.wait(60);
  auto h = host.wait(60);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rejected this node: --rdzv-id (--run-id) 'jobB' differs from "
                               "node 0's 'jobA'"));
  EXPECT_EQ(h.exit_code, 1);
  // The host says at once that it refused the node and keeps waiting, and
  // its timeout names the c10d flags (not --master-addr/--master-port).
  EXPECT_THAT(h.err, HasSubstr("differs from node 0's 'jobA'; still waiting for 1 more node(s) "
                               "(join_timeout=4 s)"));
  EXPECT_THAT(h.err, HasSubstr("only 1 of 2 nodes joined"));
  EXPECT_THAT(h.err, HasSubstr("the same --nnodes, --nproc-per-node and --rdzv-endpoint "
                               "127.0.0.1:" + std::to_string(port_) + " and --rdzv-id jobA"));
  EXPECT_THAT(h.err, Not(HasSubstr("--master-addr")));
}

TEST_F(C10dRendezvousTest, ANodeArrivingAtAStartedJobIsToldSo) {
  // Once every node of a static job joined, node 0 closes its listener and global rank 0's
  // TCPStore binds the port: a late node finds something that accepts its
  // connection but never welcomes it. This socket stands in for the store.
  // Twice no answer to its hello (10 s each) ends it long before the
  // join timeout.
  const int store = launcher::listen_on(port_);
  TestProcess late(launcher(2, "127.0.0.1", {"--rdzv-conf", "is_host=false,join_timeout=300"}),
                   env());
  auto r = late.wait(60);
  ::close(store);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("could not join node 0 at 127.0.0.1:" + std::to_string(port_) +
                               ": twice something accepted the connection but no launcher "
                               "answered"));
  EXPECT_THAT(r.err, HasSubstr("the job may have started already"));
  EXPECT_THAT(r.err, Not(HasSubstr("Start ddprun on that host too")));
}

TEST_F(C10dRendezvousTest, AnEndpointNobodyHostsFailsWithinTheJoinTimeout) {
  // 192.0.2.1 (TEST-NET-1) is no address of this machine and routes nowhere.
  TestProcess n(launcher(2, "192.0.2.1", {"--rdzv-conf", "join_timeout=3"}), env());
  auto r = n.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("this node could not join node 0 at 192.0.2.1:" +
                               std::to_string(port_) + " within join_timeout=3 s"));
  EXPECT_THAT(r.err, HasSubstr("hosts the c10d rendezvous"));
}

}  // namespace
}  // namespace ddp::testing
