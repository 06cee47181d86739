// ddp::read_state_dict / load_state_dict / save_state_dict against files
// written by PyTorch's torch.save (tests/golden/state_dict/, made by
// tests/golden/make_state_dict_golden.py), and the round trip through the
// oracle's Python: a state dict saved by Python, loaded and saved again by
// C++, equal in Python with torch.load(weights_only=True).
#include "ddp/state_dict.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "checkpoint/unpickler.h"
#include "ddp/error.h"
#include "support/oracle.h"
#include "support/temp_dir.h"

namespace {

using ddp::testing::TempDir;

const std::string kGolden = std::string(DDP_SOURCE_DIR) + "/tests/golden/state_dict/";

// The golden files' Net, as in make_state_dict_golden.py.
struct NetImpl : torch::nn::Module {
  NetImpl(int in = 4)
      : fc1(register_module("fc1", torch::nn::Linear(in, 3))),
        bn(register_module("bn", torch::nn::BatchNorm1d(3))),
        fc2(register_module("fc2", torch::nn::Linear(3, 2))) {}
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

// Python's state_dict order: each module's parameters, then its buffers.
const std::vector<std::string> kNetKeys = {
    "fc1.weight",      "fc1.bias",       "bn.weight",           "bn.bias",   "bn.running_mean",
    "bn.running_var", "bn.num_batches_tracked", "fc2.weight", "fc2.bias"};

// arange(n) / 8 + k in t's shape and dtype: the generator's `known`.
at::Tensor known(const at::Tensor& like, int k) {
  return (at::arange(like.numel(), at::kDouble) / 8 + k).reshape(like.sizes()).to(like.scalar_type());
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

void expect_known_net(Net& net) {
  auto own = net->named_parameters();
  for (const auto& b : net->named_buffers()) own.insert(b.key(), b.value());
  for (size_t k = 0; k < kNetKeys.size(); ++k) {
    const at::Tensor& t = own[kNetKeys[k]];
    EXPECT_TRUE(t.equal(known(t, static_cast<int>(k)))) << kNetKeys[k] << ": " << t;
  }
}

TEST(StateDict, ReadsPythonsTorchSaveInItsOrder) {
  for (const char* file : {"net.pt", "net_proto4.pt"}) {
    auto sd = ddp::read_state_dict(kGolden + file);
    ASSERT_EQ(sd.keys(), kNetKeys) << file;
    for (size_t k = 0; k < kNetKeys.size(); ++k) {
      const at::Tensor& t = sd[kNetKeys[k]];
      EXPECT_TRUE(t.equal(known(t, static_cast<int>(k)))) << file << " " << kNetKeys[k];
    }
    EXPECT_EQ(sd["bn.num_batches_tracked"].scalar_type(), at::kLong);
    EXPECT_EQ(sd["fc1.weight"].sizes(), (std::vector<int64_t>{3, 4}));
  }
}

TEST(StateDict, LoadsIntoTheSameArchitectureBuiltInCpp) {
  Net net;
  auto keys = ddp::load_state_dict(*net, kGolden + "net.pt");
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  expect_known_net(net);
  // The same output as the weights say: eval-mode BatchNorm with the file's statistics.
  net->eval();
  at::Tensor x = at::ones({1, 4});
  at::Tensor h = at::relu(net->bn(net->fc1(x)));
  EXPECT_TRUE(net->fc2(h).equal(at::linear(h, known(net->fc2->weight, 7), known(net->fc2->bias, 8))));
}

TEST(StateDict, DropsTheModulePrefixOfADdpWrappedModel) {
  Net net;
  ddp::load_state_dict(*net, kGolden + "net_ddp.pt");
  expect_known_net(net);
}

TEST(StateDict, ReadsEveryDtypeSharedStoragesAndStrides) {
  auto sd = ddp::read_state_dict(kGolden + "dtypes.pt");
  const std::vector<std::pair<std::string, at::ScalarType>> dtypes = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
      {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}, {"complex64", at::kComplexFloat}};
  for (size_t k = 0; k < dtypes.size(); ++k) {
    const at::Tensor& t = sd[dtypes[k].first];
    EXPECT_EQ(t.scalar_type(), dtypes[k].second) << dtypes[k].first;
    EXPECT_TRUE(t.equal(known(at::empty({2, 3}, dtypes[k].second), static_cast<int>(k))))
        << dtypes[k].first << ": " << t;
  }
  const at::Tensor base = sd["base"];
  EXPECT_TRUE(base.equal(known(at::empty({4, 5}), 20)));
  EXPECT_TRUE(sd["row2"].equal(base[2]));
  EXPECT_TRUE(sd["row2"].is_alias_of(base)) << "a view keeps sharing its storage";
  EXPECT_EQ(sd["transposed"].strides(), (std::vector<int64_t>{1, 5}));
  EXPECT_TRUE(sd["transposed"].equal(base.t()));
  EXPECT_EQ(sd["scalar"].dim(), 0);
  EXPECT_EQ(sd["scalar"].item<float>(), 7.25f);
  EXPECT_EQ(sd["empty"].sizes(), (std::vector<int64_t>{0, 3}));
}

TEST(StateDict, AnEntryOfALargerDictIsNamedByKey) {
  const std::string err = message_of([] { ddp::read_state_dict(kGolden + "nested.pt"); });
  EXPECT_NE(err.find("holds a dict of other things (keys: 'model', 'epoch', 'lr'), not a "
                     "state dict: name the entry that is one (StateDictOptions::key = \"model\")"),
            std::string::npos) << err;
  Net net;
  ddp::StateDictOptions o;
  o.key = "model";
  ddp::load_state_dict(*net, kGolden + "nested.pt", o);
  expect_known_net(net);
  o.key = "optimizer";
  const std::string missing = message_of([&] { ddp::load_state_dict(*net, kGolden + "nested.pt", o); });
  EXPECT_NE(missing.find("has no entry 'optimizer' (its keys: 'model', 'epoch', 'lr')"),
            std::string::npos) << missing;
}

TEST(StateDict, StrictNamesMissingUnexpectedAndMisShapedKeysAndChangesNothing) {
  Net net(/*in=*/5);  // fc1.weight is [3, 5] here, [3, 4] in the file
  auto before = net->fc2->weight.clone();
  const std::string err = message_of([&] { ddp::load_state_dict(*net, kGolden + "net.pt"); });
  EXPECT_NE(err.find("Error(s) in loading state_dict for"), std::string::npos) << err;
  EXPECT_NE(err.find(kGolden + "net.pt"), std::string::npos) << err;
  EXPECT_NE(err.find("size mismatch for fc1.weight: copying a param with shape float32[3, 4] "
                     "from checkpoint, the shape in current model is float32[3, 5]."),
            std::string::npos) << err;
  EXPECT_TRUE(net->fc2->weight.equal(before)) << "all or nothing";

  // A module with another layer: its key missing, the file's fc2 unexpected.
  struct Other : torch::nn::Module {
    Other() {
      register_module("fc1", torch::nn::Linear(4, 3));
      register_module("bn", torch::nn::BatchNorm1d(3));
      register_module("head", torch::nn::Linear(3, 2));
    }
  } other;
  const std::string keys = message_of([&] { ddp::load_state_dict(other, kGolden + "net.pt"); });
  EXPECT_NE(keys.find("Missing key(s) in state_dict: \"head.weight\", \"head.bias\"."),
            std::string::npos) << keys;
  EXPECT_NE(keys.find("Unexpected key(s) in state_dict: \"fc2.weight\", \"fc2.bias\"."),
            std::string::npos) << keys;
  EXPECT_NE(keys.find("strict = false"), std::string::npos) << keys;

  ddp::StateDictOptions lax;
  lax.strict = false;
  auto result = ddp::load_state_dict(other, kGolden + "net.pt", lax);
  EXPECT_EQ(result.missing_keys, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_EQ(result.unexpected_keys, (std::vector<std::string>{"fc2.weight", "fc2.bias"}));
  EXPECT_TRUE(other.named_parameters()["fc1.weight"].equal(known(at::empty({3, 4}), 0)));
  // A shape mismatch stays an error without strict, as in PyTorch.
  EXPECT_NE(message_of([&] { ddp::load_state_dict(*net, kGolden + "net.pt", lax); })
                .find("size mismatch for fc1.weight"),
            std::string::npos);
}

TEST(StateDict, WhatIsNotAStateDictIsNamed) {
  const auto err = [](const std::string& file) {
    return message_of([&] { ddp::read_state_dict(kGolden + file); });
  };
  std::string e = err("whole_module.pt");
  EXPECT_NE(e.find("__main__.Net object"), std::string::npos) << e;
  EXPECT_NE(e.find("Save model.state_dict() rather than the model"), std::string::npos) << e;
  e = err("legacy.pt");
  EXPECT_NE(e.find("torch.save's legacy format"), std::string::npos) << e;
  EXPECT_NE(e.find("torch.save(torch.load(path), path)"), std::string::npos) << e;
  e = err("scripted.pt");
  EXPECT_NE(e.find("TorchScript module (torch.jit.save); load it with torch::jit::load"),
            std::string::npos) << e;
  e = err("absent.pt");
  EXPECT_NE(e.find("absent.pt' does not exist"), std::string::npos) << e;

  TempDir dir;
  std::ifstream in(kGolden + "net.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir.path() + "/cut.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  e = message_of([&] { ddp::read_state_dict(dir.path() + "/cut.pt"); });
  EXPECT_NE(e.find("cut.pt: a damaged torch.save archive"), std::string::npos) << e;
}

// Hand-made pickles: what the restricted unpickler refuses, by name.
TEST(StateDict, TheUnpicklerRefusesRecursionDepthAndUnknownOpcodes) {
  namespace pk = ddp::detail::pickle;
  using namespace std::string_literals;  // the pickles hold NUL bytes
  pk::Hooks none{[](const pk::Value&) { return pk::ValuePtr(); },
                 [](const std::string&, const pk::Value&) { return pk::ValuePtr(); }};
  const auto err = [&](const std::string& bytes) {
    return message_of([&] { pk::unpickle(bytes, none, "p"); });
  };
  EXPECT_EQ(pk::unpickle(std::string("\x80\x02}q\x00X\x01\x00\x00\x00" "aK\x07s.", 15), none, "p")
                ->entries.at(0).second->integer, 7);
  EXPECT_NE(err("]q\x00h\x00" "a."s).find("inside itself"), std::string::npos);  // l.append(l)
  std::string deep;
  for (int i = 0; i < 600; ++i) deep += "]";
  for (int i = 0; i < 599; ++i) deep += "a";
  EXPECT_NE(err(deep + ".").find("nesting deeper than 512"), std::string::npos) << err(deep + ".");
  EXPECT_NE(err("\x8f.").find("opcode 0x8f"), std::string::npos);  // EMPTY_SET
  EXPECT_NE(err("X\xff\xff\xff\x7f").find("truncated"), std::string::npos);
  EXPECT_NE(err("a.").find("stack underflow"), std::string::npos);
  EXPECT_NE(err("h\x05.").find("memo entry 5 was never stored"), std::string::npos);
}

// Both directions with the oracle's PyTorch: random weights saved by
// Python, read and written again by C++, equal in Python when loaded with
// weights_only=True.
TEST(StateDict, RoundTripThroughPythonIsExact) {
  if (!ddp::testing::oracle_configured()) GTEST_SKIP() << ddp::testing::kNoOracle;
  TempDir dir;
  const std::string script = dir.path() + "/round.py";
  std::ofstream(script) << R"(import inspect, sys, torch
sys.path.insert(0, sys.argv[1])
# PyTorch 1.13's torch.load has no weights_only; 2.6 made it the default.
kw = {"weights_only": True} if "weights_only" in inspect.signature(torch.load).parameters else {}
from make_state_dict_golden import Net
if sys.argv[2] == "save":
    torch.manual_seed(5)
    n = Net()
    n.bn.running_mean.normal_(); n.bn.running_var.uniform_(0.5, 2); n.bn.num_batches_tracked += 9
    torch.save(n.state_dict(), sys.argv[3])
else:
    a = torch.load(sys.argv[3], **kw)
    b = torch.load(sys.argv[4], **kw)
    assert list(a) == list(b), (list(a), list(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    Net().load_state_dict(b)
    print("equal", len(a))
)";
  const std::string py = ddp::testing::oracle_python() + " " + script + " " + DDP_SOURCE_DIR +
                         "/tests/golden ";
  const std::string from = dir.path() + "/python.pt", back = dir.path() + "/cpp.pt";
  ASSERT_EQ(std::system((py + "save " + from).c_str()), 0);
  Net net;
  ddp::load_state_dict(*net, from);
  EXPECT_EQ(net->bn->num_batches_tracked.item<int64_t>(), 9);
  ddp::save_state_dict(*net, back);
  FILE* pipe = ::popen((py + "check " + from + " " + back + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  ASSERT_EQ(::pclose(pipe), 0) << out;
  EXPECT_EQ(out, "equal 9\n");
}

TEST(StateDict, SaveNamesAMissingDirectory) {
  Net net;
  const std::string e = message_of([&] { ddp::save_state_dict(*net, "/nonexistent-dir/x.pt"); });
  EXPECT_NE(e.find("its directory '/nonexistent-dir' does not exist"), std::string::npos) << e;
}

}  // namespace
