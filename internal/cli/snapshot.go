package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/store"
)

func snapshotCommand(c *adminClient) *cobra.Command {
	root := groupCommand("snapshot", "Back up a node's state and restore it (disaster recovery)")

	consistent := true
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Save a consistent copy of the replicated state from a running node (--server) to FILE",
		Long: `save downloads GET /v1/snapshot from --server (admin token needed): one
consistent copy of the node's state database, taken in a single read
transaction while writes go on. With --consistent (the default) the node first
catches up with every write the cluster acknowledged; pass --consistent=false
to save from a node that has lost its quorum. The file is verified (it must
open as a policyd state database at the announced index) before it replaces
FILE.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return saveSnapshot(cmd, c, args[0], consistent)
		},
	}
	save.Flags().BoolVar(&consistent, "consistent", true, "first wait until the node holds every write the cluster acknowledged")

	var peersFile string
	var force bool
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Make a STOPPED node's data directory a new cluster holding FILE's state (offline)",
		Long: `restore turns a stopped node's data directory into the first state of a new
Raft cluster holding the state saved in FILE. The servers of the new cluster
are, in order of preference: --peers-file (the JSON format of recover),
raft.peers from the config, or this node alone. Run it with the same FILE and
servers on every node of the new cluster, then start them all; or restore one
node alone and join fresh nodes to it, which receive the state from it.

The new cluster's history starts 2^32 entries after the backup's index, with
earlier events marked as pruned: sidecars and event readers that hold an
index of the lost cluster start over from a full state instead of being
replayed the new history on top of theirs.

The node is named by the same config file and flags as serve (--config,
--data-dir, --node-id); node_id is required. Existing state in the data
directory is refused unless --force, which moves it to
<data_dir>/pre-restore-<time>/ rather than deleting it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load("", os.Environ(), cmd.Flags())
			if err != nil {
				return err
			}
			servers := cfg.Raft.Peers
			switch {
			case peersFile != "":
				if servers, err = readPeersFile(peersFile, cfg); err != nil {
					return err
				}
			case len(servers) == 0:
				servers = []config.Peer{{ID: cfg.NodeID, Address: cfg.RaftAdvertise()}}
				if err := checkPeers(cfg, servers); err != nil {
					return err
				}
			default:
				if err := checkPeers(cfg, servers); err != nil {
					return err
				}
			}
			format, err := outputOf(cmd)
			if err != nil {
				return err
			}
			return restoreSnapshot(cfg, args[0], servers, force, format, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(restore.Flags())
	restore.Flags().StringVar(&peersFile, "peers-file", "", "JSON array of the new cluster's servers (default: raft.peers, else this node alone)")
	restore.Flags().BoolVar(&force, "force", false, "move existing state in the data directory aside instead of refusing")

	inspect := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Verify a saved snapshot (or a stopped node's state.db) and show its applied index and digest",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return inspectSnapshot(cmd, c, args[0])
		},
	}

	root.AddCommand(save, restore, inspect)
	return root
}

// saveSnapshot streams the node's snapshot into a temporary file beside
// path, fsyncs and verifies it, and only then renames it over path.
func saveSnapshot(cmd *cobra.Command, c *adminClient, path string, consistent bool) (err error) {
	api, err := c.client()
	if err != nil {
		return err
	}
	snap, err := api.Snapshot(cmd.Context(), consistent)
	if err != nil {
		return err
	}
	defer snap.Body.Close()

	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*.part")
	if err != nil {
		return fmt.Errorf("create snapshot file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, snap.Body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("receive snapshot from %s: %w", snap.Server, err)
	}
	info, err := store.Inspect(tmp)
	if err != nil {
		return fmt.Errorf("received snapshot does not verify: %w", err)
	}
	if info.AppliedIndex != snap.AppliedIndex {
		return fmt.Errorf("received snapshot is at applied index %d, the server announced %d", info.AppliedIndex, snap.AppliedIndex)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save snapshot: %w", err)
	}
	out := snapshotInfo{File: path, AppliedIndex: info.AppliedIndex, Digest: info.Digest, Bytes: n, Server: snap.Server}
	return c.print(cmd, out, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "saved snapshot at applied index %d (digest %s, %d bytes) to %s\n", info.AppliedIndex, info.Digest, n, path)
		return err
	})
}

// snapshotInfo is what save and inspect print with -o json/yaml.
type snapshotInfo struct {
	File         string `json:"file"`
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
	Bytes        int64  `json:"bytes"`
	Server       string `json:"server,omitempty"`
}

// inspectSnapshot verifies a backup (or a stopped node's state.db) in
// place, read-only, and prints its applied index and digest.
func inspectSnapshot(cmd *cobra.Command, c *adminClient, path string) error {
	if err := checkOutput(c.output); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	info, err := store.Inspect(path)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", path, err)
	}
	out := snapshotInfo{File: path, AppliedIndex: info.AppliedIndex, Digest: info.Digest, Bytes: fi.Size()}
	return c.print(cmd, out, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "%s: policyd state database at applied index %d, digest %s, %d bytes\n", path, info.AppliedIndex, info.Digest, fi.Size())
		return err
	})
}

// restoreSnapshot makes a stopped node's data directory a new cluster
// holding file's state (raftnode.Restore) and says what it did, as text or
// in format.
func restoreSnapshot(cfg config.Config, file string, servers []config.Peer, force bool, format string, out, logOut io.Writer) error {
	r, err := raftnode.Restore(cfg, file, servers, force, logOut)
	if err != nil {
		return err
	}
	v := struct {
		File         string              `json:"file"`
		DataDir      string              `json:"data_dir"`
		AppliedIndex uint64              `json:"applied_index"`
		BackupIndex  uint64              `json:"backup_index"`
		Digest       string              `json:"digest"`
		MovedTo      string              `json:"moved_to,omitempty"`
		Servers      []map[string]string `json:"servers"`
	}{file, cfg.DataDir, r.Applied, r.BackupIndex, r.Digest, r.MovedTo, peerList(servers)}
	return printValue(out, format, v, func(w io.Writer) error {
		fmt.Fprintf(w, "restored %s into %s: applied index %d (the backup's %d + %d, a new history), digest %s\n",
			file, cfg.DataDir, r.Applied, r.BackupIndex, raftnode.RestoreIndexGap, r.Digest)
		if r.MovedTo != "" {
			fmt.Fprintf(w, "previous state moved to %s\n", r.MovedTo)
		}
		_, err := fmt.Fprintf(w, "new cluster: %s\nstart the node (with the same FILE restored on every server listed); raft.bootstrap no longer applies\n", formatServers(servers))
		return err
	})
}
