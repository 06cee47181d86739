#include "ddp/process_group.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "ddp/error.h"
#include "ddp/logging.h"
#include "ddp_env.h"
#include "last_words.h"
#include "process_group_impl.h"
#include "rendezvous.h"

namespace ddp {
namespace {

// Note [Shared-memory all-reduce] (shm/shm_group.h), set up after the Gloo
// backend. Every rank takes the same decision; rank 0 warns once when
// co-located ranks cannot use it.
void start_shared_memory(const InitOptions& o, const detail::Rendezvous& r, bool env_allows,
                         detail::ProcessGroupImpl& g) {
  shm::ShmSetup s;
  s.store = r.store;
  s.rank = r.rank;
  s.size = r.size;
  s.timeout = o.timeout;
  s.enabled = o.shared_memory && env_allows;
  s.gloo_address = r.gloo_address;
  s.gloo_threads = o.gloo_threads;
  s.staging_bytes = o.shared_memory_staging_bytes;
  g.shm = shm::ShmGroup::create(s, g.shm_off_reason);
  if (!g.shm && r.rank == 0 && !g.shm_off_reason.empty() &&
      g.shm_off_reason.find("disabled (") == std::string::npos) {
    log(LogLevel::kWarning, "ddp: shared-memory all_reduce is off for this group (" +
                                g.shm_off_reason + "); all_reduce goes through Gloo");
  }
}

// The flight recorder of the group (ddp/flight_recorder.h), after the
// rendezvous: its file is named by the group and the rank.
void start_flight_recorder(const InitOptions& o, const detail::Rendezvous& r, uint32_t entries,
                           const std::string& dir, int local_rank, detail::ProcessGroupImpl& g) {
  flight::RecorderSetup s;
  s.dir = dir;
  s.capacity = entries;
  s.group = o.group_name;
  s.backend = o.backend;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  s.host = host;
  s.rank = r.rank;
  s.world_size = r.size;
  s.local_rank = local_rank;
  g.flight = flight::FlightRecorder::create(s);
  if (g.flight) flight::install_signal_handlers();
}

std::mutex g_default_mu;
ProcessGroupPtr g_default;                 // guarded by g_default_mu
thread_local ProcessGroupPtr t_override;   // DefaultGroupGuard's group

detail::MonitorOptions monitor_options(const InitOptions& options, const detail::DdpEnv& env) {
  detail::MonitorOptions m;
  m.warn_after = env.stall_warning().value_or(options.stall_warning);
  if (m.warn_after.count() <= 0) {
    throw InvalidArgument(fmt::format("InitOptions::stall_warning must be > 0 (got {} ms)",
                                      m.warn_after.count()));
  }
  // Fresh enough to explain a stall when it is reported (at the warning or
  // at the timeout, whichever comes first), cheap otherwise.
  m.publish_every = std::clamp(std::min(m.warn_after, options.timeout) / 5,
                               std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
  m.debug = options.debug_collectives || env.debug;
  return m;
}

// The CUDA device of a NCCL rank: InitOptions::device_id, else
// local_device(). Checked before the rendezvous, so that every rank fails
// at once rather than the others waiting for it.
c10::Device nccl_device(const InitOptions& options) {
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) {
    throw CommError(
        "backend 'nccl' needs a CUDA device, and this process sees none (no GPU, "
        "CUDA_VISIBLE_DEVICES empty, or no driver). Use backend 'gloo' for CPU tensors");
  }
  c10::Device d = options.device_id ? *options.device_id : local_device();
  if (!d.is_cuda()) {
    throw InvalidArgument(fmt::format(
        "InitOptions::device_id is {}: backend 'nccl' needs a CUDA device (cuda:N)", d.str()));
  }
  if (!d.has_index()) d = c10::Device(c10::kCUDA, 0);
  if (d.index() >= gpus) {
    throw InvalidArgument(fmt::format(
        "InitOptions::device_id is {}, but this process sees {} GPU(s) (cuda:0..cuda:{})",
        d.str(), gpus, gpus - 1));
  }
  return d;
}

}  // namespace

namespace detail {

std::string ProcessGroupImpl::describe(const std::string& op,
                                       uint64_t seq) const {
  return fmt::format("{} #{} on rank {} of {} ({})", op, seq, rank, size,
                     backend_name);
}

void ProcessGroupImpl::abandon() {
  if (abandoned_work.exchange(true)) return;
  if (backend && backend_name == "nccl") compat::abort_backend(*backend);
}

}  // namespace detail

namespace detail {
namespace {
// The live groups of the process (Note [Last words]). Never destroyed: the
// default group (g_default above, constructed first and so destroyed last)
// may be released at exit, after this file's later statics would be gone,
// and its destructor takes itself off this list.
struct LiveGroups {
  std::mutex mu;
  std::vector<ProcessGroupImpl*> groups;  // guarded by mu
};
LiveGroups& live_groups() {
  static LiveGroups* live = new LiveGroups();  // intentionally leaked
  return *live;
}

// Note [Last words] (last_words.h): leaves `message` in the store of every
// live group of this process ("rank R: message"); best effort, never blocks
// on a lock.
void publish_fatal_to_groups(const std::string& message) noexcept {
  LiveGroups& live = live_groups();
  std::unique_lock<std::mutex> lock(live.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (ProcessGroupImpl* g : live.groups) {
    if (g->monitor) g->monitor->publish_fatal(fmt::format("rank {}: {}", g->rank, message));
  }
}
}  // namespace
}  // namespace detail

c10::Device ProcessGroup::device() const { return impl_->device; }

int ProcessGroup::shared_memory_ranks() const {
  return impl_->shm ? impl_->shm->local_size() : 0;
}
const std::string& ProcessGroup::shared_memory_off_reason() const {
  return impl_->shm_off_reason;
}

ProcessGroup::ProcessGroup(std::unique_ptr<detail::ProcessGroupImpl> impl)
    : impl_(std::move(impl)) {
  detail::set_last_words_publisher(&detail::publish_fatal_to_groups);
  detail::LiveGroups& live = detail::live_groups();
  std::lock_guard<std::mutex> lock(live.mu);
  live.groups.push_back(impl_.get());
}
ProcessGroup::~ProcessGroup() {
  {
    detail::LiveGroups& live = detail::live_groups();
    std::lock_guard<std::mutex> lock(live.mu);
    live.groups.erase(std::remove(live.groups.begin(), live.groups.end(), impl_.get()),
                      live.groups.end());
  }
  // After a failed collective a Gloo worker thread may still be blocked:
  // on an operation past ddp's per-call timeout, or sending to a peer that
  // is gone or cut off (waitSend). Destroying the backend joins those
  // threads, so destroy_process_group() or the exit would hang. A group is
  // unusable after a failure (as in PyTorch): the backend is left to finish
  // on its own, never freed.
  if (impl_ && impl_->abandoned_work.load() && impl_->backend) {
    (void)impl_->backend.release();
  } else if (impl_ && impl_->backend && impl_->backend_name == "nccl") {
    // NCCL's graceful teardown would wait for peers that may be gone, its
    // abort does not; first, what the users waited for on the stream only
    // completes (bounded by the timeout, as every wait).
    compat::drain_device(impl_->device, impl_->timeout);
    compat::abort_backend(*impl_->backend);
  }
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
const std::string& ProcessGroup::address() const { return impl_->address; }

ProcessGroupPtr new_process_group(const InitOptions& options) {
  install_error_file_handler();  // an exception escaping main() reaches the launcher
  if (options.backend != "gloo" && options.backend != "nccl") {
    throw InvalidArgument(fmt::format(
        "unknown backend '{}': expected 'gloo' or 'nccl'", options.backend));
  }
  if (options.backend == "nccl" && !compat::nccl_compiled()) {
    compat::make_nccl({}, 0, 1, options.timeout, c10::Device(c10::kCPU));  // throws, naming why
  }
  const c10::Device device = options.backend == "nccl" ? nccl_device(options) : c10::Device(c10::kCPU);
  if (options.gloo_threads < 1) {
    throw InvalidArgument(fmt::format(
        "InitOptions::gloo_threads must be >= 1 (got {})", options.gloo_threads));
  }
  // ddp's variables and the launcher's, read once for the group (and
  // checked before the rendezvous, so that a bad value fails every rank at
  // once).
  const detail::DdpEnv env = detail::read_ddp_env();
  const LaunchEnv launch = read_launch_env();
  const uint32_t flight_entries =
      env.flight_recorder_entries(flight::kDefaultCapacity, flight::kMaxCapacity);
  if (flight_entries > 0 && !env.flight_recorder_dir.empty()) {
    flight::prepare_directory(env.flight_recorder_dir);
  }
  // Also before the rendezvous: its waiting ranks report at the stall
  // warning's interval.
  const detail::MonitorOptions monitoring = monitor_options(options, env);
  detail::Rendezvous r = detail::rendezvous(
      options, {monitoring.warn_after, env.gloo_socket_ifname, env.local_addr, env.rendezvous_file,
                launch});
  auto impl = std::make_unique<detail::ProcessGroupImpl>();
  impl->rank = r.rank;
  impl->size = r.size;
  impl->backend_name = options.backend;
  impl->device = device;
  impl->address = r.address;
  impl->timeout = options.timeout;
  impl->store = r.store;
  impl->publish_store = r.publish_store;
  impl->gloo_address = r.gloo_address;
  impl->gloo_threads = options.gloo_threads;
  impl->monitor_options = monitoring;
  try {
    impl->backend =
        options.backend == "nccl"
            ? compat::make_nccl(r.store, r.rank, r.size, options.timeout, device)
            : compat::make_gloo(r.store, r.rank, r.size, r.gloo_address,
                                options.gloo_threads, options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Where the local address came from (rendezvous.cc's gloo_address_for).
    const char* source = !options.gloo_address.empty()         ? "InitOptions::gloo_address"
                         : !env.gloo_socket_ifname.empty() ? "GLOO_SOCKET_IFNAME"
                         : !env.local_addr.empty() ? "DDP_LOCAL_ADDR, ddprun --local-addr"
                                                   : "the route to the master";
    throw CommError(fmt::format(
        "rank {} of {} could not connect the {} backend (rendezvous {}, local "
        "address '{}' ({})): {}. If the ranks are on different machines, set "
        "GLOO_SOCKET_IFNAME to the network interface they share",
        r.rank, r.size, options.backend, r.address, r.gloo_address, source,
        compat::what_without_backtrace(e)));
  }
  if (options.backend == "gloo") start_shared_memory(options, r, env.shared_memory, *impl);
  impl->debug = monitoring.debug;
  if (r.size > 1) {
    impl->monitor = std::make_unique<detail::CollectiveMonitor>(
        r.store, r.publish_store, r.rank, r.size, monitoring);
  }
  start_flight_recorder(options, r, flight_entries, env.flight_recorder_dir, launch.local_rank,
                        *impl);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

ProcessGroupPtr init_process_group(const InitOptions& options) {
  {
    std::lock_guard<std::mutex> lock(g_default_mu);
    if (g_default) {
      throw InvalidArgument(
          "init_process_group() called twice: the default process group "
          "exists; call destroy_process_group() first");
    }
  }
  ProcessGroupPtr group = new_process_group(options);
  std::lock_guard<std::mutex> lock(g_default_mu);
  g_default = group;
  return group;
}

bool is_initialized() {
  if (t_override) return true;
  std::lock_guard<std::mutex> lock(g_default_mu);
  return g_default != nullptr;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_default_mu);
  g_default.reset();
}

ProcessGroupPtr default_group() {
  if (t_override) return t_override;
  std::lock_guard<std::mutex> lock(g_default_mu);
  if (!g_default) {
    throw InvalidArgument(
        "no default process group: call ddp::init_process_group() first");
  }
  return g_default;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }
int get_local_rank() { return read_launch_env().local_rank; }

c10::Device local_device() {
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) return c10::Device(c10::kCPU);
  const int local = get_local_rank();
  if (local < 0 || local >= gpus) {
    throw InvalidArgument(fmt::format(
        "local_device(): LOCAL_RANK {} has no GPU: this process sees {} (cuda:0..cuda:{}). "
        "Start at most {} processes per node (ddprun --nproc-per-node gpu), or give each "
        "process its own GPU with CUDA_VISIBLE_DEVICES (ddprun --virtual-local-rank)",
        local, gpus, gpus - 1, gpus));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local));
}
bool is_main_process() { return !is_initialized() || get_rank() == 0; }

DefaultGroupGuard::DefaultGroupGuard(ProcessGroupPtr group)
    : previous_(std::move(t_override)) {
  t_override = std::move(group);
}
DefaultGroupGuard::~DefaultGroupGuard() { t_override = std::move(previous_); }

}  // namespace ddp
