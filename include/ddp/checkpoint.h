// Training checkpoints: rank 0 writes them atomically, every rank loads them.
//
// A checkpoint holds what a run needs to continue exactly where it stopped:
//   - the model's state: named parameters and buffers of a torch::nn::Module,
//     keyed by the module's own names ("conv1.weight", "bn.running_mean");
//     a leading "module." (a wrapper's submodule) is dropped, as in
//     PyTorch's consume_prefix_in_state_dict_if_present;
//   - the optimizer's state: per-parameter state (SGD momentum buffers, Adam
//     moments and step counts) and each parameter group's options (lr, ...);
//   - epoch and step, as the program defines them (ddp-train stores the
//     number of completed epochs and optimizer steps);
//   - every rank's random number generator state: the CPU generator
//     (torch.get_rng_state()) and each CUDA device's (torch.cuda.get_rng_state_all());
//   - string metadata of the program's own (a config, a seed).
//
// Usage, the same on every rank:
//
//   auto device = ...;                         // this rank's device
//   int64_t start_epoch = 0;
//   if (auto ckpt = ddp::load_latest_checkpoint(dir, device)) {   // collective
//     ddp::restore_checkpoint(*ckpt, *model.module(), &optimizer);  // the wrapped module
//     start_epoch = ckpt->epoch;
//   }
//   for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
//     ... train ...
//     ddp::save_checkpoint(dir, *model.module(), &optimizer, epoch + 1, step);  // collective
//   }
//
// Files, in `dir`:
//   checkpoint-epoch<E:6>-step<S:12>.ddpckpt   the checkpoint (format below)
//   checkpoint-epoch<E:6>-step<S:12>.model.pt  the model state alone, loadable
//       by Python: `model.load_state_dict(torch.load(path))` (a dict of CPU
//       tensors in torch.save's zip format; ddp::load_state_dict in
//       ddp/state_dict.h reads it, as any torch.save'd state dict).
// Zero-padded numbers make the names sort by (epoch, step); the latest
// checkpoint is the .ddpckpt file with the largest (epoch, step).
//
// Atomicity: each file is written to a temporary name in `dir`, fsynced,
// renamed over its final name, and the directory is fsynced; a crash at any
// moment leaves either the previous set of complete checkpoints or the new
// one, plus at worst a stale ".tmp" file that is ignored and removed by the
// next save. The .model.pt file is written before the .ddpckpt, so a listed
// checkpoint always has its model file (unless removed by hand).
//
// Format (.ddpckpt, little-endian): "DDPCKPT\n", u32 format version, u32
// flags, payload, then a trailer of u64 payload length, u32 CRC-32 (zlib) of
// the payload and "DDPEND\n\0". Tensors are stored raw with their dtype and
// shape. Reading checks the magic, version, length and CRC before parsing,
// then bounds-checks every field, so corrupt, truncated or hostile files
// give InvalidArgument, never a crash or an unbounded allocation (memory is
// bounded by the file size).
//
// Errors: InvalidArgument naming the file and what is wrong (truncated, bad
// checksum, another format version, another model: the first differing key);
// CommError / TimeoutError from the collectives of save and load.
// Thread safety: none of these functions may run concurrently with training
// steps on the same model and optimizer.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/optimizer_state.h"
#include "ddp/process_group.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace ddp {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// One rank's generator states, as uint8 CPU tensors (the layouts of
// at::Generator::get_state()).
struct RngState {
  at::Tensor cpu;                // the default CPU generator
  std::vector<at::Tensor> cuda;  // one per CUDA device visible at save time
};

// A checkpoint in memory.
struct Checkpoint {
  int64_t epoch = 0;
  int64_t step = 0;
  // Parameters, then buffers, in the module's order (named_parameters(),
  // named_buffers()), on the device given to load (CPU for a capture).
  torch::OrderedDict<std::string, at::Tensor> model;
  // Null when saved without an optimizer.
  std::shared_ptr<const OptimizerState> optimizer;
  // Indexed by the rank that saved it; size = world size at save time.
  std::vector<RngState> rng;
  std::map<std::string, std::string> metadata;
  // The file it was read from ("" when captured in memory): named in errors.
  std::string path;
};

// The calling rank's state, copied to CPU (the copies do not alias the
// model's tensors). `optimizer` may be null; a ZeroRedundancyOptimizer
// gives its consolidated full state (InvalidArgument on a rank where none
// is current: call consolidate_state_dict first). rng holds this rank's state
// only. Throws InvalidArgument when epoch or step is negative, or when the
// model has two tensors with the same name after "module." is dropped.
Checkpoint capture_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              int64_t epoch, int64_t step);

struct RestoreOptions {
  // Restore the optimizer's state (when both it and the checkpoint have one).
  bool optimizer = true;
  // Restore this rank's RNG state (rng[rank]); when the checkpoint was saved
  // by fewer ranks than `rank`, the generators are left as they are.
  bool rng = true;
  // -1: the rank in the default group (0 without one).
  int rank = -1;
};

// Copies the checkpoint into `model` (in place, under NoGradGuard, onto each
// parameter's own device) and into `optimizer` (per-parameter state moved to
// the parameter's device, and each group's options). Does not communicate.
// Checks everything before changing anything: on error model and optimizer
// are untouched.
// Throws InvalidArgument naming ckpt.path when the checkpoint does not fit:
// the first key whose name, shape or dtype differs from the model's, an
// optimizer of another type ("Adam" vs "SGD") or with other parameter
// groups or parameter shapes. Supported optimizers: SGD, Adam, AdamW,
// Adagrad, RMSprop natively (every option and state field); any other
// type through libtorch's own optimizer archive (Optimizer::save/load) plus
// each group's lr (libtorch's load ignores saved options, so other changed
// options are not restored), parsed by libtorch: not hardened against
// corrupt bytes beyond the file's CRC, and not all-or-nothing.
void restore_checkpoint(const Checkpoint& ckpt, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer,
                        const RestoreOptions& options = {});

struct SaveOptions {
  // Keep the newest `keep_last` checkpoints in `dir` and delete older ones
  // (with their .model.pt). 0 keeps all.
  int keep_last = 0;
  // Also write the Python-loadable .model.pt file.
  bool write_torch_model = true;
  // Stored as is; read back in Checkpoint::metadata.
  std::map<std::string, std::string> metadata;
  // The group whose rank 0 writes; null: the default group when one exists,
  // else the caller is a single process (no communication).
  ProcessGroupPtr process_group;
};

// Collective (every rank of the group calls it with its model). A
// ShardedOptimizer (ZeroRedundancyOptimizer; on the same group, else
// InvalidArgument) first gathers its shards on rank 0
// (consolidate_state_dict). Gathers every rank's RNG state to rank 0; rank 0 captures its model and optimizer,
// creates `dir` if needed, writes the checkpoint atomically (see above) and
// deletes old ones per keep_last; then rank 0 broadcasts the outcome, so
// every rank returns only after the file is durable, and every rank throws
// if rank 0 failed (the message names rank 0's error). Returns the
// checkpoint's path on every rank.
// Throws InvalidArgument: negative epoch/step, a directory that cannot be
// created or written (naming it and errno's text).
std::string save_checkpoint(const std::string& dir,
                            const torch::nn::Module& model,
                            const torch::optim::Optimizer* optimizer,
                            int64_t epoch, int64_t step,
                            const SaveOptions& options = {});

// The path of the latest complete checkpoint in `dir` (largest epoch, then
// step), or nullopt when `dir` does not exist or holds none. Local: no
// communication.
std::optional<std::string> latest_checkpoint_path(const std::string& dir);

// Reads one checkpoint file; tensors (model and optimizer state) are mapped
// to `device`. Local. Throws InvalidArgument naming the file: missing,
// unreadable, truncated, checksum mismatch, another format version, or
// malformed content.
Checkpoint load_checkpoint(const std::string& path,
                           const c10::Device& device = c10::Device(c10::kCPU));

struct LoadOptions {
  // null: the default group when one exists, else a single process.
  ProcessGroupPtr process_group;
};

// Collective when there is a group: rank 0 picks the latest checkpoint in
// `dir` and broadcasts its name, so all ranks load the same file even if a
// newer one appears meanwhile; every rank reads it (the directory must be
// visible to every rank, e.g. on a shared file system) mapping tensors to
// `device`. Returns nullopt on every rank when there is none.
// Throws on every rank when any rank failed to read it: InvalidArgument,
// the failing rank's own error on that rank and "rank N could not load ..."
// with its message on the others.
std::optional<Checkpoint> load_latest_checkpoint(
    const std::string& dir, const c10::Device& device = c10::Device(c10::kCPU),
    const LoadOptions& options = {});

}  // namespace ddp
