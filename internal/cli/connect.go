package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/adminclient"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/buildinfo"
)

// adminClient holds the connection flags shared by every admin command and
// builds the adminclient.Client from them on first use.
type adminClient struct {
	server string
	token  string
	output string
	// TLS files for https servers: the CA bundle the nodes' certificates
	// must chain to, and a client certificate for mutual TLS.
	caFile, certFile, keyFile string

	once sync.Once
	api  *adminclient.Client
	err  error
}

func (c *adminClient) registerFlags(root *cobra.Command) {
	def := os.Getenv("POLICYD_SERVER")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.server, "server", def, "admin API base URLs, comma-separated, tried in order (env POLICYD_SERVER)")
	pf.StringVar(&c.token, "token", os.Getenv("POLICYD_TOKEN"), "admin API bearer token (env POLICYD_TOKEN)")
	pf.StringVarP(&c.output, "output", "o", "", "output format: table, json or yaml (default: table, and JSON for get)")
	pf.StringVar(&c.caFile, "ca-file", os.Getenv("POLICYD_CA_FILE"), "PEM CA bundle the node's TLS certificate must chain to, for an https --server or watch over TLS (default: system roots; env POLICYD_CA_FILE)")
	pf.StringVar(&c.certFile, "cert-file", os.Getenv("POLICYD_CERT_FILE"), "client certificate for a node requiring mutual TLS (env POLICYD_CERT_FILE)")
	pf.StringVar(&c.keyFile, "key-file", os.Getenv("POLICYD_KEY_FILE"), "key of --cert-file (env POLICYD_KEY_FILE)")
}

// client returns the API client of the flags, built once.
func (c *adminClient) client() (*adminclient.Client, error) {
	c.once.Do(func() {
		if err := checkOutput(c.output); err != nil {
			c.err = err
			return
		}
		cfg := adminclient.Config{Servers: strings.Split(c.server, ","), Token: c.token, UserAgent: "policyd/" + buildinfo.Read().Version}
		if c.caFile != "" || c.certFile != "" || c.keyFile != "" {
			tc, err := client.TLSFiles(c.caFile, c.certFile, c.keyFile)
			if err != nil {
				c.err = &usageError{fmt.Errorf("--ca-file/--cert-file/--key-file: %w", err)}
				return
			}
			cfg.TLS = tc
		}
		api, err := adminclient.New(cfg)
		if err != nil {
			c.err = &usageError{fmt.Errorf("--server: %w", err)}
			return
		}
		c.api = api
	})
	return c.api, c.err
}

// print writes v in the -o format; table renders the default.
func (c *adminClient) print(cmd *cobra.Command, v any, table func(io.Writer) error) error {
	return printValue(cmd.OutOrStdout(), c.output, v, table)
}
