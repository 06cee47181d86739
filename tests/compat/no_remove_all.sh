#!/usr/bin/env bash
# Note [remove_all and libtorch 2.11] (src/compat/filesystem_compat.h): no
# program, library or object file of the build may call
# std::filesystem::remove_all, because with PyTorch 2.11's libtorch.so
# loaded that call jumps to address 0. The proof is in the object code, not
# the sources: a header's inline function counts as much as a line in a .cc.
# Every ELF file the build made (libddp and its objects, the tools, the
# benchmarks, every test binary) is read for an undefined reference to
# either overload. Left out: GoogleTest's build, and the directories that
# other tests fill while this one runs (the package test's install and
# consumer, gpu-check's results).
#
#   no_remove_all.sh <build dir>
set -euo pipefail
build=$1
checked=0
found=()
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' || continue
  # An object file's references are in its symbol table, a linked one's
  # in the dynamic one. nm's whole output first: `nm | grep -q` would see
  # nm die of SIGPIPE at a match, and pipefail turns that into "not found".
  case $f in *.o) nm_args=(--undefined-only) ;; *) nm_args=(-D --undefined-only) ;; esac
  syms=$(nm "${nm_args[@]}" "$f" 2>/dev/null) || continue
  checked=$((checked + 1))
  [[ $syms == *_ZNSt10filesystem10remove_all* ]] && found+=("${f#"$build"/}")
done < <(find "$build" \( -path "$build/googletest" -o -path "$build/tests/package/work" \
                          -o -path "$build/gpu-check" \) -prune \
           -o -type f \( -perm -u+x -o -name '*.so*' -o -name '*.o' \) -print0)
[ "$checked" -gt 0 ] || { echo "no_remove_all: no ELF file under $build: wrong directory?" >&2; exit 1; }
if [ "${#found[@]}" -gt 0 ]; then
  echo "no_remove_all: these call std::filesystem::remove_all, which crashes under libtorch 2.11" >&2
  echo "(Note [remove_all and libtorch 2.11]); use ddp::compat::remove_tree instead:" >&2
  printf '  %s\n' "${found[@]}" >&2
  exit 1
fi
echo "no_remove_all: none of $checked ELF files calls std::filesystem::remove_all"
