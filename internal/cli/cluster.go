package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

func clusterCommand(c *adminClient) *cobra.Command {
	root := groupCommand("cluster", "Inspect and change cluster membership")
	status := &cobra.Command{
		Use: "status", Short: "Show members, leader, term and applied index", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			st, err := api.Cluster(cmd.Context())
			if err != nil {
				return err
			}
			return c.print(cmd, st, func(w io.Writer) error { return printClusterStatus(w, st) })
		},
	}
	var id, raftAddr string
	join := &cobra.Command{
		Use: "join --id ID --raft-addr HOST:PORT", Short: "Add a node (started with raft.bootstrap: false) as a voter", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" || raftAddr == "" {
				return &usageError{errors.New("join needs --id and --raft-addr")}
			}
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := api.Join(cmd.Context(), adminclient.JoinRequest{ID: id, RaftAddr: raftAddr})
			if err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "node %s joined (index %d)\n", out.ID, out.Index)
				return err
			})
		},
	}
	join.Flags().StringVar(&id, "id", "", "node id of the joining node")
	join.Flags().StringVar(&raftAddr, "raft-addr", "", "Raft address of the joining node")
	remove := &cobra.Command{
		Use: "remove ID", Short: "Remove a node from the cluster", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := api.Remove(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "node %s removed (index %d)\n", out.ID, out.Index)
				return err
			})
		},
	}
	transfer := &cobra.Command{
		Use:   "transfer-leader [ID]",
		Short: "Hand leadership to voter ID, or to the most up-to-date voter",
		Long: `transfer-leader asks the leader (found through --server) to hand leadership
over, as before maintenance on its machine. Without ID raft picks the voter
most caught up. It returns once the transfer is done.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			target := ""
			if len(args) == 1 {
				target = args[0]
			}
			out, err := api.TransferLeader(cmd.Context(), target)
			if err != nil {
				return err
			}
			return c.print(cmd, out, func(w io.Writer) error {
				to := out.To
				if to == "" {
					to = "(not yet known)"
				}
				_, err := fmt.Fprintf(w, "leadership transferred from %s to %s\n", out.From, to)
				return err
			})
		},
	}
	root.AddCommand(status, join, remove, transfer)
	return root
}

// printClusterStatus is the table of cluster status.
func printClusterStatus(out io.Writer, st *adminclient.ClusterStatus) error {
	// The command version shows a rolling upgrade's progress: 1 while any
	// member runs a release that reads only JSON commands.
	fmt.Fprintf(out, "cluster %s\nnode %s (%s), leader %s, term %d, commit %d, applied %d\ndigest %s\ncommand version %d\n\n",
		st.ClusterID, st.NodeID, st.State, st.LeaderID, st.Term, st.CommitIndex, st.AppliedIndex, st.Digest, st.CommandVersion)
	tw := newTable(out)
	fmt.Fprintln(tw, "ID\tRAFT\tHTTP\tGRPC\tSUFFRAGE\tLEADER\tCOMMAND_VERSION")
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%d\n", m.ID, m.RaftAddr, m.HTTPAddr, m.GRPCAddr, m.Suffrage, m.Leader, m.CommandVersion)
	}
	return tw.Flush()
}
