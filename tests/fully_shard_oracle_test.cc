// fully_shard against PyTorch's own (torch.distributed.fsdp.fully_shard,
// FSDP2, on CPU with Gloo; tests/oracle/fsdp_oracle.py): every rank's
// shard of every parameter right after sharding is PyTorch's to_local()
// exactly, and after three steps (SGD with momentum and weight decay, Adam;
// resharding after forward or not) at W = 2 and 3 the full parameters
// equal PyTorch's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <optional>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/fully_shard.h"
#include "support/fsdp_net.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp::testing {
namespace {

using json = nlohmann::json;
using namespace fsdp_net;

json as_json(const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous().to(at::kFloat);
  std::vector<float> data(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  return {{"shape", c.sizes().vec()}, {"data", data}};
}

at::Tensor from_json(const json& j) {
  std::vector<float> data = j["data"].get<std::vector<float>>();
  std::vector<int64_t> shape = j["shape"].get<std::vector<int64_t>>();
  return torch::tensor(data, at::kFloat).reshape(shape);
}

struct Scenario {
  int world;
  bool sgd;
  bool reshard;
  // MixedPrecisionPolicy: param, reduce and output dtypes (nullopt: none).
  std::optional<at::ScalarType> param_dtype, reduce_dtype, output_dtype;
  bool mixed() const { return param_dtype || reduce_dtype || output_dtype; }
};

json dtype_json(const std::optional<at::ScalarType>& d) {
  if (!d) return nullptr;
  return *d == at::kBFloat16 ? "bfloat16" : *d == at::kHalf ? "float16" : "float32";
}

constexpr int kSteps = 3;

// Rank `rank`'s shards right after sharding, and the full state at the end.
std::pair<std::map<std::string, at::Tensor>, std::map<std::string, at::Tensor>> train_ddp(
    const Scenario& s, int rank) {
  Net net = model_like(initial_values());
  MixedPrecisionPolicy mp;
  mp.param_dtype = s.param_dtype;
  mp.reduce_dtype = s.reduce_dtype;
  mp.output_dtype = s.output_dtype;
  shard(net, s.reshard, mp);
  std::map<std::string, at::Tensor> shards;
  for (const auto& p : net->named_parameters()) shards[p.key()] = p.value().detach().clone();
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (s.sgd) {
    opt = std::make_unique<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  } else {
    opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
  }
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, rank, s.world);
    opt->zero_grad();
    torch::mse_loss(net(x).to(at::kFloat), y).backward();
    opt->step();
  }
  std::map<std::string, at::Tensor> final_state;
  for (const auto& kv : full_state_dict(*net)) final_state[kv.key()] = kv.value();
  return {shards, final_state};
}

TEST(FullyShardOracle, ShardsAndTrainedValuesEqualPyTorchsFullyShard) {
  if (!oracle_configured()) GTEST_SKIP() << kNoOracle;
  const std::optional<at::ScalarType> none, bf16 = at::kBFloat16, f16 = at::kHalf,
                                       f32 = at::kFloat;
  const std::vector<Scenario> scenarios = {
      {2, true, true},
      {3, true, false},
      {2, false, false},
      {3, false, true},
      // Mixed precision: bfloat16 computation reduced in float32 (Adam),
      // or in bfloat16; float16 (reduced with FSDP2's pre- and post-division).
      {2, false, true, bf16, f32, f32},
      {3, true, false, bf16, none, none},
      {3, true, true, f16, none, f32}};
  json spec = json::array();
  json init;
  for (const auto& [name, v] : initial_values()) init[name] = as_json(v);
  json batches = json::array();
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step, 0, 1);
    batches.push_back({as_json(x), as_json(y)});
  }
  for (const Scenario& s : scenarios) {
    spec.push_back({{"world", s.world},
                    {"optimizer", s.sgd ? "sgd" : "adam"},
                    {"reshard_after_forward", s.reshard},
                    {"mp",
                     {{"param_dtype", dtype_json(s.param_dtype)},
                      {"reduce_dtype", dtype_json(s.reduce_dtype)},
                      {"output_dtype", dtype_json(s.output_dtype)}}},
                    {"init", init},
                    {"batches", batches}});
  }
  const TempDir dir("fsdp-oracle");
  std::ofstream(dir.file("in.json")) << spec.dump();
  const std::string cmd = "timeout 300 " + oracle_python() +
                          " " DDP_SOURCE_DIR "/tests/oracle/fsdp_oracle.py " + dir.file("in.json") +
                          " " + dir.file("out.json") + " > " + dir.file("log.txt") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
    GTEST_SKIP() << "this PyTorch has no torch.distributed.fsdp.fully_shard (FSDP2 came in 2.6)";
  }
  std::ifstream log(dir.file("log.txt"));
  const std::string log_text((std::istreambuf_iterator<char>(log)), {});
  ASSERT_EQ(rc, 0) << "the Python oracle failed:\n" << log_text;
  const json results = json::parse(std::ifstream(dir.file("out.json")));
  ASSERT_EQ(results.size(), scenarios.size());

  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    const std::string where = "W=" + std::to_string(s.world) + (s.sgd ? " SGD" : " Adam") +
                              (s.reshard ? " reshard" : " keep") +
                              (s.param_dtype ? " param " + dtype_json(s.param_dtype).get<std::string>()
                                             : std::string()) +
                              (s.reduce_dtype
                                   ? " reduce " + dtype_json(s.reduce_dtype).get<std::string>()
                                   : std::string());
    run_ranks(s.world, [&](int rank) {
      auto [shards, final_state] = train_ddp(s, rank);
      for (const auto& [name, mine] : shards) {
        const at::Tensor theirs = from_json(results[i]["shards"][rank].at(name));
        ASSERT_EQ(mine.sizes(), theirs.sizes()) << where << " rank " << rank << " " << name;
        EXPECT_TRUE(torch::equal(mine, theirs)) << where << " rank " << rank << " " << name;
      }
      if (rank != 0) return;
      for (const auto& [name, mine] : final_state) {
        const at::Tensor theirs = from_json(results[i]["final"].at(name));
        // Mixed precision: the same casts of the same numbers, but a sum
        // in bfloat16 is rounded where each backend rounds it (ddp's
        // shared-memory kernels sum in float32 and round once; PyTorch's Gloo
        // rounds its own way): one bfloat16 ulp (2^-8 relative) of a
        // gradient apart; 1e-3 otherwise.
        const bool bf16_sum = s.param_dtype == at::kBFloat16 && !s.reduce_dtype;
        const double rtol = bf16_sum ? 1.0 / 256 : s.mixed() ? 1e-3 : 1e-5;
        const double atol = bf16_sum ? 1e-3 : s.mixed() ? 1e-4 : 1e-6;
        EXPECT_TRUE(torch::allclose(mine, theirs, rtol, atol))
            << where << " " << name << " differs by "
            << (mine - theirs).abs().max().item<double>();
      }
    });
  }
}

}  // namespace
}  // namespace ddp::testing
