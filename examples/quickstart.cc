// README's "Using the library" as a complete program: README quotes this
// file from `#include <ddp/ddp.h>` to the end, verbatim
// (examples/check_snippets.py fails the tests when the two differ). What
// the snippet leaves to the reader comes first: Net, the data, the sizes.
//
//   ddprun --standalone --nproc-per-node 2 build/examples/quickstart
//
// Prints nothing; exits 0 when training finished on every rank.
#include <torch/optim/sgd.h>

#include "synthetic.h"

using examples::batches_of;
using examples::Net;
const int64_t dataset_size = examples::kDatasetSize;
const int64_t batch_size = 32;  // per process
const int epochs = 2;

// README's snippet, from here to the end of the file.
#include <ddp/ddp.h>

int main() {
  ddp::init_process_group();                          // env:// (ddprun, torchrun, srun, mpirun)
  Net net;                                            // any TORCH_MODULE
  ddp::DistributedDataParallel<Net> model(net);       // broadcasts rank 0's weights
  torch::optim::SGD opt(model.parameters(), 0.1);

  ddp::DistributedSampler sampler(dataset_size);      // shuffle, seed 0, like PyTorch
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);                         // a new order every epoch
    sampler.reset();
    for (auto& batch : batches_of(sampler.indices(), batch_size)) {
      opt.zero_grad();
      auto loss = torch::cross_entropy_loss(model(batch.x), batch.y);
      loss.backward();                                // gradients averaged over ranks
      opt.step();
    }
  }
  ddp::destroy_process_group();
}
