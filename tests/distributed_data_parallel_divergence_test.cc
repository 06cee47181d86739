// Training patterns that used to let replicas drift apart silently or fail
// with a misleading message (issue 11): each either gives the single-process
// values on every rank or a clear error on every rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/scoped_env.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

constexpr int kBatch = 4;
constexpr double kLr = 0.1;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every rank must have thrown InvalidArgument containing every part.
void expect_error_everywhere(const std::vector<std::exception_ptr>& errors,
                             const std::vector<std::string>& parts) {
  for (size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(is_a<InvalidArgument>(errors[r])) << "rank " << r << ": " << message_of(errors[r]);
    for (const auto& part : parts) {
      EXPECT_TRUE(contains(message_of(errors[r]), part))
          << "rank " << r << " lacks '" << part << "': " << message_of(errors[r]);
    }
  }
}

// Micro-step k on rank r: its slice of step data x[k] ([W*B, 8]).
at::Tensor slice(const at::Tensor& x, int rank) { return x.narrow(0, rank * kBatch, kBatch); }

// Branchy with no_sync micro-steps: aux is used in micro-step `aux_micro`
// only, on the ranks in `aux_ranks`; the last micro-step synchronises.
// Returns every rank's state after one SGD step.
std::vector<NamedState> train_micro_steps(const Branchy& init, int world, int K, int aux_micro,
                                          const std::vector<int>& aux_ranks,
                                          const std::vector<at::Tensor>& x,
                                          const std::vector<at::Tensor>& y, bool find_unused) {
  std::vector<Branchy> models(world);
  for (auto& m : models) copy_state(init, m);
  std::vector<NamedState> states(world);
  run_ranks(world, [&](int r) {
    DistributedDataParallelOptions o;
    o.find_unused_parameters = find_unused;
    DistributedDataParallel<Branchy> model(models[r], o);
    torch::optim::SGD opt(model.parameters(), kLr);
    opt.zero_grad();
    const bool aux_here = std::count(aux_ranks.begin(), aux_ranks.end(), r) > 0;
    for (int k = 0; k < K; ++k) {
      auto step = [&] {
        auto out = model(slice(x[k], r), aux_here && k == aux_micro);
        (torch::mse_loss(out, slice(y[k], r)) / K).backward();
      };
      if (k + 1 < K) {
        auto guard = model.no_sync();
        step();
      } else {
        step();
      }
    }
    opt.step();
    states[r] = state_of(models[r]);
  });
  return states;
}

// One process on all W*K micro-batches, each through forward as its rank
// would: the loss is the mean of the per-(rank, micro-step) losses.
NamedState reference_micro_steps(const Branchy& init, int world, int K, int aux_micro,
                                 const std::vector<int>& aux_ranks,
                                 const std::vector<at::Tensor>& x,
                                 const std::vector<at::Tensor>& y) {
  Branchy ref;
  copy_state(init, ref);
  torch::optim::SGD opt(ref->parameters(), kLr);
  at::Tensor loss = torch::zeros({});
  for (int r = 0; r < world; ++r) {
    const bool aux_here = std::count(aux_ranks.begin(), aux_ranks.end(), r) > 0;
    for (int k = 0; k < K; ++k) {
      loss = loss + torch::mse_loss(ref(slice(x[k], r), aux_here && k == aux_micro), slice(y[k], r));
    }
  }
  (loss / (world * K)).backward();
  opt.step();
  return state_of(ref);
}

struct MicroCase {
  int world;
  std::vector<int> aux_ranks;
  bool find_unused;
};

TEST(DdpNoSync, ParameterUsedOnlyInMicroStepsIsAveragedOnEveryRank) {
  const int K = 3;
  for (const MicroCase& c : std::vector<MicroCase>{
           {2, {1}, true},        // one rank, found unused in the last step
           {3, {0, 2}, true},     // some ranks
           {2, {0, 1}, true},     // every rank
           {2, {0, 1}, false},    // every rank, without find_unused_parameters
       }) {
    torch::manual_seed(21);
    Branchy init;
    std::vector<at::Tensor> x, y;
    for (int k = 0; k < K; ++k) {
      x.push_back(torch::randn({c.world * kBatch, 8}));
      y.push_back(torch::randn({c.world * kBatch, 4}));
    }
    auto states = train_micro_steps(init, c.world, K, /*aux_micro=*/0, c.aux_ranks, x, y,
                                    c.find_unused);
    auto expected = reference_micro_steps(init, c.world, K, 0, c.aux_ranks, x, y);
    for (int r = 0; r < c.world; ++r) {
      expect_same_state(states[r], expected,
                        "world " + std::to_string(c.world) + " rank " + std::to_string(r) +
                            (c.find_unused ? " find_unused" : ""));
    }
  }
}

TEST(DdpBypass, BackwardThroughModuleForwardRaisesOnTheFirstIteration) {
  auto errors = run_ranks_collect(2, [](int) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    model.module()->forward(torch::randn({4, 8})).sum().backward();
  });
  expect_error_everywhere(errors, {"did not come from the wrapper's forward",
                                   "model.module()->forward(x)", "calling the wrapper"});
}

TEST(DdpBypass, BackwardThroughModuleForwardAfterANormalStepIsNotCalledTwice) {
  auto errors = run_ranks_collect(2, [](int) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    model(torch::randn({4, 8})).sum().backward();  // a normal step
    model.module()->forward(torch::randn({4, 8})).sum().backward();
  });
  expect_error_everywhere(errors, {"did not come from the wrapper's forward"});
  for (const auto& e : errors) EXPECT_FALSE(contains(message_of(e), "ran twice")) << message_of(e);
}

TEST(DdpBypass, SecondBackwardOfOneForwardIsStillNamedAsSuch) {
  auto errors = run_ranks_collect(2, [](int) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    model(torch::randn({4, 8})).sum().backward();
    auto loss = model(torch::randn({4, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
  });
  expect_error_everywhere(errors, {"backward() ran twice for one forward"});
}

TEST(DdpBypass, ForwardWithoutGradThenTrainingStepStillWorks) {
  // An evaluation forward under NoGradGuard builds no graph and must not
  // disturb the next training step (nor count as a stray backward).
  run_ranks(2, [](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    {
      torch::NoGradGuard no_grad;
      model(torch::randn({4, 8}));
    }
    model(torch::full({4, 8}, r + 1.0)).sum().backward();
    for (const auto& p : model.parameters()) ASSERT_TRUE(p.grad().defined());
  });
}

TEST(DdpChangedModel, ReplacedSubmoduleIsNamedAtTheNextForward) {
  auto errors = run_ranks_collect(2, [](int) {
    Branchy net;
    DistributedDataParallel<Branchy> model(net);
    model(torch::randn({4, 8}), true).sum().backward();
    net->head = net->replace_module("head", torch::nn::Linear(16, 4));
    model(torch::randn({4, 8}), true);
  });
  expect_error_everywhere(errors, {"the model changed after it was wrapped",
                                   "parameter 'head.weight' is another tensor",
                                   "Wrap the changed model again"});
}

TEST(DdpChangedModel, FlippedRequiresGradIsNamed) {
  auto errors = run_ranks_collect(2, [](int) {
    Branchy net;
    DistributedDataParallel<Branchy> model(net);
    net->aux->bias.set_requires_grad(false);
    model(torch::randn({4, 8}), true);
  });
  expect_error_everywhere(errors,
                          {"requires_grad of parameter 'aux.bias' changed from true to false"});
}

TEST(DdpChangedModel, AddedParameterIsNamed) {
  auto errors = run_ranks_collect(2, [](int) {
    Branchy net;
    DistributedDataParallel<Branchy> model(net);
    net->register_parameter("scale", torch::ones({1}));
    model(torch::randn({4, 8}), true);
  });
  expect_error_everywhere(errors, {"parameter 'scale' was added"});
}

TEST(DdpTied, ParametersListATiedTensorOnce) {
  run_ranks(1, [](int) {
    Tied net;
    DistributedDataParallel<Tied> model(net);
    EXPECT_EQ(net->parameters().size(), 4u);  // libtorch: w twice
    EXPECT_EQ(model.parameters().size(), 3u);
    std::vector<std::string> names;
    for (const auto& item : model.named_parameters()) names.push_back(item.key());
    EXPECT_EQ(names, (std::vector<std::string>{"w", "mid.weight", "mid.bias"}));
  });
}

// Two synchronised forwards whose outputs both reach the loss, then one
// backward: the same gradients as one process.
TEST(DdpTwoForwards, OneBackwardThroughBothIsReducedCorrectly) {
  for (bool find_unused : {true, false}) {
    const int W = 2;
    torch::manual_seed(5);
    Branchy init;
    at::Tensor x1 = torch::randn({W * kBatch, 8}), x2 = torch::randn({W * kBatch, 8});
    at::Tensor y = torch::randn({W * kBatch, 4});
    std::vector<Branchy> models(W);
    for (auto& m : models) copy_state(init, m);
    std::vector<NamedState> states(W);
    run_ranks(W, [&](int r) {
      DistributedDataParallelOptions o;
      o.find_unused_parameters = find_unused;
      DistributedDataParallel<Branchy> model(models[r], o);
      torch::optim::SGD opt(model.parameters(), kLr);
      auto a = model(slice(x1, r), true);    // uses aux
      auto b = model(slice(x2, r), false);   // does not
      torch::mse_loss(a + b, slice(y, r)).backward();
      opt.step();
      states[r] = state_of(models[r]);
    });
    Branchy ref;
    copy_state(init, ref);
    torch::optim::SGD opt(ref->parameters(), kLr);
    at::Tensor loss = torch::zeros({});
    for (int r = 0; r < W; ++r) {
      loss = loss + torch::mse_loss(ref(slice(x1, r), true) + ref(slice(x2, r), false), slice(y, r));
    }
    (loss / W).backward();
    opt.step();
    for (int r = 0; r < W; ++r) {
      expect_same_state(states[r], state_of(ref),
                        std::string("rank ") + std::to_string(r) + (find_unused ? " find_unused" : ""));
    }
  }
}

struct SparseNetImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
  SparseNetImpl() {
    emb = register_module("emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true)));
    fc = register_module("fc", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(at::Tensor ids) { return fc(emb(ids)); }
};
TORCH_MODULE(SparseNet);

TEST(DdpSparse, SparseEmbeddingIsRefusedAtConstruction) {
  auto errors = run_ranks_collect(2, [](int) {
    SparseNet net;
    DistributedDataParallel<SparseNet> model(net);
  });
  expect_error_everywhere(errors, {"parameter 'emb.weight' (Embedding with sparse=true)",
                                   "sparse(false)"});
}

// Note [no_sync's rule] in debug mode: the forward of the last micro-step
// inside the guard, its backward after the guard.
TEST(DdpNoSync, ForwardInsideGuardBackwardAfterItRaisesInDebugMode) {
  std::vector<std::exception_ptr> errors;
  {
    ScopedEnv debug("DDP_DEBUG", "1");
    errors = run_ranks_collect(2, [](int) {
      Mlp net;
      DistributedDataParallel<Mlp> model(net);
      at::Tensor loss;
      {
        auto guard = model.no_sync();
        loss = model(torch::randn({4, 8})).sum();
      }
      loss.backward();
    });
  }
  expect_error_everywhere(errors, {"(debug mode)", "decided at forward", "no_sync"});
  // Without debug mode: PyTorch's behaviour, a local backward (each rank's
  // gradient is its own input's, unaveraged).
  run_ranks(2, [](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    Mlp local;
    copy_state(net, local);  // after the wrapper broadcast rank 0's weights
    const at::Tensor x = torch::full({4, 8}, r + 1.0);
    at::Tensor loss;
    {
      auto guard = model.no_sync();
      loss = model(x).pow(2).sum();
    }
    loss.backward();
    local(x).pow(2).sum().backward();
    EXPECT_TRUE(net->fc1->weight.grad().equal(local->fc1->weight.grad())) << "rank " << r;
  });
}

TEST(DdpWrapper, ZeroGradAndSyncBuffers) {
  run_ranks(2, [](int r) {
    BnCnn net;
    DistributedDataParallel<BnCnn> model(net);
    model(torch::randn({4, 36})).sum().backward();
    model.zero_grad(/*set_to_none=*/false);
    for (const auto& p : model.parameters()) EXPECT_TRUE(p.grad().defined() && p.grad().eq(0).all().item<bool>());
    model.zero_grad();
    for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
    {
      torch::NoGradGuard g;
      net->bn->running_mean.fill_(r + 1.0);
    }
    model.sync_buffers();
    EXPECT_TRUE(net->bn->running_mean.eq(1.0).all().item<bool>()) << "rank " << r;
  });
}

// Note [Shared-memory all-reduce]: with co-located ranks the buckets live
// in shared memory (gradients written where the peers read them), unless
// DDP_SHM=0; the results are the same (the whole suite runs both ways).
TEST(DdpWrapper, BucketsLiveInSharedMemoryUnlessItIsOff) {
  const bool off = std::getenv("DDP_SHM") && std::string(std::getenv("DDP_SHM")) == "0";
  run_ranks(2, [off](int r) {
    Mlp net;
    DistributedDataParallel<Mlp> model(net);
    for (int i = 0; i < 3; ++i) model(torch::full({4, 8}, r + 1.0)).sum().backward();
    const DdpStats s = model.stats();
    EXPECT_EQ(s.shared_memory_buckets, off ? 0 : static_cast<int64_t>(s.bucket_bytes.size()));
    EXPECT_EQ(default_group()->shared_memory_ranks(), off ? 0 : 2);
  });
}

}  // namespace
}  // namespace ddp::testing
