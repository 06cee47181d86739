// BucketWork and the built-in communication hooks (comm_hooks.h).
#include "ddp/comm_hooks.h"

#include <ATen/ops/empty.h>

#include <exception>
#include <utility>

#include "ddp/error.h"

namespace ddp {

struct BucketWork::State {
  // Produces the value; reset once it has run (successfully or not).
  std::function<at::Tensor()> produce;
  at::Tensor value;
  std::exception_ptr error;
  bool done = false;

  at::Tensor get() {
    if (!done) {
      done = true;
      auto fn = std::move(produce);
      produce = nullptr;
      try {
        value = fn();
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return value;
  }
};

BucketWork::BucketWork(Work work, at::Tensor value) : state_(std::make_shared<State>()) {
  state_->produce = [work, value]() mutable {
    work.wait();
    return value;
  };
}

BucketWork BucketWork::ready(at::Tensor value) {
  BucketWork w;
  w.state_ = std::make_shared<State>();
  w.state_->value = std::move(value);
  w.state_->done = true;
  return w;
}

BucketWork BucketWork::then(std::function<at::Tensor(at::Tensor)> fn) && {
  if (!state_) throw InvalidArgument("BucketWork::then on an empty BucketWork");
  BucketWork next;
  next.state_ = std::make_shared<State>();
  next.state_->produce = [prev = std::move(state_), fn = std::move(fn)] {
    return fn(prev->get());
  };
  return next;
}

at::Tensor BucketWork::wait() {
  if (!state_) throw InvalidArgument("BucketWork::wait on an empty BucketWork");
  return state_->get();
}

std::vector<at::Tensor> GradBucket::gradients() const {
  std::vector<at::Tensor> views;
  for (size_t i = 0; i < parameters.size(); ++i) {
    views.push_back(
        buffer.narrow(0, offsets[i], parameters[i].numel()).view(parameters[i].sizes()));
  }
  return views;
}

BucketWork allreduce_hook(GradBucket& bucket) {
  at::Tensor t = bucket.buffer;
  t.div_(bucket.divisor);
  return BucketWork(all_reduce_async(t, ReduceOp::SUM, bucket.collective), t);
}

namespace {

// PyTorch's compress hooks: cast, divide, all_reduce, cast back into the
// original buffer.
BucketWork compress_hook(GradBucket& bucket, at::ScalarType wire) {
  at::Tensor compressed = bucket.buffer.to(wire).div_(bucket.divisor);
  Work w = all_reduce_async(compressed, ReduceOp::SUM, bucket.collective);
  return BucketWork(std::move(w), compressed).then([out = bucket.buffer](at::Tensor sum) {
    out.copy_(sum);
    return out;
  });
}

CommHook compress_wrapper(CommHook hook, at::ScalarType wire) {
  if (!hook) throw InvalidArgument("comm hook wrapper: the wrapped hook is empty");
  return [hook = std::move(hook), wire](GradBucket& bucket) {
    GradBucket compressed = bucket;
    compressed.buffer = bucket.buffer.to(wire);
    return hook(compressed).then([out = bucket.buffer](at::Tensor value) {
      out.copy_(value);
      return out;
    });
  };
}

}  // namespace

BucketWork fp16_compress_hook(GradBucket& bucket) { return compress_hook(bucket, at::kHalf); }

BucketWork bf16_compress_hook(GradBucket& bucket) {
  return compress_hook(bucket, at::kBFloat16);
}

CommHook fp16_compress_wrapper(CommHook hook) { return compress_wrapper(std::move(hook), at::kHalf); }

CommHook bf16_compress_wrapper(CommHook hook) {
  return compress_wrapper(std::move(hook), at::kBFloat16);
}

}  // namespace ddp
