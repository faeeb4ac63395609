package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
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
