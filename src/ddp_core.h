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
#include "mixed_precision_params.h"
#include "model_sync.h"
#include "reducer/reducer.h"

namespace ddp::detail {

class DdpCore {
 public:
  DdpCore(std::shared_ptr<torch::nn::Module> module,
          const DistributedDataParallelOptions& options);

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs, bool known);
  // A synchronised forward's outputs are listed: for the unused-parameter
  // search and for the hooks that tell a stray backward (reducer.h).
  bool wants_outputs() const { return syncing_now(); }
  bool syncing_now() const { return at::GradMode::is_enabled() && grad_sync_; }
  DdpStats stats() const;
  at::Tensor input_to_device(const at::Tensor& input, size_t index) const;
  void register_comm_hook(CommHook hook, std::string name);

  // no_sync(): gradient sync requested for the next forwards.
  void set_grad_sync(bool enabled);
  bool grad_sync() const { return grad_sync_; }
  // DistributedDataParallel::sync_buffers(): rank 0's buffers (with join,
  // the highest rank still training) to every rank, now. Collective.
  void sync_buffers_now();

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
  // Whether this forward (or join's shadow of one) broadcasts the buffers:
  // PyTorch's rule (broadcast_buffers, the previous forward synchronised
  // gradients, there are buffers, more than one rank).
  bool buffers_due() const;
  void sync_buffers(bool candidate);
  void check_options() const;
  // DDP's mixed precision at construction: buffers cast, the parameter
  // swap and the reducer's bucket dtype (Note [Mixed-precision parameters]).
  void setup_mixed_precision(ReducerOptions& reducer_options);
  void check_group_device() const;
  void check_no_sparse_gradients() const;
  void check_model_unchanged() const;
  std::string describe_model_change() const;
  void collect(std::vector<NamedTensor>& all, std::vector<std::string>& names,
               std::vector<at::Tensor>& params);

  std::shared_ptr<torch::nn::Module> module_;
  DistributedDataParallelOptions options_;
  bool grad_sync_ = true;
  // The model as wrapped, for check_model_unchanged(): every entry of
  // named_parameters() (tied ones repeated), with its flags and shape.
  struct WrappedParam {
    std::string name;
    const void* impl;
    bool requires_grad;
    std::vector<int64_t> sizes;
  };
  std::vector<WrappedParam> wrapped_;
  std::optional<c10::Device> device_;  // the parameters' device (none: no parameters)
  ProcessGroupPtr group_;
  CollectiveOptions copts_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> state_tensors_;  // all parameters, then buffers
  std::shared_ptr<Reducer> reducer_;
  // With MixedPrecision::param_dtype; shared with the reducer's
  // on_backward_end, which may outlive this core by a queued callback.
  std::shared_ptr<MixedPrecisionParams> low_params_;
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
