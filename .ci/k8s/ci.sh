# Sourced by .ci/run: the Kubernetes cluster the kubernetes backend's tests run against.
#   k8s_build_start   installs what the cluster needs from Debian and starts .ci/k8s/build.sh in the
#                     background (cold: 17-40 min; cached per version under ~/.cache/sandboxd/k8s)
#   k8s_up            waits for the build, brings the cluster up (.ci/k8s/up.sh), exports its variables
#                     (SANDBOXD_KUBECONFIG, ...) and tears it down when the shell exits (.ci/k8s/down.sh)
K8S_CI_LOG=${K8S_CI_LOG:-/tmp/sandboxd-ci-k8s-build.log}

k8s_build_start() {
  local need=()
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  command -v openssl >/dev/null || need+=(openssl)
  if ((${#need[@]})); then
    echo "k8s: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  K8S_BUILD_T0=$(date +%s)
  .ci/k8s/build.sh > "$K8S_CI_LOG" 2>&1 &
  K8S_BUILD_PID=$!
  echo "k8s: building the cluster's binaries in the background (pid $K8S_BUILD_PID, log $K8S_CI_LOG)"
}

k8s_up() {
  local rc=0 t1 t2
  wait "$K8S_BUILD_PID" || rc=$?
  t1=$(date +%s)
  if [ "$rc" != 0 ]; then tail -40 "$K8S_CI_LOG" >&2; echo "k8s: build failed" >&2; return 1; fi
  echo "k8s: build ready $((t1 - K8S_BUILD_T0))s after it started ($(tail -1 "$K8S_CI_LOG"))"
  trap k8s_down EXIT
  local env
  env=$(.ci/k8s/up.sh "$(tail -1 "$K8S_CI_LOG")" | tail -1) || { echo "k8s: up failed" >&2; return 1; }
  # shellcheck disable=SC1090
  source "$env"
  t2=$(date +%s)
  echo "k8s: cluster up in $((t2 - t1))s; SANDBOXD_KUBECONFIG=$SANDBOXD_KUBECONFIG"
  # The deploy manifests must be what this API server accepts: a server-side dry run, in their
  # namespaces (made for real first: a dry run of a namespace does not make it).
  local kubectl=${SANDBOXD_K8S_RUN:-/tmp/sandboxd-k8s}/kubectl
  "$kubectl" create namespace sandboxd --save-config >/dev/null && "$kubectl" create namespace sandboxd-sessions --save-config >/dev/null &&
    "$kubectl" apply --dry-run=server -f deploy/kubernetes/ || { echo "k8s: deploy/kubernetes is refused" >&2; return 1; }
}

k8s_down() {
  local rc=$?
  .ci/k8s/down.sh || { echo "k8s: down.sh could not undo everything" >&2; [ "$rc" != 0 ] || rc=1; }
  exit "$rc"
}
