#!/usr/bin/env bash
# The proof behind Note [Gloo headers] (src/compat/gloo_backend.cc): the
# object code of that translation unit does not depend on the layout of any
# Gloo type, so compiling it against Gloo headers other than those libtorch
# was built with is safe. Every symbol it defines or uses that mentions Gloo
# must be one of
#   - a function compiled inside libtorch (undefined here: U c10d::ProcessGroupGloo::...),
#   - a standard-library or c10 template instantiated for a smart pointer to
#     a Gloo type (std::vector<std::shared_ptr<gloo::...>>::..., c10::intrusive_ptr<...Options>),
#   - ddp's own make_gloo;
# and none may be a Gloo function, a member of a Gloo class, or a vtable or
# typeinfo of a Gloo class or of ProcessGroupGloo and its nested classes.
# (A symbol table cannot show a virtual call or a member access through a
# Gloo pointer: the file itself must make none; it only moves the
# shared_ptrs that libtorch's functions return.)
#
#   gloo_backend_abi.sh <build dir>
set -euo pipefail
build=$1
obj=$(find "$build" -name 'gloo_backend.cc.o' | head -1)
[ -n "$obj" ] || { echo "gloo_backend_abi: no gloo_backend.cc.o under $build" >&2; exit 1; }

symbols=$(nm -C "$obj" | grep -E 'gloo|Gloo' || true)
[ -n "$symbols" ] || { echo "gloo_backend_abi: $obj mentions no Gloo symbol: wrong file?" >&2; exit 1; }

bad=$(printf '%s\n' "$symbols" | awk '
  {
    line = $0
    # "ADDRESS TYPE NAME" or "TYPE NAME" for undefined symbols.
    if ($1 == "U") { type = "U"; name = substr(line, index(line, "U ") + 2) }
    else { type = $2; name = substr(line, index(line, " " $2 " ") + length($2) + 2) }
    sub(/^ +/, "", name)
    # Unoptimised builds keep internal-linkage constants of the headers
    # (gloo::kNoTimeout ...): private copies, read by nothing in this file.
    if (type ~ /^[rb]$/ && name ~ /^gloo::(transport::)?k[A-Z][A-Za-z]*$/) next
    if (name ~ /^(vtable|typeinfo|typeinfo name|VTT|construction vtable) for .*(gloo::|ProcessGroupGloo)/) { print; next }
    if (name ~ /^gloo::/) { print; next }
    if (type == "U" && name ~ /^c10d::ProcessGroupGloo::/) next
    if (name ~ /^c10d::ProcessGroupGloo::(GlooStore|AsyncWork|SendWork|RecvWork)/) { print; next }
    if (name ~ /^(void )?(std::|c10::)/) next
    if (name ~ /^ddp::compat::make_gloo\(/) next
    if (name ~ /^_GLOBAL__sub_I_gloo_backend\.cc/) next
    if (name ~ /^c10d::TORCH_GLOO_LAZY_INIT$/) next
    print
  }')
if [ -n "$bad" ]; then
  echo "gloo_backend_abi: $obj has code that depends on Gloo's declarations:" >&2
  printf '%s\n' "$bad" >&2
  echo "See Note [Gloo headers] in src/compat/gloo_backend.cc: keep that file to libtorch calls." >&2
  exit 1
fi
echo "gloo_backend_abi: $(printf '%s\n' "$symbols" | wc -l) Gloo-related symbols in $obj, all layout-independent"
