// ddp-train's data augmentation (--augment): random transformations of a
// training batch, drawn from the batch's own generator (BatchLoader's
// BatchFetchRandom, ddp/datasets/seeding.h), so that a run is reproducible
// whatever the number of loader threads, every rank and epoch sees other
// draws, and a resumed run sees the same ones again.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <string>

namespace ddp::train {

// images: [N, 1, 28, 28] float32 (normalized). kind:
//   "none"  the images as they are;
//   "flip"  each image mirrored left-right with probability 1/2
//           (torchvision's RandomHorizontalFlip()): a shirt is a shirt in a
//           mirror, so the class never changes;
//   "flip-shift" the same, then each image shifted by -2..2 pixels in each
//           direction, the border filled with the background (torchvision's
//           RandomCrop(28, padding=2, fill=background)).
// Returns new tensors; InvalidArgument for another kind.
at::Tensor augment(const at::Tensor& images, const std::string& kind, at::Generator& generator);

}  // namespace ddp::train
