#!/usr/bin/env bash
# tools.sh makes policyd's build tools available and prints the directory that
# holds them, so that callers can write:
#
#	PATH="$(hack/tools.sh):$PATH"
#
# protoc comes from Debian's protobuf-compiler package (installed with apt-get
# if it is missing). protoc-gen-go, protoc-gen-go-grpc, controller-gen and
# golangci-lint are built from the versions pinned in hack/tools/go.mod into a
# cache directory keyed
# by a hash of hack/tools/go.mod, hack/tools/go.sum and the Go toolchain, so the build
# happens once per pin change and every later call returns at once.
#
# The bin directory is the only thing written to stdout; progress and errors
# go to stderr. Concurrent callers are serialized with flock.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="$root/hack/tools"

# The protoc release whose output is committed under api/. Generated files
# record the protoc version in their header, so another release makes the
# "generated code is up to date" check in hack/test.sh fail.
want_protoc="3.21.12"

# The tools to build, as package paths in hack/tools/go.mod.
tools=(
	google.golang.org/protobuf/cmd/protoc-gen-go
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	sigs.k8s.io/controller-tools/cmd/controller-gen
	github.com/golangci/golangci-lint/v2/cmd/golangci-lint
)

log() { printf 'tools.sh: %s\n' "$*" >&2; }

# as_root runs a command as root, through sudo when we are not root.
as_root() {
	if [[ "$(id -u)" -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo "$@"
	else
		log "need root to run: $*"
		return 1
	fi
}

ensure_protoc() {
	if ! command -v protoc >/dev/null 2>&1; then
		log "protoc not found; installing protobuf-compiler with apt-get"
		if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler >&2; then
			log "install failed; running apt-get update and retrying"
			as_root apt-get update >&2
			as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y protobuf-compiler >&2
		fi
	fi
	local have
	have="$(protoc --version | awk '{print $2}')"
	if [[ "$have" != "$want_protoc" ]]; then
		log "warning: protoc $have found, but the committed code was generated with $want_protoc;"
		log "warning: regenerating will change the version line in api/**/*.pb.go"
	fi
}

ensure_protoc

# Everything that decides what the binaries are goes into the cache key.
key="$(
	{
		cat "$tools_dir/go.mod" "$tools_dir/go.sum"
		go version
		go env GOOS GOARCH
		printf '%s\n' "${tools[@]}"
	} | sha256sum | cut -c1-16
)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/policyd/tools"
bin="$cache_root/$key/bin"
marker="$cache_root/$key/.complete"

# Fast path: the tools are already built.
if [[ -f "$marker" ]]; then
	printf '%s\n' "$bin"
	exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
if ! flock -n 9; then
	log "waiting for another tools.sh to finish building"
	flock 9
fi

# Another caller may have finished the build while we waited.
if [[ ! -f "$marker" ]]; then
	log "building tools into $bin (the first build can take several minutes)"
	start=$SECONDS
	rm -rf "$bin"
	mkdir -p "$bin"

	lint_version="$(cd "$tools_dir" && GOWORK=off go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)"
	(
		cd "$tools_dir"
		export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
		go build -trimpath -o "$bin/" \
			google.golang.org/protobuf/cmd/protoc-gen-go \
			google.golang.org/grpc/cmd/protoc-gen-go-grpc \
			sigs.k8s.io/controller-tools/cmd/controller-gen
		# golangci-lint takes its version from ldflags when built outside
		# its own module; without them it reports "(devel)".
		go build -trimpath -o "$bin/" \
			-ldflags "-X main.version=${lint_version#v} -X main.commit=hack/tools/go.mod -X main.date=unknown" \
			github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	) >&2

	for t in "${tools[@]}"; do
		name="${t##*/}"
		if [[ ! -x "$bin/$name" ]]; then
			log "build did not produce $name"
			exit 1
		fi
	done
	touch "$marker"
	log "built tools in $((SECONDS - start))s"
fi

printf '%s\n' "$bin"
