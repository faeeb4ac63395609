package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/buildinfo"
)

// clientsCommand lists the connected sidecars, filtered on the client side
// (GET /v1/clients takes no filters).
func clientsCommand(c *adminClient) *cobra.Command {
	var node, scope, state string
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "List the sidecars connected to every node",
		Long: `clients lists every connected sidecar, cluster-wide. --scope is
org[/team[/employee]] and matches that identity and those under it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			all, err := api.Clients(cmd.Context())
			if err != nil {
				return err
			}
			out := &adminclient.ClientList{Clients: []adminclient.ClientInfo{}, Unreachable: all.Unreachable}
			for _, cl := range all.Clients {
				if (node == "" || cl.Node == node) && (state == "" || cl.State == state) && inScope(cl, scope) {
					out.Clients = append(out.Clients, cl)
				}
			}
			return c.print(cmd, out, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "NODE\tCLIENT\tTRANSPORT\tSCOPE\tVERSION\tSTATE\tLAST_HEALTH_CHECK")
				for _, cl := range out.Clients {
					st := cl.State
					if cl.NackMessage != "" {
						st += ": " + cl.NackMessage
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s/%s\t%s\t%s\t%s\n", cl.Node, cl.ClientAddress, cl.Transport,
						cl.Org, cl.Team, cl.Employee, short(cl.Version), st, cl.LastActive.Format(time.RFC3339))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				return printUnreachable(w, out.Unreachable)
			})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only clients of this node")
	cmd.Flags().StringVar(&scope, "scope", "", "only clients of org[/team[/employee]]")
	cmd.Flags().StringVar(&state, "state", "", "only clients in this state: pending, acked or nacked")
	return cmd
}

// inScope matches a client against org[/team[/employee]].
func inScope(cl adminclient.ClientInfo, scope string) bool {
	if scope == "" {
		return true
	}
	have := []string{cl.Org, cl.Team, cl.Employee}
	for i, want := range strings.SplitN(scope, "/", 3) {
		if want != "" && have[i] != want {
			return false
		}
	}
	return true
}

// short abbreviates a policy-set version (a SHA-256) for tables.
func short(v string) string {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}

func printUnreachable(w io.Writer, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "unreachable nodes (their clients are missing): %s\n", strings.Join(nodes, ", "))
	return err
}

// errRolloutNotDone fails rollout when a NACK is pending or clients have
// not answered.
var errRolloutNotDone = errors.New("rollout not complete")

func rolloutCommand(c *adminClient) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Show which discovery clients acknowledged each policy-set version",
		Long: `rollout shows, per policy-set version, the discovery (gRPC) clients that
ACKed it, NACKed it (with the error) or have not answered. --wait D (up to
5m) waits until every client has answered. Its subcommands start and steer
staged rollouts (docs/rollouts.md).

Exit codes: 0 every client ACKed its version; 1 a NACK is pending or clients
had not answered when the wait ran out; 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ro, err := api.Rollout(cmd.Context(), wait)
			if err != nil {
				return err
			}
			var nacked, pending int
			for _, v := range ro.Versions {
				nacked += len(v.Nacked)
				pending += len(v.Pending)
			}
			err = c.print(cmd, ro, func(w io.Writer) error {
				tw := newTable(w)
				fmt.Fprintln(tw, "VERSION\tDONE\tACKED\tNACKED\tPENDING")
				for _, v := range ro.Versions {
					fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\n", short(v.Version), v.Done, len(v.Acked), len(v.Nacked), len(v.Pending))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, v := range ro.Versions {
					for _, n := range v.Nacked {
						fmt.Fprintf(w, "NACK %s on %s (%s), kept %s: %s\n", n.Client, n.Node, n.Scope, short(n.LastGoodVersion), n.Message)
					}
				}
				return printUnreachable(w, ro.Unreachable)
			})
			if err != nil {
				return err
			}
			switch {
			case nacked > 0:
				return fmt.Errorf("%w: %d NACK(s) pending", errRolloutNotDone, nacked)
			case !ro.Done || pending > 0:
				return fmt.Errorf("%w: %d client(s) have not answered", errRolloutNotDone, pending)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long (at most 5m) for every client to answer")
	cmd.AddCommand(stagedRolloutCommands(c)...)
	return cmd
}

func reloadCommand(c *adminClient) *cobra.Command {
	root := groupCommand("reload", "Inspect the ConfigMap reload controller")
	status := &cobra.Command{
		Use: "status", Short: "Show the controller, its hash cache, queue, last restarts and errors", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			v, err := api.Reload(cmd.Context())
			if err != nil {
				return err
			}
			return c.print(cmd, v, func(w io.Writer) error {
				ct := v.Controller
				fmt.Fprintf(w, "controller %s", ct.State)
				if ct.Reason != "" {
					fmt.Fprintf(w, " (%s)", ct.Reason)
				}
				fmt.Fprintf(w, ", synced %v, namespace %q, selector %q, debounce %s\napplied index %d\n\n", ct.Synced, ct.Namespace, ct.Selector, ct.Debounce, v.AppliedIndex)
				tw := newTable(w)
				fmt.Fprintln(tw, "WHAT\tSCOPE\tCONFIGMAP\tHASH\tAT\tDETAIL")
				for _, h := range v.Cache {
					fmt.Fprintf(tw, "cache\t%s\t%s\t%s\t%s\t\n", h.Scope, h.ConfigMap, short(h.Hash), h.UpdatedAt.Format(time.RFC3339))
				}
				for _, p := range v.Queue {
					fmt.Fprintf(tw, "queued\t%s\t%s\t%s\t%s\t%s, %d attempts %s\n", p.Scope, p.ConfigMap, short(p.Hash), p.DueAt.Format(time.RFC3339), p.Reason, p.Attempts, p.LastError)
				}
				for _, r := range v.Restarts {
					fmt.Fprintf(tw, "restart\t%s\t%s\t%s\t%s\t%s: %s\n", r.Scope, r.ConfigMap, short(r.Hash), r.RestartedAt.Format(time.RFC3339), r.Reason, strings.Join(r.Patched, ","))
				}
				for _, e := range v.Errors {
					fmt.Fprintf(tw, "error\t%s\t%s\t%s\t%s\t%s\n", e.Scope, e.ConfigMap, short(e.Hash), e.FailedAt.Format(time.RFC3339), e.Error)
				}
				return tw.Flush()
			})
		},
	}
	root.AddCommand(status)
	return root
}

func driftCommand(c *adminClient) *cobra.Command {
	root := groupCommand("drift", "Read the drift reports")
	var f adminclient.DriftFilter
	table := func(reports []adminclient.DriftReport) func(io.Writer) error {
		return func(w io.Writer) error {
			tw := newTable(w)
			fmt.Fprintln(tw, "ID\tPHASE\tPAIR\tDELIVERY\tOBSERVATIONS\tLAST_SEEN")
			for _, r := range reports {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Phase, r.PairID, r.Delivery, r.Observations, r.LastSeen.Format(time.RFC3339))
			}
			return tw.Flush()
		}
	}
	list := &cobra.Command{
		Use: "list", Short: "List drift reports, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			out, err := api.Drift(cmd.Context(), f)
			if err != nil {
				return err
			}
			return c.print(cmd, out, table(out.Reports))
		},
	}
	list.Flags().StringVar(&f.Phase, "phase", "", "Detected or Resolved")
	list.Flags().StringVar(&f.Delivery, "delivery", "", "pending, retrying, delivered, failed, suppressed or none")
	list.Flags().IntVar(&f.Limit, "limit", 0, "at most this many (default 100, at most 1000)")
	list.Flags().BoolVar(&f.Consistent, "consistent", false, "linearizable read through the leader")
	get := &cobra.Command{
		Use: "get ID", Short: "Show one drift report (JSON unless -o yaml)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			r, err := api.DriftReport(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return c.print(cmd, r, nil)
		},
	}
	root.AddCommand(list, get)
	return root
}

// versionReport is what version prints with -o json/yaml.
type versionReport struct {
	Client  adminclient.VersionInfo     `json:"client"`
	Servers []adminclient.ServerVersion `json:"servers,omitempty"`
}

// clientVersion is this binary's build, as a server reports its own.
func clientVersion() adminclient.VersionInfo {
	b := buildinfo.Read()
	return adminclient.VersionInfo{Version: b.Version, GoVersion: b.GoVersion, Commit: b.Commit}
}

func versionCommand(c *adminClient) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client's version and every cluster member's",
		Long: `version prints this binary's version, then each cluster member's (GET
/v1/version on every member --server lists in its cluster status). A member
that does not answer is shown with its error, and the exit code is 1.
--client prints the client's alone and needs no server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(c.output); err != nil {
				return err
			}
			rep := versionReport{Client: clientVersion()}
			var failed error
			if !clientOnly {
				servers, err := serverVersions(cmd, c)
				if err != nil {
					failed = err
				}
				rep.Servers = servers
			}
			err := c.print(cmd, rep, func(w io.Writer) error {
				fmt.Fprintf(w, "policyd %s (%s, commit %s)\n", rep.Client.Version, rep.Client.GoVersion, rep.Client.Commit)
				for _, s := range rep.Servers {
					if s.Error != "" {
						fmt.Fprintf(w, "server %s: %s\n", s.Server, s.Error)
						continue
					}
					fmt.Fprintf(w, "server %s: %s (%s, commit %s)\n", s.Server, s.Build.Version, s.Build.GoVersion, s.Build.Commit)
				}
				return nil
			})
			if err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print only the client's version")
	return cmd
}

// serverVersions asks every member of the cluster for its version.
func serverVersions(cmd *cobra.Command, c *adminClient) ([]adminclient.ServerVersion, error) {
	api, err := c.client()
	if err != nil {
		return nil, err
	}
	st, err := api.Cluster(cmd.Context())
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if u, err := url.Parse(api.Servers()[0]); err == nil {
		scheme = u.Scheme
	}
	var out []adminclient.ServerVersion
	var failed int
	for _, m := range st.Members {
		sv := adminclient.ServerVersion{Server: m.ID}
		if m.HTTPAddr == "" {
			sv.Error = "has not registered its HTTP address"
			failed++
		} else if b, err := api.VersionOf(cmd.Context(), scheme+"://"+m.HTTPAddr); err != nil {
			sv.Error = err.Error()
			failed++
		} else {
			sv.Build = b
		}
		out = append(out, sv)
	}
	if failed > 0 {
		return out, fmt.Errorf("%d of %d members did not report a version", failed, len(st.Members))
	}
	return out, nil
}
