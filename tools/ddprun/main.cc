// ddprun: runs a program on N processes per node as one data-parallel job,
// accepting torchrun's flags. See `ddprun --help` and docs/launcher.md.
#include <iostream>

#include "launcher/launcher.h"
#include "launcher/options.h"

int main(int argc, char** argv) {
  ddp::launcher::LaunchOptions options;
  if (auto exit_code =
          ddp::launcher::parse_command_line(argc, argv, options, std::cout, std::cerr)) {
    return *exit_code;
  }
  return ddp::launcher::run_launcher(options);
}
