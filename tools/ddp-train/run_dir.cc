#include "run_dir.h"

#include <dirent.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "ddp/collectives.h"
#include "ddp/error.h"

namespace ddp::train {
namespace {

using json = nlohmann::json;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// ddp-train's own files in the run's directories (Note [One run per
// directory]): --overwrite removes these and nothing else.
std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("checkpoint-epoch", 0) == 0) out.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  return out;
}

int count_lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.empty() ? 0 : 1;
  return n;
}

// Rank 0's look at the directories: "" when training may go on.
std::string inspect(const TrainConfig& c) {
  const std::string jsonl = c.out_dir + "/metrics.jsonl";
  const std::vector<std::string> ckpts = checkpoint_files(c.checkpoint_dir);
  const bool has_metrics = exists(jsonl);
  if (!has_metrics && ckpts.empty()) return "";
  if (c.resume) return "";
  // Checkpoints in a --checkpoint-dir of its own, beside an --out-dir with
  // no run: they are another --out-dir's run, not this one's to replace.
  const bool own_checkpoint_dir = c.checkpoint_dir != c.out_dir + "/checkpoints";
  const bool foreign = own_checkpoint_dir && !has_metrics;
  if (c.overwrite && foreign) {
    return fmt::format(
        "ddp-train: --overwrite: --checkpoint-dir {} holds {} checkpoint file{} of a run whose "
        "--out-dir is not {} (it has no metrics.jsonl): not replaced. Remove them yourself, or "
        "choose another --checkpoint-dir",
        c.checkpoint_dir, ckpts.size(), ckpts.size() == 1 ? "" : "s", c.out_dir);
  }
  if (c.overwrite) {
    for (const char* name : {"/metrics.jsonl", "/metrics.png", "/metrics.png.dat", "/metrics.png.gp"}) {
      ::unlink((c.out_dir + name).c_str());
    }
    for (const std::string& f : ckpts) ::unlink(f.c_str());
    return "";
  }
  std::vector<std::string> what;
  if (has_metrics) {
    const int n = count_lines(jsonl);
    what.push_back(fmt::format("{} with {} epoch{}", jsonl, n, n == 1 ? "" : "s"));
  }
  if (!ckpts.empty()) {
    what.push_back(fmt::format("{} checkpoint file{} in {}", ckpts.size(),
                               ckpts.size() == 1 ? "" : "s", c.checkpoint_dir));
  }
  if (foreign) {
    return fmt::format(
        "ddp-train: --checkpoint-dir {} holds another run ({}): continue it with --resume (and "
        "that run's flags and --out-dir), or choose another --checkpoint-dir",
        c.checkpoint_dir, fmt::join(what, ", "));
  }
  return fmt::format(
      "ddp-train: --out-dir {} holds another run ({}): continue it with --resume (and that "
      "run's flags), replace it with --overwrite, or choose another --out-dir",
      c.out_dir, fmt::join(what, ", "));
}

std::string model_name(const TrainConfig& c) {
  return c.sync_bn ? "FashionCnn with SyncBatchNorm" : "FashionCnn";
}

}  // namespace

void claim_run_dir(const TrainConfig& config, int rank) {
  std::string problem;
  if (rank == 0) {
    try {
      problem = inspect(config);
    } catch (const std::exception& e) {
      problem = fmt::format("ddp-train: cannot inspect --out-dir {}: {}", config.out_dir, e.what());
    }
  }
  problem = broadcast_string(problem, 0);
  if (!problem.empty()) throw InvalidArgument(problem);
}

std::string config_record(const TrainConfig& c, int world_size) {
  const json j = {{"seed", c.seed},           {"train_samples", c.train_samples},
                  {"batch_size", c.batch_size}, {"model", model_name(c)},
                  {"optimizer", c.optimizer}, {"schedule", c.schedule},
                  {"lr", c.lr},               {"scale_lr", c.scale_lr},
                  {"epochs", c.epochs},       {"world_size", world_size},
                  {"augment", c.augment},     {"label_smoothing", c.label_smoothing},
                  {"amp", c.amp},
                  // Informational: a checkpoint holds full state either way,
                  // so a run may continue sharded or not.
                  {"parallelism", c.fully_shard ? "fully_shard" : "ddp"}};
  return j.dump();
}

namespace {

// check_resume's comparison of a parsed record `was` with the flags.
std::string compare_with_run(const Checkpoint& ckpt, json was, const TrainConfig& c,
                             int world_size) {
  const json now = json::parse(config_record(c, world_size));
  // Keys an older ddp-train did not record: its runs had these values (not
  // today's defaults), so a resume of such a run must not change them.
  for (const auto& [key, then] : {std::pair<const char*, json>{"augment", "none"},
                                  std::pair<const char*, json>{"label_smoothing", 0.0},
                                  std::pair<const char*, json>{"amp", "none"}}) {
    if (!was.contains(key)) was[key] = then;
  }
  // Flag, key: what makes the continued run another run. The one-cycle
  // schedule spans --epochs, so they count there; a constant one may be
  // extended.
  std::vector<std::pair<const char*, const char*>> keys = {
      {"--seed", "seed"},           {"--train-samples", "train_samples"},
      {"--batch-size", "batch_size"}, {"--sync-bn", "model"},
      {"--optimizer", "optimizer"}, {"--schedule", "schedule"},
      {"--lr", "lr"},               {"--scale-lr", "scale_lr"},
      {"--augment", "augment"},     {"--label-smoothing", "label_smoothing"},
      {"--amp", "amp"}};
  if (c.schedule == "onecycle" || was.value("schedule", std::string()) == "onecycle") {
    keys.push_back({"--epochs", "epochs"});
  }
  std::vector<std::string> diffs;
  for (const auto& [flag, key] : keys) {
    if (!was.contains(key) || was[key] == now[key]) continue;
    diffs.push_back(fmt::format("{} gives {}, but the checkpoint's run used {}", flag,
                                now[key].dump(), was[key].dump()));
  }
  if (!diffs.empty()) {
    throw InvalidArgument(fmt::format(
        "ddp-train: --resume: {} belongs to another run: {}. Resume with that run's flags, "
        "or start a new run in another --out-dir (or replace this one with --overwrite)",
        ckpt.path, fmt::join(diffs, "; ")));
  }
  const int old_world = was.value("world_size", world_size);
  if (old_world == world_size) return "";
  return fmt::format(
      "ddp-train: --resume: world size {} where the checkpoint's run had {}: the global batch "
      "is now {} (was {}){}",
      world_size, old_world, c.batch_size * world_size, c.batch_size * old_world,
      c.scale_lr ? ", and --scale-lr scales the learning rate by the new world size" : "");
}

}  // namespace

int recorded_world_size(const Checkpoint& ckpt, int otherwise) {
  auto it = ckpt.metadata.find("config");
  if (it == ckpt.metadata.end()) return otherwise;
  const json was = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!was.is_object() || !was.contains("world_size") || !was["world_size"].is_number_integer()) {
    return otherwise;
  }
  return was["world_size"].get<int>();
}

std::string check_resume(const Checkpoint& ckpt, const TrainConfig& c, int world_size) {
  auto it = ckpt.metadata.find("config");
  if (it == ckpt.metadata.end()) {
    return fmt::format("ddp-train: --resume: {} records no configuration (an older ddp-train "
                       "wrote it): the flags are not checked against its run",
                       ckpt.path);
  }
  json was;
  try {
    was = json::parse(it->second);
  } catch (const std::exception&) {
    was = nullptr;
  }
  // A damaged record (JSON of another shape, a value of another type) is
  // named as such, not as nlohmann's type_error.
  const std::string damaged = fmt::format(
      "checkpoint '{}': metadata 'config' is not the run record ddp-train writes (a JSON "
      "object of its flags); was it written by ddp-train? Resume from another checkpoint or "
      "start without --resume",
      ckpt.path);
  if (!was.is_object()) throw InvalidArgument(damaged);
  try {
    return compare_with_run(ckpt, std::move(was), c, world_size);
  } catch (const json::exception&) {
    throw InvalidArgument(damaged);
  }
}


int cut_metrics(const std::string& jsonl, int64_t step, int64_t epochs_done) {
  std::ifstream in(jsonl);
  if (!in) return 0;
  std::string kept;
  int dropped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    bool keep = false;
    try {
      const json j = json::parse(line);
      keep = j.value("steps", int64_t{0}) <= step && j.value("epoch", int64_t{0}) <= epochs_done;
    } catch (const std::exception&) {
      keep = false;  // a torn last line (a crash mid-write)
    }
    if (keep) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string tmp = jsonl + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out.flush()) throw InvalidArgument("ddp-train: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), jsonl.c_str()) != 0) {
    throw InvalidArgument("ddp-train: cannot replace " + jsonl);
  }
  return dropped;
}

int64_t metrics_mark(const std::string& jsonl) {
  struct stat st {};
  return ::stat(jsonl.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

void metrics_rollback(const std::string& jsonl, int64_t mark) {
  // Nothing before this epoch's line: the file goes, so that the directory
  // does not look like it holds a run.
  if (mark == 0) {
    ::unlink(jsonl.c_str());
  } else {
    (void)::truncate(jsonl.c_str(), static_cast<off_t>(mark));
  }
}

}  // namespace ddp::train
