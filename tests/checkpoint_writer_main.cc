// Helper for checkpoint_test's crash test: resumes from the latest checkpoint
// in argv[1] (if any), then saves checkpoints in a loop until killed.
// Prints "ready <epoch>" after its first save.
#include <ATen/ops/randn.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

#include "ddp/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer DIR\n");
    return 2;
  }
  try {
    torch::nn::Linear net(512, 512);  // 1 MiB of weights: writes take a while
    torch::optim::SGD opt(net->parameters(),
                          torch::optim::SGDOptions(0.1).momentum(0.9));
    int64_t epoch = 0;
    if (auto ckpt = ddp::load_latest_checkpoint(argv[1])) {
      ddp::restore_checkpoint(*ckpt, *net, &opt);
      epoch = ckpt->epoch;
    }
    ddp::SaveOptions options;
    options.keep_last = 2;
    for (bool first = true;; first = false) {
      opt.zero_grad();
      net->forward(at::randn({4, 512})).sum().backward();
      opt.step();
      ++epoch;
      ddp::save_checkpoint(argv[1], *net, &opt, epoch, epoch, options);
      if (first) {
        std::printf("ready %lld\n", static_cast<long long>(epoch));
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
}
