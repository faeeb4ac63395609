package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/spf13/cobra"

	"github.com/policyd/policyd/config"
	"github.com/policyd/policyd/server/adminapi"
	"github.com/policyd/policyd/store"
)

func snapshotCommand(c *adminClient) *cobra.Command {
	root := &cobra.Command{Use: "snapshot", Short: "Back up a node's state and restore it (disaster recovery)"}

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
			return restoreSnapshot(cfg, args[0], servers, force, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	config.RegisterFlags(restore.Flags())
	restore.Flags().StringVar(&peersFile, "peers-file", "", "JSON array of the new cluster's servers (default: raft.peers, else this node alone)")
	restore.Flags().BoolVar(&force, "force", false, "move existing state in the data directory aside instead of refusing")

	root.AddCommand(save, restore)
	return root
}

// saveSnapshot streams the node's snapshot into a temporary file beside
// path, fsyncs and verifies it, and only then renames it over path.
func saveSnapshot(cmd *cobra.Command, c *adminClient, path string, consistent bool) (err error) {
	q := "/v1/snapshot?consistent=" + strconv.FormatBool(consistent)
	resp, err := c.send(cmd.Context(), http.MethodGet, q, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	wantIndex, err := strconv.ParseUint(resp.Header.Get(adminapi.HeaderAppliedIndex), 10, 64)
	if err != nil {
		return fmt.Errorf("snapshot answer from %s lacks a valid %s header: %w", c.server, adminapi.HeaderAppliedIndex, err)
	}

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
	n, err := io.Copy(f, resp.Body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("receive snapshot from %s: %w", c.server, err)
	}
	info, err := store.Inspect(tmp)
	if err != nil {
		return fmt.Errorf("received snapshot does not verify: %w", err)
	}
	if info.AppliedIndex != wantIndex {
		return fmt.Errorf("received snapshot is at applied index %d, the server announced %d", info.AppliedIndex, wantIndex)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save snapshot: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "saved snapshot at applied index %d (digest %s, %d bytes) to %s\n", info.AppliedIndex, info.Digest, n, path)
	return nil
}

// restoreIndexGap is how far above the backup's index a restored cluster
// starts its history (store.StartHistory): more entries than a cluster
// could have committed after its backup was taken (at 10,000 writes a
// second, five days' worth), and small enough to leave room in a uint64
// for billions of restores.
const restoreIndexGap = 1 << 32

// restoreSnapshot makes a stopped node's data directory the start of a new
// cluster. It writes FILE as state.db, moves it restoreIndexGap entries
// ahead (a new history, see store.StartHistory), and writes beside it a Raft
// snapshot at that index whose configuration is servers. Raft then starts
// from that snapshot (no bootstrap) and numbers new entries after it: the
// state's applied index and the Raft log stay in step, so no new entry is
// mistaken for one already applied.
func restoreSnapshot(cfg config.Config, file string, servers []config.Peer, force bool, out, logOut io.Writer) (err error) {
	info, err := store.Inspect(file)
	if err != nil {
		return fmt.Errorf("restore from %s: %w", file, err)
	}
	if info.AppliedIndex == 0 {
		return fmt.Errorf("restore from %s: the snapshot holds no applied entries", file)
	}
	if err := checkOffline(cfg); err != nil {
		return err
	}
	// Opened before the state is moved aside: FILE may be the node's own
	// state.db, the way out for a node alone whose Raft log is damaged.
	src, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer src.Close()
	moved, err := moveStateAside(cfg.DataDir, force)
	if err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, stateFile), slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	if err := st.Restore(src); err != nil {
		return err
	}
	digest, idx, err := st.Digest()
	if err != nil {
		return err
	}
	if digest != info.Digest || idx != info.AppliedIndex {
		return fmt.Errorf("restored state is at %d (digest %s), the file at %d (digest %s)", idx, digest, info.AppliedIndex, info.Digest)
	}
	// Every server restores the same file, so every one starts the new
	// history at the same index and with the same digest.
	if err := st.StartHistory(idx + restoreIndexGap); err != nil {
		return err
	}
	if digest, idx, err = st.Digest(); err != nil {
		return err
	}

	r, err := openOfflineRaft(cfg, logOut)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	// Term 1, as a freshly bootstrapped cluster's first entries; the
	// configuration counts as committed at the snapshot's index.
	sink, err := r.snaps.Create(raft.SnapshotVersionMax, idx, 1, raftConfiguration(servers), idx, r.trans)
	if err != nil {
		return fmt.Errorf("create raft snapshot: %w", err)
	}
	sn, err := st.Snapshot()
	if err != nil {
		_ = sink.Cancel()
		return err
	}
	_, err = sn.WriteTo(sink)
	sn.Release()
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write raft snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("finish raft snapshot: %w", err)
	}

	fmt.Fprintf(out, "restored %s into %s: applied index %d (the backup's %d + %d, a new history), digest %s\n",
		file, cfg.DataDir, idx, info.AppliedIndex, restoreIndexGap, digest)
	if moved != "" {
		fmt.Fprintf(out, "previous state moved to %s\n", moved)
	}
	fmt.Fprintf(out, "new cluster: %s\nstart the node (with the same FILE restored on every server listed); raft.bootstrap no longer applies\n", formatServers(servers))
	return nil
}

// moveStateAside moves state.db and raft/ into a fresh pre-restore-<time>
// directory, if either exists. Without force, existing state is an error.
func moveStateAside(dataDir string, force bool) (string, error) {
	var present []string
	for _, name := range []string{stateFile, raftDirName} {
		if _, err := os.Stat(filepath.Join(dataDir, name)); err == nil {
			present = append(present, name)
		}
	}
	if len(present) == 0 {
		return "", os.MkdirAll(dataDir, 0o700)
	}
	if !force {
		return "", fmt.Errorf("data_dir %s already holds state (%v): pass --force to move it aside, or use an empty directory", dataDir, present)
	}
	aside := filepath.Join(dataDir, "pre-restore-"+time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Mkdir(aside, 0o700); err != nil {
		return "", fmt.Errorf("move state aside: %w", err)
	}
	for _, name := range present {
		if err := os.Rename(filepath.Join(dataDir, name), filepath.Join(aside, name)); err != nil {
			return "", fmt.Errorf("move %s aside: %w", name, err)
		}
	}
	return aside, nil
}
