#include "launcher/options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <ostream>

#include "cli/usage_error.h"
#include "ddp/error.h"
#include "launcher/help.h"
#include "launcher/net.h"
#include "launcher/signals.h"

namespace ddp::launcher {
namespace {

// The flags' raw text, checked and converted by finish_options().
struct RawFlags {
  std::string nproc = "1", nnodes = "1", redirects = "0", tee = "0";
  // torchrun 2.x flags ddprun takes only in their default form.
  std::string event_log_handler = "null", logs_specs, local_addr, numa_binding;
  std::string duplicate_stdout, duplicate_stderr, print_completion;
  std::string signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::optional<double> shutdown_timeout;
  std::string filter, rdzv_backend = "static", rdzv_endpoint, rdzv_conf;
  std::string start_method = "spawn";
  std::optional<int> node_rank;  // unset: 0, or assigned by the c10d rendezvous
  bool module = false, run_path = false, no_python = false, use_env = false;
};

}  // namespace

namespace {

// The flags torchrun gained in 2.x (torchrun 2.13's and 2.14's --help).
void add_torchrun2_flags(CLI::App& app, LaunchOptions& o, RawFlags& r) {
  auto env = [](CLI::Option* opt, const char* name) { opt->envname(name); };
  env(app.add_option("--shutdown-timeout", r.shutdown_timeout, kHelpShutdownTimeout),
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  env(app.add_option("--signals-to-handle", r.signals, kHelpSignals), "PET_SIGNALS_TO_HANDLE");
  env(app.add_flag("--virtual-local-rank", o.virtual_local_rank, kHelpVirtualLocalRank),
      "PET_VIRTUAL_LOCAL_RANK");
  env(app.add_option("--event-log-handler", r.event_log_handler, kHelpEventLogHandler),
      "PET_EVENT_LOG_HANDLER");
  env(app.add_option("--logs-specs", r.logs_specs, kHelpLogsSpecs), "PET_LOGS_SPECS");
  env(app.add_option("--local-addr", r.local_addr, kHelpLocalAddr), "PET_LOCAL_ADDR");
  env(app.add_option("--numa-binding", r.numa_binding, kHelpNumaBinding), "PET_NUMA_BINDING");
  env(app.add_option("--duplicate-stdout-filters", r.duplicate_stdout, kHelpDuplicateFilters),
      "PET_DUPLICATE_STDOUT_FILTERS");
  env(app.add_option("--duplicate-stderr-filters", r.duplicate_stderr, kHelpDuplicateFilters),
      "PET_DUPLICATE_STDERR_FILTERS");
  // torchrun reads the variable below when the flag is not given.
  if (const char* t = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")) {
    o.log_line_prefix_template = t;
  }
  env(app.add_option("--log-line-prefix-template", o.log_line_prefix_template, kHelpLogLinePrefix),
      "PET_LOG_LINE_PREFIX_TEMPLATE");
  app.add_option("--print-completion", r.print_completion, kHelpPrintCompletion);
}

void add_flags(CLI::App& app, LaunchOptions& o, RawFlags& r) {
  auto env = [](CLI::Option* opt, const char* name) { opt->envname(name); };
  env(app.add_option("--nproc-per-node", r.nproc, kHelpNproc), "PET_NPROC_PER_NODE");
  env(app.add_option("--nnodes", r.nnodes, kHelpNnodes), "PET_NNODES");
  env(app.add_option("--node-rank", r.node_rank, kHelpNodeRank), "PET_NODE_RANK");
  env(app.add_option("--master-addr", o.master_addr, kHelpMasterAddr), "PET_MASTER_ADDR");
  env(app.add_option("--master-port", o.master_port, kHelpMasterPort), "PET_MASTER_PORT");
  env(app.add_flag("--standalone", o.standalone, kHelpStandalone), "PET_STANDALONE");
  env(app.add_option("--max-restarts", o.max_restarts, kHelpMaxRestarts), "PET_MAX_RESTARTS");
  env(app.add_option("--monitor-interval", o.monitor_interval, kHelpMonitor),
      "PET_MONITOR_INTERVAL");
  app.add_option("--grace-period", o.grace_period, kHelpGrace);
  env(app.add_option("--log-dir", o.log_dir, kHelpLogDir), "PET_LOG_DIR");
  env(app.add_option("-r,--redirects", r.redirects, kHelpRedirects), "PET_REDIRECTS");
  env(app.add_option("-t,--tee", r.tee, kHelpTee), "PET_TEE");
  env(app.add_option("--local-ranks-filter", r.filter, kHelpFilter),
      "PET_LOCAL_RANKS_FILTER");
  env(app.add_option("--run-id,--rdzv-id", o.run_id, kHelpRunId), "PET_RDZV_ID");
  env(app.add_option("--role", o.role, kHelpRole), "PET_ROLE");
  env(app.add_option("--rdzv-backend", r.rdzv_backend, kHelpRdzvBackend),
      "PET_RDZV_BACKEND");
  env(app.add_option("--rdzv-endpoint", r.rdzv_endpoint, kHelpRdzvEndpoint),
      "PET_RDZV_ENDPOINT");
  env(app.add_option("--rdzv-conf", r.rdzv_conf, kHelpRdzvConf), "PET_RDZV_CONF");
  env(app.add_flag("--no-python", r.no_python, kHelpNoPython), "PET_NO_PYTHON");
  app.add_flag("-m,--module", r.module, kHelpModule);
  app.add_flag("--run-path", r.run_path, kHelpRunPath);
  app.add_option("--start-method", r.start_method, kHelpStartMethod);
  app.add_flag("--use-env", r.use_env, kHelpUseEnv);
  app.add_flag("--legacy-launch", o.legacy_local_rank_arg, kHelpLegacy);
  add_torchrun2_flags(app, o, r);
  app.set_version_flag("--version", "ddprun 0.1.0");
}

// Splits argv into the launcher's flags (names normalised from
// --snake_case to --kebab-case) and the program with its arguments.
std::vector<std::string> split_argv(const CLI::App& app, int argc,
                                    const char* const* argv,
                                    std::vector<std::string>& program) {
  std::vector<std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      program.assign(argv + i + 1, argv + argc);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      program.assign(argv + i, argv + argc);
      break;
    }
    auto eq = a.find('=');
    std::string name = a.substr(0, eq);
    if (name.rfind("--", 0) == 0) {
      for (char& c : name) c = (c == '_') ? '-' : c;
      a = name + (eq == std::string::npos ? "" : a.substr(eq));
    }
    flags.push_back(a);
    const CLI::Option* opt = app.get_option_no_throw(name);
    bool takes_value = opt && opt->get_type_size() != 0 && opt->get_expected_min() > 0;
    if (takes_value && eq == std::string::npos && name.size() > 1 && i + 1 < argc &&
        (name.rfind("--", 0) == 0 || a.size() == 2)) {
      flags.push_back(argv[++i]);
    }
  }
  return flags;
}

std::pair<std::string, int> parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (colon == std::string::npos) return {host, 29400};  // torchrun's default
  auto port = parse_long(text.substr(colon + 1));
  if (!port || *port < 1 || *port > 65535 || host.empty()) {
    throw InvalidArgument(fmt::format(
        "--rdzv-endpoint '{}' is not valid: expected host:port", text));
  }
  return {host, static_cast<int>(*port)};
}

// torchrun reads is_host as a boolean (true/false, 1/0, yes/no).
bool parse_is_host(const std::string& conf, const std::string& value) {
  for (const char* yes : {"true", "1", "yes", "True", "TRUE"}) {
    if (value == yes) return true;
  }
  for (const char* no : {"false", "0", "no", "False", "FALSE"}) {
    if (value == no) return false;
  }
  throw InvalidArgument(fmt::format(
      "--rdzv-conf '{}': is_host needs true or false, not '{}'", conf, value));
}

void apply_rdzv_conf(const std::string& text, LaunchOptions& o) {
  if (text.empty()) return;
  for (const std::string& item : split(text, ',')) {
    auto eq = item.find('=');
    std::string key = item.substr(0, eq);
    if (key == "is_host") {
      o.rdzv_is_host = parse_is_host(text, eq == std::string::npos ? "" : item.substr(eq + 1));
      continue;
    }
    auto value = parse_double(eq == std::string::npos ? "" : item.substr(eq + 1));
    bool known = key == "join_timeout" || key == "keep_alive_interval" ||
                 key == "keep_alive_max_attempt" || key == "last_call_timeout";
    if (!known) continue;  // torchrun's other keys tune its own rendezvous
    if (!value || *value <= 0) {
      throw InvalidArgument(fmt::format(
          "--rdzv-conf '{}': {} needs a positive number", text, key));
    }
    if (key == "join_timeout") o.join_timeout = *value;
    if (key == "last_call_timeout") o.last_call_timeout = *value;
    if (key == "keep_alive_interval") o.keep_alive_interval = *value;
    if (key == "keep_alive_max_attempt") o.keep_alive_max_attempt = static_cast<int>(*value);
  }
}

void check_standalone(const LaunchOptions& o) {
  if (o.standalone && o.nnodes != 1) {
    throw InvalidArgument(fmt::format(
        "--standalone runs one node, but --nnodes is {}: drop --standalone "
        "and pass --master-addr/--master-port",
        o.nnodes));
  }
}

// --nnodes MIN:MAX: torchrun allows it with a dynamic rendezvous only, and
// node ranks belong to the rendezvous (they change from round to round).
void check_elastic(const RawFlags& r, LaunchOptions& o) {
  if (r.rdzv_backend != "c10d") {
    throw InvalidArgument(fmt::format(
        "--nnodes {}: an elastic range needs --rdzv-backend c10d (not '{}') and "
        "--rdzv-endpoint HOST:PORT ({})",
        r.nnodes, r.rdzv_backend,
        r.rdzv_backend == "static" ? "the static rendezvous needs a fixed number of nodes"
                                   : "ddprun's rendezvous backends are static and c10d"));
  }
  if (r.node_rank) {
    throw InvalidArgument(fmt::format(
        "--node-rank {} with --nnodes {}: an elastic job assigns node ranks at every "
        "round; drop --node-rank",
        *r.node_rank, r.nnodes));
  }
  if (o.standalone) {
    throw InvalidArgument(fmt::format(
        "--standalone runs one node, but --nnodes is {}: drop --standalone", r.nnodes));
  }
  o.node_rank = kNodeRankAtRendezvous;
  o.rendezvous_ranks = true;
}

void check_nodes(const RawFlags& r, LaunchOptions& o) {
  auto parts = split(r.nnodes, ':');
  auto lo = parse_long(parts.front());
  auto hi = parse_long(parts.back());
  if (parts.size() > 2 || !lo || !hi || *lo < 1) {
    throw InvalidArgument(fmt::format(
        "--nnodes '{}' is not valid: expected a positive number of nodes",
        r.nnodes));
  }
  if (*lo > *hi) {
    throw InvalidArgument(fmt::format(
        "--nnodes {}: MIN is larger than MAX; pass --nnodes MIN:MAX with MIN <= MAX",
        r.nnodes));
  }
  o.min_nnodes = static_cast<int>(*lo);
  o.max_nnodes = static_cast<int>(*hi);
  o.nnodes = o.max_nnodes;  // until a round is formed
  if (o.elastic()) return check_elastic(r, o);
  if (!r.node_rank) {
    // torchrun's c10d rendezvous assigns node ranks; the static one needs them.
    o.rendezvous_ranks = o.nnodes > 1 && r.rdzv_backend == "c10d";
    o.node_rank = o.rendezvous_ranks ? kNodeRankAtRendezvous : 0;
    return check_standalone(o);
  }
  o.node_rank = *r.node_rank;
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw InvalidArgument(fmt::format(
        "--node-rank {} is out of range for --nnodes {}: expected 0..{}",
        o.node_rank, o.nnodes, o.nnodes - 1));
  }
  check_standalone(o);
}

void check_rdzv(const RawFlags& r, LaunchOptions& o) {
  if (r.rdzv_backend != "static" && r.rdzv_backend != "c10d") {
    throw InvalidArgument(fmt::format(
        "--rdzv-backend '{}' is not supported: ddprun rendezvouses like "
        "torchrun's static and c10d backends; pass static or c10d",
        r.rdzv_backend));
  }
  o.rdzv_c10d = r.rdzv_backend == "c10d";
  if (!r.rdzv_endpoint.empty() && !o.standalone) {
    std::tie(o.master_addr, o.master_port) = parse_endpoint(r.rdzv_endpoint);
  }
  apply_rdzv_conf(r.rdzv_conf, o);
  if (o.master_addr.size() > 2 && o.master_addr.front() == '[') {
    o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
  }
  if (o.master_port < 1 || o.master_port > 65535) {
    throw InvalidArgument(fmt::format(
        "--master-port {} is out of range: expected 1..65535", o.master_port));
  }
  if (o.standalone) o.master_addr = "127.0.0.1";
}

void check_numbers(const LaunchOptions& o) {
  if (o.max_restarts < 0) {
    throw InvalidArgument(fmt::format(
        "--max-restarts {} is negative: expected 0 or more", o.max_restarts));
  }
  if (!(o.monitor_interval > 0)) {
    throw InvalidArgument(fmt::format(
        "--monitor-interval {} must be a positive number of seconds",
        o.monitor_interval));
  }
  if (!(o.grace_period >= 0)) {
    throw InvalidArgument(fmt::format(
        "--grace-period {} must be 0 or more seconds", o.grace_period));
  }
  if (o.keep_alive_max_attempt < 1) {
    throw InvalidArgument("--rdzv-conf keep_alive_max_attempt must be >= 1");
  }
}

// SIGTERM,SIGINT,... (names with or without SIG, or numbers) to signals.
std::vector<int> parse_signals(const std::string& text) {
  std::vector<int> out;
  for (std::string name : split(text, ',')) {
    int sig = 0;
    if (auto n = parse_long(name)) {
      sig = static_cast<int>(*n);
    } else {
      if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
      for (int s = 1; s < NSIG; ++s) {
        if (signal_name(s) == name) sig = s;
      }
    }
    if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      throw InvalidArgument(fmt::format(
          "--signals-to-handle '{}': '{}' is not a signal ddprun can handle; "
          "expected names like SIGTERM,SIGINT,SIGUSR1 (not SIGKILL, SIGSTOP or SIGCHLD)",
          text, name));
    }
    out.push_back(sig);
  }
  if (out.empty()) {
    throw InvalidArgument("--signals-to-handle is empty: name at least one signal");
  }
  return out;
}

// torchrun 2.x flags: supported ones applied, the others refused unless
// they hold torchrun's default.
void check_torchrun2_flags(const RawFlags& r, LaunchOptions& o) {
  auto refuse = [](const char* flag, const std::string& value, const char* why) {
    throw InvalidArgument(fmt::format("{} {}: not supported by ddprun: {}", flag, value, why));
  };
  if (r.event_log_handler != "null") {
    refuse("--event-log-handler", r.event_log_handler,
           "ddprun keeps no elastic event log (only null is accepted)");
  }
  if (!r.logs_specs.empty()) {
    refuse("--logs-specs", r.logs_specs,
           "LogsSpecs plugins are Python entry points; use --log-dir, -r and -t");
  }
  if (!r.local_addr.empty() && !is_local_host(r.local_addr)) {
    throw InvalidArgument(fmt::format(
        "--local-addr {} is not an address of this machine (it cannot be bound here): "
        "pass one of this node's addresses (ip -brief address), or leave it out to use "
        "the one that routes to the master",
        r.local_addr));
  }
  o.local_addr = r.local_addr;
  if (!r.print_completion.empty()) {
    refuse("--print-completion", r.print_completion, "ddprun ships no shell completion script");
  }
  if (!r.numa_binding.empty()) {
    refuse("--numa-binding", r.numa_binding,
           "bind workers yourself (numactl, taskset) or run under torchrun");
  }
  if (!r.duplicate_stdout.empty() || !r.duplicate_stderr.empty()) {
    refuse(r.duplicate_stdout.empty() ? "--duplicate-stderr-filters" : "--duplicate-stdout-filters",
           r.duplicate_stdout.empty() ? r.duplicate_stderr : r.duplicate_stdout,
           "use -t/--tee with --log-dir and grep the log files");
  }
  if (r.shutdown_timeout) o.grace_period = *r.shutdown_timeout;
  o.stop_signals = parse_signals(r.signals);
}

void finish_options(const RawFlags& r, LaunchOptions& o) {
  if (r.module || r.run_path) {
    throw InvalidArgument(fmt::format(
        "{} runs a Python module in the launcher's interpreter; ddprun runs "
        "programs: use `ddprun [flags] python3 -u -m MODULE` instead",
        r.module ? "--module" : "--run-path"));
  }
  if (o.program.empty()) {
    throw InvalidArgument(
        "no program given: usage is ddprun [flags] PROGRAM [ARGS...] (see "
        "ddprun --help)");
  }
  o.nproc_per_node = resolve_nproc_per_node(r.nproc);
  check_nodes(r, o);
  check_rdzv(r, o);
  check_torchrun2_flags(r, o);
  check_numbers(o);
  o.redirects = parse_std_spec(r.redirects, "--redirects");
  o.tee = parse_std_spec(r.tee, "--tee");
  if (!r.filter.empty()) {
    o.local_ranks_filter = parse_rank_list(r.filter, "--local-ranks-filter");
  }
  // torch.distributed.launch: --use-env turns the --local_rank argument off.
  if (r.use_env) o.legacy_local_rank_arg = false;
}

}  // namespace

std::optional<int> parse_command_line(int argc, const char* const* argv,
                                      LaunchOptions& options, std::ostream& out,
                                      std::ostream& err) {
  CLI::App app(kHelpDescription, "ddprun");
  app.footer(kHelpFooter);
  app.get_formatter()->column_width(30);
  // The usage line: "Usage: ddprun [flags] PROGRAM [ARGS...]".
  app.get_formatter()->label("OPTIONS", "flags] PROGRAM [ARGS...");
  // A repeated flag: the last one wins, as with torchrun's argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  RawFlags raw;
  LaunchOptions parsed;
  add_flags(app, parsed, raw);
  std::vector<std::string> program;
  std::vector<std::string> flags = split_argv(app, argc, argv, program);
  std::vector<std::string> reversed(flags.rbegin(), flags.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, out, err);  // --help
    err << cli::usage_error("ddprun", app, e, flags) << "\n";
    return cli::kUsageExit;
  }
  try {
    parsed.program = program;
    finish_options(raw, parsed);
  } catch (const InvalidArgument& e) {
    err << "ddprun: error: " << e.what() << "\n";
    return 2;
  }
  options = std::move(parsed);
  return std::nullopt;
}

}  // namespace ddp::launcher
