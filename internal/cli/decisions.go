package cli

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
)

// decisionsCommand is `policyd decisions`: the cluster's decision logs
// (docs/decisions.md).
func decisionsCommand(c *adminClient) *cobra.Command {
	cmd := groupCommand("decisions", "Read the decisions the sidecars logged, from every node")
	cmd.AddCommand(decisionsListCommand(c), decisionsTailCommand(c))
	return cmd
}

// decisionFlags are the filters list and tail share.
type decisionFlags struct {
	f            adminclient.DecisionFilter
	since, until string
}

func (d *decisionFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&d.f.Org, "org", "", "only decisions of this org")
	fl.StringVar(&d.f.Team, "team", "", "only decisions of this team")
	fl.StringVar(&d.f.Employee, "employee", "", "only decisions of this employee")
	fl.StringVar(&d.f.Policy, "policy", "", "only decisions this policy made")
	fl.StringVar(&d.f.Result, "result", "", "only allow or deny")
	fl.StringVar(&d.since, "since", "", "only decisions after this: a duration back from now (1h) or an RFC 3339 time")
}

// filter resolves the flags' times against now.
func (d *decisionFlags) filter(now time.Time) (adminclient.DecisionFilter, error) {
	f := d.f
	var err error
	if f.Since, err = flagTime("since", d.since, now); err != nil {
		return f, err
	}
	if f.Until, err = flagTime("until", d.until, now); err != nil {
		return f, err
	}
	return f, nil
}

// flagTime reads a duration back from now or an RFC 3339 time.
func flagTime(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if dur, err := time.ParseDuration(v); err == nil && dur > 0 {
		return now.Add(-dur), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, &usageError{fmt.Errorf("--%s: %q is neither a duration such as 1h nor an RFC 3339 time", name, v)}
	}
	return t, nil
}

func decisionsListCommand(c *adminClient) *cobra.Command {
	var d decisionFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List logged decisions, newest first, merged from every node",
		Long: `list prints one page of decisions, newest first. --cursor takes the
cursor a page printed, for the next (older) page. Nodes that did not
answer are named: their decisions are missing from the page.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			f, err := d.filter(time.Now())
			if err != nil {
				return err
			}
			page, err := api.Decisions(cmd.Context(), f)
			if err != nil {
				return err
			}
			return c.print(cmd, page, func(w io.Writer) error {
				if err := decisionsTable(w, page.Records, true); err != nil {
					return err
				}
				if page.Cursor != "" {
					fmt.Fprintf(w, "more: --cursor %s\n", page.Cursor)
				}
				return printMissing(w, page.Unavailable)
			})
		},
	}
	d.register(cmd)
	cmd.Flags().StringVar(&d.until, "until", "", "only decisions before this: a duration back from now or an RFC 3339 time")
	cmd.Flags().IntVar(&d.f.Limit, "limit", 50, "decisions per page, at most 1000")
	cmd.Flags().StringVar(&d.f.Cursor, "cursor", "", "the page after the one that printed this cursor")
	return cmd
}

func decisionsTailCommand(c *adminClient) *cobra.Command {
	var d decisionFlags
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow logged decisions as the nodes receive them",
		Long: `tail prints the newest decisions, then asks every --interval for those
stamped later than the last printed, oldest first, until interrupted. A
sidecar that ships late (after a disconnection) may log decisions stamped
earlier than what tail has printed: list shows them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			if interval < 100*time.Millisecond {
				return &usageError{fmt.Errorf("--interval: %v is below 100ms", interval)}
			}
			f, err := d.filter(time.Now())
			if err != nil {
				return err
			}
			f.Limit = 100
			w := cmd.OutOrStdout()
			var last time.Time
			seen := map[string]bool{} // the records printed at time last
			header := true
			for {
				page, err := api.Decisions(cmd.Context(), f)
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				var fresh []adminclient.DecisionRecord
				for i := len(page.Records) - 1; i >= 0; i-- { // oldest first
					r := page.Records[i]
					k := decisionID(r)
					if r.Time.Before(last) || (r.Time.Equal(last) && seen[k]) {
						continue
					}
					if !r.Time.Equal(last) {
						last, seen = r.Time, map[string]bool{}
					}
					seen[k] = true
					fresh = append(fresh, r)
				}
				if len(fresh) > 0 {
					if err := decisionsTable(w, fresh, header); err != nil {
						return err
					}
					header = false
				}
				if !last.IsZero() {
					f.Since = last
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	d.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often to ask")
	return cmd
}

// decisionID tells apart records stamped at the same time.
func decisionID(r adminclient.DecisionRecord) string {
	return strings.Join([]string{r.Node, r.ClientAddress, r.Employee, r.Request.Tool, r.Policy, r.Reason, fmt.Sprint(r.Allowed, r.LatencyUS)}, "\x00")
}

func decisionsTable(w io.Writer, recs []adminclient.DecisionRecord, header bool) error {
	tw := newTable(w)
	if header {
		fmt.Fprintln(tw, "TIME\tNODE\tSCOPE\tCLIENT\tTOOL\tRESULT\tPOLICY\tREASON")
	}
	for _, r := range recs {
		result := "deny"
		if r.Allowed {
			result = "allow"
		}
		what := r.Request.Tool
		if what == "" && r.Request.HTTP != nil {
			what = fmt.Sprintf("%v %v", r.Request.HTTP["method"], r.Request.HTTP["path"])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.UTC().Format(time.RFC3339Nano), cell(r.Node),
			cell(r.Org+"/"+r.Team+"/"+r.Employee), cell(r.ClientAddress), cell(what), result, cell(r.Policy), cell(r.Reason))
	}
	return tw.Flush()
}

// cell makes a sidecar's text safe for a table row: no control characters
// (a recorded tool name could hold terminal escapes), no tabs, and at most
// 80 characters.
func cell(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) > 80 {
		s = string([]rune(s)[:79]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

// printMissing names the nodes whose decisions a page lacks.
func printMissing(w io.Writer, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "unreachable nodes (their decisions are missing): %s\n", strings.Join(nodes, ", "))
	return err
}
