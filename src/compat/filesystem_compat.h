// Filesystem calls that some libtorch builds break: ddp uses these instead.
//
// Note [remove_all and libtorch 2.11]
// PyTorch 2.11.0's wheel (PyPI's, CUDA 13; built on manylinux_2_28 with
// Red Hat's GCC 13.3) carries the std::filesystem functions newer than that
// system's libstdc++ linked into libtorch.so, and exports them. A program's
// symbol lookup finds libtorch.so before libstdc++.so (the linker puts
// libstdc++ last), so every std::filesystem::remove_all call in the process,
// ddp's, the tests' and the user's own, runs libtorch's copy. That copy
// calls recursive_directory_iterator::__erase through a weak reference,
// which is null wherever libstdc++.so lacks it (GCC 12's, Debian 12's, and
// the lent H200 machine's): the call jumps to address 0 and the process dies
// with SIGSEGV and no frame to unwind. Nothing else in libtorch.so calls
// through such a reference (checked with objdump on 2.11.0); the copies
// that 2.11's, 2.13's and 2.14's libtorch_cpu.so export make no such call
// (nm shows no weak reference in them). So ddp never calls
// std::filesystem::remove_all (the CTest `no_remove_all` reads every binary
// of the build for it); remove_tree below does the same with POSIX calls.
// docs/compat.md says what a user's own program can do.
#pragma once

#include <cstddef>
#include <string>
#include <system_error>

namespace ddp::compat {

// Removes `path` and, for a directory, everything under it, without
// following symbolic links (a link is removed, not its target), as
// std::filesystem::remove_all does; like it and `rm -rf`, a path ending in
// '/' that names a link to a directory is resolved, and that directory's
// entries are removed. A path that does not exist is not an error, nor is
// an entry that another process removes meanwhile. On failure `ec` holds
// the first error (errno's category) and the rest of the tree is still
// attempted (remove_all stops and returns -1); returns the number of
// entries removed. Thread-safe for distinct trees.
std::size_t remove_tree(const std::string& path, std::error_code& ec);

// As above; throws std::filesystem::filesystem_error naming `path`.
std::size_t remove_tree(const std::string& path);

}  // namespace ddp::compat
