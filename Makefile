# policyd's developer entry points. `make test` is the project's test command
# (CI runs it through .ci/run); the work lives in hack/test.sh.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

# VERSION is stamped into the binary (buildinfo.version) and tags the image.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VERSION := $(VERSION)

# BIN is where `make build` writes the binary.
BIN ?= bin/policyd

# How long `make fuzz` runs each fuzz target.
FUZZTIME ?= 30s

GO_LDFLAGS := -s -w -X github.com/policyd/policyd/internal/buildinfo.version=$(VERSION)

# TOOLS puts protoc, the protoc plugins and golangci-lint on PATH; it fails
# the recipe if hack/tools.sh fails.
TOOLS = tools_bin="$$(hack/tools.sh)" && export PATH="$$tools_bin:$$PATH" &&

.PHONY: all build run check test lint generate fuzz image clean bench

all: build

build:
	CGO_ENABLED=0 go build -trimpath -ldflags "$(GO_LDFLAGS)" -o $(BIN) ./cmd/policyd

run: build
	$(abspath $(BIN)) serve

# check is the inner loop (gofmt, vet, the -short tests; about a minute on
# 2 cores with a warm cache); test is the whole suite CI runs.
check:
	hack/test.sh check

test:
	hack/test.sh

lint:
	$(TOOLS) golangci-lint run ./...

generate:
	$(TOOLS) go generate ./...

# bench runs bench's standard set (DESIGN part 10; etcd side by side,
# propagation, idle memory, failover) against bin/policyd in under 10
# minutes, and writes every figure with the machine's description to
# bench/results/latest.json. The figures only compare within one run: run
# it on an otherwise idle machine. See docs/performance.md.
bench: build
	mkdir -p bench/results
	go run ./bench suite -binary $(BIN) -results bench/results/latest.json

# fuzz runs every fuzz target in the module for FUZZTIME, one at a time
# (go test -fuzz accepts only one target per run).
fuzz:
	@found=0; \
	for file in $$(grep -rl '^func Fuzz' --include='*_test.go' . | LC_ALL=C sort); do \
		pkg="$$(dirname "$$file")"; \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$file"); do \
			found=1; \
			echo "==> fuzz $$target in $$pkg for $(FUZZTIME)" >&2; \
			go test -run='^$$' -fuzz="^$$target$$" -fuzztime=$(FUZZTIME) "$$pkg"; \
		done; \
	done; \
	if [[ $$found == 0 ]]; then echo "no fuzz targets found" >&2; fi

# image builds a scratch image from a static binary and the few files it
# needs in build/ (build/data is an empty directory that becomes /data, owned
# by the policyd user); see the Dockerfile for a multi-stage variant.
image:
	rm -rf build/data && mkdir -p build/data
	CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "$(GO_LDFLAGS)" -o build/policyd ./cmd/policyd
	printf '%s\n' 'policyd:x:65532:65532::/data:/sbin/nologin' >build/passwd
	printf '%s\n' 'policyd:x:65532:' >build/group
	cp /etc/ssl/certs/ca-certificates.crt build/ca-certificates.crt
	docker build -t policyd:$(VERSION) -t policyd:latest .

# COMPOSE is the docker compose v2 plugin when present, else docker-compose v1.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/compose/docker-compose.yml

.PHONY: compose-up compose-down

# compose-up builds the image and starts the 3-node cluster and its sidecar
# (deploy/compose); the admin APIs are on 127.0.0.1:18081-18083.
compose-up: image
	POLICYD_IMAGE=policyd:$(VERSION) $(COMPOSE) -p policyd -f $(COMPOSE_FILE) up -d
	$(COMPOSE) -p policyd -f $(COMPOSE_FILE) ps

# compose-down stops the compose cluster and deletes its volumes.
compose-down:
	$(COMPOSE) -p policyd -f $(COMPOSE_FILE) down -v --remove-orphans

clean:
	rm -rf bin build
