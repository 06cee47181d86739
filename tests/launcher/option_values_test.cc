// Values of ddprun's flags (option_values.cc): -r/-t stream selections,
// rank lists, --nproc-per-node names.
#include "launcher/option_values.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "ddp/error.h"
#include "support/scoped_env.h"

namespace ddp::launcher {
namespace {

TEST(LauncherOptionValues, StdSpecs) {
  StdSpec all = parse_std_spec("2", "-r");
  EXPECT_EQ(all.for_rank(0), kStdErr);
  EXPECT_EQ(all.for_rank(7), kStdErr);
  StdSpec map = parse_std_spec("0:1,2:3", "-r");
  EXPECT_EQ(map.for_rank(0), kStdOut);
  EXPECT_EQ(map.for_rank(1), kStdNone);  // not named: none, as torchrun
  EXPECT_EQ(map.for_rank(2), kStdAll);
  EXPECT_TRUE(map.any());
  EXPECT_FALSE(parse_std_spec("0", "-t").any());
  EXPECT_THROW(parse_std_spec("1:", "-t"), InvalidArgument);
  EXPECT_EQ(parse_rank_list("0,2", "f"), (std::set<int>{0, 2}));
}

TEST(LauncherOptionValues, NprocNames) {
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(resolve_nproc_per_node("cpu"), cpus);
  {
    testing::ScopedEnv three("CUDA_VISIBLE_DEVICES", "0,1,2");
    EXPECT_EQ(resolve_nproc_per_node("gpu"), 3);
    EXPECT_EQ(resolve_nproc_per_node("auto"), 3);
  }
  testing::ScopedEnv none("CUDA_VISIBLE_DEVICES", "");
  EXPECT_THROW(resolve_nproc_per_node("gpu"), InvalidArgument);
  EXPECT_EQ(resolve_nproc_per_node("auto"), cpus);
}

}  // namespace
}  // namespace ddp::launcher
