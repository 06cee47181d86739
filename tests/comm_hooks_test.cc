// Communication hooks (comm_hooks.h): the built-in hooks give the values
// PyTorch's give (ddp_oracle_test checks them against Python too), a user's
// hook sees the buckets as documented and is fully in charge of the result,
// and hooks work with no_sync, find_unused_parameters,
// gradient_as_bucket_view and join. PowerSGD's hooks: powersgd_test.cc.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/branchy_training.h"
#include "support/model_state.h"
#include "support/models.h"

namespace ddp::testing {
namespace {

// The rank-0 gradients of one synchronised backward with `hook` (or none).
NamedState one_backward(int world, const CommHook& hook) {
  TrainRun run;
  run.world = world;
  NamedState grads;
  std::mutex mu;
  run.steps = 0;
  run.setup = [&](DistributedDataParallel<Branchy>& model, int r) {
    if (hook) model.register_comm_hook(hook, "under test");
    torch::mse_loss(model(data(0, r, 8), true), data(0, r + 100, 4)).backward();
    if (r == 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& p : model.named_parameters()) {
        if (p.value().grad().defined()) grads.emplace_back(p.key(), p.value().grad().clone());
      }
    }
  };
  train(run);
  return grads;
}

// What each rank's gradients are alone (no reduction).
std::vector<NamedState> local_gradients(int world) {
  std::vector<NamedState> out;
  torch::manual_seed(3);
  Branchy m;
  for (int r = 0; r < world; ++r) {
    m->zero_grad();
    torch::mse_loss(m(data(0, r, 8), true), data(0, r + 100, 4)).backward();
    NamedState g;
    for (const auto& p : m->named_parameters()) {
      if (p.value().grad().defined()) g.emplace_back(p.key(), p.value().grad().clone());
    }
    out.push_back(g);
  }
  return out;
}

// PyTorch's compress hook by hand: each rank's gradient cast to `wire`,
// divided by the world size, summed in `wire`.
NamedState compressed_average(int world, at::ScalarType wire) {
  auto local = local_gradients(world);
  NamedState avg = local[0];
  for (size_t i = 0; i < avg.size(); ++i) {
    at::Tensor sum = local[0][i].second.to(wire).div(world);
    for (int r = 1; r < world; ++r) sum = sum + local[r][i].second.to(wire).div(world);
    avg[i].second = sum.to(at::kFloat);
  }
  return avg;
}

TEST(CommHooks, AllreduceHookEqualsTheBuiltInAllReduce) {
  TrainRun plain;
  TrainRun hooked;
  hooked.setup = [](auto& model, int) { model.register_comm_hook(allreduce_hook, "allreduce"); };
  for (int world : {1, 2, 3}) {
    plain.world = hooked.world = world;
    auto a = train(plain), b = train(hooked);
    for (int r = 0; r < world; ++r) {
      expect_same_state(a[r], b[r], "world " + std::to_string(world), 1e-6);
    }
  }
}

TEST(CommHooks, Fp16CompressRoundsAsPyTorchDoes) {
  NamedState got = one_backward(2, fp16_compress_hook);
  NamedState want = compressed_average(2, at::kHalf);
  expect_same_state(got, want, "fp16_compress_hook", 1e-7);
  // The rounding is real: the float32 average differs.
  EXPECT_GT(max_diff(got, one_backward(2, nullptr)), 1e-6);
}

TEST(CommHooks, Bf16CompressRoundsAsPyTorchDoes) {
  NamedState got = one_backward(2, bf16_compress_hook);
  expect_same_state(got, compressed_average(2, at::kBFloat16), "bf16_compress_hook", 1e-7);
  EXPECT_GT(max_diff(got, one_backward(2, nullptr)), 1e-5);
}

TEST(CommHooks, CompressWrappersAroundAllreduceEqualTheCompressHooks) {
  expect_same_state(one_backward(2, fp16_compress_wrapper(allreduce_hook)),
                    one_backward(2, fp16_compress_hook), "fp16 wrapper", 0);
  expect_same_state(one_backward(2, bf16_compress_wrapper(allreduce_hook)),
                    one_backward(2, bf16_compress_hook), "bf16 wrapper", 0);
}

TEST(CommHooks, Fp16AtWorldSizeOneStillRounds) {
  NamedState got = one_backward(1, fp16_compress_hook);
  expect_same_state(got, compressed_average(1, at::kHalf), "fp16 alone", 0);
}

TEST(CommHooks, NoopHookLeavesEachRanksOwnGradients) {
  CommHook noop = [](GradBucket& b) { return BucketWork::ready(b.buffer); };
  TrainRun run;
  run.steps = 0;
  std::vector<NamedState> got(2);
  run.setup = [&](auto& model, int r) {
    model.register_comm_hook(noop, "noop");
    torch::mse_loss(model(data(0, r, 8), true), data(0, r + 100, 4)).backward();
    for (const auto& p : model.named_parameters()) {
      if (p.value().grad().defined()) got[r].emplace_back(p.key(), p.value().grad().clone());
    }
  };
  train(run);
  auto local = local_gradients(2);
  expect_same_state(got[0], local[0], "rank 0", 0);
  expect_same_state(got[1], local[1], "rank 1", 0);
}

TEST(CommHooks, AllGatherHookAveragesLikeTheBuiltIn) {
  CommHook gather_mean = [](GradBucket& b) {
    std::vector<at::Tensor> all = all_gather(b.buffer, b.collective);
    at::Tensor sum = at::zeros_like(b.buffer);
    for (const at::Tensor& t : all) sum.add_(t);
    return BucketWork::ready(sum.div_(b.divisor));
  };
  expect_same_state(one_backward(2, gather_mean), one_backward(2, nullptr), "all_gather hook",
                    1e-7);
}

// A hook with separate state sees every bucket once per backward, in order,
// with the documented fields.
TEST(CommHooks, StatefulHookSeesEveryBucketInOrder) {
  struct Seen {
    std::vector<size_t> indices;
    std::vector<bool> last;
    int64_t params = 0;
    std::vector<int64_t> iterations;
  };
  std::vector<std::shared_ptr<Seen>> seen{std::make_shared<Seen>(), std::make_shared<Seen>()};
  TrainRun run;
  run.options.bucket_cap_mb = 1e-4;  // ~100 bytes: several buckets
  run.options.first_bucket_cap_mb = 1e-4;
  std::vector<DdpStats> stats(2);
  run.setup = [&](auto& model, int r) {
    model.register_comm_hook(
        seen[r],
        [](Seen& s, GradBucket& b) {
          s.indices.push_back(b.index);
          s.last.push_back(b.is_last);
          s.params += static_cast<int64_t>(b.parameters.size());
          s.iterations.push_back(b.iteration);
          int64_t numel = 0;
          for (const at::Tensor& g : b.gradients()) numel += g.numel();
          EXPECT_EQ(numel, b.buffer.numel());
          EXPECT_EQ(b.divisor, 2);
          return allreduce_hook(b);
        },
        "recorder");
    stats[r] = model.stats();
  };
  run.steps = 2;
  train(run);
  const size_t buckets = stats[0].bucket_bytes.size();
  ASSERT_GT(buckets, 2u);
  EXPECT_EQ(stats[0].comm_hook, "recorder");
  for (const auto& s : seen) {
    ASSERT_EQ(s->indices.size(), 2 * buckets);
    for (size_t i = 0; i < s->indices.size(); ++i) {
      EXPECT_EQ(s->indices[i], i % buckets);
      EXPECT_EQ(s->last[i], i % buckets == buckets - 1);
      EXPECT_EQ(s->iterations[i], static_cast<int64_t>(i / buckets));
    }
    EXPECT_EQ(s->params, 2 * 6);  // Branchy: 6 parameters, every one each time
  }
}

TrainRun with_allreduce_hook(TrainRun run) {
  run.setup = [](auto& model, int) { model.register_comm_hook(allreduce_hook, "allreduce"); };
  return run;
}

void expect_hook_equals_builtin(const TrainRun& run, const std::string& what) {
  auto a = train(run), b = train(with_allreduce_hook(run));
  for (size_t r = 0; r < a.size(); ++r) {
    expect_same_state(a[r], b[r], what + ", rank " + std::to_string(r), 1e-6);
  }
}

TEST(CommHooks, WorkWithNoSyncFindUnusedBucketViewAndJoin) {
  TrainRun accumulate;
  accumulate.accumulate = 2;
  expect_hook_equals_builtin(accumulate, "no_sync");
  TrainRun unused;
  unused.aux_on_rank1 = true;
  unused.options.find_unused_parameters = true;
  expect_hook_equals_builtin(unused, "find_unused_parameters");
  TrainRun view;
  view.options.gradient_as_bucket_view = true;
  expect_hook_equals_builtin(view, "gradient_as_bucket_view");
  TrainRun uneven;
  uneven.rank_steps = {2, 4};
  expect_hook_equals_builtin(uneven, "join");
}

TEST(CommHooks, UnusedParameterIsStillNamedOnEveryRank) {
  TrainRun run = with_allreduce_hook(TrainRun{});
  run.aux_on_rank1 = true;
  run.steps = 1;
  try {
    train(run);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("aux.weight (unused on this rank; used on 1 of 2 ranks)"),
              std::string::npos)
        << e.what();
  }
}

std::string error_of(const std::function<void(DistributedDataParallel<Branchy>&, int)>& setup) {
  TrainRun run;
  run.steps = 1;
  run.setup = setup;
  try {
    train(run);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CommHooks, MisuseIsRefusedWithAClearMessage) {
  EXPECT_NE(error_of([](auto& m, int) {
              m.register_comm_hook(allreduce_hook, "first");
              m.register_comm_hook(fp16_compress_hook, "second");
            }).find("a comm hook ('first') is already registered"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& m, int r) {
              torch::mse_loss(m(data(0, r, 8), true), data(0, r, 4)).backward();
              m.register_comm_hook(allreduce_hook, "late");
            }).find("call it before the first forward"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& m, int) { m.register_comm_hook(CommHook(), "empty"); })
                .find("the hook is empty"),
            std::string::npos);
}

TEST(CommHooks, ABadHookValueOrAThrowingHookNamesTheBucket) {
  std::string wrong = error_of([](auto& m, int) {
    m.register_comm_hook([](GradBucket& b) { return BucketWork::ready(b.buffer.narrow(0, 0, 1)); },
                         "short");
  });
  EXPECT_NE(wrong.find("comm hook 'short' gave gradient bucket 0 of 1 a value with 1 elements "
                       "of float32; expected 280 elements of float32"),
            std::string::npos)
      << wrong;
  std::string threw = error_of([](auto& m, int) {
    m.register_comm_hook(
        [](GradBucket&) -> BucketWork { throw std::runtime_error("compressor broke"); },
        "thrower");
  });
  EXPECT_NE(threw.find("comm hook 'thrower' threw on gradient bucket 0 of 1 (iteration 0): "
                       "compressor broke"),
            std::string::npos)
      << threw;
}

// An error while waiting (in a continuation) names the hook and the bucket,
// and the next backward is refused: the ranks are out of step.
TEST(CommHooks, AContinuationThatThrowsIsNamedAndStopsTraining) {
  TrainRun run;
  run.steps = 0;
  std::vector<std::string> first(2), second(2);
  run.setup = [&](auto& model, int r) {
    model.register_comm_hook(
        [](GradBucket& b) {
          return allreduce_hook(b).then(
              [](at::Tensor) -> at::Tensor { throw std::runtime_error("decoder broke"); });
        },
        "bad decoder");
    auto step = [&] {
      torch::mse_loss(model(data(0, r, 8), true), data(0, r + 100, 4)).backward();
    };
    try {
      step();
    } catch (const InvalidArgument& e) {
      first[r] = e.what();
    }
    try {
      step();
    } catch (const InvalidArgument& e) {
      second[r] = e.what();
    }
  };
  train(run);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(first[r].find("comm hook 'bad decoder' threw on gradient bucket 0 of 1 "
                            "(iteration 0) computing its result: decoder broke"),
              std::string::npos)
        << first[r];
    EXPECT_NE(second[r].find("the previous backward() did not finish"), std::string::npos)
        << second[r];
  }
}

TEST(CommHooks, BucketWorkThenChainsAndWaitIsRepeatable) {
  int calls = 0;
  BucketWork w = BucketWork::ready(torch::ones({2})).then([&](at::Tensor t) {
    ++calls;
    return t * 3;
  });
  EXPECT_TRUE(torch::equal(w.wait(), torch::full({2}, 3.0)));
  EXPECT_TRUE(torch::equal(w.wait(), torch::full({2}, 3.0)));
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(BucketWork().wait(), InvalidArgument);
  // An error is kept, not recomputed.
  BucketWork failing = BucketWork::ready(torch::ones({1})).then([&](at::Tensor) -> at::Tensor {
    ++calls;
    throw std::runtime_error("once");
  });
  EXPECT_THROW(failing.wait(), std::runtime_error);
  EXPECT_THROW(failing.wait(), std::runtime_error);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace ddp::testing
