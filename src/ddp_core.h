// Internal: the state behind DistributedDataParallel<M> (see
// distributed_data_parallel.h); join.cc adds the join protocol.
#pragma once

#include <c10/core/GradMode.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/join.h"
#include "model_sync.h"
#include "reducer.h"

namespace ddp::detail {

class DdpCore {
 public:
  DdpCore(std::shared_ptr<torch::nn::Module> module,
          const DistributedDataParallelOptions& options);

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs, bool known);
  bool wants_outputs() const {
    return options_.find_unused_parameters && syncing_now();
  }
  bool syncing_now() const { return at::GradMode::is_enabled() && grad_sync_; }
  DdpStats stats() const;

  bool grad_sync_ = true;

  // Join (join.cc). begin/end bracket the user's loop; shadow_iteration()
  // mirrors one iteration of the ranks still training and returns false
  // once none is.
  void begin_join(const JoinOptions& options);
  void end_join();
  bool shadow_iteration();
  void sync_final_model(bool is_last_joiner);
  bool joining() const { return join_.has_value(); }

 private:
  int count_ranks_training(bool training);
  void sync_buffers(bool candidate);
  void check_options() const;
  void collect(std::vector<NamedTensor>& all, std::vector<std::string>& names,
               std::vector<at::Tensor>& params);

  std::shared_ptr<torch::nn::Module> module_;
  DistributedDataParallelOptions options_;
  ProcessGroupPtr group_;
  CollectiveOptions copts_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> state_tensors_;  // all parameters, then buffers
  std::shared_ptr<Reducer> reducer_;
  // PyTorch syncs buffers before a forward only if the previous forward
  // synchronised gradients (require_forward_param_sync); we follow it.
  bool require_forward_param_sync_ = true;
  std::optional<JoinOptions> join_;  // set while a join scope runs
  using Clock = std::chrono::steady_clock;
  Clock::time_point forward_start_;
  int64_t forwards_ = 0;
  double forward_s_ = 0, buffer_s_ = 0;
};

}  // namespace ddp::detail
