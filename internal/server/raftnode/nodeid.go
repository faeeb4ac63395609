package raftnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/server/raftlog"
)

// ResolveNodeID returns the configured ID, or the one persisted in the data
// directory, or (first start, nothing configured) the host name, which it
// then persists: a node whose host name changes (a re-created container)
// must not come back as a stranger to its own cluster. A configured ID that
// differs from the persisted one is refused: the data directory belongs to
// another node.
func ResolveNodeID(configured string, l raftlog.Layout) (string, error) {
	p := l.NodeIDPath()
	raw, err := os.ReadFile(p)
	switch {
	case err == nil:
		persisted := strings.TrimSpace(string(raw))
		if configured != "" && configured != persisted {
			return "", fmt.Errorf("node_id %q does not match %q recorded in %s: this data directory belongs to node %q", configured, persisted, p, persisted)
		}
		if !config.ValidNodeID(persisted) {
			return "", fmt.Errorf("node id %q in %s is not a valid node id", persisted, p)
		}
		return persisted, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read node id %s: %w", p, err)
	}
	id := configured
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("node_id is empty and the host name is unknown: %w", err)
		}
		id = sanitizeHost(host)
	}
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("persist node id to %s: %w", p, err)
	}
	return id, nil
}

// sanitizeHost turns a host name into a node ID: its first label, with
// characters a node ID may not hold dropped, no leading punctuation, and at
// most 63 characters. "node1" if nothing usable is left.
func sanitizeHost(h string) string {
	h, _, _ = strings.Cut(h, ".")
	var b strings.Builder
	for _, r := range h {
		if r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	s := strings.TrimLeft(b.String(), "-_")
	if len(s) > 63 {
		s = s[:63]
	}
	if !config.ValidNodeID(s) {
		return "node1"
	}
	return s
}
