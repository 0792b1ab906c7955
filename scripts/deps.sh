#!/bin/sh
# Installs the Debian packages kettle needs to build and test, if any is
# missing. Does nothing (and needs no network) when all are present.
set -eu
PKGS="build-essential cmake pkg-config libcmocka-dev libjansson-dev libpcre2-dev libmicrohttpd-dev libcurl4-openssl-dev libxxhash-dev nettle-dev libpng-dev libjpeg62-turbo-dev libwebp-dev curl python3-jsonschema chromium haproxy clang"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing="$missing $p"
done
# chromium: headless, for tests/js/webui_e2e.mjs (the chat page at /).
# clang: the libFuzzer targets (tests/fuzz/, KT_FUZZ; scripts/fuzz_ci.sh, scripts/fuzz_long.sh).
# haproxy: test_scaleout (bench/scaleout/run.py), replicas behind a real balancer.
# Node.js and npm run tests/js (the `openai` npm package against kettle serve).
# Checked by command, not by package: a nodesource nodejs ships its own npm,
# and Debian's npm must not be installed beside it.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
