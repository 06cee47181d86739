// The collectives of sharded data parallelism (FSDP, ZeRO-3):
// reduce_scatter_tensor, reduce_scatter, all_gather_into_tensor,
// all_to_all_single and all_to_all, as torch.distributed's.
//
// Every rank of the group calls the same operation in the same order, with
// the options, timeouts, stall reports, debug-mode checks and flight records
// of collectives.h, and its error policy: InvalidArgument for bad arguments
// (before anything is sent, on the rank that passed them), TimeoutError,
// CommError. Tensors must be contiguous and of one dtype per call; outputs
// are written in place, inputs are not modified. Gloo takes CPU
// tensors; NCCL takes CUDA tensors on the rank's device (CPU tensors are
// staged through it, Note [Staging on NCCL]). Zero-element calls complete
// without communication (every rank passes the same sizes).
//
// Note [Sharding on Gloo]: Gloo (and PyTorch 1.13's Gloo in particular) has
// no reduce-scatter of one flat tensor. On Gloo, reduce_scatter_tensor is an
// all_reduce of the whole input (through the ranks' shared memory when they
// share a host: its two-shot algorithm is a reduce-scatter and an
// all-gather) of which each rank keeps its chunk; all_gather_into_tensor
// gathers straight into the chunks of the output. On NCCL they are NCCL's
// own reduce-scatter and all-gather (_reduce_scatter_base, _allgather_base).
// Results are the same; the bytes moved on Gloo are those of an all_reduce.
//
// Thread safety: see process_group.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ddp/collectives.h"

namespace ddp {

// torch.distributed.reduce_scatter_tensor: `input` is world_size equal
// chunks of output's size, back to back (input.numel() == world_size *
// output.numel(); the shapes may differ, e.g. [W*n] and [n], or [W, n] and
// [n]); rank r's `output` receives chunk r reduced over the ranks by `op`
// (AVG divides the sum by world_size and needs a floating-point dtype).
// `input` is not modified.
void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::SUM, const CollectiveOptions& options = {});
Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input,
                                 ReduceOp op = ReduceOp::SUM,
                                 const CollectiveOptions& options = {});

// torch.distributed.reduce_scatter, the list form: `inputs` has world_size
// tensors of output's shape and dtype; rank r's `output` receives inputs[r]
// reduced over the ranks.
void reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                    ReduceOp op = ReduceOp::SUM, const CollectiveOptions& options = {});

// torch.distributed.all_gather_into_tensor: `output` (world_size *
// input.numel() elements, any shape) receives every rank's `input`, back to
// back in rank order.
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const CollectiveOptions& options = {});
Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const CollectiveOptions& options = {});

// torch.distributed.all_to_all_single: `input`'s rows (dim 0) are cut into
// world_size consecutive pieces, input_split_sizes[j] rows for rank j, and
// `output` receives rank j's piece for this rank in its output_split_sizes[j]
// rows, in rank order. Empty split sizes: equal pieces (dim 0 divisible by
// world_size). Every rank's rows have the same number of elements and one
// dtype. Before any data moves, the ranks exchange their split sizes (one
// small all_gather): a rank that would send a piece of another size than its
// receiver expects is an InvalidArgument on every rank, naming both ranks
// and both sizes, instead of a crash or a hang in the backend.
void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {},
                       const CollectiveOptions& options = {});

// torch.distributed.all_to_all, the list form: rank i's inputs[j] becomes
// rank j's outputs[i]. Both lists have world_size tensors of one dtype; the
// sizes may differ, and outputs[j] must have as many elements as rank j's
// inputs[i] (checked as all_to_all_single's split sizes are).
void all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                const CollectiveOptions& options = {});

}  // namespace ddp
