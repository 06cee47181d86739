// Small models shared by the DistributedDataParallel tests (and the Python
// oracle test, whose script builds the same architectures).
#pragma once

#include <torch/torch.h>

namespace ddp::testing {

// 8 -> 16 -> 16 -> 4 MLP.
struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(at::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
};
TORCH_MODULE(Mlp);

// Conv + BatchNorm + Linear on 1x6x6 inputs: BatchNorm has running buffers.
struct BnCnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
  BnCnnImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3)));
    bn = register_module("bn", torch::nn::BatchNorm2d(3));
    fc = register_module("fc", torch::nn::Linear(3 * 4 * 4, 4));
  }
  at::Tensor forward(at::Tensor x) {
    return fc(torch::relu(bn(conv(x.view({-1, 1, 6, 6})))).flatten(1));
  }
};
TORCH_MODULE(BnCnn);

// A weight used twice and registered twice ("w" and "sub.w_tied").
struct TiedImpl : torch::nn::Module {
  at::Tensor w;
  torch::nn::Linear mid{nullptr};
  TiedImpl() {
    w = register_parameter("w", torch::randn({8, 8}) * 0.3);
    auto sub = std::make_shared<torch::nn::Module>();
    sub->register_parameter("w_tied", w);
    register_module("sub", sub);
    mid = register_module("mid", torch::nn::Linear(8, 8));
  }
  at::Tensor forward(at::Tensor x) {
    return torch::matmul(mid(torch::tanh(x.matmul(w))), w.t()).narrow(1, 0, 4);
  }
};
TORCH_MODULE(Tied);

// An MLP whose "aux" head is used only when asked: for unused parameters.
struct BranchyImpl : torch::nn::Module {
  torch::nn::Linear body{nullptr}, head{nullptr}, aux{nullptr};
  BranchyImpl() {
    body = register_module("body", torch::nn::Linear(8, 16));
    head = register_module("head", torch::nn::Linear(16, 4));
    aux = register_module("aux", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(at::Tensor x, bool use_aux) {
    auto h = torch::relu(body(x));
    return use_aux ? head(h) + aux(h) : head(h);
  }
};
TORCH_MODULE(Branchy);

// Activation checkpointing with a re-entrant backward, as
// torch.utils.checkpoint(use_reentrant=True): forward without a graph,
// backward recomputes `fn` with one and runs a nested backward through it,
// which accumulates into the parameters of `fn` from inside the outer one.
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, const Fn* fn) {
    ctx->save_for_backward({x});
    ctx->saved_data["fn"] = reinterpret_cast<int64_t>(fn);
    at::NoGradGuard no_grad;
    return (*fn)(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Fn* fn = reinterpret_cast<const Fn*>(ctx->saved_data["fn"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode on(true);
      y = (*fn)(x);
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

// One block called twice in forward, optionally each call checkpointed
// (then block's gradient is accumulated twice per backward). The input
// layer makes the first checkpoint's input require grad.
// checkpoint_head: the head too, so the first parameter gradient of a
// backward arrives inside a re-entrant backward.
struct TwiceImpl : torch::nn::Module {
  torch::nn::Linear inp{nullptr}, block{nullptr}, head{nullptr};
  bool checkpointed, checkpointed_head;
  Checkpoint::Fn fn, head_fn;
  explicit TwiceImpl(bool checkpoint = false, bool checkpoint_head = false)
      : checkpointed(checkpoint), checkpointed_head(checkpoint_head) {
    inp = register_module("inp", torch::nn::Linear(8, 8));
    block = register_module("block", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 4));
    fn = [this](const at::Tensor& x) { return torch::tanh(block(x)); };
    head_fn = [this](const at::Tensor& x) { return head(x); };
  }
  at::Tensor forward(at::Tensor x) {
    x = torch::tanh(inp(x));
    for (int i = 0; i < 2; ++i) x = checkpointed ? Checkpoint::apply(x, &fn) : fn(x);
    return checkpointed_head ? Checkpoint::apply(x, &head_fn) : head(x);
  }
};
TORCH_MODULE(Twice);

}  // namespace ddp::testing
