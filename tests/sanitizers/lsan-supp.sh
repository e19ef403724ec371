#!/bin/sh
# Usage: lsan-supp.sh LIBRDT OUT
# Writes LeakSanitizer suppressions for LIBRDT to OUT: the comments of
# lsan.supp, then the one allocation they describe, named exactly.
set -eu
lib=$1 out=$2
here=$(dirname "$0")
{
  cat "$here/lsan.supp"
  nm "$lib" | sed -n 's/.* github\.com\/ianlancetaylor\/cgosymbolizer\.\(_cgo_[0-9a-f]*_Cfunc__Cmalloc\)$/leak:\1/p'
} >"$out.tmp"
mv "$out.tmp" "$out"
