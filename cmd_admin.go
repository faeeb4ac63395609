package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server/adminapi"
	"github.com/policyd/policyd/store"
)

// adminClient talks to a node's admin REST API.
type adminClient struct {
	server string
	token  string
	output string
	http   *http.Client
	// TLS files for an https --server: the CA bundle the node's certificate
	// must chain to, and a client certificate for mutual TLS.
	caFile, certFile, keyFile string
	tlsOnce                   sync.Once
	tlsErr                    error
}

func (c *adminClient) registerFlags(root *cobra.Command) {
	def := os.Getenv("POLICYD_SERVER")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.server, "server", def, "admin API base URL (env POLICYD_SERVER)")
	pf.StringVar(&c.token, "token", os.Getenv("POLICYD_TOKEN"), "admin API bearer token (env POLICYD_TOKEN)")
	pf.StringVarP(&c.output, "output", "o", "table", "output format for lists: table or json")
	pf.StringVar(&c.caFile, "ca-file", os.Getenv("POLICYD_CA_FILE"), "PEM CA bundle the node's TLS certificate must chain to, for an https --server or watch over TLS (default: system roots; env POLICYD_CA_FILE)")
	pf.StringVar(&c.certFile, "cert-file", os.Getenv("POLICYD_CERT_FILE"), "client certificate for a node requiring mutual TLS (env POLICYD_CERT_FILE)")
	pf.StringVar(&c.keyFile, "key-file", os.Getenv("POLICYD_KEY_FILE"), "key of --cert-file (env POLICYD_KEY_FILE)")
	c.http = &http.Client{}
}

// setupTLS configures the HTTP client from the TLS flags, once.
func (c *adminClient) setupTLS() error {
	c.tlsOnce.Do(func() {
		if c.caFile == "" && c.certFile == "" && c.keyFile == "" {
			return
		}
		tc, err := client.TLSFiles(c.caFile, c.certFile, c.keyFile)
		if err != nil {
			c.tlsErr = &usageError{fmt.Errorf("--ca-file/--cert-file/--key-file: %w", err)}
			return
		}
		c.http.Transport = &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc}
	})
	return c.tlsErr
}

// apiError is an error envelope returned by the server.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// do sends a request and decodes a JSON answer into out (unless nil).
func (c *adminClient) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) error {
	resp, err := c.send(ctx, method, path, hdr, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer from %s %s: %w", method, path, err)
	}
	return nil
}

func (c *adminClient) send(ctx context.Context, method, path string, hdr http.Header, body []byte) (*http.Response, error) {
	u := strings.TrimRight(c.server, "/") + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, u, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if err := c.setupTLS(); err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var env struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
			return nil, &apiError{Status: resp.StatusCode, Code: "unknown", Message: strings.TrimSpace(string(raw))}
		}
		return nil, &apiError{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message}
	}
	return resp, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// readDocuments reads a JSON or YAML file (or - for stdin) holding one object
// or a list of objects, and returns each as JSON.
func readDocuments(path string) ([][]byte, error) {
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	j := bytes.TrimSpace(raw)
	if len(j) == 0 || (j[0] != '[' && j[0] != '{') {
		var v any
		if err := yaml.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("%s: not JSON, and not YAML: %w", path, err)
		}
		if j, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("%s: YAML does not convert to JSON: %w", path, err)
		}
	}
	return readJSONItems(path, j)
}

func readJSONItems(path string, j []byte) ([][]byte, error) {
	if len(j) > 0 && j[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(j, &items); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out := make([][]byte, len(items))
		for i, it := range items {
			out[i] = it
		}
		return out, nil
	}
	return [][]byte{j}, nil
}

// nameOf extracts a document's key field without validating the rest (the
// server does that).
func nameOf(doc []byte, field string) (string, error) {
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		return "", fmt.Errorf("document is not a JSON object: %w", err)
	}
	s, _ := m[field].(string)
	if s == "" {
		return "", fmt.Errorf("document has no %q", field)
	}
	return s, nil
}

func ifMatchHeader(rev int64) http.Header {
	if rev < 0 {
		return nil
	}
	return http.Header{"If-Match": []string{strconv.FormatInt(rev, 10)}}
}

// resource describes policies or employees for the shared commands.
type resource struct {
	noun, plural, key string
	list              func(c *adminClient, cmd *cobra.Command, q url.Values) error
	listFlags         []string
}

func policyCommand(c *adminClient) *cobra.Command {
	return resourceCommand(c, resource{
		noun: "policy", plural: "policies", key: "name",
		listFlags: []string{"org", "team", "employee", "kind"},
		list: func(c *adminClient, cmd *cobra.Command, q url.Values) error {
			var out adminapi.PolicyList
			if err := c.do(cmd.Context(), http.MethodGet, "/v1/policies?"+q.Encode(), nil, nil, &out); err != nil {
				return err
			}
			if c.output == "json" {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tSCOPE\tREVISION")
			for _, p := range out.Policies {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", p.Name, p.Kind, scopeString(p.Scope), p.Revision)
			}
			return tw.Flush()
		},
	})
}

// scopeString renders a scope for tables: "global", or its set fields
// ("org=acme,team=red").
func scopeString(s policy.Scope) string {
	if s.IsGlobal() {
		return "global"
	}
	var parts []string
	for _, f := range [][2]string{{"org", s.Org}, {"team", s.Team}, {"employee", s.Employee}} {
		if f[1] != "" {
			parts = append(parts, f[0]+"="+f[1])
		}
	}
	return strings.Join(parts, ",")
}

func employeeCommand(c *adminClient) *cobra.Command {
	return resourceCommand(c, resource{
		noun: "employee", plural: "employees", key: "id",
		listFlags: []string{"org", "team"},
		list: func(c *adminClient, cmd *cobra.Command, q url.Values) error {
			var out adminapi.EmployeeList
			if err := c.do(cmd.Context(), http.MethodGet, "/v1/employees?"+q.Encode(), nil, nil, &out); err != nil {
				return err
			}
			if c.output == "json" {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tORG\tTEAM\tSTATUS\tREVISION")
			for _, e := range out.Employees {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", e.ID, e.Org, e.Team, e.Status, e.Revision)
			}
			return tw.Flush()
		},
	})
}

// resourceCommand builds list/get/apply/delete for one resource.
func resourceCommand(c *adminClient, r resource) *cobra.Command {
	root := &cobra.Command{Use: r.noun, Short: "Manage " + r.plural}
	base := "/v1/" + r.plural + "/"

	var consistent bool
	filters := map[string]*string{}
	list := &cobra.Command{
		Use: "list", Short: "List " + r.plural, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for k, v := range filters {
				if *v != "" {
					q.Set(k, *v)
				}
			}
			if consistent {
				q.Set("consistent", "true")
			}
			return r.list(c, cmd, q)
		},
	}
	for _, f := range r.listFlags {
		filters[f] = list.Flags().String(f, "", "filter by "+f)
	}
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read through the leader")

	get := &cobra.Command{
		Use: "get " + strings.ToUpper(r.key), Short: "Show one " + r.noun, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out json.RawMessage
			if err := c.do(cmd.Context(), http.MethodGet, base+url.PathEscape(args[0]), nil, nil, &out); err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}

	var file string
	var applyRev int64
	apply := &cobra.Command{
		Use: "apply -f FILE", Short: "Create or replace " + r.plural + " from a JSON or YAML file (- for stdin)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &usageError{errors.New("apply needs -f FILE")}
			}
			docs, err := readDocuments(file)
			if err != nil {
				return err
			}
			for _, d := range docs {
				key, err := nameOf(d, r.key)
				if err != nil {
					return fmt.Errorf("%s: %w", file, err)
				}
				var out struct {
					Revision uint64 `json:"revision"`
				}
				if err := c.do(cmd.Context(), http.MethodPut, base+url.PathEscape(key), ifMatchHeader(applyRev), d, &out); err != nil {
					return fmt.Errorf("%s/%s: %w", r.noun, key, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s/%s applied (revision %d)\n", r.noun, key, out.Revision)
			}
			return nil
		},
	}
	apply.Flags().StringVarP(&file, "filename", "f", "", "file to apply (JSON or YAML; one object or a list)")
	apply.Flags().Int64Var(&applyRev, "if-match", -1, "only apply if the current revision is this (0: only create)")

	var delRev int64
	del := &cobra.Command{
		Use: "delete " + strings.ToUpper(r.key), Short: "Delete a " + r.noun, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out adminapi.Deleted
			if err := c.do(cmd.Context(), http.MethodDelete, base+url.PathEscape(args[0]), ifMatchHeader(delRev), nil, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted (revision %d)\n", r.noun, args[0], out.Revision)
			return nil
		},
	}
	del.Flags().Int64Var(&delRev, "if-match", -1, "only delete if the current revision is this")

	root.AddCommand(append([]*cobra.Command{list, get, apply, del}, historyCommands(c, r)...)...)
	return root
}

func eventsCommand(c *adminClient) *cobra.Command {
	root := &cobra.Command{Use: "events", Short: "Read the event log"}
	var typ, org string
	var after uint64
	var limit int
	query := func() url.Values {
		q := url.Values{}
		if typ != "" {
			q.Set("type", typ)
		}
		if org != "" {
			q.Set("org", org)
		}
		q.Set("after", strconv.FormatUint(after, 10))
		return q
	}
	list := &cobra.Command{
		Use: "list", Short: "List events", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := query()
			q.Set("limit", strconv.Itoa(limit))
			var page store.EventPage
			if err := c.do(cmd.Context(), http.MethodGet, "/v1/events?"+q.Encode(), nil, nil, &page); err != nil {
				return err
			}
			if c.output == "json" {
				return printJSON(cmd.OutOrStdout(), page)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTYPE\tORG\tACTION\tENTITY\tPROCESSED")
			for _, e := range page.Events {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.EntityType, e.Org, e.Action, e.EntityID, e.ProcessedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	list.Flags().IntVar(&limit, "limit", 100, "at most this many events")
	watch := &cobra.Command{
		Use: "watch", Short: "Stream events as they are applied (one JSON line each)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := c.send(cmd.Context(), http.MethodGet, "/v1/events/watch?"+query().Encode(), nil, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return copySSE(cmd.Context(), resp.Body, cmd.OutOrStdout())
		},
	}
	for _, cmd := range []*cobra.Command{list, watch} {
		cmd.Flags().StringVar(&typ, "type", "", "entity type: policy, employee, drift, reload")
		cmd.Flags().StringVar(&org, "org", "", "only this org")
		cmd.Flags().Uint64Var(&after, "after", 0, "only events after this id")
	}
	root.AddCommand(list, watch)
	return root
}

// copySSE prints each event's data line; a reset is printed as a JSON object
// with "reset". It returns nil when ctx ends (Ctrl-C).
func copySSE(ctx context.Context, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := strings.TrimPrefix(line, "data: ")
			if event == "reset" {
				fmt.Fprintf(w, "{\"reset\":%s}\n", data)
			} else {
				fmt.Fprintln(w, data)
			}
		case line == "":
			event = ""
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("event stream: %w", err)
	}
	return errors.New("event stream ended by the server")
}

func clusterCommand(c *adminClient) *cobra.Command {
	root := &cobra.Command{Use: "cluster", Short: "Inspect and change cluster membership"}
	status := &cobra.Command{
		Use: "status", Short: "Show members, leader, term and applied index", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st adminapi.ClusterStatus
			if err := c.do(cmd.Context(), http.MethodGet, "/v1/cluster", nil, nil, &st); err != nil {
				return err
			}
			if c.output == "json" {
				return printJSON(cmd.OutOrStdout(), st)
			}
			out := cmd.OutOrStdout()
			// The command version shows a rolling upgrade's progress: 1 while
			// any member runs a release that reads only JSON commands.
			fmt.Fprintf(out, "cluster %s\nnode %s (%s), leader %s, term %d, commit %d, applied %d\ndigest %s\ncommand version %d\n\n",
				st.ClusterID, st.NodeID, st.State, st.LeaderID, st.Term, st.CommitIndex, st.AppliedIndex, st.Digest, st.CommandVersion)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRAFT\tHTTP\tGRPC\tSUFFRAGE\tLEADER\tCOMMAND_VERSION")
			for _, m := range st.Members {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%d\n", m.ID, m.RaftAddr, m.HTTPAddr, m.GRPCAddr, m.Suffrage, m.Leader, m.CommandVersion)
			}
			return tw.Flush()
		},
	}
	var id, raftAddr string
	join := &cobra.Command{
		Use: "join --id ID --raft-addr HOST:PORT", Short: "Add a node (started with raft.bootstrap: false) as a voter", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id == "" || raftAddr == "" {
				return &usageError{errors.New("join needs --id and --raft-addr")}
			}
			body, _ := json.Marshal(adminapi.JoinRequest{ID: id, RaftAddr: raftAddr})
			var out adminapi.Membership
			if err := c.do(cmd.Context(), http.MethodPost, "/v1/cluster/join", nil, body, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s joined (index %d)\n", out.ID, out.Index)
			return nil
		},
	}
	join.Flags().StringVar(&id, "id", "", "node id of the joining node")
	join.Flags().StringVar(&raftAddr, "raft-addr", "", "Raft address of the joining node")
	remove := &cobra.Command{
		Use: "remove ID", Short: "Remove a node from the cluster", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out adminapi.Membership
			if err := c.do(cmd.Context(), http.MethodDelete, "/v1/cluster/members/"+url.PathEscape(args[0]), nil, nil, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s removed (index %d)\n", out.ID, out.Index)
			return nil
		},
	}
	root.AddCommand(status, join, remove)
	return root
}
