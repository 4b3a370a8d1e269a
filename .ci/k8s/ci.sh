# Sourced by .ci/run (after .ci/steps.sh): the Kubernetes cluster the kubernetes backend's tests run against.
#   k8s_deps        installs what the cluster needs from Debian (containerd, runc, CNI plugins, openssl)
#   k8s_up DIR      brings the cluster up from build.sh's result DIR as the step cluster-up (.ci/k8s/up.sh),
#                   exports its variables (SANDBOXD_KUBECONFIG, ...) into this shell and has .ci/k8s/down.sh
#                   tear it down when the shell exits
# .ci/run runs .ci/k8s/build.sh itself, as the background step k8s-build (cold: see BENCHMARKS.md).

k8s_deps() {
  local need=()
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  command -v openssl >/dev/null || need+=(openssl)
  command -v curl >/dev/null || need+=(curl)
  if ((${#need[@]})); then
    echo "k8s: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

k8s_up() {
  on_exit k8s_down
  step cluster-up .ci/k8s/up.sh "$1"
  # shellcheck disable=SC1090
  source "$(tail -1 "$(step_log cluster-up)")"
  echo "k8s: SANDBOXD_KUBECONFIG=$SANDBOXD_KUBECONFIG"
}

k8s_down() {
  .ci/k8s/down.sh || { echo "k8s: down.sh could not undo everything" >&2; return 1; }
}
