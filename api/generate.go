// Package api holds policyd's protobuf contracts and the generated Go code,
// which is committed. Regenerate with `go generate ./...` (or `make generate`):
// protoc comes from Debian's protobuf-compiler, the plugins from
// `hack/tools.sh`, at the versions pinned in hack/tools/go.mod.
package api

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative command/v1/command.proto command/v1/rollout.proto command/v1/reload.proto command/v1/drift.proto command/v1/source.proto command/v1/body.proto cluster/v1/cluster.proto discovery/v1/discovery.proto
