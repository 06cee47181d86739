// DistributedDataParallel misuse and edge cases: every error with its
// message on every rank, within the timeout; outputs that are tuples or
// structs; statistics and the bucket rebuild.
#include <gtest/gtest.h>

#include "ddp/collectives.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/models.h"
#include "support/thread_world.h"

namespace ddp::testing {

// A forward output struct, made visible to find_unused_parameters.
struct HeadsOut {
  at::Tensor main, extra;
};
void collect_tensors(const HeadsOut& o, std::vector<at::Tensor>& into) {
  into.push_back(o.main);
  into.push_back(o.extra);
}

struct TwoHeadsImpl : torch::nn::Module {
  torch::nn::Linear body{nullptr}, a{nullptr}, b{nullptr};
  TwoHeadsImpl() {
    body = register_module("body", torch::nn::Linear(8, 8));
    a = register_module("a", torch::nn::Linear(8, 4));
    b = register_module("b", torch::nn::Linear(8, 4));
  }
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x) {
    auto h = torch::relu(body(x));
    return {a(h), b(h)};
  }
};
TORCH_MODULE(TwoHeads);

struct StructOutImpl : TwoHeadsImpl {
  HeadsOut forward(at::Tensor x) {
    auto [p, q] = TwoHeadsImpl::forward(x);
    return {p, q};
  }
};
TORCH_MODULE(StructOut);

namespace {

std::string message(const std::exception_ptr& e) { return message_of(e); }

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DdpErrors, UnusedParameterWithoutFlagIsNamedOnEveryRank) {
  auto errors = run_ranks_collect(2, [](int r) {
    Branchy net;
    DistributedDataParallel<Branchy> model(net);
    // Rank 1 uses the aux head, rank 0 does not: rank 1's bucket with aux
    // must not hang waiting for rank 0.
    model(torch::randn({4, 8}), r == 1).sum().backward();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(is_a<InvalidArgument>(errors[r])) << "rank " << r << ": " << message(errors[r]);
    std::string m = message(errors[r]);
    EXPECT_TRUE(contains(m, "2 parameter(s) received no gradient")) << m;
    EXPECT_TRUE(contains(m, "aux.weight")) << m;
    EXPECT_TRUE(contains(m, "aux.bias")) << m;
    EXPECT_TRUE(contains(m, r == 0 ? "unused on this rank; used on 1 of 2 ranks"
                                   : "used on this rank; used on 1 of 2 ranks")) << m;
    EXPECT_TRUE(contains(m, "find_unused_parameters = true")) << m;
    EXPECT_FALSE(contains(m, "body.weight")) << m;
  }
}

TEST(DdpErrors, UnusedOnAllRanksSaysSo) {
  auto errors = run_ranks_collect(3, [](int) {
    Branchy net;
    DistributedDataParallel<Branchy> model(net);
    model(torch::randn({4, 8}), false).sum().backward();
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(message(e), "aux.weight (unused on all 3 ranks)")) << message(e);
  }
}

TEST(DdpErrors, ModelMismatchNamesTheParameterOnEveryRank) {
  struct Case { const char* what; std::function<void(Mlp&)> change; const char* expect; };
  std::vector<Case> cases = {
      {"shape", [](Mlp& m) { m->fc2 = m->replace_module("fc2", torch::nn::Linear(16, 15)); m->fc3 = m->replace_module("fc3", torch::nn::Linear(15, 4)); },
       "at position 2 rank 0 has parameter 'fc2.weight' float32[16, 16] but rank 1 has parameter 'fc2.weight' float32[15, 16]"},
      {"dtype", [](Mlp& m) { m->fc3->to(torch::kDouble); },
       "at position 4 rank 0 has parameter 'fc3.weight' float32[4, 16] but rank 1 has parameter 'fc3.weight' float64[4, 16]"},
      {"count", [](Mlp& m) { m->register_parameter("extra", torch::zeros({2})); },
       "rank 0 has 6 parameters and buffers but rank 1 has 7; at position 0 rank 0 has parameter 'fc1.weight' float32[16, 8] but rank 1 has parameter 'extra' float32[2]"},
  };
  for (const auto& c : cases) {
    auto errors = run_ranks_collect(2, [&](int r) {
      Mlp net;
      if (r == 1) c.change(net);
      DistributedDataParallel<Mlp> model(net);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(is_a<MismatchError>(errors[r])) << c.what << " rank " << r << ": " << message(errors[r]);
      EXPECT_TRUE(contains(message(errors[r]), c.expect)) << c.what << ": " << message(errors[r]);
    }
  }
}

TEST(DdpErrors, BackwardTwiceForOneForward) {
  auto errors = run_ranks_collect(2, [](int) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    auto loss = model(torch::randn({4, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
  });
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(message(e), "backward() ran twice for one forward")) << message(e);
  }
}

TEST(DdpErrors, BadOptions) {
  run_ranks(1, [](int) {
    Mlp net;
    auto expect = [&](DistributedDataParallelOptions o, const std::string& part) {
      try {
        DistributedDataParallel<Mlp> model(net, o);
        ADD_FAILURE() << "accepted: " << part;
      } catch (const InvalidArgument& e) {
        EXPECT_TRUE(contains(e.what(), part)) << e.what();
      }
    };
    DistributedDataParallelOptions o;
    o.bucket_cap_mb = 0;
    expect(o, "bucket_cap_mb (0)");
    o = {};
    o.device_ids = {c10::Device("cpu"), c10::Device("cpu")};
    expect(o, "device_ids has 2 devices");
    o = {};
    o.device_ids = {c10::Device("meta")};
    expect(o, "parameter 'fc1.weight' is on cpu but device_ids names meta");
  });
}

TEST(DdpErrors, RankThatSkipsBackwardTimesOutNamingTheBucket) {
  ThreadWorldOptions w;
  w.timeout = std::chrono::milliseconds(1500);
  auto errors = run_ranks_collect(2, [](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    auto loss = model(torch::randn({4, 8})).sum();
    if (r == 0) loss.backward();
  }, w);
  ASSERT_TRUE(is_a<TimeoutError>(errors[0])) << message(errors[0]);
  EXPECT_TRUE(contains(message(errors[0]), "all_reduce of gradient bucket 0 of 1")) << message(errors[0]);
  EXPECT_FALSE(errors[1]);
}

TEST(DdpOutputs, TupleAndStructOutputsWithUnusedHead) {
  run_ranks(2, [](int r) {
    DistributedDataParallelOptions o;
    o.find_unused_parameters = true;
    TwoHeads net;
    DistributedDataParallel<TwoHeads> model(net, o);
    auto [p, q] = model(torch::randn({4, 8}));
    // Head b is in the output but not in the loss: reachable from the
    // outputs, yet it gets no gradient. PyTorch raises here; we reduce it as
    // unused.
    p.sum().backward();
    EXPECT_TRUE(net->a->weight.grad().defined());
    EXPECT_FALSE(net->b->weight.grad().defined());
    EXPECT_EQ(model.stats().unused_parameters_last, 2);

    StructOut snet;
    DistributedDataParallel<StructOut> smodel(snet, o);
    HeadsOut out = smodel(torch::randn({4, 8}));
    (r == 0 ? out.main : out.extra).sum().backward();
    // Each head used on one rank: both get (that rank's gradient) / 2.
    EXPECT_TRUE(snet->a->weight.grad().defined());
    EXPECT_TRUE(snet->b->weight.grad().defined());
    auto a = ddp::all_gather(snet->a->weight.grad().contiguous());
    EXPECT_TRUE(a[0].equal(a[1]));
  });
}

TEST(DdpStatsTest, BucketsRebuildOnceAndStatsAreFilled) {
  run_ranks(2, [](int) {
    DistributedDataParallelOptions o;
    o.bucket_cap_mb = 0.001;  // 1048 bytes
    o.first_bucket_cap_mb = 0.0002;
    Mlp net;
    DistributedDataParallel<Mlp> model(net, o);
    for (int i = 0; i < 3; ++i) model(torch::randn({4, 8})).sum().backward();
    DdpStats s = model.stats();
    EXPECT_EQ(s.iterations, 3);
    EXPECT_TRUE(s.buckets_rebuilt);
    EXPECT_EQ(s.parameters, 6);
    int64_t params = 0, bytes = 0;
    for (size_t b = 0; b < s.bucket_params.size(); ++b) {
      params += s.bucket_params[b];
      bytes += s.bucket_bytes[b];
    }
    EXPECT_EQ(params, 6);
    EXPECT_EQ(bytes, (8 * 16 + 16 + 16 * 16 + 16 + 16 * 4 + 4) * 4);
    EXPECT_EQ(s.gradient_bytes, bytes);
    EXPECT_GT(s.bucket_params.size(), 2u);
    EXPECT_GT(s.forward_s, 0.0);
    EXPECT_GT(s.backward_compute_s, 0.0);
    EXPECT_GT(s.backward_comm_s, 0.0);
    EXPECT_TRUE(contains(to_string(s), "6 params in")) << to_string(s);
  });
}

TEST(DdpStatsTest, WorldSizeOneReportsNoCommunication) {
  run_ranks(1, [](int) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    for (int i = 0; i < 3; ++i) model(torch::randn({4, 8})).sum().backward();
    DdpStats s = model.stats();
    EXPECT_EQ(s.iterations, 3);
    EXPECT_GT(s.backward_compute_s, 0.0);
    EXPECT_EQ(s.backward_comm_s, 0.0);
    EXPECT_EQ(s.exposed_comm_s, 0.0);
  });
}

}  // namespace
}  // namespace ddp::testing
