// ddp-demo: the smallest ddp program. Every rank all-reduces a tensor
// holding its rank + 1; rank 0 prints the sum, which must be W(W+1)/2.
//
//   ddprun --standalone --nproc-per-node 2 ddp-demo
#include <ATen/ops/full.h>

#include <iostream>

#include "ddp/ddp.h"

int main(int argc, char** argv) {
  try {
    ddp::local_rank_from_argv(argc, argv);  // accepted, as torch.distributed.launch passes it
    ddp::init_process_group();
    const int rank = ddp::get_rank();
    const int world = ddp::get_world_size();
    at::Tensor t = at::full({4}, static_cast<double>(rank + 1), at::kFloat);
    ddp::all_reduce(t);
    const double expect = world * (world + 1) / 2.0;
    const bool ok = t.eq(expect).all().item<bool>();
    if (rank == 0) {
      std::cout << "ddp-demo: world_size " << world << ", all_reduce sum " << t[0].item<double>()
                << (ok ? " (correct)" : " (WRONG)") << std::endl;
    }
    ddp::barrier();
    ddp::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "ddp-demo: " << e.what() << std::endl;
    return 1;
  }
}
