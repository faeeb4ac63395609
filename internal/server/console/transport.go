package console

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"sync"
)

// inProcess is an http.RoundTripper that serves every request with the
// admin API's handler in this process: the console reads and acts through
// the same routes, role checks and audit as any client, without a socket.
// Bodies stream through a pipe, so the event watch works too.
type inProcess struct{ api http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, body: pw, ready: make(chan struct{})}
	// A request the transport hands over must not be modified; the
	// handler gets a copy it may change.
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "console"
	in.TLS = tlsFrom(req.Context())
	if in.Body == nil {
		in.Body = http.NoBody
	}
	go func() {
		defer func() {
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			_ = pw.Close()
		}()
		t.api.ServeHTTP(w, in)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:     http.StatusText(w.status),
		StatusCode: w.status,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1, ProtoMinor: 1,
		Header:  w.sent,
		Body:    pr,
		Request: req,
	}, nil
}

// pipeWriter is the handler's side of inProcess.
type pipeWriter struct {
	header http.Header
	sent   http.Header
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
	status int
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush is a no-op: the pipe hands every write to the reader at once.
func (w *pipeWriter) Flush() {}

type tlsKey struct{}

// withTLS makes inProcess hand the API the browser's TLS connection state,
// so that a client certificate authenticates the console's calls as it
// would the browser's own.
func withTLS(ctx context.Context, cs *tls.ConnectionState) context.Context {
	return context.WithValue(ctx, tlsKey{}, cs)
}

func tlsFrom(ctx context.Context) *tls.ConnectionState {
	cs, _ := ctx.Value(tlsKey{}).(*tls.ConnectionState)
	return cs
}
