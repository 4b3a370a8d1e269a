#!/usr/bin/env bash
# ociimage.sh NAME:TAG FILE OUT.tar [PATH-IN-IMAGE]
# Writes a FROM-scratch OCI image-layout archive holding one file (mode 0755, owned by root) at
# /PATH-IN-IMAGE (default: the file's base name), with that file as the entrypoint. No registry and no
# docker: `ctr -n k8s.io images import OUT.tar` loads it under NAME:TAG.
set -euo pipefail
ref=$1 file=$2 out=$3 entry=${4:-$(basename "$2")}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/rootfs/$(dirname "$entry")" "$d/oci/blobs/sha256"
cp "$file" "$d/rootfs/$entry" && chmod 0755 "$d/rootfs/$entry"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$d/rootfs" -cf "$d/layer.tar" .
blob() { # blob FILE -> moves FILE into blobs/, prints "DIGEST SIZE"
  local dig size
  dig=$(sha256sum "$1" | cut -d' ' -f1) size=$(stat -c %s "$1")
  mv "$1" "$d/oci/blobs/sha256/$dig"
  echo "$dig $size"
}
diffid=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
gzip -n -c "$d/layer.tar" > "$d/layer.tgz"
read -r ldig lsize < <(blob "$d/layer.tgz")
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/%s"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$entry" "$diffid" > "$d/config.json"
read -r cdig csize < <(blob "$d/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
  "$cdig" "$csize" "$ldig" "$lsize" > "$d/manifest.json"
read -r mdig msize < <(blob "$d/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$mdig" "$msize" "$ref" "${ref##*:}" > "$d/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$d/oci/oci-layout"
tar -C "$d/oci" -cf "$out" .
