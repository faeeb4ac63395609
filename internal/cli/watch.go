package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/policyd/policyd/client"
)

// watchCommand is `policyd watch`: a sidecar built on the client SDK. It
// prints every policy update and state change until it is interrupted
// (exit 0) or its access is revoked (exit 1).
func watchCommand() *cobra.Command {
	var (
		sf     = sidecarFlags{env: "POLICYD_WATCH", cmd: "watch"}
		output string
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Follow the policies that apply to an identity, as a sidecar would",
		Long: `watch connects to the nodes in --servers as a sidecar does (the gRPC discovery
stream, or the WebSocket feed with --transport ws), fails over between them, and
prints every policy update and state change (connecting, ready, disconnected,
revoked) to stdout. With --output json each event is one JSON object per line:
  {"event":"state","from":"ready","to":"disconnected",...}
  {"event":"update","version":"...","policies":["name",...],"count":1,"shadow":["name"],...}
Shadow policies (evaluated by the SDK, never enforced) are marked: name(shadow)
in text, and listed again under "shadow" in json and yaml.
It runs until SIGINT/SIGTERM, or exits 1 when access is revoked.

With --ca-file (and, for nodes requiring mutual TLS, --cert-file and
--key-file) it connects over TLS: gRPC with TLS, or wss:// for ws.

The JWT is read from --token-file (re-read on every reconnect) or from
POLICYD_WATCH_TOKEN. With the server in auth.mode none, name the identity with
--org/--team/--employee (grpc) or --employee (ws).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "text", "table": // table: the root's name for the plain form
				output = "text"
			case "json", "yaml":
			default:
				return &usageError{fmt.Errorf("--output %q: want text, json or yaml", output)}
			}
			cfg, err := sf.config(cmd)
			if err != nil {
				return err
			}
			p := &watchPrinter{w: cmd.OutOrStdout(), format: output}
			cfg.OnStateChange = p.state
			cfg.OnUpdate = p.update
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo}))
			c, err := client.New(cfg, logger)
			if err != nil {
				return &usageError{err}
			}
			if err := c.Run(cmd.Context()); err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			return nil
		},
	}
	sf.register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, json (one object per line) or yaml (one document per event)")
	return cmd
}

// sidecarFlags are the flags of the commands built on the client SDK
// (watch, authz): which nodes, which identity, and how long to trust the
// cache. env prefixes the environment variables that back them.
type sidecarFlags struct {
	env, cmd             string
	transport, tokenFile string
	org, team, employee  string
	servers              []string
	grace                time.Duration
	unknownIdentityGrace time.Duration
}

func (sf *sidecarFlags) register(f *pflag.FlagSet) {
	f.StringVar(&sf.transport, "transport", client.TransportGRPC, "grpc (discovery stream) or ws (WebSocket feed)")
	f.StringSliceVar(&sf.servers, "servers", envList(sf.env+"_SERVERS"), "comma-separated node addresses: gRPC host:port, or HTTP host:port/URL for ws (env "+sf.env+"_SERVERS)")
	f.StringVar(&sf.tokenFile, "token-file", "", "file holding the sidecar JWT (else env "+sf.env+"_TOKEN)")
	f.StringVar(&sf.org, "org", "", "scope org (grpc)")
	f.StringVar(&sf.team, "team", "", "scope team (grpc)")
	f.StringVar(&sf.employee, "employee", "", "scope employee (grpc); the employee for ws when the server runs auth.mode none")
	f.DurationVar(&sf.grace, "grace", client.DefaultGrace, "how long cached policies are served while disconnected before everything is blocked")
	f.DurationVar(&sf.unknownIdentityGrace, "unknown-identity-grace", client.DefaultUnknownIdentityGrace,
		"how long an employee the nodes do not know (yet) is retried before access counts as revoked; an inactive one is revoked at once")
}

// config is the SDK configuration the flags describe, TLS included.
func (sf *sidecarFlags) config(cmd *cobra.Command) (client.Config, error) {
	if len(sf.servers) == 0 {
		return client.Config{}, &usageError{fmt.Errorf("%s needs --servers (or %s_SERVERS): the nodes' gRPC (grpc) or HTTP (ws) addresses", sf.cmd, sf.env)}
	}
	if sf.unknownIdentityGrace < 0 {
		return client.Config{}, &usageError{fmt.Errorf("--unknown-identity-grace %v is negative", sf.unknownIdentityGrace)}
	}
	cfg := client.Config{
		Servers:   sf.servers,
		Transport: sf.transport,
		Employee:  sf.employee,
		Grace:     sf.grace,
		// Zero would mean the default to the SDK; the flag's zero means
		// no retry.
		UnknownIdentityGrace: max(sf.unknownIdentityGrace, time.Nanosecond),
	}
	if sf.transport != client.TransportWS {
		cfg.Scope = client.Scope{Org: sf.org, Team: sf.team, Employee: sf.employee}
	}
	if sf.tokenFile != "" {
		if _, err := readToken(sf.tokenFile); err != nil {
			return client.Config{}, &usageError{err}
		}
		path := sf.tokenFile
		cfg.TokenSource = func(context.Context) (string, error) { return readToken(path) }
	} else {
		cfg.Token = strings.TrimSpace(os.Getenv(sf.env + "_TOKEN"))
	}
	if sf.transport == client.TransportWS && cfg.Token == "" && cfg.TokenSource == nil && sf.employee == "" {
		return client.Config{}, &usageError{fmt.Errorf("--transport ws needs a token (--token-file or %s_TOKEN) or, with the server in auth.mode none, --employee", sf.env)}
	}
	tc, err := watchTLS(cmd)
	if err != nil {
		return client.Config{}, err
	}
	cfg.TLS = tc
	return cfg, nil
}

// watchTLS builds the TLS configuration from the global --ca-file,
// --cert-file and --key-file flags; nil when none is set.
func watchTLS(cmd *cobra.Command) (*tls.Config, error) {
	var files [3]string
	for i, name := range []string{"ca-file", "cert-file", "key-file"} {
		files[i], _ = cmd.Flags().GetString(name) // "" when not defined
	}
	if files == [3]string{} {
		return nil, nil
	}
	tc, err := client.TLSFiles(files[0], files[1], files[2])
	if err != nil {
		return nil, &usageError{fmt.Errorf("--ca-file/--cert-file/--key-file: %w", err)}
	}
	return tc, nil
}

// envList splits a comma-separated environment variable.
func envList(name string) []string {
	var out []string
	for s := range strings.SplitSeq(os.Getenv(name), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// watchPrinter writes one line per event.
type watchPrinter struct {
	mu     sync.Mutex
	w      io.Writer
	format string // text, json or yaml
}

// stateEvent and updateEvent are the JSON lines of --output json.
type stateEvent struct {
	Event string `json:"event"` // "state"
	Time  string `json:"time"`
	From  string `json:"from"`
	To    string `json:"to"`
}

type updateEvent struct {
	Event    string   `json:"event"` // "update"
	Time     string   `json:"time"`
	Version  string   `json:"version"`
	Policies []string `json:"policies"`
	Count    int      `json:"count"`
	// Shadow names the shadow policies among Policies.
	Shadow []string `json:"shadow,omitempty"`
	Server string   `json:"server"`
}

func (p *watchPrinter) state(from, to client.State) {
	now := time.Now().UTC()
	p.print(stateEvent{Event: "state", Time: now.Format(time.RFC3339Nano), From: string(from), To: string(to)},
		fmt.Sprintf("%s state %s -> %s", now.Format(time.RFC3339), from, to))
}

func (p *watchPrinter) update(u client.Update) {
	now := time.Now().UTC()
	names := make([]string, 0, len(u.Policies))
	marked := make([]string, 0, len(u.Policies))
	var shadow []string
	for _, pol := range u.Policies {
		names = append(names, pol.Name)
		if pol.Enforcement == client.EnforcementShadow {
			shadow = append(shadow, pol.Name)
			marked = append(marked, pol.Name+"(shadow)")
		} else {
			marked = append(marked, pol.Name)
		}
	}
	p.print(updateEvent{Event: "update", Time: now.Format(time.RFC3339Nano), Version: u.Version, Policies: names, Count: len(names), Shadow: shadow, Server: u.Server},
		fmt.Sprintf("%s update version=%s count=%d policies=%s server=%s", now.Format(time.RFC3339), u.Version, len(names), strings.Join(marked, ","), u.Server))
}

func (p *watchPrinter) print(ev any, text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.format {
	case "json":
		b, _ := json.Marshal(ev)
		fmt.Fprintf(p.w, "%s\n", b)
	case "yaml":
		b, _ := yaml.Marshal(ev)
		fmt.Fprintf(p.w, "---\n%s", b)
	default:
		fmt.Fprintln(p.w, text)
	}
}
