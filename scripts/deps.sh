#!/bin/sh
# Installs the Debian packages kettle needs to build and test, if any is
# missing. Does nothing (and needs no network) when all are present.
set -eu
PKGS="build-essential cmake pkg-config libcmocka-dev libjansson-dev libpcre2-dev libmicrohttpd-dev libcurl4-openssl-dev curl"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
