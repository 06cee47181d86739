// fully_shard's MixedPrecisionPolicy (FSDP2's): the unit computes in
// param_dtype on parameters gathered in it and on inputs cast to it, its
// outputs are cast to output_dtype, and the shards, their gradients and
// the optimizer stay float32; training with bfloat16 computation follows
// float32 training to bfloat16's precision, also with accumulation; a
// policy equal to the parameters' dtype changes nothing; an output type it
// cannot cast is named. (Values against PyTorch's own: the oracle test.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "ddp/error.h"
#include "ddp/fully_shard.h"
#include "support/expect_error.h"
#include "support/fsdp_net.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

namespace nn = torch::nn;
using fsdp_net::batch;
using fsdp_net::initial_values;
using fsdp_net::model_like;
using fsdp_net::Net;
using fsdp_net::shard;

// Records what its forward saw: its weight's dtype, its input's.
struct ProbeImpl : nn::Module {
  ProbeImpl() : fc(register_module("fc", nn::Linear(4, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    weight_dtype = fc->weight.scalar_type();
    input_dtype = x.scalar_type();
    return fc(x);
  }
  nn::Linear fc;
  at::ScalarType weight_dtype = at::kFloat, input_dtype = at::kFloat;
};

struct Pair {
  at::Tensor a;
  int64_t n;
};
struct PairOutImpl : nn::Module {
  PairOutImpl() : fc(register_module("fc", nn::Linear(4, 4))) {}
  Pair forward(const at::Tensor& x) { return {fc(x), 1}; }
  nn::Linear fc;
};
void collect_tensors(const Pair& p, std::vector<at::Tensor>& into) { into.push_back(p.a); }

MixedPrecisionPolicy bf16_policy(std::optional<at::ScalarType> reduce) {
  MixedPrecisionPolicy mp;
  mp.param_dtype = at::kBFloat16;
  mp.reduce_dtype = reduce;
  mp.output_dtype = at::kFloat;
  return mp;
}

TEST(FullyShardMixedPrecision, ComputesInParamDtypeAndKeepsShardsAndGradientsFloat32) {
  run_ranks(2, [](int rank) {
    torch::manual_seed(1);
    FullyShard<ProbeImpl> probe;
    FullyShardOptions o;
    o.mp_policy = bf16_policy(at::kFloat);
    fully_shard(probe, o);
    at::Tensor x = torch::randn({3, 4}).requires_grad_(true);
    at::Tensor out = probe(x);
    EXPECT_EQ(probe->weight_dtype, at::kBFloat16);
    EXPECT_EQ(probe->input_dtype, at::kBFloat16);
    EXPECT_EQ(out.scalar_type(), at::kFloat);  // output_dtype
    out.sum().backward();
    EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
    for (const auto& p : probe->named_parameters()) {
      EXPECT_EQ(p.value().scalar_type(), at::kFloat) << p.key();
      EXPECT_EQ(p.value().size(0), 2) << p.key();  // 4 rows: 2 per rank
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_EQ(p.value().grad().scalar_type(), at::kFloat) << p.key();
      EXPECT_EQ(p.value().grad().sizes(), p.value().sizes()) << p.key();
    }
    (void)rank;
  });
}

std::map<std::string, at::Tensor> train(int rank, int world, const MixedPrecisionPolicy& mp,
                                        int micro_steps) {
  Net net = model_like(initial_values());
  shard(net, true, mp);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    for (int m = 0; m < micro_steps; ++m) {
      set_requires_gradient_sync(*net, m == micro_steps - 1);
      auto [x, y] = batch(step * 10 + m, rank, world);
      torch::mse_loss(net(x).to(at::kFloat), y).backward();
    }
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : full_state_dict(*net)) out[kv.key()] = kv.value();
  return out;
}

// bfloat16 keeps 8 bits: a few bfloat16 ulps of the float32 values after
// three steps, and clearly not the float32 values themselves.
TEST(FullyShardMixedPrecision, FollowsFloat32TrainingToBfloat16sPrecision) {
  for (int micro_steps : {1, 2}) {
    std::map<std::string, at::Tensor> want;
    run_ranks(1, [&](int) { want = train(0, 1, {}, micro_steps); });
    for (const auto& reduce : {std::optional<at::ScalarType>(at::kFloat),
                               std::optional<at::ScalarType>()}) {
      run_ranks(3, [&](int rank) {
        const auto got = train(rank, 3, bf16_policy(reduce), micro_steps);
        double worst = 0;
        for (const auto& [name, w] : want) {
          EXPECT_EQ(got.at(name).scalar_type(), at::kFloat) << name;
          EXPECT_TRUE(torch::allclose(got.at(name), w, 2e-2, 2e-2))
              << name << " differs by " << (got.at(name) - w).abs().max().item<double>();
          worst = std::max(worst, (got.at(name) - w).abs().max().item<double>());
        }
        EXPECT_GT(worst, 1e-5) << "computed in float32?";
      });
    }
  }
}

TEST(FullyShardMixedPrecision, APolicyOfTheParametersOwnDtypeChangesNothing) {
  MixedPrecisionPolicy same;
  same.param_dtype = at::kFloat;
  same.reduce_dtype = at::kFloat;
  run_ranks(2, [&](int rank) {
    const auto plain = train(rank, 2, {}, 1);
    const auto with = train(rank, 2, same, 1);
    for (const auto& [name, v] : plain) EXPECT_TRUE(with.at(name).equal(v)) << name;
  });
}

TEST(FullyShardMixedPrecision, AnOutputTypeItCannotCastIsNamed) {
  run_ranks(2, [](int) {
    FullyShard<PairOutImpl> unit;
    FullyShardOptions o;
    o.mp_policy = bf16_policy(std::nullopt);
    fully_shard(unit, o);
    expect_error([&] { unit(torch::randn({2, 4})); },
                 "MixedPrecisionPolicy::output_dtype is set, but forward returns "
                 "ddp::testing::(anonymous namespace)::Pair");
  });
}

}  // namespace
}  // namespace ddp::testing
