// Writes the fuzzers' seed corpus: small valid IDX files (each element type,
// 0-d to 3-d, empty, plain and gzip, a two-member gzip) and small
// checkpoints written by ddp::detail::serialize_checkpoint (empty; a model of every
// dtype code with metadata and RNG states; native and archive optimizer
// snapshots). scripts/fuzz.sh --seeds runs it:
//   fuzz_seeds <dir>   writes <dir>/idx/*, <dir>/checkpoint/* and
//                      <dir>/flight_trace/* (rings: flight_ring.h)
#include <ATen/ops/arange.h>
#include <zlib.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "ddp/checkpoint.h"
#include "flight_ring.h"
#include "idx_encode.h"

namespace {

using ddp::datasets::IdxArray;
using ddp::datasets::IdxDtype;
using ddp::OptimizerField;
using ddp::OptimizerFields;
using ddp::OptimizerState;

// Writes one seed after checking that it parses: seeds must be valid files,
// so that mutations start from the deep end of the parser.
void write_file(const std::string& path, const std::string& bytes) {
  if (path.find("/idx/") != std::string::npos) {
    ddp::datasets::parse_idx(bytes.data(), bytes.size(), path);
  } else {
    ddp::detail::parse_checkpoint(bytes, path);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) throw std::runtime_error("cannot write " + path);
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

std::string gzip(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("deflateInit2");
  std::string out(deflateBound(&z, in.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

at::Tensor values(std::vector<int64_t> shape, at::ScalarType type) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return at::arange(n).to(type).reshape(shape).contiguous();
}

std::string idx(IdxDtype dtype, std::vector<int64_t> shape, at::ScalarType type) {
  IdxArray a;
  a.dtype = dtype;
  a.dims = shape;
  a.magic = ddp::datasets::idx_magic(dtype, static_cast<int>(shape.size()));
  a.tensor = values(shape, type);
  return ddp::fuzz::encode_idx(a);
}

void idx_seeds(const std::string& dir) {
  const std::string images = idx(IdxDtype::kUInt8, {2, 3, 2}, at::kByte);
  const std::string labels = idx(IdxDtype::kUInt8, {4}, at::kByte);
  write_file(dir + "/uint8-3d-images.idx", images);
  write_file(dir + "/uint8-3d-images.idx.gz", gzip(images));
  write_file(dir + "/uint8-1d-labels.idx", labels);
  write_file(dir + "/uint8-1d-labels.idx.gz", gzip(labels));
  write_file(dir + "/int8-2d-empty.idx", idx(IdxDtype::kInt8, {0, 5}, at::kChar));
  write_file(dir + "/int16-1d.idx", idx(IdxDtype::kInt16, {3}, at::kShort));
  write_file(dir + "/int32-0d.idx", idx(IdxDtype::kInt32, {}, at::kInt));
  write_file(dir + "/float32-2d.idx.gz", gzip(idx(IdxDtype::kFloat32, {2, 2}, at::kFloat)));
  write_file(dir + "/float64-1d.idx", idx(IdxDtype::kFloat64, {2}, at::kDouble));
  // Two gzip members make one stream (as gunzip reads them).
  write_file(dir + "/uint8-two-members.idx.gz",
             gzip(images.substr(0, 7)) + gzip(images.substr(7)));
}

OptimizerField field(const std::string& name, double real) {
  OptimizerField f;
  f.name = name;
  f.kind = OptimizerField::Kind::kReal;
  f.real = real;
  return f;
}

std::shared_ptr<const OptimizerState> sgd() {
  auto s = std::make_shared<OptimizerState>();
  s->type = "SGD";
  OptimizerState::Group g;
  g.options = {field("lr", 0.1), field("momentum", 0.9)};
  OptimizerField nesterov;
  nesterov.name = "nesterov";
  nesterov.kind = OptimizerField::Kind::kBool;
  nesterov.flag = true;
  OptimizerField step;
  step.name = "step";
  step.kind = OptimizerField::Kind::kInt;
  step.integer = 7;
  g.options.push_back(nesterov);
  g.options.push_back(step);
  OptimizerField momentum;
  momentum.name = "momentum_buffer";
  momentum.kind = OptimizerField::Kind::kTensor;
  momentum.tensor = values({2}, at::kFloat);
  OptimizerField unused = momentum;
  unused.name = "unused";
  unused.tensor = at::Tensor();
  g.state.push_back(OptimizerFields{momentum, unused});
  g.state.push_back(std::nullopt);
  s->groups.push_back(g);
  return s;
}

std::shared_ptr<const OptimizerState> archive() {
  auto s = std::make_shared<OptimizerState>();
  s->type = "archive:LBFGS";
  s->archive = std::string("PK\x03\x04 libtorch archive bytes", 28);
  OptimizerState::Group g;
  g.options = {field("lr", 1.0)};
  s->groups.push_back(g);
  return s;
}

void checkpoint_seeds(const std::string& dir) {
  ddp::Checkpoint empty;
  write_file(dir + "/empty.ddpckpt", ddp::detail::serialize_checkpoint(empty));

  ddp::Checkpoint model;
  model.epoch = 2;
  model.step = 40;
  const std::pair<const char*, at::ScalarType> tensors[] = {
      {"conv.weight", at::kFloat}, {"fc.bias", at::kDouble}, {"h", at::kHalf},
      {"bf", at::kBFloat16}, {"c", at::kChar}, {"b", at::kByte}, {"s", at::kShort},
      {"i", at::kInt}, {"bn.num_batches_tracked", at::kLong}, {"z", at::kComplexFloat},
      {"zz", at::kComplexDouble}};
  for (const auto& [name, type] : tensors) model.model.insert(name, values({2, 1}, type));
  model.model.insert("mask", values({2}, at::kLong).lt(1));  // bool 1, 0
  model.model.insert("scalar", values({}, at::kFloat));
  model.model.insert("empty", values({0, 3}, at::kFloat));
  model.rng.push_back({values({16}, at::kByte), {}});
  model.rng.push_back({at::Tensor(), {values({8}, at::kByte), values({8}, at::kByte)}});
  model.metadata = {{"config", "{\"lr\": 0.1}"}, {"seed", "1"}};
  write_file(dir + "/model-rng-metadata.ddpckpt", ddp::detail::serialize_checkpoint(model));

  ddp::Checkpoint with_sgd;
  with_sgd.model.insert("w", values({2}, at::kFloat));
  with_sgd.model.insert("v", values({1}, at::kFloat));
  with_sgd.optimizer = sgd();
  write_file(dir + "/sgd.ddpckpt", ddp::detail::serialize_checkpoint(with_sgd));

  ddp::Checkpoint with_archive;
  with_archive.optimizer = archive();
  write_file(dir + "/optimizer-archive.ddpckpt", ddp::detail::serialize_checkpoint(with_archive));
}

// flight_trace_fuzzer's input: a facts byte, a torn-read byte, then rings
// (flight_ring.h).
// Seeds: a rank behind (stopped before its last collective), a timeout on
// both, ranks out of step (different signatures), a ring that wrapped.
void flight_seeds(const std::string& dir) {
  using ddp::flight::State;
  using ddp::fuzz::make_ring;
  auto write = [&](const std::string& name, uint8_t facts, const std::string& rings) {
    std::ofstream(dir + "/" + name, std::ios::binary)
        << std::string(1, static_cast<char>(facts)) << std::string(1, '\0') << rings;
  };
  write("behind", 0x00,
        make_ring(0, 2, 4, 6, State::kTimedOut, "all_reduce #6 timed out after 8.0 s") +
            make_ring(1, 2, 4, 5, State::kCompleted));
  write("both-timed-out", 0x01,
        make_ring(0, 2, 2, 3, State::kTimedOut, "timeout") +
            make_ring(1, 2, 2, 3, State::kTimedOut, "timeout"));
  std::string odd = make_ring(1, 3, 4, 4, State::kStarted);
  // The last slot's signature: another collective on rank 1.
  odd.replace(ddp::flight::ring_bytes(4) - sizeof(ddp::flight::Entry) +
                  offsetof(ddp::flight::Entry, signature),
              17, "barrier          ");
  write("out-of-step", 0x80,
        make_ring(0, 3, 4, 4, State::kStarted) + odd + make_ring(2, 3, 4, 4, State::kStarted));
  write("wrapped-single", 0x10, make_ring(0, 1, 3, 10, State::kFailed, "SIGSEGV"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>  (writes <dir>/idx and <dir>/checkpoint)\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/idx");
  std::filesystem::create_directories(dir + "/checkpoint");
  std::filesystem::create_directories(dir + "/flight_trace");
  idx_seeds(dir + "/idx");
  checkpoint_seeds(dir + "/checkpoint");
  flight_seeds(dir + "/flight_trace");
  return 0;
}
