# Shared by the set-up scripts: installs missing Debian packages (idempotent) and builds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

JOBS=$(nproc)

# apt_install PKG...: installs whichever of the packages are missing.
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# python_venv DIR REQUIREMENT...: a virtual environment at DIR with these installed (idempotent:
# pip skips what is already there).
python_venv() {
  local dir=$1
  shift
  if [ ! -x "$dir/bin/python" ]; then
    apt_install python3 python3-venv python3-pip
    python3 -m venv "$dir"
  fi
  "$dir/bin/pip" install -q "$@"
}

BUILD_PACKAGES=(g++ cmake ninja-build pkg-config libgtest-dev libfmt-dev libcli11-dev
                nlohmann-json3-dev libjpeg62-turbo-dev libpng-dev libxxhash-dev
                libcurl4-openssl-dev libpugixml-dev
                libavformat-dev libavcodec-dev libavutil-dev libswscale-dev ffmpeg)

# build DIR [cmake args...]: configures and builds the project into DIR.
build() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DSTOKER_WERROR=ON "$@" >/dev/null
  ninja -C "$dir" -j "$JOBS"
}
