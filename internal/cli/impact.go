package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// impactCommand is `policy impact -f DRAFT`: what a change set would have
// decided differently over the logged decisions (docs/decisions.md).
func impactCommand(c *adminClient) *cobra.Command {
	var (
		file string
		req  adminclient.ImpactRequest
		tout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "impact -f CHANGES [--since 24h]",
		Short: "Replay the logged decisions under draft policy changes, before they ship",
		Long: `impact replays, on every node, the decisions logged since --since of the
identities CHANGES affects (policy documents to put and {delete: NAME}
documents, as rollout start takes), under their current policies and under
the policies with the changes, and counts per org and team how many flip
from allow to deny and from deny to allow, with examples. Nothing is
changed. A draft that does not validate is refused with the field at fault.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &usageError{errors.New("-f CHANGES is required")}
			}
			changes, err := readChanges(file)
			if err != nil {
				return err
			}
			req.Changes = changes
			if tout != 0 {
				req.Timeout = tout.String()
			}
			api, err := c.client()
			if err != nil {
				return err
			}
			rep, err := api.Impact(cmd.Context(), req)
			if err != nil {
				return err
			}
			return c.print(cmd, rep, func(w io.Writer) error { return impactTable(w, rep) })
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the changes: policy documents (puts) and {delete: NAME} documents, YAML or JSON; - for stdin")
	f.StringVar(&req.Since, "since", "24h", "replay the decisions logged since: a duration back from now or an RFC 3339 time")
	f.StringVar(&req.Org, "org", "", "only the decisions of this org")
	f.StringVar(&req.Team, "team", "", "only the decisions of this team (with --org)")
	f.IntVar(&req.MaxExamples, "max-examples", 0, "examples per team and flip (default 20, at most 100)")
	f.DurationVar(&tout, "timeout", 0, "stop the replay after this long (default 1m, at most 10m)")
	return cmd
}

func impactTable(w io.Writer, rep *adminclient.ImpactReport) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ORG\tTEAM\tEVALUATED\tALLOW→DENY\tDENY→ALLOW\tUNCHANGED\tERRORS")
	for _, t := range rep.Teams {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", cell(t.Org), cell(t.Team), t.Evaluated, t.AllowToDeny, t.DenyToAllow, t.Unchanged, t.Errors)
	}
	tt := rep.Totals
	fmt.Fprintf(tw, "TOTAL\t\t%d\t%d\t%d\t%d\t%d\n", tt.Evaluated, tt.AllowToDeny, tt.DenyToAllow, tt.Unchanged, tt.Errors)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "allow→deny ratio %.4f; %d records scanned, %d evaluated with masked fields, %d decisions not logged (sampled out or dropped)\n",
		rep.AllowToDenyRatio, rep.Scanned, rep.Masked, rep.Unrecorded)
	if rep.Oldest != nil {
		fmt.Fprintf(w, "oldest decision replayed: %s (asked since %s)\n", rep.Oldest.Format(time.RFC3339), rep.Since.Format(time.RFC3339))
	}
	for _, t := range rep.Teams {
		for _, ex := range []struct {
			what string
			recs []adminclient.DecisionRecord
		}{{"allow→deny", t.AllowToDenyExamples}, {"deny→allow", t.DenyToAllowExamples}} {
			if len(ex.recs) == 0 {
				continue
			}
			fmt.Fprintf(w, "\n%s examples of %s/%s:\n", ex.what, cell(t.Org), cell(t.Team))
			if err := decisionsTable(w, ex.recs, true); err != nil {
				return err
			}
		}
	}
	if len(rep.CutOff) > 0 {
		fmt.Fprintf(w, "cut off (the replay ran out of time; counts are partial): %v\n", rep.CutOff)
	}
	return printMissing(w, rep.Unavailable)
}
