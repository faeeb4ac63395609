package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/policyd/policyd/client"
)

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
