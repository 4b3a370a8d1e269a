#!/usr/bin/env bash
# Build the single-node Kubernetes cluster that the kubernetes backend's tests run against, from the Go
# module proxy alone (no registry, no release tarballs), as little of it as the tests need:
#   bin/kube: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubelet in one binary
#             (.ci/k8s/kube/main.go; a link of each name runs that component)   k8s.io/kubernetes $K8S_VERSION,
#                                                                             go.etcd.io/etcd/server/v3 $ETCD_VERSION
#   bin/pause and its FROM-scratch OCI archive images/pause.tar (the pod sandbox process)   .ci/k8s/pause
#   bin/kubectl only with SANDBOXD_K8S_KUBECTL=1 (nothing in CI uses it; a person at the cluster may)
#
# What was cut, and why (measured: BENCHMARKS.md, "CI from a cold machine"): five binaries linked
# separately from ~2,500 shared packages became one, kubectl is not built (191 packages of its own,
# kustomize's among them), and etcd is the release whose client Kubernetes already requires, built in
# Kubernetes' module graph (its gRPC, protobuf and OpenTelemetry packages compiled once, not twice).
#
# Everything is cached under $SANDBOXD_K8S_CACHE (default ~/.cache/sandboxd/k8s):
#   <cache>/<K8S_VERSION>-etcd-<ETCD_VERSION>-<hash>/{bin,images,build}   the result; a stamp file marks it
#                         complete; <hash> covers this script, kube/main.go and the pinned go.mod/go.sum
#   <cache>/gocache, <cache>/gomod                                          GOCACHE and GOMODCACHE of this build
# A second run with the stamp present does nothing (prints the directory). Each step prints its time.
#
# Usage: .ci/k8s/build.sh           prints the result directory on its last line
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
# The etcd release whose client k8s.io/kubernetes $K8S_VERSION requires: building it beside Kubernetes
# moves none of Kubernetes' dependency versions.
ETCD_VERSION=${ETCD_VERSION:-v3.7.0}
STAGING_VERSION=v0.${K8S_VERSION#v1.}     # staging modules are tagged in lockstep: v1.37.2 -> v0.37.2
CACHE=${SANDBOXD_K8S_CACHE:-$HOME/.cache/sandboxd/k8s}
KEY=$(cat "$0" "$HERE/kube/main.go" "$HERE/pause/main.go" "$HERE"/mod/k8s/go.* 2>/dev/null | sha256sum | cut -c1-8)
OUT=$CACHE/$K8S_VERSION-etcd-$ETCD_VERSION-$KEY
BIN=$OUT/bin
STAMP=$OUT/complete

T0=$(date +%s)
TS=$T0
log() { echo "[k8s-build $(date +%T)] $*" >&2; }
lap() { # lap WHAT: logs WHAT with the time since the last lap and since the start
  local now
  now=$(date +%s)
  log "$1 in $((now - TS))s (+$((now - T0))s)"
  TS=$now
}

if [ -f "$STAMP" ] && { [ "${SANDBOXD_K8S_KUBECTL:-}" != 1 ] || [ -x "$BIN/kubectl" ]; }; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

export GOCACHE=$CACHE/gocache GOMODCACHE=$CACHE/gomod
export GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOWORK=off
mkdir -p "$BIN" "$OUT/build" "$OUT/images"

# The version variables `kube-apiserver --version` and the API's /version report. No buildDate: the
# binaries stay byte-identical between builds. -s -w: no symbol table, no DWARF (the link is the
# shorter for it; nobody debugs these binaries), and GCFLAGS' -dwarf=false has the compiler not make
# the DWARF the linker would drop (5% less CPU on client-go cold, BENCHMARKS.md).
GCFLAGS=all=-dwarf=false
ldflags() {
  local maj=${K8S_VERSION#v} min=${K8S_VERSION#v*.} ldf="-s -w" p
  maj=${maj%%.*} min=${min%%.*}
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean"
  done
  echo "$ldf"
}

# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the staging modules with ./staging/...
# A throwaway module requires it and replaces each staging module with its published v0.x version
# (the list is read from kubernetes' own go.mod). The sample-* staging modules are not published and
# nothing requires them. Committed go.mod/go.sum under mod/k8s pin every version when present.
# tools.go (build tag tools, never compiled by the build below) keeps kubectl's requirements in them.
build_kube() {
  local K=$OUT/build/kube
  mkdir -p "$K" && cd "$K"
  cp "$HERE/kube/main.go" .
  printf '//go:build tools\n\npackage main\n\nimport _ "k8s.io/kubernetes/cmd/kubectl"\n' > tools.go
  if [ -f "$HERE/mod/k8s/go.mod" ] && grep -q "k8s.io/kubernetes $K8S_VERSION\$" "$HERE/mod/k8s/go.mod" &&
    grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION\$" "$HERE/mod/k8s/go.mod"; then
    cp "$HERE/mod/k8s/go.mod" "$HERE/mod/k8s/go.sum" .
  else
    log "no pinned go.mod for $K8S_VERSION and etcd $ETCD_VERSION: resolving (copy go.mod and go.sum to .ci/k8s/mod/k8s/ to pin)"
    rm -f go.mod go.sum
    go mod init sandboxd.ci/k8s >/dev/null 2>&1
    go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
    local m
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$GOMODCACHE/k8s.io/kubernetes@$K8S_VERSION/go.mod"); do
      case $m in k8s.io/sample-cli-plugin|k8s.io/sample-controller) continue ;; esac
      go mod edit -replace "$m=$m@$STAGING_VERSION"
    done
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION" -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
  fi
  # Loading the packages fetches the modules they are in: before the compile, so that each has its time.
  go list -deps . >/dev/null
  lap "modules downloaded"
  go build -trimpath -gcflags "$GCFLAGS" -ldflags "$(ldflags)" -o "$BIN/kube" .
  local n
  for n in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do ln -sfn kube "$BIN/$n"; done
  lap "kube (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) built"
  if [ "${SANDBOXD_K8S_KUBECTL:-}" = 1 ]; then
    go build -trimpath -gcflags "$GCFLAGS" -ldflags "$(ldflags)" -o "$BIN/kubectl" k8s.io/kubernetes/cmd/kubectl
    lap "kubectl built"
  fi
}

build_pause() {
  local P=$OUT/build/pause
  mkdir -p "$P" && cd "$P"
  cp "$HERE/pause/main.go" .
  [ -f go.mod ] || go mod init sandboxd.ci/pause >/dev/null 2>&1
  go build -trimpath -gcflags "$GCFLAGS" -ldflags "-s -w" -o "$BIN/pause" .   # the flags of kube: its std packages
  "$HERE/ociimage.sh" localhost/pause:local "$BIN/pause" "$OUT/images/pause.tar"
  lap "pause built"
}

build_kube
build_pause
touch "$STAMP"
log "done in $(($(date +%s) - T0))s: $(du -shL "$BIN/kube" | cut -f1) binary in $BIN"
echo "$OUT"
