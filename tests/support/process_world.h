// Ranks as processes of the test binary itself, for what thread ranks
// cannot do. The one case today: CUDA tensors on two ranks of one GPU.
// PyTorch's autograd engine runs the CUDA part of every thread's backward
// on one worker thread per device, so a rank whose backward waits for a
// collective (DDP's reducer on Gloo, SyncBatchNorm's backward, ZeRO behind
// DDP) holds that thread, and the other rank's backward, queued behind it,
// never reaches the collective: two thread ranks on one GPU deadlock until
// the timeout. Two processes each have their own engine.
//
// A test written for it runs twice over: in the parent, which spawns the
// ranks, and in each rank, which runs the same test body up to the branch
// (so inputs built from a seed before it are the same everywhere):
//
//   TEST(Gpu, Something) {
//     const Data d = make_data(...);                     // seeded: same in all
//     if (testing::in_rank_process()) {
//       testing::as_rank_process("gloo", [&](int rank) {
//         ...                                             // the default group is set
//         testing::save_tensors("got", {...});
//       });
//       return;
//     }
//     const testing::RankProcesses ranks(2);              // spawns, waits
//     if (!ranks.ok()) return;                            // a failure names the rank
//     auto got = ranks.load_tensors(1, "got");
//   }
//
// Each rank is the binary run with --gtest_filter=<this test> and
// DDP_TEST_RANK_PROCESS=<rank>, DDP_TEST_WORLD_SIZE, DDP_TEST_RANK_DIR set;
// the group rendezvous through a file:// store in that directory, and each
// rank's output goes to rank<R>.log there, printed by the parent when the
// rank fails. Tensors cross as torch::save files (on the CPU).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace ddp::testing {

// True in a spawned rank.
bool in_rank_process();

// In a spawned rank: joins the group of all ranks (`backend`, timeout 60 s),
// makes it the default group, and runs fn(rank). An exception fails the
// rank's test (and so the parent's).
void as_rank_process(const std::string& backend, const std::function<void(int rank)>& fn);

// In a spawned rank: saves `tensors` (copied to the CPU) as `name`.
void save_tensors(const std::string& name, const std::vector<at::Tensor>& tensors);

// In the parent: runs the current test in `world_size` processes and waits
// for them (killing them all after `timeout`). A rank that fails, crashes
// or runs out of time is a test failure with its log.
class RankProcesses {
 public:
  explicit RankProcesses(int world_size,
                         std::chrono::seconds timeout = std::chrono::seconds(150));
  bool ok() const { return ok_; }
  std::vector<at::Tensor> load_tensors(int rank, const std::string& name) const;

 private:
  TempDir dir_{"ddp-ranks"};
  bool ok_ = false;
};

}  // namespace ddp::testing
