#!/usr/bin/env bash
# kube-bins.sh: build (once) and cache kube-apiserver, etcd and
# kube-controller-manager for the tests (envtest, and the drift tests' real
# deployment and replicaset controllers) and for bench's etcd comparison,
# and kubectl for the policy sources' apply and delete paths.
# hack/test.sh calls it.
#
# Prints the cache directory holding the binaries; use it as KUBEBUILDER_ASSETS:
#   export KUBEBUILDER_ASSETS="$(hack/kube-bins.sh)"
#
# Everything comes from the Go module proxy (no GitHub / dl.k8s.io downloads).
# The cache dir is keyed by k8s version, etcd version, Go version and GOOS/GOARCH,
# so a version bump builds into a fresh dir and old dirs can be deleted safely.
# kube-apiserver and etcd are published together (marker .complete);
# kube-controller-manager, from the same k8s.io/kubernetes version, is added to
# the same dir with a marker of its own (.complete-kube-controller-manager), so
# a dir cached before it existed keeps its two binaries and only gains the third.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"       # k8s.io/kubernetes tag; staging modules use v0.<minor>.<patch>
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"        # go.etcd.io/etcd/server/v3 tag
CACHE_ROOT="${KUBEENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeenv}"

GOVER="$(go env GOVERSION)"
PLAT="$(go env GOOS)_$(go env GOARCH)"
KEY="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_${GOVER}_${PLAT}"
DEST="$CACHE_ROOT/$KEY"
KCM_DONE="$DEST/.complete-kube-controller-manager"
KUBECTL_DONE="$DEST/.complete-kubectl"

published() { [[ -f "$DEST/.complete" && -f "$KCM_DONE" && -f "$KUBECTL_DONE" ]]; }

if published; then echo "$DEST"; exit 0; fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9                                   # serialize concurrent builders on one machine
if published; then echo "$DEST"; exit 0; fi

WORK="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0   # static binaries; -mod=mod lets tidy write go.sum

kv="${KUBE_VERSION#v}"; major="${kv%%.*}"; rest="${kv#*.}"; minor="${rest%%.*}"
staging="v0.${kv#*.}"                       # v1.34.4 -> v0.34.4

# --- the kubernetes tools module (kube-apiserver, kube-controller-manager) ----
# One module for both commands: one tidy, and their shared packages compile once.
mkdir -p "$WORK/kube" "$WORK/etcd" "$WORK/out"
kmod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
{
  printf 'module kubeenv/tools/kube\n\ngo 1.24.0\n\n'
  grep -m1 '^godebug ' "$kmod" || true     # keep k8s's GODEBUG defaults (e.g. default=go1.24)
  printf '\ntool (\n\tk8s.io/kubernetes/cmd/kube-apiserver\n\tk8s.io/kubernetes/cmd/kube-controller-manager\n\tk8s.io/kubernetes/cmd/kubectl\n)\n'
  printf '\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
  # k8s.io/kubernetes replaces every k8s.io/* staging module with ./staging/src/...; map them to released tags.
  grep -E '=> \./staging/' "$kmod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  printf ')\n'
} > "$WORK/kube/go.mod"
ld="-s -w"
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
( cd "$WORK/kube" && go mod tidy >&2 )
build_kube() { ( cd "$WORK/kube" && go build -trimpath -ldflags "$ld" -o "$2" "k8s.io/kubernetes/cmd/$1" >&2 ); }

# --- kube-apiserver and etcd (published together, as before) -----------------
if [[ ! -f "$DEST/.complete" ]]; then
  build_kube kube-apiserver "$WORK/out/kube-apiserver"
  printf 'module kubeenv/tools/etcd\n\ngo 1.24.0\n\ntool go.etcd.io/etcd/server/v3\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$ETCD_VERSION" > "$WORK/etcd/go.mod"
  ( cd "$WORK/etcd" && go mod tidy >&2 && \
    go build -trimpath -ldflags "-s -w" -o "$WORK/out/etcd" go.etcd.io/etcd/server/v3 >&2 )
  "$WORK/out/kube-apiserver" --version >&2
  "$WORK/out/etcd" --version >&2          # (no "| head": SIGPIPE + pipefail would abort)
  cp "$WORK/kube/go.mod" "$WORK/out/kube.go.mod"; cp "$WORK/kube/go.sum" "$WORK/out/kube.go.sum"
  cp "$WORK/etcd/go.mod" "$WORK/out/etcd.go.mod"; cp "$WORK/etcd/go.sum" "$WORK/out/etcd.go.sum"
  touch "$WORK/out/.complete"
  rm -rf "$DEST"; mv "$WORK/out" "$DEST"
fi

# --- kube-controller-manager and kubectl (added to the published dir) ---------
add_kube() {  # add_kube CMD MARKER VERSION-ARGS...: build CMD into the published dir once
  [[ -f "$2" ]] && return 0
  local cmd="$1" marker="$2" tmp="$DEST/.$1.tmp"; shift 2
  build_kube "$cmd" "$tmp"
  "$tmp" "$@" >&2
  mv -f "$tmp" "$DEST/$cmd"   # same filesystem: atomic
  touch "$marker"
}
add_kube kube-controller-manager "$KCM_DONE" --version
add_kube kubectl "$KUBECTL_DONE" version --client
echo "$DEST"
