package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// historyCommands builds history, diff and revert for one resource: the
// revisions its event log still holds. Their reads are consistent (a read
// index through the leader): an operator comparing or reverting revisions
// must see the latest.
func historyCommands(c *adminClient, r resource) []*cobra.Command {
	arg := strings.ToUpper(r.key)

	history := &cobra.Command{
		Use: "history " + arg, Short: "List the revisions of a " + r.noun + " the event log still holds", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			h, err := api.History(cmd.Context(), r.plural, args[0], true)
			if err != nil {
				return err
			}
			return printValue(cmd.OutOrStdout(), c.output, h, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "REVISION\tTIME\tACTION\tACTOR\tREQUEST ID\tNOTE")
				for _, rv := range h.Revisions {
					note := ""
					if rv.RevertedTo != 0 {
						note = fmt.Sprintf("revert to %d", rv.RevertedTo)
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", rv.Revision, rv.Time.Format(time.RFC3339), rv.Action,
						orDash(rv.Actor), orDash(rv.RequestID), note)
				}
				return tw.Flush()
			})
		},
	}

	var from, to uint64
	diff := &cobra.Command{
		Use: "diff " + arg + " --from R1 [--to R2]", Short: "Show the change between two revisions of a " + r.noun + " as a unified diff", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from == 0 {
				return &usageError{errors.New("diff needs --from REVISION")}
			}
			api, err := c.client()
			if err != nil {
				return err
			}
			toName := strconv.FormatUint(to, 10)
			if to == 0 {
				// The current revision; a deleted entity has none.
				toName = "current"
			}
			b, err := canonical(cmd.Context(), api, r.plural, args[0], to)
			if err != nil {
				return err
			}
			a, err := canonical(cmd.Context(), api, r.plural, args[0], from)
			if err != nil {
				return err
			}
			text, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
				A: difflib.SplitLines(string(a)), B: difflib.SplitLines(string(b)),
				FromFile: fmt.Sprintf("%s/%s@%d", r.noun, args[0], from),
				ToFile:   fmt.Sprintf("%s/%s@%s", r.noun, args[0], toName),
				Context:  3,
			})
			if err != nil {
				return fmt.Errorf("diff: %w", err)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), text)
			return err
		},
	}
	diff.Flags().Uint64Var(&from, "from", 0, "the older revision")
	diff.Flags().Uint64Var(&to, "to", 0, "the newer revision (default: the current one)")

	var revertTo uint64
	var ifMatch int64
	revert := &cobra.Command{
		Use: "revert " + arg + " --to R", Short: "Write revision R of a " + r.noun + " back as a new revision", Args: cobra.ExactArgs(1),
		Long: "Write revision R's content back as a new revision, recorded as a revert by you. " +
			"The write is compare-and-set on the revision current when the command starts (or --if-match): " +
			"if another write lands in between, it fails with 409 and nothing is written.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if revertTo == 0 {
				return &usageError{errors.New("revert needs --to REVISION")}
			}
			req := adminclient.RevertRequest{To: revertTo}
			if ifMatch >= 0 {
				v := uint64(ifMatch)
				req.IfMatch = &v
			}
			api, err := c.client()
			if err != nil {
				return fmt.Errorf("%s/%s: %w", r.noun, args[0], err)
			}
			out, err := api.Revert(cmd.Context(), r.plural, args[0], req)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", r.noun, args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s reverted to revision %d (new revision %d)\n", r.noun, args[0], revertTo, out.Revision)
			return nil
		},
	}
	revert.Flags().Uint64Var(&revertTo, "to", 0, "the revision to write back")
	revert.Flags().Int64Var(&ifMatch, "if-match", -1, "only revert if the current revision is this (0: the "+r.noun+" is deleted); default: the current one")
	return []*cobra.Command{history, diff, revert}
}

// canonical fetches revision rev of key (0: the current one) and returns
// it indented with sorted keys, without the fields every write changes
// (revision and timestamps), so that a diff shows the content.
func canonical(ctx context.Context, api *adminclient.Client, collection, key string, rev uint64) ([]byte, error) {
	raw, err := api.Document(ctx, collection, key, rev, true)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode %s/%s: %w", collection, key, err)
	}
	for _, f := range []string{"revision", "created_at", "updated_at"} {
		delete(m, f)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
