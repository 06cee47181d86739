// The two BucketComm implementations of Note [Bucket communication]
// (reducer/bucket_comm.h), over a ddp ProcessGroup.
#include "group_bucket_comm.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <exception>
#include <utility>

#include "ddp/error.h"
#include "tensor_text.h"
#include "work.h"

namespace ddp::detail {
namespace {

BucketBuffer ordinary_buffer(int64_t numel, const at::TensorOptions& options) {
  return {at::zeros({numel}, options), false};
}

// Today's default: one all_reduce per bucket over [grads | flags].
class FusedAllReduce : public BucketComm {
 public:
  explicit FusedAllReduce(BucketCommContext c) : c_(std::move(c)) {}
  bool prescaled() const override { return true; }
  std::string name() const override { return "built-in all_reduce (fused with the used flags)"; }

  // In the group's shared memory where it has some (Note [Shared-memory
  // all-reduce]): the gradients are then written straight into the buffer
  // the peers read, and the all_reduce copies nothing in.
  BucketBuffer allocate(int64_t numel, const at::TensorOptions& options) override {
    const auto& shm = c_.group->impl().shm;
    if (shm && options.device().is_cpu()) {
      at::Tensor t = shm->allocate(numel, options.dtype().toScalarType());
      if (t.defined()) return {t.zero_(), true};
    }
    return ordinary_buffer(numel, options);
  }

  void fence() override {
    ProcessGroupImpl& g = c_.group->impl();
    if (!g.shm) return;
    try {
      g.shm->fence(c_.timeout.value_or(g.timeout));
    } catch (...) {
      rethrow_as_comm_error("DistributedDataParallel: waiting for the peers to finish reading "
                            "the shared gradient buckets");
    }
  }

  void launch(const BucketIo& b) override {
    if (b.index == 0) works_.assign(b.count, nullptr);
    CollectiveOptions copts{c_.group, c_.timeout};
    std::vector<at::Tensor> tensors{b.flat};
    BucketScope scope(b.iteration, static_cast<int>(b.index));
    works_.at(b.index) = (start_work(
        copts,
        fmt::format("all_reduce of gradient bucket {} of {} (iteration {})", b.index, b.count,
                    b.iteration),
        [&](compat::Backend& backend, std::chrono::milliseconds t) {
          c10d::AllreduceOptions o;
          o.timeout = t;
          return backend_all_reduce(c_.group->impl(), backend, tensors, o);
        },
        [&] { return "all_reduce SUM " + describe_tensors(tensors); }));
  }

  // Every bucket on the stream first, then on the host (Note [CUDA buckets]
  // in reducer.h; on CPU both are the one wait).
  void wait(const std::vector<BucketIo>&) override {
    for (auto& w : works_) {
      if (w) w->wait_stream();
    }
    for (auto& w : works_) {
      if (w) w->wait();
    }
  }

 private:
  BucketCommContext c_;
  std::vector<std::shared_ptr<WorkImpl>> works_;
};

// A user's CommHook per bucket, then every bucket's flags in one all_reduce.
class HookComm : public BucketComm {
 public:
  HookComm(BucketCommContext c, CommHook hook, std::string name)
      : c_(std::move(c)), hook_(std::move(hook)), name_(std::move(name)) {}
  bool prescaled() const override { return false; }
  std::string name() const override { return name_; }
  // Out of shared memory: a hook's collectives copy their own tensors.
  BucketBuffer allocate(int64_t numel, const at::TensorOptions& options) override {
    return ordinary_buffer(numel, options);
  }
  void fence() override {}

  void launch(const BucketIo& b) override {
    if (b.index == 0) {
      results_.assign(b.count, BucketWork());
      flags_.clear();
    }
    BucketScope scope(b.iteration, static_cast<int>(b.index));
    results_.at(b.index) = run_hook(b);
    flags_.push_back(b.flags.to(at::kFloat));
    if (b.index + 1 == b.count) {
      flags_sum_ = at::cat(flags_);
      flags_work_ = all_reduce_async(flags_sum_, ReduceOp::SUM, {c_.group, c_.timeout});
    }
  }

  void wait(const std::vector<BucketIo>& buckets) override {
    for (size_t k = 0; k < buckets.size(); ++k) {
      at::Tensor value = named_errors(buckets[k], "its result", [&] { return results_.at(k).wait(); });
      take_value(buckets[k], value);
    }
    flags_work_.wait();
    int64_t at = 0;
    for (const BucketIo& b : buckets) {
      b.flags.copy_(flags_sum_.narrow(0, at, b.flags.numel()));
      at += b.flags.numel();
    }
  }

 private:
  BucketWork run_hook(const BucketIo& b) {
    GradBucket g;
    g.index = b.index;
    g.is_last = b.index + 1 == b.count;
    g.buffer = b.grads;
    g.parameters = b.params;
    g.offsets = b.offsets;
    g.divisor = b.divisor;
    g.collective = CollectiveOptions{c_.group, c_.timeout};
    g.iteration = b.iteration;
    BucketWork w = named_errors(b, "", [&] { return hook_(g); });
    if (!w.valid()) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: comm hook '{}' returned an empty BucketWork for "
          "gradient bucket {} of {}; return BucketWork::ready(bucket.buffer) to keep "
          "the local gradients",
          name_, b.index, b.count));
    }
    return w;
  }

  // Runs fn; an error other than a collective's (which keeps its type)
  // becomes InvalidArgument naming the hook and the bucket.
  template <typename Fn>
  auto named_errors(const BucketIo& b, const char* where, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const TimeoutError&) {
      throw;
    } catch (const CommError&) {
      throw;
    } catch (const MismatchError&) {
      throw;
    } catch (const std::exception& e) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: comm hook '{}' threw on gradient bucket {} of {} "
          "(iteration {}){}{}: {}",
          name_, b.index, b.count, b.iteration, *where ? " computing " : "", where, e.what()));
    }
  }

  void take_value(const BucketIo& b, const at::Tensor& value) const {
    if (!value.defined() || value.numel() != b.grads.numel() ||
        value.scalar_type() != b.grads.scalar_type()) {
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: comm hook '{}' gave gradient bucket {} of {} a "
          "value with {} elements of {}; expected {} elements of {} (the bucket "
          "buffer's size and dtype)",
          name_, b.index, b.count, value.defined() ? value.numel() : 0,
          value.defined() ? dtype_name(value.scalar_type()) : "undefined",
          b.grads.numel(), dtype_name(b.grads.scalar_type())));
    }
    if (!(value.data_ptr() == b.grads.data_ptr() && value.is_contiguous())) {
      b.grads.copy_(value.reshape({-1}));
    }
  }

  BucketCommContext c_;
  CommHook hook_;
  std::string name_;
  std::vector<BucketWork> results_;
  std::vector<at::Tensor> flags_;
  at::Tensor flags_sum_;
  Work flags_work_;
};

}  // namespace

std::unique_ptr<BucketComm> make_fused_all_reduce(BucketCommContext context) {
  return std::make_unique<FusedAllReduce>(std::move(context));
}

std::unique_ptr<BucketComm> make_hook_comm(BucketCommContext context, CommHook hook,
                                           std::string name) {
  if (!hook) throw InvalidArgument("DistributedDataParallel::register_comm_hook: the hook is empty");
  return std::make_unique<HookComm>(std::move(context), std::move(hook), std::move(name));
}

}  // namespace ddp::detail
