#!/usr/bin/env bash
# Bring up the single-node Kubernetes cluster the kubernetes backend's tests run against, from the
# binaries build.sh made: PKI (openssl) -> etcd -> kube-apiserver -> controller-manager + scheduler ->
# containerd (an instance of its own, CRI on) -> kubelet, and wait for the node to be Ready.
# Everything listens on 127.0.0.1 only; all state is under $SANDBOXD_K8S_RUN (down.sh removes it, and
# everything else this script changed). Needs root, Debian's containerd, runc, containernetworking-plugins
# and openssl, and docker for the sandbox images (imported with `docker save | ctr import`, no registry).
#
# Usage: .ci/k8s/up.sh [BUILD_DIR]   (BUILD_DIR: what build.sh printed; default: runs build.sh, cached)
# On success the last line is the env file to source: KUBECONFIG, SANDBOXD_KUBECONFIG, SANDBOXD_K8S_AGENT_IMAGE.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$("$HERE/build.sh" | tail -1)}
BIN=$OUT/bin
RUN=${SANDBOXD_K8S_RUN:-/tmp/sandboxd-k8s}
PKI=$RUN/pki LOGS=$RUN/logs PIDS=$RUN/pids
NODE=localhost                     # the apiserver dials the kubelet by this name (exec, attach, logs)
ETCD_PORT=24379 ETCD_PEER_PORT=24380 API_PORT=26443 KUBELET_PORT=20250 KUBELET_HEALTHZ_PORT=20248
KCM_PORT=20257 SCHED_PORT=20259
POD_CIDR=10.247.0.0/24 SERVICE_CIDR=10.97.0.0/24 BRIDGE=sbxk8s0
CNI_BIN=${CNI_BIN:-/usr/lib/cni}
# Sandbox images (docker repositories; every tag is imported) the pods may run.
IMAGES=${SANDBOXD_K8S_IMAGES:-sandboxd/minimal}
export PATH=$BIN:$PATH KUBECACHEDIR=$RUN/kubectl-cache

[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root" >&2; exit 1; }
[ ! -e "$RUN" ] || { echo "up.sh: $RUN exists: run .ci/k8s/down.sh first" >&2; exit 1; }
missing=""
for f in "$BIN/etcd" "$BIN/kube-apiserver" "$BIN/kube-controller-manager" "$BIN/kube-scheduler" "$BIN/kubelet" \
  "$OUT/images/pause.tar" /usr/bin/containerd "$CNI_BIN/bridge" "$CNI_BIN/host-local" "$CNI_BIN/loopback"; do
  [ -e "$f" ] || missing+=" $f"
done
for c in runc ctr openssl curl; do command -v "$c" >/dev/null || missing+=" $c"; done
[ -z "$missing" ] || { echo "up.sh: missing:$missing (run build.sh; apt-get install containerd runc containernetworking-plugins openssl curl)" >&2; exit 1; }

mkdir -p "$PKI" "$LOGS" "$PIDS"
trap 'echo "up.sh: failed at line $LINENO; logs in $LOGS; run .ci/k8s/down.sh" >&2' ERR
# Paths outside $RUN that the kubelet, CRI and CNI hard-code: down.sh removes those this run created.
for p in /var/lib/kubelet /var/log/containers /var/log/pods /var/lib/cni /run/netns; do [ -e "$p" ] || echo "$p"; done > "$RUN/outside.created"
ls -d /run/netns/* > "$RUN/netns.before" 2>/dev/null || true
# kubectl only when build.sh made it (SANDBOXD_K8S_KUBECTL=1): nothing here needs it, a person may.
[ ! -x "$BIN/kubectl" ] || ln -s "$BIN/kubectl" "$RUN/kubectl"
# Kernel tunables the kubelet rewrites (it has no switch to leave them): down.sh restores them.
for s in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
  echo "$s=$(sysctl -n "$s")"
done > "$RUN/sysctl.saved"

T0=$(date +%s%N)
log() { echo "[k8s-up +$(( ($(date +%s%N) - T0) / 1000000 ))ms] $*" >&2; }
start() { # start NAME CMD...: in the background, its own session, PID recorded for down.sh
  local name=$1; shift
  setsid "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$PIDS/$name.pid"
}
wait_for() { # wait_for WHAT SECONDS CMD...: polls CMD until it succeeds; fails naming WHAT, with its log
  local what=$1 end=$(( $(date +%s) + $2 )); shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then echo "up.sh: timed out waiting for $what" >&2; tail -20 "$LOGS"/*.log >&2; return 1; fi
    sleep 0.3
  done
  log "$what"
}

# PKI: a CA and EC P-256 certificates, valid 30 days.
cd "$PKI"
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt -days 30 \
  -subj "/CN=sandboxd-ci-ca" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
cert() { # cert NAME SUBJECT EKU [SAN]
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; echo "extendedKeyUsage=$3"
    [ -z "${4:-}" ] || echo "subjectAltName=$4"; } > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -out "$1.crt" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
cert apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:${SERVICE_CIDR%.0/*}.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kubelet-client "/O=system:nodes/CN=system:node:$NODE" clientAuth
cert kubelet-serving "/CN=$NODE" serverAuth "DNS:$NODE,IP:127.0.0.1"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
openssl pkey -in sa.key -pubout -out sa.pub
chmod 600 ./*.key
kubeconfig() { # kubeconfig NAME CERT: a kubeconfig with the certificates embedded, written by hand
  cat > "$RUN/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: $(base64 -w0 ca.crt)}
users:
- name: $2
  user: {client-certificate-data: $(base64 -w0 "$2.crt"), client-key-data: $(base64 -w0 "$2.key")}
contexts:
- name: default
  context: {cluster: local, user: $2}
current-context: default
KC
  chmod 600 "$RUN/$1.kubeconfig"
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kubelet kubelet-client
export KUBECONFIG=$RUN/admin.kubeconfig
log "pki"

start etcd "$BIN/etcd" --name default --data-dir "$RUN/etcd" --log-level warn \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT"
wait_for "etcd healthy" 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# A loopback address cannot go into Endpoints (--endpoint-reconciler-type=none); the apiserver reaches the
# kubelet by the node's Hostname address, localhost.
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=Hostname \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --allow-privileged=false --profiling=false
api() { # api PATH: GET PATH from the API server as the admin (no kubectl: build.sh does not build it)
  curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT$1"
}
node_ready() { api "/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; }
wait_for "kube-apiserver ready" 180 api /readyz

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$RUN/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false --profiling=false
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$RUN/scheduler.kubeconfig" \
  --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false

# containerd: an instance of our own (Docker's is untouched), every path under $RUN.
# This machine's root may lack CAP_SYS_RESOURCE, so runc cannot set the sandbox's negative oom_score_adj:
# restrict_oom_score_adj clamps it to containerd's own.
mkdir -p "$RUN/containerd" "$RUN/cni/net.d" "$RUN/cni/ipam" "$RUN/runc"
cat > "$RUN/containerd/config.toml" <<TOML
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$RUN/containerd/containerd.sock"
[ttrpc]
  address = "$RUN/containerd/containerd.sock.ttrpc"
[debug]
  address = "$RUN/containerd/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:local"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$RUN/cni/net.d"
TOML
# The pod network: one bridge, host-local addresses; no gateway, no masquerade, nothing routed off the host.
cat > "$RUN/cni/net.d/10-sandboxd.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "sandboxd-ci", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$RUN/cni/ipam"}}]}
JSON
# The host reaches the pods, as a daemon on a node does (the kubernetes backend's direct stream to an
# agent): the bridge, made here, holds the pod network's first address (host-local's gateway, never a
# pod's). It is not the pods' gateway: they still route nothing off the bridge. down.sh deletes it.
ip link add "$BRIDGE" type bridge && ip addr add "${POD_CIDR%.*}.1/${POD_CIDR#*/}" dev "$BRIDGE" && ip link set "$BRIDGE" up
start containerd /usr/bin/containerd --config "$RUN/containerd/config.toml"
CTR="ctr --address $RUN/containerd/containerd.sock -n k8s.io"
wait_for "containerd up" 60 $CTR version

# Images, without a registry: the pause image build.sh wrote, the agent image (a FROM-scratch image holding
# this checkout's agent, tagged by its hash), and the sandbox images from docker.
$CTR images import "$OUT/images/pause.tar" >/dev/null
AGENT=$RUN/sandboxd-agent
(cd "$REPO" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$AGENT" ./cmd/sandboxd-agent)
AGENT_IMAGE=localhost/sandboxd-agent:$(sha256sum "$AGENT" | cut -c1-12)
"$HERE/ociimage.sh" "$AGENT_IMAGE" "$AGENT" "$RUN/agent-image.tar" sandboxd-agent
$CTR images import "$RUN/agent-image.tar" >/dev/null
for repo in $IMAGES; do
  refs=$(docker images --format '{{.Repository}}:{{.Tag}}' "$repo" | grep -v ':<none>$' || true)
  [ -n "$refs" ] || { echo "up.sh: docker has no image $repo (run: bin/sandboxd image build ${repo#sandboxd/})" >&2; exit 1; }
  # shellcheck disable=SC2086
  docker save $refs | $CTR images import --all-platforms - >/dev/null
done
log "images: $($CTR images ls -q | grep -v '^sha256:' | tr '\n' ' ')"

mkdir -p "$RUN/kubelet"
cat > "$RUN/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/kubelet-serving.crt"
tlsPrivateKeyFile: "$PKI/kubelet-serving.key"
containerRuntimeEndpoint: "unix://$RUN/containerd/containerd.sock"
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: "$POD_CIDR"
podPidsLimit: 1024
maxPods: 110
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: "$RUN/pod-logs"
YAML
start kubelet "$BIN/kubelet" --config="$RUN/kubelet-config.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
  --root-dir="$RUN/kubelet" --hostname-override="$NODE" --v=1
wait_for "node registered" 180 api "/api/v1/nodes/$NODE"
wait_for "node $NODE Ready" 180 node_ready
wait_for "default service account" 120 api /api/v1/namespaces/default/serviceaccounts/default

cat > "$RUN/env" <<ENV
export KUBECONFIG=$KUBECONFIG
export SANDBOXD_KUBECONFIG=$KUBECONFIG
export SANDBOXD_K8S_AGENT_IMAGE=$AGENT_IMAGE
export KUBECACHEDIR=$KUBECACHEDIR
ENV
log "cluster up"
echo "$RUN/env"
