#include "weights.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ddp/error.h"

namespace ddp::bench {

void write_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  bool ok = fd >= 0;
  size_t done = 0;
  while (ok && done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    throw InvalidArgument(fmt::format(
        "cannot write '{}': check that its directory exists and is writable", path));
  }
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(fmt::format(
        "cannot read weights file '{}': create it with `ddp-bench --workload W "
        "--save-weights PREFIX` (bench/run.py does)",
        path));
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

void save_weights(const torch::nn::Module& module, const std::string& prefix) {
  nlohmann::json index = nlohmann::json::array();
  std::string data;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor t = item.value().detach().to(at::kFloat).contiguous();
    index.push_back({{"name", item.key()},
                     {"shape", t.sizes().vec()},
                     {"offset", data.size()}});
    data.append(static_cast<const char*>(t.data_ptr()), t.numel() * sizeof(float));
  }
  write_atomically(prefix + ".bin", data);
  write_atomically(prefix + ".json", nlohmann::json{{"tensors", index}}.dump(1) + "\n");
}

void load_weights(torch::nn::Module& module, const std::string& prefix) {
  const auto index = nlohmann::json::parse(read_file(prefix + ".json"))["tensors"];
  std::string data = read_file(prefix + ".bin");
  auto params = module.named_parameters(/*recurse=*/true);
  if (index.size() != params.size()) {
    throw InvalidArgument(fmt::format(
        "weights file '{}.json' has {} tensors but the model has {} parameters: "
        "regenerate it for this workload",
        prefix, index.size(), params.size()));
  }
  at::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& item : params) {
    const auto& e = index[i++];
    auto shape = e["shape"].get<std::vector<int64_t>>();
    if (e["name"] != item.key() || shape != item.value().sizes().vec()) {
      throw InvalidArgument(fmt::format(
          "weights file '{}.json': entry {} is {} {} but the model's parameter is {} {}",
          prefix, i - 1, e["name"].get<std::string>(), shape, item.key(),
          item.value().sizes().vec()));
    }
    const size_t offset = e["offset"].get<size_t>();
    const size_t bytes = item.value().numel() * sizeof(float);
    if (offset + bytes > data.size()) {
      throw InvalidArgument(fmt::format(
          "weights file '{}.bin' is truncated at parameter {}", prefix, item.key()));
    }
    item.value().copy_(at::from_blob(data.data() + offset, shape, at::kFloat));
  }
}

}  // namespace ddp::bench
