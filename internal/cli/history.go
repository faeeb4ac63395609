package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"

	"github.com/policyd/policyd/server/adminapi"
)

func init() { resourceExtras = append(resourceExtras, historyCommands) }

// do sends a request through the API client and decodes the answer into
// out.
func (c *adminClient) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) error {
	api, err := c.client()
	if err != nil {
		return err
	}
	return api.Do(ctx, method, path, hdr, body, out)
}

// historyCommands builds history, diff and revert for one resource: the
// revisions its event log still holds (issue 30). Their reads are
// consistent (a read index through the leader): an operator comparing or
// reverting revisions must see the latest.
func historyCommands(c *adminClient, r resource) []*cobra.Command {
	base := "/v1/" + r.plural + "/"
	arg := strings.ToUpper(r.key)

	history := &cobra.Command{
		Use: "history " + arg, Short: "List the revisions of a " + r.noun + " the event log still holds", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var h adminapi.History
			if err := c.do(cmd.Context(), http.MethodGet, base+url.PathEscape(args[0])+"/history?consistent=true", nil, nil, &h); err != nil {
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
			key := base + url.PathEscape(args[0])
			toName := strconv.FormatUint(to, 10)
			var b []byte
			var err error
			if to == 0 {
				// The current revision; a deleted entity has none.
				b, err = c.canonical(cmd, key+"?consistent=true")
				toName = "current"
			} else {
				b, err = c.canonical(cmd, key+"/revisions/"+strconv.FormatUint(to, 10)+"?consistent=true")
			}
			if err != nil {
				return err
			}
			a, err := c.canonical(cmd, key+"/revisions/"+strconv.FormatUint(from, 10)+"?consistent=true")
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
			key := base + url.PathEscape(args[0])
			req := adminapi.RevertRequest{To: revertTo}
			if ifMatch >= 0 {
				v := uint64(ifMatch)
				req.IfMatch = &v
			}
			body, err := json.Marshal(req)
			if err != nil {
				return err
			}
			var out struct {
				Revision uint64 `json:"revision"`
			}
			if err := c.do(cmd.Context(), http.MethodPost, key+"/revert?consistent=true", nil, body, &out); err != nil {
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

// canonical fetches an entity's JSON from path and returns it indented
// with sorted keys, without the fields every write changes (revision and
// timestamps), so that a diff shows the content.
func (c *adminClient) canonical(cmd *cobra.Command, path string) ([]byte, error) {
	var m map[string]any
	if err := c.do(cmd.Context(), http.MethodGet, path, nil, nil, &m); err != nil {
		return nil, err
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
