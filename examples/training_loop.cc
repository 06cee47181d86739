// A training program with metrics reduced over the ranks, rank-0 printing
// and checkpoints: README's sections "Metrics across ranks", "Printing and
// logging", "Checkpoints" and "Weights from Python" quote its functions
// train_epoch, report, train and exchange_weights verbatim
// (examples/check_snippets.py checks it).
//
//   ddprun --standalone --nproc-per-node 2 build/examples/training_loop DIR 2
//   ddprun --standalone --nproc-per-node 2 build/examples/training_loop DIR 3
//
// trains 2 epochs, saving a checkpoint in DIR after each, then resumes from
// the second checkpoint and trains the third epoch only.
#include <ATen/ops/cross_entropy_loss.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <iostream>
#include <string>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/error.h"
#include "ddp/process_group.h"
#include "ddp/state_dict.h"
#include "synthetic.h"

using examples::Batch;
using examples::batches_of;
using examples::Net;
const int64_t dataset_size = examples::kDatasetSize;
const int64_t batch_size = 32;  // per process

#include <ddp/metrics.h>

// One epoch over this rank's batches. Returns, on every rank, the metrics
// of all ranks' samples.
ddp::ReducedMetrics train_epoch(ddp::DistributedDataParallel<Net>& model,
                                torch::optim::Optimizer& opt, const std::vector<Batch>& loader) {
  ddp::Metrics m;
  for (auto& batch : loader) {
    opt.zero_grad();
    auto logits = model(batch.x);
    auto loss = torch::cross_entropy_loss(logits, batch.y);
    loss.backward();
    opt.step();
    const int64_t n = batch.y.size(0);
    const int64_t n_correct = logits.argmax(1).eq(batch.y).sum().item<int64_t>();
    m.add_mean("loss", loss.item<double>(), n);  // sample-weighted
    m.add_count("correct", n_correct);            // exact int64
    m.add_count("samples", n);
  }
  return m.all_reduce();  // collective: one all_reduce of values
}

#include <ddp/logging.h>

// Rank 0 prints the job's numbers; each rank speaks for itself where it must.
void report(int epoch, const ddp::ReducedMetrics& r, size_t batches) {
  double acc = double(r.count("correct")) / r.count("samples");
  // stdout, rank 0 only: "epoch 3: loss 0.2310 acc 0.9141"
  ddp::print0f("epoch %d: loss %.4f acc %.4f", epoch, r.value("loss"), acc);
  // stderr, this rank: "[rank1]: WARNING: shard is empty"
  if (batches == 0) ddp::log(ddp::LogLevel::kWarning, "shard is empty");
  // stderr, rank 0 only, no prefix (it speaks for the job): "INFO: epoch 3 done"
  ddp::log0(ddp::LogLevel::kInfo, "epoch " + std::to_string(epoch) + " done");
  // stdout, every rank: "[rank1]: trained on 16 batches"
  ddp::print_all("trained on " + std::to_string(batches) + " batches");
}

#include <ddp/checkpoint.h>

// Trains until `epochs`, continuing from the latest checkpoint in `dir`.
void train(ddp::DistributedDataParallel<Net>& model, torch::optim::Optimizer& optimizer,
           const std::string& dir, int64_t epochs, const c10::Device& device) {
  int64_t start_epoch = 0, step = 0;
  if (auto ckpt = ddp::load_latest_checkpoint(dir, device)) {     // collective
    ddp::restore_checkpoint(*ckpt, *model.module(), &optimizer);  // model, optimizer, RNG
    start_epoch = ckpt->epoch;
    step = ckpt->step;
    ddp::log0(ddp::LogLevel::kInfo, "resumed at epoch " + std::to_string(start_epoch));
  }
  for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
    auto indices = ddp::distributed_sampler_indices(dataset_size, {}, epoch);  // this rank's share
    auto loader = batches_of(indices, batch_size);
    ddp::ReducedMetrics r = train_epoch(model, optimizer, loader);
    step += static_cast<int64_t>(loader.size());
    report(static_cast<int>(epoch), r, loader.size());
    ddp::SaveOptions o;
    o.keep_last = 3;
    ddp::save_checkpoint(dir, *model.module(), &optimizer, epoch + 1, step, o);  // collective
  }
}

// Weights to Python and back, as torch.save(model.state_dict()) writes them.
void exchange_weights(torch::nn::Module& net, const std::string& path) {
  ddp::save_state_dict(net, path);  // Python: model.load_state_dict(torch.load(path))
  ddp::load_state_dict(net, path);  // strict: missing, unexpected, mis-shaped keys named
}

int main(int argc, char** argv) {
  try {
    if (argc != 3) {
      std::cerr << "usage: training_loop CHECKPOINT_DIR EPOCHS\n";
      return 2;
    }
    ddp::init_process_group();
    torch::manual_seed(0);
    Net net;
    ddp::DistributedDataParallel<Net> model(net);
    torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-2));
    train(model, optimizer, argv[1], std::stoll(argv[2]), c10::Device(c10::kCPU));
    if (ddp::get_rank() == 0) exchange_weights(*model.module(), std::string(argv[1]) + "/weights.pt");
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "training_loop: " << e.what() << std::endl;
    ddp::record_error(e);
    return 1;
  }
}
