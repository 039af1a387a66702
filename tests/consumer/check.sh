#!/usr/bin/env bash
# check.sh BUILD_DIR: installs the stoker built in BUILD_DIR into a temporary prefix, checks
# that its public headers include nothing but the standard library and each other, then
# builds and runs this consumer project against it: with find_package(stoker) (the shared and
# the static library) and with pkg-config. ctest runs it as `install_consumer`.
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null

leaks=$(grep -hE '^#include' "$prefix"/include/stoker/*.h "$prefix"/include/stoker/frontend/*.h |
  grep -vE '^#include (<[a-z_]+>|"stoker/([a-z_]+/)?[a-z_]+\.h")( +//.*)?$' || true)
[ -z "$leaks" ] || { echo "public headers include more than the standard library: $leaks"; exit 1; }
# The front ends' headers (include/stoker/frontend/, unstable) compile on their own from the
# install, as the bindings and the command line use them.
for h in "$prefix"/include/stoker/frontend/*.h; do
  echo "#include <stoker/frontend/$(basename "$h")>" |
    c++ -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - ||
    { echo "installed $h does not compile on its own"; exit 1; }
done

cmake -S "$here" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer_shared"
# (ldd's output kept first: grep -q stops reading at a match, and pipefail would count
# ldd's SIGPIPE as a failure.)
libs=$(ldd "$tmp/build/consumer_shared")
grep -q "$prefix/.*libstoker.so" <<<"$libs" ||
  { echo "consumer_shared does not run with the installed libstoker.so"; exit 1; }
"$tmp/build/consumer_static"
libs=$(ldd "$tmp/build/consumer_static")
if grep -q libstoker <<<"$libs"; then
  echo "consumer_static links libstoker.so"
  exit 1
fi

pc_dir=$(dirname "$(find "$prefix" -name stoker.pc)")
export PKG_CONFIG_PATH=$pc_dir
[ "$(pkg-config --modversion stoker)" = "$("$prefix/bin/stoker" --version | cut -d' ' -f2)" ]
libdir=$(pkg-config --variable=libdir stoker)
# shellcheck disable=SC2046  # pkg-config's flags are meant to split
c++ -std=c++20 -O1 "$here/main.cc" $(pkg-config --cflags --libs stoker) -Wl,-rpath,"$libdir" \
  -o "$tmp/consumer_pkg_config"
"$tmp/consumer_pkg_config"
