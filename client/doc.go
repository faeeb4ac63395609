// Package client is the Go SDK for sidecars and agent proxies. It keeps
// the policies that apply to one identity in memory (never on disk),
// follows a policyd cluster over the discovery stream or the WebSocket feed
// with failover and jittered backoff, and answers "may this tool call run?"
// (IsBlocked, Evaluate) without locks on the hot path. It fails closed:
// connecting, past its grace, revoked or stopped, it blocks everything. It
// does not enforce anything itself; the caller acts on its answers. It can
// record decisions, masked, in a bounded buffer (Config.DecisionLog). The
// states, transports and policy semantics are in docs/sidecars.md.
package client
