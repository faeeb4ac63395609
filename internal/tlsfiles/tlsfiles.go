// Package tlsfiles serves TLS from PEM files that may be replaced while the
// process runs: a key pair (cert_file, key_file) and, for mutual TLS, a CA
// bundle (client_ca_file) that peers' certificates must chain to. A
// Reloader hands out *tls.Config values whose certificate, client CA pool
// and roots are looked up per handshake: ServerConfig for listeners,
// ClientConfig for the node's connections to its peers. Files are re-read
// on Reload (SIGHUP) and on handshakes when their content changed; a
// version that does not load keeps the previous one. It starts no
// goroutine. It does not choose which files a listener uses (internal/config
// does). The rotation rules are in docs/security.md.
package tlsfiles

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/policyd/policyd/internal/config"
)

// CheckInterval is how often, at most, a handshake re-reads the files to
// look for a change.
const CheckInterval = time.Second

// maxFileBytes bounds one PEM file; real ones are a few KiB.
const maxFileBytes = 1 << 20

// MinVersion is the lowest TLS version offered or accepted.
const MinVersion = tls.VersionTLS12

// Reloader is one key pair and optional CA bundle, re-read when they change.
// It is safe for concurrent use.
type Reloader struct {
	cfg    config.TLS
	logger *slog.Logger
	start  time.Time

	cur atomic.Pointer[material]
	// nextCheck is when, as a duration since start, the files are next due
	// to be compared; monotonic, so a wall clock step cannot stall it.
	nextCheck atomic.Int64

	mu      sync.Mutex        // serializes loads
	digest  [sha256.Size]byte // of the content last read, loaded or not
	lastErr string            // last load error, so it is logged once
}

// material is one loaded version of the files.
type material struct {
	cert   *tls.Certificate
	cas    *x509.CertPool // nil without client_ca_file
	server *tls.Config    // the listener config for this version
}

// New loads cfg's files. cfg must name a key pair (config.TLS.Enabled); a
// file that does not load is an error here, unlike on reload, because there
// is nothing to fall back to. A nil logger discards the reload messages.
func New(cfg config.TLS, logger *slog.Logger) (*Reloader, error) {
	if !cfg.Enabled() {
		return nil, errors.New("tls: cert_file and key_file are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{cfg: cfg, logger: logger, start: time.Now()}
	data, err := r.read()
	if err != nil {
		return nil, err
	}
	m, err := r.parse(data)
	if err != nil {
		return nil, err
	}
	r.digest = sha256.Sum256(bytes.Join(data, []byte{0}))
	r.cur.Store(m)
	r.nextCheck.Store(int64(CheckInterval))
	r.logLoaded("loaded TLS certificate", m)
	return r, nil
}

// MutualTLS reports whether clients must present a certificate.
func (r *Reloader) MutualTLS() bool { return r.cfg.ClientCAFile != "" }

// Leaf is the certificate currently presented.
func (r *Reloader) Leaf() *x509.Certificate { return r.cur.Load().cert.Leaf }

// Reload re-reads the files now. If their content changed and loads, it is
// used from the next handshake; if it does not load, the previous material
// stays and the error is returned (and logged).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextCheck.Store(int64(time.Since(r.start) + CheckInterval))
	return r.reloadLocked()
}

// maybeReload re-reads the files if CheckInterval has passed since the last
// look. A handshake that finds a reload in progress goes on with the current
// material rather than queue behind file I/O.
func (r *Reloader) maybeReload() {
	elapsed := time.Since(r.start)
	if int64(elapsed) < r.nextCheck.Load() || !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	if int64(elapsed) < r.nextCheck.Load() {
		return // reloaded while we were getting the lock
	}
	r.nextCheck.Store(int64(elapsed + CheckInterval))
	_ = r.reloadLocked() // logged
}

func (r *Reloader) reloadLocked() error {
	data, err := r.read()
	if err != nil {
		return r.failed(err)
	}
	digest := sha256.Sum256(bytes.Join(data, []byte{0}))
	if digest == r.digest {
		return nil
	}
	// Remember the digest even if it fails to load, so that a broken
	// version is reported once, not at every check; the next write changes
	// the digest and is tried again.
	r.digest = digest
	m, err := r.parse(data)
	if err != nil {
		return r.failed(err)
	}
	r.cur.Store(m)
	r.lastErr = ""
	r.logLoaded("reloaded TLS certificate", m)
	return nil
}

func (r *Reloader) failed(err error) error {
	if msg := err.Error(); msg != r.lastErr {
		r.lastErr = msg
		old := r.cur.Load().cert.Leaf
		r.logger.Error("cannot reload TLS files; keeping the previous certificate",
			"cert_file", r.cfg.CertFile, "serial", old.SerialNumber.String(), "not_after", old.NotAfter, "err", err)
	}
	return err
}

func (r *Reloader) logLoaded(msg string, m *material) {
	leaf := m.cert.Leaf
	r.logger.Info(msg, "cert_file", r.cfg.CertFile, "subject", leaf.Subject.String(),
		"serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter, "mutual", r.MutualTLS())
	if time.Now().After(leaf.NotAfter) {
		r.logger.Warn("TLS certificate has expired; peers will refuse it", "cert_file", r.cfg.CertFile, "not_after", leaf.NotAfter)
	}
}

// read returns the content of cert, key and (if set) CA file.
func (r *Reloader) read() ([][]byte, error) {
	paths := []string{r.cfg.CertFile, r.cfg.KeyFile}
	if r.cfg.ClientCAFile != "" {
		paths = append(paths, r.cfg.ClientCAFile)
	}
	out := make([][]byte, 0, len(paths))
	for _, p := range paths {
		b, err := readFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (r *Reloader) parse(data [][]byte) (*material, error) {
	cert, err := tls.X509KeyPair(data[0], data[1])
	if err != nil {
		return nil, fmt.Errorf("tls: key pair %s, %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	// X509KeyPair fills Leaf since Go 1.23; keep a check so a change of
	// that default is an error here, not a nil dereference later.
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls: certificate %s: %w", r.cfg.CertFile, err)
		}
	}
	m := &material{cert: &cert}
	if r.cfg.ClientCAFile != "" {
		if m.cas, err = ParseCAs(r.cfg.ClientCAFile, data[2]); err != nil {
			return nil, err
		}
	}
	m.server = &tls.Config{MinVersion: MinVersion, Certificates: []tls.Certificate{cert}}
	if m.cas != nil {
		m.server.ClientAuth = tls.RequireAndVerifyClientCert
		m.server.ClientCAs = m.cas
	}
	return m, nil
}

// ServerConfig returns a listener config that serves the current material,
// offering nextProtos by ALPN ("h2" for gRPC). The config picks the material
// per handshake, so it stays valid across reloads.
func (r *Reloader) ServerConfig(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: MinVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			r.maybeReload()
			c := r.cur.Load().server.Clone()
			c.NextProtos = nextProtos
			return c, nil
		},
	}
}

// ClientConfig returns a config for one connection to a peer: the current
// key pair as client certificate, and the current CA bundle (or, without
// client_ca_file, the system roots) to verify the peer, whose certificate
// must name serverName. serverName "" leaves it to the caller (gRPC's TLS
// credentials set it from the dialled authority).
//
// Roots are fixed in the returned config, so take a fresh one per
// connection.
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	r.maybeReload()
	m := r.cur.Load()
	return &tls.Config{
		MinVersion: MinVersion,
		ServerName: serverName,
		RootCAs:    m.cas,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.cur.Load().cert, nil
		},
	}
}

// ParseCAs parses a PEM bundle of CA certificates; path is for messages. Text
// between blocks is ignored; a block other than CERTIFICATE is an error, and
// so is a bundle without a single certificate: it would refuse every
// peer, which is never what was meant.
func ParseCAs(path string, data []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			// A key or request here is a mistake worth reporting, not
			// something to skip past.
			return nil, fmt.Errorf("tls: CA file %s: PEM block %d is %q, want CERTIFICATE", path, n+1, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls: CA file %s: certificate %d: %w", path, n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("tls: CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// readFile reads one PEM file, refusing one too large to be one.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tls: read %s: %w", path, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("tls: %s is larger than %d bytes", path, maxFileBytes)
	}
	return data, nil
}

// NodeURI is the URI SAN a node certificate carries.
func NodeURI(trustDomain, nodeID string) string {
	return "spiffe://" + trustDomain + "/node/" + nodeID
}

// NodeIDs returns the node IDs cert names in trustDomain, if any.
func NodeIDs(cert *x509.Certificate, trustDomain string) []string {
	var ids []string
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != trustDomain || u.RawQuery != "" || u.Fragment != "" {
			continue
		}
		if id, ok := strings.CutPrefix(u.Path, "/node/"); ok && config.ValidNodeID(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// IsNodeCertificate reports whether cert names a node identity in any
// trust domain: such a certificate is for the peer plane only.
func IsNodeCertificate(cert *x509.Certificate) bool {
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && strings.HasPrefix(u.Path, "/node/") {
			return true
		}
	}
	return false
}
