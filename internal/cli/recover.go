package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/server/raftnode"
)

func recoverCommand() *cobra.Command {
	var peersFile string
	cmd := &cobra.Command{
		Use:   "recover --peers-file FILE",
		Short: "Recover a stopped node from the loss of quorum by rewriting its Raft configuration (offline)",
		Long: `recover rewrites the Raft configuration of a STOPPED node to the servers listed
in --peers-file, using hashicorp/raft's RecoverCluster, so that a cluster that
lost its quorum for good can elect a leader again. Run it on every surviving
node with the same peers file, then start them.

The peers file is a JSON array naming every server of the recovered cluster,
this node included:

  [
    {"id": "node1", "address": "10.0.0.1:7000"}
  ]

The node's data directory and ID come from the same config file and flags as
serve (--config, --data-dir, --node-id). Every entry in this node's Raft log is
applied, including entries the old cluster may never have committed: they are
committed by the recovery. See docs/operations.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if peersFile == "" {
				return &usageError{errors.New("recover needs --peers-file FILE (a JSON array of {\"id\", \"address\"})")}
			}
			cfg, err := config.Load("", os.Environ(), cmd.Flags())
			if err != nil {
				return err
			}
			servers, err := readPeersFile(peersFile, cfg)
			if err != nil {
				return err
			}
			format, err := outputOf(cmd)
			if err != nil {
				return err
			}
			return recoverNode(cfg, servers, format, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&peersFile, "peers-file", "", "JSON array of the recovered cluster's servers: [{\"id\": ..., \"address\": \"host:port\"}]")
	return cmd
}

// peerEntry is one server in a peers file.
type peerEntry struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// readPeersFile reads a peers file and checks it with the rules raft.peers
// follows in the config file (valid IDs, dialable distinct addresses, this
// node among them).
func readPeersFile(path string, cfg config.Config) ([]config.Peer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read peers file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var entries []peerEntry
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("peers file %s: want a JSON array of {\"id\", \"address\"}: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("peers file %s: data after the JSON array", path)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("peers file %s: no servers; list at least this node", path)
	}
	peers := make([]config.Peer, len(entries))
	for i, e := range entries {
		peers[i] = config.Peer{ID: e.ID, Address: e.Address}
	}
	if err := checkPeers(cfg, peers); err != nil {
		return nil, fmt.Errorf("peers file %s: %w", path, err)
	}
	return peers, nil
}

// checkPeers validates a new cluster configuration with config's raft.peers
// rules, as if this node bootstrapped from it.
func checkPeers(cfg config.Config, peers []config.Peer) error {
	if cfg.NodeID == "" {
		return &usageError{errors.New("node_id is required (--node-id or the config file): the new configuration must name this node")}
	}
	probe := cfg
	probe.Raft.Peers = peers
	probe.Raft.Bootstrap = true
	if err := probe.Validate(); err != nil {
		return fmt.Errorf("checked as raft.peers: %w", err)
	}
	return nil
}

// recoverNode rewrites a stopped node's Raft configuration to servers
// (raftnode.Recover) and says what it did, as text or in format.
func recoverNode(cfg config.Config, servers []config.Peer, format string, out, logOut io.Writer) error {
	r, err := raftnode.Recover(cfg, servers, logOut)
	if err != nil {
		return err
	}
	v := struct {
		NodeID        string              `json:"node_id"`
		AppliedIndex  uint64              `json:"applied_index"`
		PreviousIndex uint64              `json:"previous_applied_index"`
		Digest        string              `json:"digest"`
		Servers       []map[string]string `json:"servers"`
	}{cfg.NodeID, r.Applied, r.Before, r.Digest, peerList(servers)}
	return printValue(out, format, v, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "recovered node %s: state at applied index %d (was %d), digest %s\nnew configuration: %s\nstart the node; it elects a leader once a majority of these servers run\n",
			cfg.NodeID, r.Applied, r.Before, r.Digest, formatServers(servers))
		return err
	})
}

func formatServers(servers []config.Peer) string {
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = s.ID + "=" + s.Address
	}
	return strings.Join(ids, ", ")
}
