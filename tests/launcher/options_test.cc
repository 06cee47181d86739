// ddprun's command line (options.cc), in process: torchrun's spellings, the
// split between launcher flags and the program's arguments, and the errors.
#include "launcher/options.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "ddp/error.h"
#include "launcher/group_support.h"
#include "support/scoped_env.h"

namespace ddp::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Parsed {
  std::optional<int> exit_code;
  LaunchOptions options;
  std::string out, err;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  Parsed p;
  std::ostringstream out, err;
  p.exit_code = parse_command_line(static_cast<int>(argv.size()), argv.data(), p.options, out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

TEST(LauncherOptions, DefaultsAreTorchruns) {
  Parsed p = parse({"prog"});
  ASSERT_FALSE(p.exit_code) << p.err;
  const LaunchOptions& o = p.options;
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.run_id, "none");
  EXPECT_EQ(o.role, "default");
  EXPECT_FALSE(o.legacy_local_rank_arg);
  EXPECT_THAT(o.program, ElementsAre("prog"));
}

TEST(LauncherOptions, BothSpellingsAndEqualsForms) {
  for (auto args : {std::vector<std::string>{"--nproc_per_node", "4", "--node_rank=1",
                                             "--nnodes=2", "--master_addr", "10.0.0.1",
                                             "--master_port=1234", "--max_restarts", "2"},
                    std::vector<std::string>{"--nproc-per-node=4", "--node-rank", "1",
                                             "--nnodes", "2:2", "--master-addr=10.0.0.1",
                                             "--master-port", "1234", "--max-restarts=2"}}) {
    args.push_back("prog");
    Parsed p = parse(args);
    ASSERT_FALSE(p.exit_code) << p.err;
    EXPECT_EQ(p.options.nproc_per_node, 4);
    EXPECT_EQ(p.options.node_rank, 1);
    EXPECT_EQ(p.options.nnodes, 2);
    EXPECT_EQ(p.options.master_addr, "10.0.0.1");
    EXPECT_EQ(p.options.master_port, 1234);
    EXPECT_EQ(p.options.max_restarts, 2);
    EXPECT_EQ(p.options.global_rank(3), 7);
    EXPECT_EQ(p.options.world_size(), 8);
  }
}

TEST(LauncherOptions, ProgramArgumentsAreNotParsed) {
  Parsed p = parse({"-t", "3", "prog", "--nproc_per_node", "9", "-r", "--help"});
  ASSERT_FALSE(p.exit_code) << p.err;
  EXPECT_EQ(p.options.nproc_per_node, 1);
  EXPECT_EQ(p.options.tee.for_rank(0), kStdAll);
  EXPECT_THAT(p.options.program, ElementsAre("prog", "--nproc_per_node", "9", "-r", "--help"));
  Parsed q = parse({"--standalone", "--", "-weird-name", "a"});
  ASSERT_FALSE(q.exit_code) << q.err;
  EXPECT_THAT(q.options.program, ElementsAre("-weird-name", "a"));
}

TEST(LauncherOptions, LegacyLaunchAndUseEnv) {
  EXPECT_TRUE(parse({"--legacy-launch", "p"}).options.legacy_local_rank_arg);
  EXPECT_FALSE(parse({"--legacy-launch", "--use_env", "p"}).options.legacy_local_rank_arg);
  EXPECT_FALSE(parse({"--use-env", "p"}).options.legacy_local_rank_arg);
}

TEST(LauncherOptions, RendezvousFlagsOfTorchrun) {
  Parsed p = parse({"--rdzv-backend", "c10d", "--rdzv_endpoint", "node7:4000", "--rdzv-id",
                    "abc", "--rdzv_conf", "join_timeout=30,keep_alive_interval=2,foo=bar", "p"});
  ASSERT_FALSE(p.exit_code) << p.err;
  EXPECT_EQ(p.options.master_addr, "node7");
  EXPECT_EQ(p.options.master_port, 4000);
  EXPECT_EQ(p.options.run_id, "abc");
  EXPECT_EQ(p.options.join_timeout, 30);
  EXPECT_EQ(p.options.keep_alive_interval, 2);
  Parsed v6 = parse({"--master-addr", "[::1]", "p"});
  EXPECT_EQ(v6.options.master_addr, "::1");
  Parsed s = parse({"--standalone", "--master-addr", "10.1.1.1", "p"});
  EXPECT_EQ(s.options.master_addr, "127.0.0.1");
}

// --nnodes MIN:MAX with the c10d rendezvous, as torchrun (control.h, Note
// [Elastic rounds]); a fixed count is MIN = MAX.
TEST(LauncherOptions, ElasticNodeRangeWithTheC10dRendezvous) {
  Parsed e = parse({"--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
                    "--rdzv-conf", "last_call_timeout=2.5", "p"});
  ASSERT_FALSE(e.exit_code) << e.err;
  EXPECT_TRUE(e.options.elastic());
  EXPECT_EQ(e.options.min_nnodes, 1);
  EXPECT_EQ(e.options.max_nnodes, 3);
  EXPECT_EQ(e.options.nnodes, 3);
  EXPECT_EQ(e.options.node_rank, kNodeRankAtRendezvous);
  EXPECT_EQ(e.options.last_call_timeout, 2.5);
  EXPECT_EQ(e.options.nnodes_spec(), "1:3");
  // The static rendezvous: a fixed job, whose lost node ends it.
  Parsed fixed = parse({"--nnodes", "2:2", "p"});
  EXPECT_FALSE(fixed.options.elastic());
  EXPECT_EQ(fixed.options.nnodes, 2);
  EXPECT_EQ(fixed.options.nnodes_spec(), "2");
  // torchrun's c10d --nnodes N is N:N: rounds, a lost node is replaced; not
  // with --node-rank (ranks the user fixed), nor on one node.
  for (const char* n : {"2", "2:2"}) {
    Parsed c10d = parse({"--nnodes", n, "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "p"});
    ASSERT_FALSE(c10d.exit_code) << c10d.err;
    EXPECT_TRUE(c10d.options.elastic()) << n;
    EXPECT_EQ(c10d.options.nnodes_spec(), "2") << n;
  }
  EXPECT_FALSE(parse({"--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", "h:1", "p"})
                   .options.elastic());
  EXPECT_FALSE(parse({"--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "p"})
                   .options.elastic());
  EXPECT_EQ(parse({"p"}).options.last_call_timeout, 30);
}

// torchrun's c10d rendezvous assigns node ranks; the static one defaults to 0.
TEST(LauncherOptions, NodeRankIsAssignedAtTheC10dRendezvousUnlessGiven) {
  Parsed c = parse({"--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "p"});
  ASSERT_FALSE(c.exit_code) << c.err;
  EXPECT_EQ(c.options.node_rank, kNodeRankAtRendezvous);
  EXPECT_FALSE(c.options.rdzv_is_host.has_value());
  Parsed given = parse({"--nnodes", "3", "--node-rank", "2", "--rdzv-backend", "c10d", "p"});
  EXPECT_EQ(given.options.node_rank, 2);
  EXPECT_EQ(parse({"--nnodes", "3", "p"}).options.node_rank, 0);
  EXPECT_EQ(parse({"--rdzv-backend", "c10d", "p"}).options.node_rank, 0);  // one node
  Parsed host = parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-conf",
                       "is_host=false,join_timeout=5", "p"});
  EXPECT_EQ(host.options.rdzv_is_host, std::optional<bool>(false));
  EXPECT_EQ(host.options.join_timeout, 5);
  EXPECT_EQ(parse({"--local-addr", "127.0.0.1", "p"}).options.local_addr, "127.0.0.1");
  Parsed bad = parse({"--rdzv-conf", "is_host=maybe", "p"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("is_host needs true or false, not 'maybe'"));
}

TEST(LauncherOptions, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nproc-per-node", "0", "p"}, "--nproc-per-node 0 is out of range"},
           {{"--nproc-per-node", "many", "p"}, "--nproc-per-node 'many' is not valid"},
           {{"--nnodes", "1:4", "p"}, "--nnodes 1:4: an elastic range needs --rdzv-backend c10d"},
           {{"--nnodes", "1:4", "--rdzv-backend", "etcd", "p"},
            "an elastic range needs --rdzv-backend c10d (not 'etcd') and --rdzv-endpoint "
            "HOST:PORT (ddprun's rendezvous backends are static and c10d)"},
           {{"--nnodes", "1:4", "--rdzv-backend", "c10d", "--node-rank", "1", "p"},
            "--node-rank 1 with --nnodes 1:4: an elastic job assigns node ranks at every round"},
           {{"--nnodes", "3:2", "p"}, "--nnodes 3:2: MIN is larger than MAX"},
           {{"--rdzv-conf", "last_call_timeout=0", "p"}, "last_call_timeout needs a positive number"},
           {{"--nnodes", "2", "--node-rank", "2", "p"}, "--node-rank 2 is out of range"},
           {{"--standalone", "--nnodes", "2", "p"}, "--standalone runs one node"},
           {{"--master-port", "70000", "p"}, "--master-port 70000 is out of range"},
           {{"-r", "4", "p"}, "--redirects '4' is not valid"},
           {{"--tee", "0:5", "p"}, "--tee '0:5' is not valid"},
           {{"--local-ranks-filter", "a", "p"}, "--local-ranks-filter 'a' is not valid"},
           {{"--rdzv-backend", "etcd", "p"}, "--rdzv-backend 'etcd' is not supported"},
           {{"--max-restarts", "-1", "p"}, "--max-restarts -1 is negative"},
           {{"-m", "p"}, "use `ddprun [flags] python3 -u -m MODULE`"},
           {{"--nproc-per-node", "2"}, "no program given"},
           {{"--local-addr", "192.0.2.7", "p"}, "--local-addr 192.0.2.7 is not an address of this machine"},
           {{"--numa-binding", "node", "p"}, "--numa-binding node: not supported by ddprun"},
           {{"--print-completion", "bash", "p"}, "--print-completion bash: not supported by ddprun"},
           {{"--logs-specs", "mine", "p"}, "--logs-specs mine: not supported by ddprun"},
           {{"--event-log-handler", "console", "p"}, "only null is accepted"},
           {{"--duplicate-stdout-filters", "loss", "p"}, "use -t/--tee with --log-dir"},
           {{"--signals-to-handle", "SIGKILL", "p"}, "'SIGKILL' is not a signal ddprun can handle"},
           {{"--signals-to-handle", "SIGNOPE", "p"}, "'SIGNOPE' is not a signal"},
       }) {
    Parsed p = parse(c.args);
    EXPECT_EQ(p.exit_code, 2) << c.message;
    EXPECT_THAT(p.err, HasSubstr(c.message));
  }
}

// A flag ddprun does not know: "ddprun: error:", the flag as given, the
// closest known flag, and where to look (CLI11 alone printed "The following
// argument was not expected: --nprocs").
TEST(LauncherOptions, AnUnknownFlagIsNamedWithTheClosestKnownOne) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nprocs", "2", "p"},
            "ddprun: error: unknown flag --nprocs (did you mean --nproc-per-node?) (see ddprun "
            "--help)"},
           {{"--standalon", "p"}, "unknown flag --standalon (did you mean --standalone?)"},
           {{"--max_restart=2", "p"}, "unknown flag --max-restart (did you mean --max-restarts?)"},
           {{"--frobnicate", "p"}, "ddprun: error: unknown flag --frobnicate (see ddprun --help)"},
       }) {
    Parsed p = parse(c.args);
    EXPECT_EQ(p.exit_code, 2) << c.message;
    EXPECT_THAT(p.err, HasSubstr(c.message));
  }
}

TEST(LauncherOptions, HelpNamesEveryFlag) {
  Parsed p = parse({"--help"});
  EXPECT_EQ(p.exit_code, 0);
  for (const char* flag :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
        "--standalone", "--max-restarts", "--monitor-interval", "--grace-period", "--log-dir",
        "--redirects", "--tee", "--local-ranks-filter", "--run-id", "--no-python", "--use-env",
        "--legacy-launch", "--rdzv-endpoint", "--rdzv-conf", "Usage: ddprun [flags] PROGRAM"}) {
    EXPECT_THAT(p.out, HasSubstr(flag));
  }
}

// torchrun 2.14's --log-line-prefix-template: the console prefix.
TEST(LauncherOptions, LogLinePrefixTemplateSubstitutesTorchrunsMacros) {
  Parsed p = parse({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--role", "trainer",
                    "--log-line-prefix-template", "${role_name}/${local_rank}/${rank}@${hostname}: ",
                    "prog"});
  ASSERT_FALSE(p.exit_code) << p.err;
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(line_prefix(p.options.log_line_prefix_template, p.options, 1),
            std::string("trainer/1/3@") + host + ": ");
  EXPECT_EQ(stream_route(p.options, 1, kStdOut, /*prefix=*/false, "/tmp", false).prefix,
            std::string("trainer/1/3@") + host + ": ");
  Parsed d = parse({"prog"});
  EXPECT_EQ(stream_route(d.options, 0, kStdOut, /*prefix=*/true, "/tmp", false).prefix, "[rank0]:");
}

TEST(LauncherOptions, Torchrun2FlagsWithTheirMeaning) {
  Parsed p = parse({"--shutdown-timeout", "7", "--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1",
                    "--virtual-local-rank", "--event-log-handler", "null", "prog"});
  ASSERT_FALSE(p.exit_code) << p.err;
  EXPECT_EQ(p.options.grace_period, 7.0);
  EXPECT_THAT(p.options.stop_signals, ElementsAre(SIGTERM, SIGINT, SIGUSR1));
  EXPECT_TRUE(p.options.virtual_local_rank);
  Parsed d = parse({"prog"});
  EXPECT_THAT(d.options.stop_signals, ElementsAre(SIGTERM, SIGINT, SIGHUP, SIGQUIT));
  EXPECT_FALSE(d.options.virtual_local_rank);
}

// Every flag of the oracle's `torchrun --help` (PyTorch 2.13) is one that
// ddprun knows: it either has torchrun's meaning or says what it does not
// support (LauncherOptions.ErrorsNameTheFlag).
TEST(LauncherOptions, KnowsEveryFlagOfTorchrun) {
  const std::string python = DDP_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python with torch configured (DDP_PYTHON)";
  std::FILE* pipe = ::popen((python + " -m torch.distributed.run --help 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string help;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) help.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << help;
  Parsed ours = parse({"--help"});
  // The flags declared in the options section: lines that start (after
  // indentation) with a dash, up to the description (two spaces).
  std::set<std::string> flags;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos || first == 0 || line[first] != '-') continue;
    const std::string decl = line.substr(first, line.find("  ", first) - first);
    for (size_t at = decl.find("--"); at != std::string::npos; at = decl.find("--", at + 2)) {
      size_t end = at + 2;
      while (end < decl.size() && (std::isalnum(static_cast<unsigned char>(decl[end])) ||
                                   decl[end] == '-' || decl[end] == '_')) {
        ++end;
      }
      const std::string flag = decl.substr(at, end - at);
      // The --snake_case spellings are the same flags (ddprun accepts both).
      if (end > at + 2 && flag.find('_') == std::string::npos) flags.insert(flag);
    }
  }
  ASSERT_GT(flags.size(), 25u) << help;
  for (const std::string& flag : flags) {
    EXPECT_THAT(ours.out, HasSubstr(flag + " ")) << "torchrun's " << flag << " is unknown to ddprun";
  }
}

TEST(LauncherOptions, PetEnvironmentVariables) {
  testing::ScopedEnv nproc("PET_NPROC_PER_NODE", "3");
  testing::ScopedEnv restarts("PET_MAX_RESTARTS", "2");
  Parsed p = parse({"p"});
  Parsed q = parse({"--nproc-per-node", "5", "p"});
  EXPECT_EQ(p.options.nproc_per_node, 3);
  EXPECT_EQ(p.options.max_restarts, 2);
  EXPECT_EQ(q.options.nproc_per_node, 5);  // the flag wins
}

}  // namespace
}  // namespace ddp::launcher
