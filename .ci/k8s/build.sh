#!/usr/bin/env bash
# Build the single-node Kubernetes toolset that the kubernetes backend's tests run against, from the Go
# module proxy alone (no registry, no release tarballs):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl   k8s.io/kubernetes $K8S_VERSION
#   etcd                                                                       go.etcd.io/etcd/server/v3 $ETCD_VERSION
#   pause (the pod sandbox process) and its FROM-scratch OCI archive           .ci/k8s/pause
#
# Everything is cached per version under $SANDBOXD_K8S_CACHE (default ~/.cache/sandboxd/k8s):
#   <cache>/<K8S_VERSION>-etcd-<ETCD_VERSION>/{bin,images,build}   the result; a stamp file marks it complete
#   <cache>/gocache, <cache>/gomod                                   GOCACHE and GOMODCACHE of this build
# A second run with the stamp present does nothing (prints the directory). Cold: 17-40 min on 2 cores.
#
# Usage: .ci/k8s/build.sh           prints the result directory on its last line
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
STAGING_VERSION=v0.${K8S_VERSION#v1.}     # staging modules are tagged in lockstep: v1.37.2 -> v0.37.2
CACHE=${SANDBOXD_K8S_CACHE:-$HOME/.cache/sandboxd/k8s}
OUT=$CACHE/$K8S_VERSION-etcd-$ETCD_VERSION
BIN=$OUT/bin
STAMP=$OUT/complete

log() { echo "[k8s-build $(date +%T)] $*" >&2; }

if [ -f "$STAMP" ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

export GOCACHE=$CACHE/gocache GOMODCACHE=$CACHE/gomod
export GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOWORK=off
mkdir -p "$BIN" "$OUT/build" "$OUT/images"
T0=$(date +%s)

# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the staging modules with ./staging/...
# A throwaway module requires it and replaces each staging module with its published v0.x version
# (the list is read from kubernetes' own go.mod). The sample-* staging modules are not published and
# nothing requires them. Committed go.mod/go.sum under mod/ pin every version when present.
build_k8s() {
  local K=$OUT/build/k8s
  mkdir -p "$K" && cd "$K"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  if [ -f "$HERE/mod/k8s/go.mod" ] && grep -q "k8s.io/kubernetes $K8S_VERSION" "$HERE/mod/k8s/go.mod"; then
    cp "$HERE/mod/k8s/go.mod" "$HERE/mod/k8s/go.sum" .
  else
    rm -f go.mod go.sum
    go mod init sandboxd.ci/k8s >/dev/null 2>&1
    go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
    local m
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$GOMODCACHE/k8s.io/kubernetes@$K8S_VERSION/go.mod"); do
      case $m in k8s.io/sample-cli-plugin|k8s.io/sample-controller) continue ;; esac
      go mod edit -replace "$m=$m@$STAGING_VERSION"
    done
    go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
    go mod tidy
  fi
  log "k8s: modules resolved after $(($(date +%s) - T0))s"
  local maj=${K8S_VERSION#v} min=${K8S_VERSION#v*.} ldf="-s -w" p
  maj=${maj%%.*} min=${min%%.*}
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    # no buildDate: the binaries stay byte-identical between builds
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$maj -X $p.gitMinor=$min -X $p.gitTreeState=clean"
  done
  go build -trimpath -ldflags "$ldf" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet
  log "k8s: built after $(($(date +%s) - T0))s"
}

# etcd gets its own throwaway module so that kubernetes' dependency versions stay untouched.
build_etcd() {
  local E=$OUT/build/etcd
  mkdir -p "$E" && cd "$E"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  if [ -f "$HERE/mod/etcd/go.mod" ] && grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" "$HERE/mod/etcd/go.mod"; then
    cp "$HERE/mod/etcd/go.mod" "$HERE/mod/etcd/go.sum" .
  else
    rm -f go.mod go.sum
    go mod init sandboxd.ci/etcd >/dev/null 2>&1
    go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
  fi
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  log "etcd: built after $(($(date +%s) - T0))s"
}

build_pause() {
  local P=$OUT/build/pause
  mkdir -p "$P" && cd "$P"
  cp "$HERE/pause/main.go" .
  [ -f go.mod ] || go mod init sandboxd.ci/pause >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w" -o "$BIN/pause" .
  "$HERE/ociimage.sh" localhost/pause:local "$BIN/pause" "$OUT/images/pause.tar"
}

build_k8s
build_etcd
build_pause
touch "$STAMP"
log "done in $(($(date +%s) - T0))s: $(du -sh "$BIN" | cut -f1) of binaries in $BIN"
echo "$OUT"
