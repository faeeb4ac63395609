package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/policyd/policyd/internal/server/console"
)

// setupConsole mounts the web console at /ui/ on the HTTP listener's mux.
func (n *Node) setupConsole(mux *http.ServeMux) error {
	if !n.cfg.HTTP.Console.Enabled {
		return nil
	}
	con, err := console.New(console.Config{
		Tokens:      n.api.Tokens,
		SessionTTL:  n.cfg.HTTP.Console.SessionTTL,
		IdleTimeout: n.cfg.HTTP.Console.IdleTimeout,
		NodeID:      n.id,
		Probe:       n.probeReady,
	}, n.logger.With("component", "console"), n.api)
	if err != nil {
		return err
	}
	mux.Handle("/ui/", con)
	mux.Handle("/ui", con)
	n.httpSrv.RegisterOnShutdown(con.CloseStreams)
	return nil
}

// probeReady asks a member's /readyz, as a load balancer would, and reads
// its applied index from the answer. Under http.tls it presents this
// node's HTTP certificate and verifies the member's against
// http.tls.client_ca_file (or the system roots).
func (n *Node) probeReady(ctx context.Context, httpAddr string) (uint64, error) {
	scheme, tr := "http", http.DefaultTransport.(*http.Transport).Clone()
	if n.tls.http != nil {
		host, _, err := net.SplitHostPort(httpAddr)
		if err != nil {
			return 0, fmt.Errorf("admin address %q: %w", httpAddr, err)
		}
		scheme, tr.TLSClientConfig = "https", n.tls.http.ClientConfig(host)
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+httpAddr+"/readyz", nil)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		var ue *url.Error // the URL is in the member's row already
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, fmt.Errorf("no answer: %w", err)
	}
	defer resp.Body.Close()
	var answer struct {
		AppliedIndex uint64 `json:"applied_index"`
		Error        struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(body, &answer) // a member of an older release sends less
	switch {
	case resp.StatusCode == http.StatusOK:
		return answer.AppliedIndex, nil
	case answer.Error.Message != "":
		return 0, errors.New(answer.Error.Message)
	}
	return 0, fmt.Errorf("/readyz answered %s", resp.Status)
}
