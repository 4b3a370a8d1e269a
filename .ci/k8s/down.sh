#!/usr/bin/env bash
# Tear down what up.sh started and undo what it changed: the pods first (so that the kubelet and CNI
# clean up after them), every process by its recorded PID (and the containerd shims that name our
# socket), mounts under $SANDBOXD_K8S_RUN, the bridge, the kubepods cgroups, the hard-coded directories
# up.sh found absent, the kernel tunables the kubelet rewrote; then $SANDBOXD_K8S_RUN itself.
# Safe to run twice, and after a failed up.sh. Exits non-zero when something could not be undone.
set -uo pipefail
RUN=${SANDBOXD_K8S_RUN:-/tmp/sandboxd-k8s}
PIDS=$RUN/pids BRIDGE=sbxk8s0
[ -d "$RUN" ] || { echo "down.sh: nothing to do ($RUN absent)" >&2; exit 0; }
T0=$(date +%s)
API="https://127.0.0.1:26443" PKI=$RUN/pki   # up.sh's API_PORT
CTR="ctr --address $RUN/containerd/containerd.sock -n k8s.io"
failed=0

pidof_() { [ -f "$PIDS/$1.pid" ] && cat "$PIDS/$1.pid"; }
alive() { local p; p=$(pidof_ "$1") && kill -0 "$p" 2>/dev/null; }
stop() { # stop NAME...: SIGTERM to each, up to 20 s for all to end, then SIGKILL
  local name pid left
  for name; do alive "$name" && kill -TERM "$(pidof_ "$name")" 2>/dev/null; done
  for _ in $(seq 200); do
    left=""
    for name; do alive "$name" && left+=" $name"; done
    [ -n "$left" ] || break
    sleep 0.1
  done
  for name in $left; do pid=$(pidof_ "$name") && kill -KILL "$pid" 2>/dev/null && echo "down.sh: killed $name" >&2; done
  echo "down.sh: stopped $* (+$(( $(date +%s) - T0 ))s)" >&2
}

# 1. pods, through the API, so that sandboxes are torn down (CNI DEL) by the kubelet
api() { # api METHOD PATH [BODY]: as the admin; no kubectl (build.sh does not build it)
  curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" -X "$1" \
    ${3:+-H 'Content-Type: application/json' -d "$3"} "$API$2"
}
if alive kube-apiserver && alive kubelet; then
  # every namespace's pods, at once (kubectl delete pods --all -A --grace-period=0 --force --wait=false)
  for ns in $(api GET /api/v1/namespaces | tr -d ' \n' | grep -o '"metadata":{"name":"[^"]*"' | cut -d'"' -f6); do
    api DELETE "/api/v1/namespaces/$ns/pods" '{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0}' >/dev/null 2>&1
  done
  # until no task runs (the kubelet keeps exited containers for its garbage collector: step 2 removes them)
  for _ in $(seq 60); do
    [ "$($CTR tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"' | wc -l)" = 0 ] && break
    sleep 0.5
  done
fi
stop kubelet
# 2. what is still in containerd: kill its tasks, remove its containers
if alive containerd; then
  for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks delete -f "$t" >/dev/null 2>&1; done
  for c in $($CTR containers ls -q 2>/dev/null); do $CTR containers rm "$c" >/dev/null 2>&1; done
fi
stop containerd
# shims started by our containerd carry our socket's path in their arguments; end them by PID
for pid in $(ps -eo pid=,args= | awk -v s="$RUN/containerd/containerd.sock" 'index($0, "containerd-shim") && index($0, s) {print $1}'); do
  kill -KILL "$pid" 2>/dev/null && echo "down.sh: killed shim $pid" >&2
done
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd

# 3. mounts under $RUN (deepest first), network namespaces our pods left, the bridge, cgroups, CNI cache
awk -v r="$RUN/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || failed=1; done
for ns in /run/netns/cni-*; do
  [ -e "$ns" ] || continue
  if grep -qs "$ns" "$RUN/netns.before"; then continue; fi
  umount -l "$ns" 2>/dev/null; rm -f "$ns"
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && echo "down.sh: deleted bridge $BRIDGE" >&2; fi
for root in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice; do
  [ -d "$root" ] && find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$root" ] && { echo "down.sh: could not remove $root" >&2; failed=1; }
done
rm -f /var/lib/cni/results/sandboxd-ci-* 2>/dev/null
find /var/log/containers -maxdepth 1 -lname "$RUN/*" -delete 2>/dev/null
rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint 2>/dev/null
while read -r p; do
  case $p in /var/lib/kubelet|/var/log/containers|/var/log/pods|/var/lib/cni|/run/netns) ;; *) continue ;; esac
  [ -d "$p" ] && find "$p" -depth -type d -empty -delete 2>/dev/null
  [ ! -e "$p" ] || { echo "down.sh: left $p (not empty)" >&2; failed=1; }
done < "$RUN/outside.created"

# 4. the kernel tunables the kubelet set
while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null || { echo "down.sh: could not restore $kv" >&2; failed=1; }; done < "$RUN/sysctl.saved"

rm -rf "$RUN" || failed=1
echo "down.sh: done in $(( $(date +%s) - T0 ))s" >&2
exit $failed
