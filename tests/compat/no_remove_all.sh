#!/usr/bin/env bash
# Note [remove_all and libtorch 2.11] (src/compat/filesystem_compat.h): no
# program or library of the build may call std::filesystem::remove_all,
# because with PyTorch 2.11's libtorch.so loaded that call jumps to address
# 0. The proof is in the object code, not the sources: a header's inline
# function counts as much as a line in a .cc. Every ELF file the build made
# (libddp, the tools, the benchmarks, every test binary) is read for an
# undefined reference to either overload.
#
#   no_remove_all.sh <build dir>
set -euo pipefail
build=$1
checked=0
found=()
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' || continue
  checked=$((checked + 1))
  if nm -D --undefined-only "$f" 2>/dev/null | grep -q '_ZNSt10filesystem10remove_all'; then
    found+=("${f#"$build"/}")
  fi
done < <(find "$build" -path "$build/googletest" -prune -o -type f \( -perm -u+x -o -name '*.so*' \) \
           -not -name '*.o' -print0)
[ "$checked" -gt 0 ] || { echo "no_remove_all: no ELF file under $build: wrong directory?" >&2; exit 1; }
if [ "${#found[@]}" -gt 0 ]; then
  echo "no_remove_all: these call std::filesystem::remove_all, which crashes under libtorch 2.11" >&2
  echo "(Note [remove_all and libtorch 2.11]); use ddp::compat::remove_tree instead:" >&2
  printf '  %s\n' "${found[@]}" >&2
  exit 1
fi
echo "no_remove_all: none of $checked ELF files calls std::filesystem::remove_all"
