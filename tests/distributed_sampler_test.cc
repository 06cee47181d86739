// DistributedSampler against PyTorch: golden index lists from
// torch.utils.data.DistributedSampler (tests/golden/distributed_sampler.json,
// regenerated here with the oracle Python, support/oracle.h), randperm with a
// seeded generator, set_epoch through a real libtorch data loader, coverage
// of the dataset over ranks, save/load, and the error messages.
#include "ddp/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>
#include <gtest/gtest.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ddp/error.h"
#include "support/oracle.h"
#include "support/temp_dir.h"
#include "support/thread_world.h"

namespace ddp {
namespace {

using json = nlohmann::json;
using Indices = std::vector<int64_t>;

const std::string kGolden =
    std::string(DDP_SOURCE_DIR) + "/tests/golden/distributed_sampler.json";
const std::string kScript =
    std::string(DDP_SOURCE_DIR) + "/tests/golden/make_sampler_golden.py";

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

const json& golden() {
  static const json doc = read_json(kGolden);
  return doc;
}

DistributedSamplerOptions options_of(const json& c, int64_t rank) {
  DistributedSamplerOptions o;
  o.num_replicas = c["num_replicas"].get<int64_t>();
  o.rank = rank;
  o.shuffle = c["shuffle"].get<bool>();
  o.seed = c["seed"].get<int64_t>();
  o.drop_last = c["drop_last"].get<bool>();
  return o;
}

std::string describe(const json& c, int64_t rank) {
  json d = c;
  d.erase("ranks");
  d.erase("digests");
  d.erase("perm");
  return d.dump() + (rank >= 0 ? " rank " + std::to_string(rank) : "");
}

// Same digest as make_sampler_golden.py: length, head, tail, sum((i+1)*v).
void expect_digest(const Indices& got, const json& want, const std::string& at) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want["len"].get<int64_t>()) << at;
  const size_t k = std::min<size_t>(16, got.size());
  EXPECT_EQ(Indices(got.begin(), got.begin() + k), want["head"].get<Indices>()) << at;
  EXPECT_EQ(Indices(got.end() - k, got.end()), want["tail"].get<Indices>()) << at;
  int64_t sum = 0;
  for (size_t i = 0; i < got.size(); ++i) sum += static_cast<int64_t>(i + 1) * got[i];
  EXPECT_EQ(sum, want["weighted_sum"].get<int64_t>()) << at;
}

// Every case and rank of a golden document: the free functions, and the
// sampler class iterated through next() for the lists stored in full.
void check_cases(const json& doc) {
  for (const json& c : doc["cases"]) {
    const int64_t n = c["dataset_size"].get<int64_t>();
    const int64_t epoch = c["epoch"].get<int64_t>();
    for (int64_t r = 0; r < c["num_replicas"].get<int64_t>(); ++r) {
      const auto o = options_of(c, r);
      const std::string at = describe(c, r);
      const Indices got = distributed_sampler_indices(n, o, epoch);
      EXPECT_EQ(distributed_sampler_num_samples(n, *o.num_replicas, o.drop_last),
                c["num_samples"][r].get<int64_t>()) << at;
      EXPECT_EQ(distributed_sampler_num_unique_samples(n, o),
                c["num_unique_samples"][r].get<int64_t>()) << at;
      if (!c.contains("ranks")) {
        expect_digest(got, c["digests"][r], at);
        continue;
      }
      const Indices want = c["ranks"][r].get<Indices>();
      EXPECT_EQ(got, want) << at;
      DistributedSampler s(n, o);
      s.set_epoch(epoch);
      s.reset();
      EXPECT_EQ(s.size(), c["num_samples"][r].get<int64_t>()) << at;
      EXPECT_EQ(s.num_unique_samples(), c["num_unique_samples"][r].get<int64_t>()) << at;
      Indices streamed;
      while (auto batch = s.next(3)) streamed.insert(streamed.end(), batch->begin(), batch->end());
      EXPECT_EQ(streamed, want) << at;
    }
  }
}

// The golden file itself must keep covering what the task demands.
TEST(DistributedSamplerGolden, FileCoversRequiredCombinations) {
  std::set<std::string> configs;
  bool n_lt_w = false, uneven = false, drop = false, w1 = false, noshuf = false;
  std::set<int64_t> seeds;
  std::map<std::string, int> epochs_per_config;
  for (const json& c : golden()["cases"]) {
    const int64_t n = c["dataset_size"], w = c["num_replicas"];
    json key = c;
    for (auto k : {"ranks", "digests", "epoch", "num_samples", "num_unique_samples"}) key.erase(k);
    configs.insert(key.dump());
    ++epochs_per_config[key.dump()];
    n_lt_w |= n < w;
    uneven |= n % w != 0;
    drop |= c["drop_last"].get<bool>();
    w1 |= w == 1;
    noshuf |= !c["shuffle"].get<bool>();
    seeds.insert(c["seed"].get<int64_t>());
  }
  EXPECT_GE(configs.size(), 20u);
  EXPECT_TRUE(n_lt_w && uneven && drop && w1 && noshuf);
  EXPECT_GE(seeds.size(), 4u);
  EXPECT_GE(std::count_if(epochs_per_config.begin(), epochs_per_config.end(),
                          [](auto& kv) { return kv.second >= 3; }), 3);
}

TEST(DistributedSamplerGolden, MatchesPyTorch) { check_cases(golden()); }

uint64_t seed_of(const json& v) {
  return v.is_number_unsigned() ? v.get<uint64_t>()
                                : static_cast<uint64_t>(v.get<int64_t>());
}

TEST(DistributedSamplerGolden, RandpermWithSeededGeneratorMatchesPython) {
  for (const json& p : golden()["randperm"]) {
    const int64_t n = p["n"];
    const uint64_t seed = seed_of(p["seed"]);
    at::Tensor perm = at::randperm(n, at::detail::createCPUGenerator(seed), at::kLong);
    const Indices want = p["perm"].get<Indices>();
    EXPECT_EQ(Indices(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n), want)
        << p["seed"].dump();
    // W = 1, epoch 0 is the bare permutation; seeds >= 2^63 arrive as
    // negative int64 and must wrap like Python's manual_seed.
    DistributedSamplerOptions o;
    o.num_replicas = 1;
    o.rank = 0;
    o.seed = static_cast<int64_t>(seed);
    EXPECT_EQ(distributed_sampler_indices(n, o, 0), want) << p["seed"].dump();
  }
}

bool python_with_torch() { return ddp::testing::oracle_configured(); }

TEST(DistributedSamplerGolden, RegeneratedByPythonMatchesStoredFile) {
  if (!python_with_torch()) {
    GTEST_SKIP() << ddp::testing::kNoOracle << " (compared with the stored golden file only)";
  }
  const testing::TempDir dir("ddp-sampler-golden");
  const std::string out = dir.file("golden.json");
  const std::string cmd =
      "timeout 300 " + ddp::testing::oracle_python() + " " + kScript + " --out " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json fresh = read_json(out);
  // Entry by entry, naming the first that differs (a whole-file dump is
  // unreadable).
  for (const char* part : {"cases", "randperm"}) {
    const json& a = fresh[part];
    const json& b = golden()[part];
    ASSERT_EQ(a.size(), b.size()) << part << ": regenerate " << kGolden;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) {
        ADD_FAILURE() << part << "[" << i << "] differs from Python's: "
                      << describe(b[i], -1) << "; regenerate " << kGolden;
        break;
      }
    }
  }
  check_cases(fresh);
}

// One int64 per sample: the batch is the list of indices the loader got.
struct IndexDataset : torch::data::datasets::Dataset<IndexDataset, int64_t> {
  explicit IndexDataset(size_t n) : n(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  c10::optional<size_t> size() const override { return n; }
  size_t n;
};

const json& golden_case(int64_t n, int64_t w, int64_t seed, bool drop, int64_t epoch) {
  for (const json& c : golden()["cases"]) {
    if (c["dataset_size"] == n && c["num_replicas"] == w && c["seed"] == seed &&
        c["drop_last"] == drop && c["shuffle"] == true && c["epoch"] == epoch)
      return c;
  }
  throw std::runtime_error("golden case missing");
}

TEST(DistributedSamplerLoader, SetEpochReachesTheLoadersCopy) {
  for (size_t workers : {0, 2}) {
    DistributedSamplerOptions o;
    o.num_replicas = 3;
    o.rank = 1;
    DistributedSampler sampler(10, o);
    auto loader = torch::data::make_data_loader(
        IndexDataset(10), sampler,
        torch::data::DataLoaderOptions().batch_size(3).workers(workers));
    auto epoch_order = [&] {
      Indices seen;
      for (auto& batch : *loader) seen.insert(seen.end(), batch.begin(), batch.end());
      return seen;
    };
    std::vector<Indices> orders;
    for (int64_t epoch : {0, 1, 2}) {
      sampler.set_epoch(epoch);
      orders.push_back(epoch_order());
      EXPECT_EQ(orders.back(), golden_case(10, 3, 0, false, epoch)["ranks"][1].get<Indices>())
          << "epoch " << epoch << " workers " << workers;
    }
    EXPECT_NE(orders[0], orders[1]);
    EXPECT_EQ(epoch_order(), orders[2]) << "no set_epoch: same order again";
  }
}

TEST(DistributedSamplerLoader, CopiesShareEpochNotCursor) {
  DistributedSamplerOptions o;
  o.num_replicas = 3;
  o.rank = 1;
  DistributedSampler a(10, o);
  DistributedSampler b = a;
  const Indices e0 = distributed_sampler_indices(10, o, 0);
  const Indices e3 = distributed_sampler_indices(10, o, 3);
  ASSERT_NE(e0, e3);
  ASSERT_EQ(*b.next(2), std::vector<size_t>(e0.begin(), e0.begin() + 2));
  a.set_epoch(3);
  EXPECT_EQ(b.epoch(), 3);
  // An iteration in progress keeps its order, as in PyTorch.
  EXPECT_EQ(*b.next(9), std::vector<size_t>(e0.begin() + 2, e0.end()));
  EXPECT_FALSE(b.next(1).has_value());
  b.reset();
  EXPECT_EQ(b.indices(), e3);
  EXPECT_EQ(a.indices(), e0) << "a's own list changes at a's reset";
  EXPECT_EQ(a.position(), 0u);
  a.reset(16);  // a new dataset size, as libtorch's reset(new_size)
  EXPECT_EQ(a.dataset_size(), 16);
  EXPECT_EQ(a.size(), 6);
  EXPECT_EQ(a.indices(), distributed_sampler_indices(16, o, 3));
}

// Interleaving every rank's list gives the padded order: positions below N
// are a permutation of the dataset, padding repeats the order from its start,
// and the first num_unique_samples of each rank cover each sample once.
TEST(DistributedSamplerCoverage, UnionOverRanksIsTheDatasetPlusPadding) {
  for (int64_t n : {0, 1, 2, 5, 10, 17, 100}) {
    for (int64_t w : {1, 2, 3, 4, 7}) {
      for (bool drop : {false, true}) {
        for (bool shuffle : {false, true}) {
          const std::string at = "N=" + std::to_string(n) + " W=" + std::to_string(w) +
                                 " drop_last=" + std::to_string(drop) + " shuffle=" +
                                 std::to_string(shuffle);
          const int64_t per = distributed_sampler_num_samples(n, w, drop);
          const int64_t total = per * w;
          EXPECT_EQ(total, drop ? n / w * w : (n + w - 1) / w * w) << at;
          Indices global(total, -1), unique;
          for (int64_t r = 0; r < w; ++r) {
            DistributedSamplerOptions o{w, r, shuffle, 5, drop};
            const Indices mine = distributed_sampler_indices(n, o, 2);
            ASSERT_EQ(static_cast<int64_t>(mine.size()), per) << at;
            for (int64_t k = 0; k < per; ++k) global[r + k * w] = mine[k];
            const int64_t u = distributed_sampler_num_unique_samples(n, o);
            unique.insert(unique.end(), mine.begin(), mine.begin() + u);
          }
          std::sort(unique.begin(), unique.end());
          Indices expected_unique(std::min(n, total));
          if (drop) {
            expected_unique.assign(global.begin(), global.end());
            std::sort(expected_unique.begin(), expected_unique.end());
          } else {
            for (int64_t i = 0; i < n; ++i) expected_unique[i] = i;
          }
          EXPECT_EQ(unique, expected_unique) << at;
          EXPECT_EQ(std::adjacent_find(unique.begin(), unique.end()), unique.end()) << at;
          for (int64_t p = n; p < total; ++p) EXPECT_EQ(global[p], global[p % n]) << at;
          for (int64_t v : global) EXPECT_TRUE(v >= 0 && v < n) << at;
        }
      }
    }
  }
}

// A resume after k full batches of b on W ranks, on the same world: each
// rank's rest equals the tail of its uninterrupted list.
TEST(DistributedSamplerResume, SameWorldContinuesEachRanksList) {
  for (int64_t n : {1, 7, 10, 17, 100}) {
    for (int64_t w : {1, 2, 3, 4}) {
      for (bool drop : {false, true}) {
        const int64_t per = distributed_sampler_num_samples(n, w, drop);
        for (int64_t b : {1, 2, 3}) {
          for (int64_t k = 0; k * b < per; ++k) {
            const std::string at = "N=" + std::to_string(n) + " W=" + std::to_string(w) +
                                   " b=" + std::to_string(b) + " k=" + std::to_string(k) +
                                   " drop_last=" + std::to_string(drop);
            for (int64_t r = 0; r < w; ++r) {
              DistributedSamplerOptions o{w, r, true, 9, drop};
              const Indices whole = distributed_sampler_indices(n, o, 4);
              EXPECT_EQ(distributed_sampler_indices_after(n, o, 4, k * b * w),
                        Indices(whole.begin() + k * b, whole.end()))
                  << at << " rank " << r;
            }
          }
        }
      }
    }
  }
}

// On another world: what W ranks trained (k batches of b each) and what the
// W2 ranks are given afterwards cover the dataset once, apart from fewer than
// W2 padding repeats; every new rank gets as many samples.
TEST(DistributedSamplerResume, AnotherWorldCoversTheRestOnce) {
  for (int64_t n : {5, 17, 100}) {
    for (int64_t w : {1, 2, 3}) {
      for (int64_t w2 : {1, 2, 4, 5}) {
        const int64_t b = 2;
        const int64_t per = distributed_sampler_num_samples(n, w, false);
        for (int64_t k = 0; k * b < per; ++k) {
          const std::string at = "N=" + std::to_string(n) + " W=" + std::to_string(w) +
                                 " W2=" + std::to_string(w2) + " k=" + std::to_string(k);
          std::multiset<int64_t> seen;
          for (int64_t r = 0; r < w; ++r) {
            const Indices whole = distributed_sampler_indices(n, {w, r, true, 3, false}, 1);
            seen.insert(whole.begin(), whole.begin() + k * b);
          }
          const int64_t consumed = k * b * w;
          const int64_t each = (n - consumed + w2 - 1) / w2;
          std::multiset<int64_t> rest;
          for (int64_t r = 0; r < w2; ++r) {
            const Indices mine = distributed_sampler_indices_after(n, {w2, r, true, 3, false}, 1,
                                                                   consumed);
            ASSERT_EQ(static_cast<int64_t>(mine.size()), each) << at;
            rest.insert(mine.begin(), mine.end());
          }
          std::set<int64_t> all(seen.begin(), seen.end());
          all.insert(rest.begin(), rest.end());
          EXPECT_EQ(static_cast<int64_t>(all.size()), n) << at;
          EXPECT_EQ(static_cast<int64_t>(seen.size() + rest.size()), consumed + each * w2) << at;
          EXPECT_LT(each * w2 - (n - consumed), w2) << at;
        }
      }
    }
  }
  // The arithmetic spelled out once: N=10, 2 ranks did one batch of 2
  // (positions 0..3 of the order); 3 ranks share positions 4..9.
  const Indices order = distributed_sampler_indices(10, {1, 0, true, 3, false}, 1);
  EXPECT_EQ(distributed_sampler_indices_after(10, {3, 1, true, 3, false}, 1, 4),
            (Indices{order[5], order[8]}));
  EXPECT_EQ(distributed_sampler_indices_after(10, {4, 3, true, 3, false}, 1, 4),
            (Indices{order[7], order[1]}));  // padding from the epoch's start
}

TEST(DistributedSamplerCoverage, DefaultsComeFromTheProcessGroup) {
  std::vector<Indices> got(3);
  std::vector<int64_t> ranks(3, -1), worlds(3, -1);
  testing::run_ranks(3, [&](int rank) {
    DistributedSampler s(10);
    ranks[rank] = s.rank();
    worlds[rank] = s.num_replicas();
    got[rank] = s.indices();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[r], r);
    EXPECT_EQ(worlds[r], 3);
    EXPECT_EQ(got[r], golden_case(10, 3, 0, false, 0)["ranks"][r].get<Indices>());
  }
}

TEST(DistributedSamplerState, SaveLoadResumesAndRefusesOtherSettings) {
  DistributedSamplerOptions o{3, 1, true, 0, false};
  DistributedSampler s(10, o);
  s.set_epoch(2);
  s.reset();
  s.next(2);
  torch::serialize::OutputArchive out;
  s.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  auto load_into = [&](DistributedSampler& t) {
    bytes.seekg(0);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    t.load(in);
  };
  DistributedSampler restored(10, o);
  load_into(restored);
  EXPECT_EQ(restored.epoch(), 2);
  EXPECT_EQ(restored.position(), 2u);
  const Indices e2 = golden_case(10, 3, 0, false, 2)["ranks"][1].get<Indices>();
  EXPECT_EQ(*restored.next(10), std::vector<size_t>(e2.begin() + 2, e2.end()));

  DistributedSamplerOptions other = o;
  other.seed = 1;
  DistributedSampler wrong(10, other);
  try {
    load_into(wrong);
    ADD_FAILURE() << "loading a seed-0 archive into a seed-1 sampler";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the archive has seed=0 but this sampler has seed=1"),
              std::string::npos) << e.what();
  }
}

void expect_invalid(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument; expected one containing: " << part;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(DistributedSamplerErrors, MessagesNameTheValues) {
  auto make = [](int64_t n, std::optional<int64_t> w, std::optional<int64_t> r) {
    return [=] { DistributedSampler s(n, DistributedSamplerOptions{w, r}); };
  };
  expect_invalid(make(10, 4, 4), "invalid rank 4, rank should be in the interval [0, 3] for num_replicas=4");
  expect_invalid(make(10, 4, -1), "invalid rank -1, rank should be in the interval [0, 3]");
  expect_invalid(make(10, 0, 0), "num_replicas must be >= 1, got 0");
  expect_invalid(make(-1, 2, 0), "dataset_size must be >= 0, got -1");
  expect_invalid([] { distributed_sampler_indices(-3, {2, 0}, 0); }, "dataset_size must be >= 0, got -3");
  // No default group on this thread.
  expect_invalid(make(10, std::nullopt, std::nullopt), "options.num_replicas not given");
  expect_invalid(make(10, 2, std::nullopt), "options.rank not given and there is no default process group");
  DistributedSampler s(10, {2, 0});
  expect_invalid([&] { s.next(0); }, "batch_size must be >= 1, got 0");
  torch::serialize::OutputArchive empty;
  std::stringstream bytes;
  empty.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  expect_invalid([&] { s.load(in); }, "key 'dataset_size' missing from the archive");
  expect_invalid([] { distributed_sampler_indices_after(10, {2, 0}, 0, 10); },
                 "consumed = 10 is outside [0, dataset_size = 10)");
  expect_invalid([] { distributed_sampler_indices_after(10, {2, 0}, 0, -1); },
                 "consumed = -1 is outside");
}

}  // namespace
}  // namespace ddp
