#!/usr/bin/env bash
# test.sh is policyd's test command: `make test` and CI (.ci/run) both run it.
# It checks that the generated protobuf code matches the .proto files, checks
# formatting, vets and lints the module, and runs the tests with the race
# detector, then upstream hashicorp/raft's tests on the patched copy in
# internal/third_party/raft (hack/raft-fork-test.sh). The chaos suite runs on both
# Raft log stores. It finds or installs headless Chromium (hack/chromium.sh)
# and exports its path as POLICYD_CHROMIUM for the console's browser tests.
#
# Environment:
#	PKGS         packages to test (default: the module's, but internal/third_party/raft)
#	GOTESTFLAGS  extra flags for go test, e.g. GOTESTFLAGS="-run TestRaft -v"
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# Cluster tests open many sockets and bbolt files. Raise the open-file limit
# to 65536, or as far as the hard limit allows.
if [[ "$(ulimit -n)" != unlimited && "$(ulimit -n)" -lt 65536 ]]; then
	ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi

# own_packages lists the module's packages but the hashicorp/raft copy in
# internal/third_party/raft, whose upstream suite hack/raft-fork-test.sh runs (with
# its retries for that suite's timing-sensitive tests).
own_packages() { go list ./... | grep -v '/third_party/'; }

# go_files lists the module's hand-written .go files: generated files (marked
# "// Code generated ... DO NOT EDIT.") and testdata are left out.
go_files() {
	find . \( -path ./.git -o -path ./bin -o -path ./build -o -path ./data -o -name testdata -o -name vendor \) -prune \
		-o -type f -name '*.go' -print |
		sort |
		while IFS= read -r f; do
			grep -qE '^// Code generated .* DO NOT EDIT\.$' "$f" || printf '%s\n' "$f"
		done
}

# check_format fails on a hand-written file gofmt -s would change.
check_format() {
	local files unformatted
	mapfile -t files < <(go_files)
	if ((${#files[@]} > 0)); then
		unformatted="$(gofmt -s -l "${files[@]}")"
		if [[ -n "$unformatted" ]]; then
			printf '%s\n' "$unformatted" >&2
			fail "the files above are not gofmt-formatted; run: gofmt -s -w <file>"
		fi
	fi
}

# `hack/test.sh check` (make check) is the inner loop: formatting, vet and
# the -short tests, which skip whatever starts clusters, processes,
# Kubernetes or containers. It needs no tools beyond Go.
if [[ "${1:-}" == check ]]; then
	step "gofmt"
	check_format
	step "go vet"
	mapfile -t own < <(own_packages)
	go vet "${own[@]}"
	step "go test -short"
	go test -short -count=1 "${own[@]}"
	step "ok"
	exit 0
fi

step "tools"
tools_bin="$(hack/tools.sh)"
export PATH="$tools_bin:$PATH"

# envtest's kube-apiserver and etcd, and kube-controller-manager for the
# drift tests' real controllers, built once from the Go module proxy and
# cached under ~/.cache/kubeenv (several minutes the first time on 2 cores).
step "kube-apiserver, etcd and kube-controller-manager for the Kubernetes tests"
KUBEBUILDER_ASSETS="$(hack/kube-bins.sh)"
export KUBEBUILDER_ASSETS

# Headless Chromium for the console's browser tests (chromedp), from
# Debian's chromium package. Its absence fails nothing here: POLICYD_CHROMIUM
# is then empty and those tests skip, saying why.
step "chromium for the console's browser tests"
POLICYD_CHROMIUM="$(hack/chromium.sh)" || true
export POLICYD_CHROMIUM

step "go mod download"
go mod download

step "go.mod is tidy"
if ! go mod tidy -diff >&2; then
	fail "go.mod/go.sum are not tidy; run: go mod tidy"
fi

# The generated code is committed, so regenerate it and see whether anything
# under api/ (protobuf code, the Kubernetes types' deep copies) or
# deploy/kubernetes/crds/ (the CRDs controller-gen makes of those types)
# changed. This runs before vet and lint, whose errors would
# otherwise be the first sign of stale or missing generated code. It compares
# checksums taken before and after rather than asking git alone, so it works
# the same in a fresh clone, in a checkout whose api/ files are not committed
# yet, and without .git at all.
step "generated code is up to date"
generated=(api deploy/kubernetes/crds)
api_snapshot() { find "${generated[@]}" -type f | LC_ALL=C sort | xargs sha256sum; }
before="$(api_snapshot)"
go generate ./api/...
after="$(api_snapshot)"
if [[ "$before" != "$after" ]]; then
	diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") >&2 || true
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git status --porcelain -- "${generated[@]}" >&2 || true
	fi
	printf '%s\n' "The generated code in api/ or deploy/kubernetes/crds/ did not match its sources" \
		"(the .proto files, the kubebuilder markers of api/kubernetes)." \
		"It has been regenerated (protoc $(protoc --version | awk '{print $2}')); review and commit it." \
		"The files record the protoc version, so a protoc other than Debian 12's 3.21.12 also fails here." >&2
	fail "generated code out of date"
fi

step "gofmt"
check_format

step "go vet"
mapfile -t own < <(own_packages)
go vet "${own[@]}"

step "golangci-lint"
golangci-lint run ./...

step "go test"
if [[ -n "${PKGS:-}" ]]; then
	read -ra pkgs <<<"$PKGS"
else
	pkgs=("${own[@]}")
fi
read -ra testflags <<<"${GOTESTFLAGS:-}"
go test -race -count=1 -timeout 20m "${testflags[@]}" "${pkgs[@]}"

# The chaos suite ran above on the default log store (raft-wal); the
# porcupine-checked history must also hold on raft-boltdb, which existing
# data dirs keep.
step "chaos suite on the boltdb log store"
if [[ -z "${PKGS:-}" ]]; then
	go test -race -count=1 -timeout 20m "${testflags[@]}" -run '^TestChaos$' ./tests/chaos -chaos.log-store=boltdb
else
	echo "skipped: PKGS is set" >&2
fi

# The race detector randomises which runnable goroutine runs next, so tests
# that measure what the scheduler's hand-off does skip under -race and run
# here without it; so does the Kubernetes source's bound on how soon 1,000
# statuses are final, which the detector's slowdown would blunt.
step "go test without -race: scheduling and timing bounds"
if [[ -z "${PKGS:-}" ]]; then
	go test -count=1 -run '^TestPushBatchesStreamsOfAConnection$' ./internal/server/discovery
	go test -count=1 -run '^TestThousandObjectsReachFinalStatusThenRest$' ./internal/sources/kube
else
	echo "skipped: PKGS is set" >&2
fi

# internal/third_party/raft is left out above: its upstream suite runs here.
step "hashicorp/raft fork: upstream's tests, with the parallel leader append"
if [[ -z "${PKGS:-}" ]]; then
	hack/raft-fork-test.sh
else
	echo "skipped: PKGS is set" >&2
fi

step "ok"
