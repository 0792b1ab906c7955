#!/bin/sh
# install_check.sh BUILD_DIR CC - `cmake --install` puts the program, the
# library, its header and kettle.pc under a prefix, the installed program
# runs, and a program using only what was installed (header, libkettle.a,
# `pkg-config --static`) compiles, links and runs.
set -eu
build=$1 cc=$2
prefix=$(mktemp -d "${TMPDIR:-/tmp}/kettle_install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
fail() { echo "install_check: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null
[ -x "$prefix/bin/kettle" ] || fail "no bin/kettle"
[ -f "$prefix/include/kettle.h" ] || fail "no include/kettle.h"
lib=$(find "$prefix" -name libkettle.a | head -n 1)
[ -n "$lib" ] || fail "no libkettle.a"
pc=$(find "$prefix" -name kettle.pc | head -n 1)
[ -n "$pc" ] || fail "no kettle.pc"
"$prefix/bin/kettle" --version | grep -q '^kettle [0-9]' || fail "the installed kettle --version"

# a client of the installed library, found through the installed .pc
cat > "$prefix/client.c" <<'C'
#include <kettle.h>
#include <stdio.h>
int main(void) {
    kt_error err = {0};
    kt_model *m = kt_model_load("/nonexistent.gguf", &err);
    printf("%s\n", m ? "loaded?" : err.msg);
    return m != NULL;
}
C
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --static --cflags --libs kettle) || fail "pkg-config kettle"
case "$flags" in *"-I$prefix/"*) ;; *) fail "kettle.pc does not point into the prefix: $flags" ;; esac
# shellcheck disable=SC2086
"$cc" -std=c11 "$prefix/client.c" -o "$prefix/client" $flags || fail "cannot build a client of the installed library"
"$prefix/client" | grep -q "cannot open" || fail "the client's kt_model_load did not report the missing file"
echo "install_check: ok ($prefix)"
