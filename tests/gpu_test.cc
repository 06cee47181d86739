// The CUDA side (CTest label `gpu`): DistributedDataParallel, the
// collectives, comm hooks, SyncBatchNorm, ZeroRedundancyOptimizer and
// checkpoints with CUDA tensors, on NCCL and on Gloo. Built with every
// libtorch; each test skips, saying why, where there is no GPU (or fewer
// than it needs: NCCL refuses two ranks on one GPU, so two-rank NCCL tests
// need two GPUs, and two-rank tests on one GPU use Gloo with CUDA tensors).
// At world size 1 DDP skips communication; DDP_REDUCE_AT_WORLD_SIZE_1=1
// sends it through NCCL anyway, which is how one GPU exercises that path.
// scripts/gpu-check.sh runs these on a lent GPU machine.
// The GpuLess tests are the other way round: they run where no GPU is.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include <unistd.h>

#include "compat/torch_compat.h"
#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/comm_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/error.h"
#include "ddp/join.h"
#include "ddp/powersgd.h"
#include "ddp/sync_batchnorm.h"
#include "ddp/zero_redundancy_optimizer.h"
#include "flight/flight_trace.h"
#include "process_group_impl.h"
#include "support/model_state.h"
#include "support/models.h"
#include "support/oracle.h"
#include "support/process_world.h"
#include "support/scoped_env.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using testing::Branchy;
using testing::Mlp;
using testing::NamedState;
using testing::ScopedEnv;
using testing::TempDir;
using testing::copy_state;
using testing::state_of;

// Line-buffered stdout: under CTest it is a pipe, and a test that crashes
// (as some did on the first GPU machine) would take its last lines with it.
[[maybe_unused]] const bool kLineBuffered = [] {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return true;
}();

int gpus() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

std::string skip_reason(int needed) {
  const int have = gpus();
  if (have == 0) {
    return compat::cuda_compiled()
               ? "no CUDA device: this libtorch has CUDA but no GPU is visible (run "
                 "scripts/gpu-check.sh on a GPU machine)"
               : "no CUDA device: this libtorch is built without CUDA";
  }
  return fmt::format(
      "needs {} GPUs (NCCL refuses two ranks on one GPU), this machine has {}", needed, have);
}

#define DDP_REQUIRE_GPUS(n)                                     \
  do {                                                          \
    if (gpus() < (n)) GTEST_SKIP() << skip_reason(n);           \
  } while (0)

const c10::Device kCuda0(c10::kCUDA, 0);

ProcessGroupPtr group_of_one(const std::string& backend) {
  InitOptions o;
  o.backend = backend;
  o.init_method = testing::unique_memory_url();
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(60);
  return new_process_group(o);
}

NamedState on_cpu(const NamedState& s) {
  NamedState out;
  for (const auto& [k, v] : s) out.emplace_back(k, v.cpu());
  return out;
}

void expect_close(const NamedState& a, const NamedState& b, const std::string& what,
                  double atol = 1e-6) {
  testing::expect_same_state(on_cpu(a), on_cpu(b), what, atol);
}

constexpr int kSteps = 4;
constexpr int kBatch = 4;  // per rank

struct Data {
  std::vector<at::Tensor> x, y;  // per step, W*B rows, on the device
  at::Tensor x_of(int s, int r) const { return x[s].narrow(0, r * kBatch, kBatch); }
  at::Tensor y_of(int s, int r) const { return y[s].narrow(0, r * kBatch, kBatch); }
};

Data make_data(int world, c10::Device device) {
  torch::manual_seed(99);
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({world * kBatch, 8}).to(device));
    d.y.push_back(torch::randn({world * kBatch, 4}).to(device));
  }
  return d;
}

Mlp mlp_on(c10::Device device, const Mlp& init) {
  Mlp m;
  m->to(device);
  copy_state(init, m);
  return m;
}

// One process on the concatenated batch, SGD.
NamedState train_reference(const Mlp& init, const Data& d, int world, c10::Device device) {
  Mlp m = mlp_on(device, init);
  torch::optim::SGD opt(m->parameters(), 0.1);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    std::vector<at::Tensor> outs;
    for (int r = 0; r < world; ++r) outs.push_back(m(d.x_of(s, r)));
    torch::mse_loss(torch::cat(outs), d.y[s]).backward();
    opt.step();
  }
  return state_of(m);
}

// One rank's DDP training (the calling thread's default group), SGD;
// accumulate: two micro-steps of half the rank's batch per step, the first
// in no_sync.
NamedState train_rank(const Mlp& init, const Data& d, int rank, c10::Device device,
                      DistributedDataParallelOptions options, DdpStats* stats = nullptr,
                      bool accumulate = false) {
  Mlp m = mlp_on(device, init);
  DistributedDataParallel<Mlp> model(m, options);
  torch::optim::SGD opt(model.parameters(), 0.1);
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const at::Tensor x = d.x_of(s, rank), y = d.y_of(s, rank);
    if (accumulate) {
      {
        auto guard = model.no_sync();
        (torch::mse_loss(model(x.narrow(0, 0, 2)), y.narrow(0, 0, 2)) / 2).backward();
      }
      (torch::mse_loss(model(x.narrow(0, 2, 2)), y.narrow(0, 2, 2)) / 2).backward();
    } else {
      torch::mse_loss(model(x), y).backward();
    }
    opt.step();
  }
  if (stats) *stats = model.stats();
  return state_of(m);
}

// --- where there is no GPU -------------------------------------------------

TEST(GpuLess, LocalDeviceIsCpuAndNcclIsRefusedByName) {
  if (gpus() > 0) GTEST_SKIP() << "a GPU is visible: the GPU tests below cover this";
  EXPECT_EQ(local_device(), c10::Device(c10::kCPU));
  try {
    group_of_one("nccl");
    FAIL() << "a NCCL group without a GPU";
  } catch (const CommError& e) {
    const std::string m = e.what();
    if (compat::nccl_compiled()) {
      EXPECT_NE(m.find("backend 'nccl' needs a CUDA device, and this process sees none"),
                std::string::npos) << m;
    } else {
      EXPECT_NE(m.find("built without CUDA/NCCL support"), std::string::npos) << m;
    }
  }
}

// --- one GPU -----------------------------------------------------------------

// LOCAL_RANK counts where a launcher's RANK is set too (torchrun sets both;
// read_launch_env() reads none of a launcher's variables without its rank).
TEST(Gpu, LocalDeviceIsTheLocalRanksGpu) {
  DDP_REQUIRE_GPUS(1);
  const std::string ranks = std::to_string(gpus() + 1);
  ScopedEnv rank("RANK", "0"), world("WORLD_SIZE", ranks), local_world("LOCAL_WORLD_SIZE", ranks);
  {
    ScopedEnv local("LOCAL_RANK", "0");
    EXPECT_EQ(local_device(), kCuda0);
  }
  ScopedEnv local("LOCAL_RANK", std::to_string(gpus()));
  try {
    local_device();
    FAIL() << "LOCAL_RANK past the GPUs";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("LOCAL_RANK {} has no GPU", gpus())),
              std::string::npos) << e.what();
  }
}

TEST(Gpu, NcclCollectivesOnCudaAndStagedCpuTensors) {
  DDP_REQUIRE_GPUS(1);
  ProcessGroupPtr g = group_of_one("nccl");
  DefaultGroupGuard guard(g);
  EXPECT_EQ(g->device(), kCuda0);
  at::Tensor t = torch::arange(6, torch::dtype(torch::kFloat).device(kCuda0));
  Work w = all_reduce_async(t);
  w.wait();
  EXPECT_TRUE(w.is_completed());
  EXPECT_TRUE(t.cpu().equal(torch::arange(6).to(torch::kFloat)));
  all_reduce(t, ReduceOp::AVG);
  EXPECT_TRUE(t.cpu().equal(torch::arange(6).to(torch::kFloat)));
  // Note [Staging on NCCL]: a CPU tensor stays on the CPU, reduced.
  at::Tensor c = torch::full({3}, 2.0);
  all_reduce(c, ReduceOp::MAX);
  EXPECT_TRUE(c.device().is_cpu());
  EXPECT_TRUE(c.equal(torch::full({3}, 2.0)));
  broadcast(c, 0);
  EXPECT_EQ(all_gather(t).at(0).device(), kCuda0);
  EXPECT_EQ(all_gather_string("cuda"), std::vector<std::string>{"cuda"});
  barrier();
  if (gpus() >= 2) {
    at::Tensor other = torch::ones({2}, torch::device(c10::Device(c10::kCUDA, 1)));
    try {
      all_reduce(other);
      FAIL() << "a tensor on another GPU";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is on cuda:1, but this rank's NCCL group uses cuda:0"),
                std::string::npos) << e.what();
    }
  }
  // The flight recorder records NCCL work, completed.
  ASSERT_TRUE(g->impl().flight);
  flight::RankTrace trace = flight::read_trace(g->impl().flight->path());
  EXPECT_EQ(trace.backend, "nccl");
  ASSERT_GE(trace.entries.size(), 5u);
  for (const auto& e : trace.entries) EXPECT_EQ(e.state, flight::State::kCompleted) << e.op;
}

// Every DDP mode on one GPU through NCCL equals one process.
TEST(Gpu, DdpThroughNcclAtWorldSize1EqualsOneProcess) {
  DDP_REQUIRE_GPUS(1);
  ScopedEnv alone("DDP_REDUCE_AT_WORLD_SIZE_1", "1");
  torch::manual_seed(3);
  Mlp init;
  const Data d = make_data(1, kCuda0);
  const NamedState reference = train_reference(init, d, 1, kCuda0);
  struct Mode {
    const char* name;
    DistributedDataParallelOptions options;
    bool accumulate;
  };
  std::vector<Mode> modes(5);
  modes[0].name = "default";
  modes[1].name = "gradient_as_bucket_view";
  modes[1].options.gradient_as_bucket_view = true;
  modes[2].name = "find_unused_parameters";
  modes[2].options.find_unused_parameters = true;
  modes[3].name = "static_graph";
  modes[3].options.static_graph = true;
  modes[4].name = "no_sync";
  modes[4].accumulate = true;
  for (Mode& mode : modes) {
    ProcessGroupPtr g = group_of_one("nccl");
    DefaultGroupGuard guard(g);
    mode.options.device_ids = {kCuda0};
    mode.options.bucket_cap_mb = 0.0005;  // several buckets
    mode.options.first_bucket_cap_mb = 0.0005;
    DdpStats stats;
    NamedState got = train_rank(init, d, 0, kCuda0, mode.options, &stats, mode.accumulate);
    expect_close(got, reference, mode.name);
    EXPECT_GT(stats.bucket_bytes.size(), 1u) << mode.name;
    // Timed with CUDA events: the communication ran, and took time.
    EXPECT_GT(stats.backward_comm_s, 0.0) << mode.name;
    EXPECT_GT(stats.backward_compute_s, 0.0) << mode.name;
    EXPECT_EQ(stats.shared_memory_buckets, 0) << mode.name;
  }
}

TEST(Gpu, ModuleAndInputOnTheWrongDeviceAreNamed) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(3);
  Mlp init;
  {
    ProcessGroupPtr g = group_of_one("gloo");
    DefaultGroupGuard guard(g);
    DistributedDataParallel<Mlp> model(mlp_on(kCuda0, init));
    try {
      model(torch::randn({4, 8}));
      FAIL() << "a CPU input to a CUDA module";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "forward's argument 1 is a float32[4, 8] tensor on cpu, but the module's "
                    "parameters are on cuda:0"),
                std::string::npos) << e.what();
    }
    DistributedDataParallelOptions o;
    o.device_ids = {kCuda0};
    DistributedDataParallel<Mlp> moved(mlp_on(kCuda0, init), o);
    EXPECT_EQ(moved(torch::randn({4, 8})).device(), kCuda0);  // as PyTorch: moved
    at::Tensor x = torch::randn({4, 8});  // an lvalue, as a training loop has it
    EXPECT_EQ(moved(x).device(), kCuda0);
    EXPECT_EQ(x.device(), c10::Device(c10::kCPU));  // the caller's tensor stays
  }
  ProcessGroupPtr g = group_of_one("nccl");
  DefaultGroupGuard guard(g);
  try {
    DistributedDataParallel<Mlp> model(mlp_on(c10::Device(c10::kCPU), init));
    FAIL() << "a CPU module on NCCL";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the module is on cpu, but the process group's backend 'nccl' reduces "
                  "tensors on cuda:0"),
              std::string::npos) << e.what();
  }
}

// fp16, bf16 (PyTorch: NCCL only) and PowerSGD on CUDA buckets over NCCL:
// the hook runs (its name in the stats) and training stays within the
// hook's rounding of one process.
TEST(Gpu, CommHooksOnNccl) {
  DDP_REQUIRE_GPUS(1);
  ScopedEnv alone("DDP_REDUCE_AT_WORLD_SIZE_1", "1");
  torch::manual_seed(3);
  Mlp init;
  const Data d = make_data(1, kCuda0);
  const NamedState reference = train_reference(init, d, 1, kCuda0);
  for (const std::string hook : {"fp16", "bf16", "powersgd"}) {
    ProcessGroupPtr g = group_of_one("nccl");
    DefaultGroupGuard guard(g);
    Mlp m = mlp_on(kCuda0, init);
    DistributedDataParallel<Mlp> model(m);
    if (hook == "fp16") model.register_comm_hook(fp16_compress_hook, hook);
    if (hook == "bf16") model.register_comm_hook(bf16_compress_hook, hook);
    if (hook == "powersgd") {
      PowerSGDOptions po;
      // At least each layer's smaller side: PowerSGD is then exact up to rounding.
      po.matrix_approximation_rank = 16;
      po.start_powerSGD_iter = 2;
      auto state = std::make_shared<PowerSGDState>(po);
      model.register_comm_hook(state, powerSGD_hook, hook);
    }
    torch::optim::SGD opt(model.parameters(), 0.1);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      torch::mse_loss(model(d.x_of(s, 0)), d.y_of(s, 0)).backward();
      opt.step();
    }
    EXPECT_EQ(model.stats().comm_hook, hook);
    const double diff = testing::max_diff(on_cpu(state_of(m)), on_cpu(reference));
    EXPECT_LT(diff, hook == "bf16" ? 2e-2 : hook == "fp16" ? 5e-3 : 1e-4) << hook;
  }
}

// --- two ranks on one GPU: Gloo with CUDA tensors ---------------------------
//
// Two processes, not two threads (tests/support/process_world.h): the
// autograd engine runs every thread's CUDA backward on one thread per
// device, so two thread ranks on one GPU deadlock in any backward that waits
// for a collective (seen on an H200: DDP, SyncBatchNorm and ZeRO tests ran
// into their timeouts). In each test the part before in_rank_process() runs
// in the parent and in both ranks alike (seeded inputs).

std::vector<at::Tensor> values_of(const NamedState& s) {
  std::vector<at::Tensor> out;
  for (const auto& [k, v] : s) out.push_back(v);
  return out;
}

// The first like.size() of `values`, named as `like`.
NamedState named_like(const NamedState& like, const std::vector<at::Tensor>& values) {
  NamedState out;
  for (size_t i = 0; i < like.size() && i < values.size(); ++i) {
    out.emplace_back(like[i].first, values[i]);
  }
  return out;
}

TEST(Gpu, GlooWithCudaTensorsEqualsOneProcessAndSkipsSharedMemory) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(3);
  Mlp init;
  const Data d = make_data(2, kCuda0);
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [&](int r) {
      for (bool accumulate : {false, true}) {
        DistributedDataParallelOptions o;
        o.gradient_as_bucket_view = accumulate;
        DdpStats stats;
        std::vector<at::Tensor> out =
            values_of(train_rank(init, d, r, kCuda0, o, &stats, accumulate));
        // A CUDA tensor on a group with shared memory goes through Gloo.
        at::Tensor t = torch::full({1000}, r + 1.0, torch::device(kCuda0));
        all_reduce(t);
        out.push_back(t);
        out.push_back(torch::tensor({stats.shared_memory_buckets,
                                     int64_t{default_group()->shared_memory_ranks()}}));
        testing::save_tensors(fmt::format("accumulate{}", accumulate), out);
      }
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  const NamedState reference = train_reference(init, d, 2, kCuda0);
  for (bool accumulate : {false, true}) {
    for (int r = 0; r < 2; ++r) {
      const std::string what = fmt::format("rank {} accumulate {}", r, accumulate);
      const auto got = ranks.load_tensors(r, fmt::format("accumulate{}", accumulate));
      ASSERT_EQ(got.size(), reference.size() + 2) << what;
      expect_close(named_like(reference, got), reference, what);
      EXPECT_TRUE(got[reference.size()].equal(torch::full({1000}, 3.0))) << what;
      const at::Tensor counts = got.back();
      EXPECT_EQ(counts[0].item<int64_t>(), 0) << what << ": shared-memory buckets";
      if (std::getenv("DDP_SHM") == nullptr) {
        EXPECT_EQ(counts[1].item<int64_t>(), 2) << what << ": the group's shared-memory ranks";
      }
    }
  }
}

// Rank 1 uses the aux head, rank 0 not (find_unused_parameters); then
// uneven inputs under join (rank 0 has one batch more).
NamedState unused_then_join_rank(const Branchy& init, const Data& d, int r,
                                 c10::Device device) {
  Branchy m;
  m->to(device);
  copy_state(init, m);
  torch::optim::SGD opt(m->parameters(), 0.1);
  {  // the first wrapper ends before the second wraps the module
    DistributedDataParallelOptions o;
    o.find_unused_parameters = true;
    DistributedDataParallel<Branchy> model(m, o);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      torch::mse_loss(model(d.x_of(s, r), r == 1), d.y_of(s, r)).backward();
      opt.step();
    }
  }
  DistributedDataParallel<Branchy> joined(m);
  join(joined, [&] {
    for (int s = 0; s < kSteps - r; ++s) {
      opt.zero_grad();
      torch::mse_loss(joined(d.x_of(s, r), true), d.y_of(s, r)).backward();
      opt.step();
    }
  });
  return state_of(m);
}

// On CUDA tensors (two processes) the ranks end as the same run on the CPU
// (two threads) does.
TEST(Gpu, UnusedParametersAndJoinOnCudaEqualTheCpuRun) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(4);
  Branchy init;
  const Data d = make_data(2, kCuda0);
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [&](int r) {
      testing::save_tensors("state", values_of(unused_then_join_rank(init, d, r, kCuda0)));
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  Data on_cpu_data;
  for (int s = 0; s < kSteps; ++s) {
    on_cpu_data.x.push_back(d.x[s].cpu());
    on_cpu_data.y.push_back(d.y[s].cpu());
  }
  std::vector<NamedState> cpu(2);
  testing::run_ranks(2, [&](int r) {
    cpu[r] = unused_then_join_rank(init, on_cpu_data, r, c10::Device(c10::kCPU));
  });
  for (int r = 0; r < 2; ++r) {
    expect_close(named_like(cpu[r], ranks.load_tensors(r, "state")), cpu[r],
                 fmt::format("rank {}", r), 1e-5);
  }
}

TEST(Gpu, SyncBatchNormOnCudaEqualsBatchNormOfTheWholeBatch) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(6);
  const at::Tensor x = (torch::randn({8, 3, 5, 5}) * 2 + 1).to(kCuda0);
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [&](int r) {
      SyncBatchNorm sbn(torch::nn::BatchNormOptions(3));
      sbn->to(kCuda0);
      at::Tensor xi = x.narrow(0, r * 4, 4).clone().requires_grad_(true);
      at::Tensor yi = sbn(xi);
      (yi * yi.detach().sin()).sum().backward();
      testing::save_tensors("out", {yi, xi.grad(), sbn->running_mean,
                                    torch::tensor({yi.device().is_cuda() ? 1 : 0})});
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  torch::nn::BatchNorm2d bn(3);
  bn->to(kCuda0);
  at::Tensor xr = x.clone().requires_grad_(true);
  at::Tensor yr = bn(xr);
  (yr * yr.detach().sin()).sum().backward();
  const auto r0 = ranks.load_tensors(0, "out"), r1 = ranks.load_tensors(1, "out");
  ASSERT_EQ(r0.size(), 4u);
  ASSERT_EQ(r1.size(), 4u);
  EXPECT_TRUE(torch::allclose(torch::cat({r0[0], r1[0]}), yr.detach().cpu(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(torch::cat({r0[1], r1[1]}), xr.grad().cpu(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(r0[2], bn->running_mean.cpu(), 1e-5, 1e-6));
  EXPECT_EQ(r0[3].item<int64_t>(), 1) << "SyncBatchNorm's output left the GPU";
}

std::vector<double> flat(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// Against PyTorch's own torch.nn.SyncBatchNorm on CUDA
// (tests/oracle/sync_batchnorm_cuda.py): two Python processes on cuda:0
// over gloo, and ddp's two rank processes over gloo, on the same rows.
TEST(Gpu, SyncBatchNormOnCudaEqualsPyTorchsSyncBatchNorm) {
  DDP_REQUIRE_GPUS(1);
  if (!testing::oracle_configured()) GTEST_SKIP() << testing::kNoOracle;
  torch::manual_seed(16);
  const at::Tensor x = torch::randn({8, 3, 5, 5}) * 2 + 1;
  const at::Tensor weight = torch::rand({3}) + 0.5, bias = torch::randn({3});
  const std::vector<std::string> names = {"y",         "x_grad",       "weight_grad",
                                          "bias_grad", "running_mean", "running_var"};
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [&](int r) {
      SyncBatchNorm sbn(torch::nn::BatchNormOptions(3));
      {
        torch::NoGradGuard no_grad;
        sbn->weight.copy_(weight);
        sbn->bias.copy_(bias);
      }
      sbn->to(kCuda0);
      at::Tensor xi = x.narrow(0, r * 4, 4).to(kCuda0).requires_grad_(true);
      at::Tensor yi = sbn(xi);
      (yi * yi.detach().sin()).sum().backward();
      testing::save_tensors("out", {yi, xi.grad(), sbn->weight.grad(), sbn->bias.grad(),
                                    sbn->running_mean, sbn->running_var});
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  const nlohmann::json in = {{"world", 2}, {"shape", x.sizes().vec()}, {"x", flat(x)},
                             {"weight", flat(weight)}, {"bias", flat(bias)}};
  const TempDir dir("ddp-sbn-oracle");
  std::ofstream(dir.file("in.json")) << in.dump();
  const std::string cmd = "timeout 120 " + testing::oracle_python() +
                          " " DDP_SOURCE_DIR "/tests/oracle/sync_batchnorm_cuda.py " +
                          dir.file("in.json") + " " + dir.file("out.json") + " > " +
                          dir.file("log.txt") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(dir.file("log.txt"));
  ASSERT_EQ(rc, 0) << "PyTorch's SyncBatchNorm failed:\n"
                   << std::string(std::istreambuf_iterator<char>(log), {});
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json want =
        nlohmann::json::parse(std::ifstream(dir.file("out.json." + std::to_string(r))));
    const auto got = ranks.load_tensors(r, "out");
    ASSERT_EQ(got.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const at::Tensor expected =
          torch::tensor(want.at(names[i]).get<std::vector<double>>(), torch::kDouble);
      EXPECT_TRUE(torch::allclose(got[i].to(torch::kDouble).reshape(-1), expected, 1e-5, 1e-5))
          << "rank " << r << ": " << names[i] << " differs from PyTorch's SyncBatchNorm";
    }
  }
}

TEST(Gpu, ZeroRedundancyOptimizerWithCudaParameters) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(7);
  Mlp init;
  const Data d = make_data(2, kCuda0);
  if (testing::in_rank_process()) {
    testing::as_rank_process("gloo", [&](int r) {
      Mlp m = mlp_on(kCuda0, init);
      DistributedDataParallel<Mlp> model(m);
      ZeroRedundancyOptimizer opt(model.parameters(), torch::optim::AdamOptions(1e-2));
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        torch::mse_loss(model(d.x_of(s, r)), d.y_of(s, r)).backward();
        opt.step();
      }
      testing::save_tensors("state", values_of(state_of(m)));
    });
    return;
  }
  const testing::RankProcesses ranks(2);
  ASSERT_TRUE(ranks.ok());
  Mlp ref = mlp_on(kCuda0, init);
  torch::optim::Adam adam(ref->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    adam.zero_grad();
    std::vector<at::Tensor> outs{ref(d.x_of(s, 0)), ref(d.x_of(s, 1))};
    torch::mse_loss(torch::cat(outs), d.y[s]).backward();
    adam.step();
  }
  const NamedState want = state_of(ref);
  for (int r = 0; r < 2; ++r) {
    expect_close(named_like(want, ranks.load_tensors(r, "state")), want,
                 fmt::format("rank {}", r), 1e-5);
  }
}

TEST(Gpu, CheckpointOfACudaModelLoadsOnCpuAndBack) {
  DDP_REQUIRE_GPUS(1);
  torch::manual_seed(8);
  Mlp init;
  Mlp m = mlp_on(kCuda0, init);
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
  opt.zero_grad();
  m(torch::randn({4, 8}, torch::device(kCuda0))).sum().backward();
  opt.step();
  const TempDir dir("ddp-gpu-ckpt");
  const std::string path = save_checkpoint(dir.path(), *m, &opt, 1, 10);
  Checkpoint cpu = load_checkpoint(path);
  Mlp on_host;
  torch::optim::Adam host_opt(on_host->parameters(), torch::optim::AdamOptions(1e-2));
  restore_checkpoint(cpu, *on_host, &host_opt);
  expect_close(state_of(on_host), state_of(m), "loaded on the CPU", 0.0);
  EXPECT_TRUE(on_host->fc1->weight.device().is_cpu());
  Mlp back = mlp_on(kCuda0, Mlp());
  torch::optim::Adam back_opt(back->parameters(), torch::optim::AdamOptions(1e-2));
  restore_checkpoint(load_checkpoint(path, kCuda0), *back, &back_opt);
  expect_close(state_of(back), state_of(m), "loaded back on the GPU", 0.0);
  EXPECT_EQ(back->fc1->weight.device(), kCuda0);
  // The restored Adam state steps on the GPU as the original does.
  for (auto* o : {&opt, &back_opt}) {
    o->zero_grad();
    (o == &opt ? m : back)(torch::ones({4, 8}, torch::device(kCuda0))).sum().backward();
    o->step();
  }
  expect_close(state_of(back), state_of(m), "one step after the restore", 0.0);
}

// --- two GPUs: NCCL with two ranks -----------------------------------------

// Runs fn(rank) on two threads, each with a NCCL group on its own GPU.
void run_nccl_ranks(const std::function<void(int)>& fn, std::chrono::milliseconds timeout,
                    std::vector<std::exception_ptr>& errors) {
  const std::string url = testing::unique_memory_url();
  errors.assign(2, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions o;
        o.backend = "nccl";
        o.init_method = url;
        o.rank = r;
        o.world_size = 2;
        o.timeout = timeout;
        o.device_id = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r));
        DefaultGroupGuard guard(new_process_group(o));
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Gpu, NcclTwoRanksEqualOneProcess) {
  DDP_REQUIRE_GPUS(2);
  torch::manual_seed(3);
  Mlp init;
  const Data d = make_data(2, kCuda0);
  const NamedState reference = train_reference(init, d, 2, kCuda0);
  std::vector<NamedState> got(2);
  std::vector<std::exception_ptr> errors;
  run_nccl_ranks([&](int r) {
    const c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(r));
    Data mine;
    for (int s = 0; s < kSteps; ++s) {
      mine.x.push_back(d.x[s].to(dev));
      mine.y.push_back(d.y[s].to(dev));
    }
    DistributedDataParallelOptions o;
    o.device_ids = {dev};
    got[r] = train_rank(init, mine, r, dev, o);
  }, std::chrono::seconds(60), errors);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(errors[r]) << testing::message_of(errors[r]);
    expect_close(got[r], reference, fmt::format("rank {}", r));
  }
}

// A rank that never reaches a collective: the other fails within its
// timeout, naming it, instead of hanging in the NCCL kernel.
TEST(Gpu, NcclStalledRankIsNamedWithinTheTimeout) {
  DDP_REQUIRE_GPUS(2);
  std::atomic<bool> rank0_done{false};
  std::vector<std::exception_ptr> errors;
  const auto t0 = std::chrono::steady_clock::now();
  run_nccl_ranks([&](int r) {
    at::Tensor t = torch::ones({1 << 10}, torch::device(c10::Device(c10::kCUDA, r)));
    all_reduce(t);  // both: the communicator is up
    if (r == 0) {
      struct Done {  // however rank 0 leaves: rank 1 must not wait forever
        std::atomic<bool>& flag;
        ~Done() { flag = true; }
      } done{rank0_done};
      all_reduce(t);
    } else {
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }, std::chrono::seconds(5), errors);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(testing::is_a<TimeoutError>(errors[0])) << testing::message_of(errors[0]);
  const std::string m = testing::message_of(errors[0]);
  EXPECT_NE(m.find("all_reduce #1 on rank 0 of 2 (nccl) timed out"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  EXPECT_LT(waited, 30.0);
}

}  // namespace
}  // namespace ddp
