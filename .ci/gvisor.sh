#!/usr/bin/env bash
# gVisor for the tests: a runsc built with the fix sandboxd needs, and a dockerd of its own that has it.
# Sourced by .ci/run (after .ci/steps.sh), or run by a developer:
#   bash .ci/gvisor.sh runsc        builds runsc (cached) and prints its path
#   bash .ci/gvisor.sh up [DIR]     starts the engine sandboxd-gvisor in DIR (default /tmp/sandboxd-gvisor),
#                                   loads the images of the default engine into it, prints the line
#                                   `export SANDBOXD_TEST_GVISOR_HOST=...` that makes the tests use it
#   bash .ci/gvisor.sh down [DIR]   stops it
#
# The runsc: gVisor's releases to date follow a symbolic link on open(2) with O_NOFOLLOW|O_DIRECTORY
# (they treat O_DIRECTORY as a trailing slash), which Go's os.Root, and so the agent's confinement to the
# workspace, rely on failing; the agent refuses to serve on such a kernel (localfs.ErrKernelFollowsLinks).
# So runsc is built from gvisor.dev/gvisor at GVISOR_VERSION (a module the Go proxy has) with
# .ci/gvisor/nofollow-directory.patch applied, once per version and patch, into GVISOR_CACHE.
# The engine: its own socket, data root, exec root and pidfile under DIR, no bridge, no iptables; runtimes
# `runsc` (that build) and, where Debian's is installed, `runsc-debian` (/usr/bin/runsc, for the test
# that the agent refuses it). Both run with --network=none (sessions have no network; egress goes through
# the daemon) and --oci-seccomp (the session's seccomp profile applies inside gVisor), on the systrap
# platform (ptrace for Debian's, which has no systrap).

GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237
GVISOR_PATCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gvisor/nofollow-directory.patch
GVISOR_CACHE=${GVISOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxd/gvisor}
GVISOR_RUNTIME_ARGS='["--network=none", "--platform=systrap", "--oci-seccomp"]'

# gvisor_runsc: builds runsc (or finds it built) and prints its path on the last line.
gvisor_runsc() {
  local key out src
  key=$(cat "$GVISOR_PATCH" | sha256sum | cut -c1-12)
  out=$GVISOR_CACHE/runsc-${GVISOR_VERSION##*-}-$key
  if [ ! -x "$out" ]; then
    mkdir -p "$GVISOR_CACHE"
    src=$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { echo "gvisor: go mod download gvisor.dev/gvisor@$GVISOR_VERSION gave no directory" >&2; return 1; }
    rm -rf "$out.src" && cp -r "$src" "$out.src" && chmod -R u+w "$out.src"
    git -C "$out.src" apply "$GVISOR_PATCH" 2>/dev/null || (cd "$out.src" && git apply "$GVISOR_PATCH")
    (cd "$out.src" && CGO_ENABLED=0 go build -trimpath -o "$out.tmp" ./runsc)
    mv "$out.tmp" "$out" && rm -rf "$out.src"
  fi
  echo "$out"
}

# gvisor_up DIR: starts the engine sandboxd-gvisor in DIR, loads the default engine's sandboxd images
# into it, and prints its address (DOCKER_HOST form) on the last line.
gvisor_up() {
  local dir=$1 runsc host debian=""
  runsc=$(gvisor_runsc | tail -1)
  mkdir -p "$dir"
  host=unix://$dir/docker.sock
  # Debian's has no systrap platform.
  [ ! -x /usr/bin/runsc ] || debian=', "runsc-debian": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--platform=ptrace", "--oci-seccomp"]}'
  cat > "$dir/daemon.json" <<EOF
{"data-root": "$dir/data", "exec-root": "$dir/exec", "pidfile": "$dir/dockerd.pid", "hosts": ["$host"],
 "storage-driver": "$(docker info --format '{{.Driver}}' 2>/dev/null || echo overlay2)",
 "bridge": "none", "iptables": false, "ip-masq": false, "log-driver": "none",
 "runtimes": {"runsc": {"path": "$runsc", "runtimeArgs": $GVISOR_RUNTIME_ARGS}$debian}}
EOF
  (dockerd --config-file "$dir/daemon.json" > "$dir/dockerd.log" 2>&1 &)
  for _ in $(seq 120); do DOCKER_HOST=$host docker info >/dev/null 2>&1 && break; sleep 0.5; done
  DOCKER_HOST=$host docker info >/dev/null 2>&1 || { tail -30 "$dir/dockerd.log"; echo "gvisor: dockerd did not start" >&2; return 1; }
  gvisor_load "$host"
  echo "$host"
}

# gvisor_load HOST: copies the default engine's sandboxd images (they are built locally, no registry has
# them) to the engine at HOST.
gvisor_load() {
  local refs
  refs=$(docker images --format '{{.Repository}}:{{.Tag}}' | grep '^sandboxd/' || true)
  [ -n "$refs" ] || { echo "gvisor: the default engine has no sandboxd images to load" >&2; return 1; }
  # shellcheck disable=SC2086
  docker save $refs | DOCKER_HOST=$1 docker load -q
}

# gvisor_down DIR: stops the engine of DIR and removes DIR.
gvisor_down() {
  local dir=$1 pid
  pid=$(cat "$dir/dockerd.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  # What the engine left mounted in DIR (the network namespace file of --network=none) first.
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l
  rm -rf "$dir"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case ${1:-} in
  runsc) gvisor_runsc ;;
  up) echo "export SANDBOXD_TEST_GVISOR_HOST=$(gvisor_up "${2:-/tmp/sandboxd-gvisor}" | tail -1)" ;;
  down) gvisor_down "${2:-/tmp/sandboxd-gvisor}" ;;
  *) sed -n '2,8p' "$0" >&2; exit 2 ;;
  esac
fi
