// Package adminclient is the Go client of the admin REST API, shared by the
// CLI, bench/, chaos/ and the end-to-end tests. It imports no server
// package: its request and response types mirror the documented JSON, and
// a test decodes real answers into them strictly. A Client knows several
// servers and moves on only on a connection error or a 503, and a write only
// when it cannot have been committed twice. See docs/api.md and
// docs/cli.md.
package adminclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Config configures a Client.
type Config struct {
	// Servers are base URLs of nodes' admin APIs (http://host:port or
	// https://…), tried in order.
	Servers []string
	// Token is the bearer token (auth.admin_tokens_file); "" sends none.
	Token string
	// TLS is used for https servers: the CA the nodes' certificates chain
	// to and, for mutual TLS, a client certificate. nil: system roots.
	TLS *tls.Config
	// HTTPClient overrides the HTTP client (its Transport then carries TLS).
	HTTPClient *http.Client
	// UserAgent is sent with every request; "" sends "policyd-adminclient".
	UserAgent string
}

// Client is an admin API client; safe for concurrent use.
type Client struct {
	servers []string
	token   string
	agent   string
	http    *http.Client

	mu   sync.Mutex
	next int // index of the server that answered last
}

// New returns a client of cfg.Servers; it checks the URLs, dials nothing.
func New(cfg Config) (*Client, error) {
	c := &Client{token: cfg.Token, agent: cfg.UserAgent, http: cfg.HTTPClient}
	for _, s := range cfg.Servers {
		s = strings.TrimRight(strings.TrimSpace(s), "/")
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("server %q is not an http:// or https:// URL", s)
		}
		c.servers = append(c.servers, s)
	}
	if len(c.servers) == 0 {
		return nil, errors.New("no server given")
	}
	if c.agent == "" {
		c.agent = "policyd-adminclient"
	}
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg.TLS
		c.http = &http.Client{Transport: tr}
	}
	return c, nil
}

// Servers lists the configured base URLs in order.
func (c *Client) Servers() []string { return append([]string(nil), c.servers...) }

// Sentinels for errors.Is on an *Error (or on the UnreachableError).
var (
	ErrInvalid      = errors.New("invalid request")
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrUnavailable  = errors.New("unavailable")
)

// Error is an error answer of the API: its status and the envelope
// {"error": {"code", "message"}}.
type Error struct {
	Status  int
	Code    string
	Message string
	// Server is the base URL that answered.
	Server string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Is matches the sentinel of the status.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrInvalid:
		return e.Status == http.StatusBadRequest
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	case ErrUnavailable:
		return e.Status == http.StatusServiceUnavailable
	}
	return false
}

// UnreachableError is returned when no server answered (or every one
// answered 503); it reads as one line naming each server's failure.
type UnreachableError struct {
	// Attempts holds each server's failure, in the order tried.
	Attempts []Attempt
}

// Attempt is one server's failure.
type Attempt struct {
	Server string
	Err    error
}

func (e *UnreachableError) Error() string {
	parts := make([]string, len(e.Attempts))
	for i, a := range e.Attempts {
		parts[i] = a.Server + ": " + shortErr(a.Err)
	}
	return "no server answered (" + strings.Join(parts, "; ") + ")"
}

// Is makes every UnreachableError an ErrUnavailable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the last failure.
func (e *UnreachableError) Unwrap() error {
	if len(e.Attempts) == 0 {
		return nil
	}
	return e.Attempts[len(e.Attempts)-1].Err
}

// shortErr drops the "Get \"url\": " prefix net/http puts on transport
// errors, which the server name already says.
func shortErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Op + ": " + oe.Err.Error()
	}
	return err.Error()
}

// request is one API call, replayable on the next server.
type request struct {
	method string
	path   string // with the query
	header http.Header
	body   []byte
}

// Do sends a request and decodes the JSON answer into out (nil: discard).
// path includes the query string. It is the escape hatch for routes this
// package has no method for.
func (c *Client) Do(ctx context.Context, method, path string, header http.Header, body []byte, out any) error {
	resp, err := c.send(ctx, request{method: method, path: path, header: header, body: body})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer to %s %s from %s: %w", method, path, resp.Request.URL.Host, err)
	}
	return nil
}

// Stream sends a GET and returns the open response, for streaming answers
// (the event watch, the snapshot). The caller closes its body.
func (c *Client) Stream(ctx context.Context, path string) (*http.Response, error) {
	return c.send(ctx, request{method: http.MethodGet, path: path})
}

// send tries each server from the last good one on.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	c.mu.Lock()
	start := c.next
	c.mu.Unlock()
	var failed []Attempt
	for i := range c.servers {
		n := (start + i) % len(c.servers)
		server := c.servers[n]
		resp, err := c.sendTo(ctx, server, r)
		if err == nil {
			c.mu.Lock()
			c.next = n
			c.mu.Unlock()
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", r.method, server+r.path, ctx.Err())
		}
		if !c.failover(r, err) {
			return nil, err
		}
		failed = append(failed, Attempt{Server: server, Err: err})
	}
	if len(failed) == 1 {
		var ae *Error
		if errors.As(failed[0].Err, &ae) {
			return nil, ae
		}
	}
	return nil, &UnreachableError{Attempts: failed}
}

// failover says whether err from one server lets r go to the next.
func (c *Client) failover(r request, err error) bool {
	var ae *Error
	if errors.As(err, &ae) {
		return ae.Status == http.StatusServiceUnavailable
	}
	if r.method == http.MethodGet || r.method == http.MethodHead {
		return true
	}
	// A write is replayed only if it surely never reached the server.
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func (c *Client) sendTo(ctx context.Context, server string, r request) (*http.Response, error) {
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, server+r.path, body)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", r.method, r.path, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.agent)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(server, resp)
}

// decodeError reads an error answer's envelope; a body that is not one
// (a proxy's page) becomes the message.
func decodeError(server string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
		return &Error{Status: resp.StatusCode, Code: "unknown", Message: strings.TrimSpace(string(raw)), Server: server}
	}
	return &Error{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message, Server: server}
}
