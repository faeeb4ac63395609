package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// TLSFiles builds a Config.TLS from PEM files, for nodes serving TLS
// (grpc.tls / http.tls).
//
// caFile is the bundle the nodes' certificates must chain to; "" uses the
// system roots. certFile and keyFile, set together, are the client
// certificate presented to nodes that require one (client_ca_file set on the
// node: mutual TLS). The key pair is read again at every connection, so a
// rotated certificate is used from the next reconnect on; a pair that does
// not load then (a rotation half written) falls back to the last good one.
// The CA bundle is read once.
//
// The SDK takes a *tls.Config rather than file names so that callers with
// their own certificate source (a SPIFFE workload API, a secret store) plug
// it in directly; TLSFiles is the common case.
func TLSFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
		return cfg, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("client certificate: cert file and key file must be given together")
	}
	kp := &keyPairFiles{certFile: certFile, keyFile: keyFile}
	if _, err := kp.load(); err != nil {
		return nil, err
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return kp.load()
	}
	return cfg, nil
}

// keyPairFiles loads a client key pair, keeping the last good one.
type keyPairFiles struct {
	certFile, keyFile string

	mu   sync.Mutex
	last *tls.Certificate
}

func (k *keyPairFiles) load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if k.last != nil {
			return k.last, nil
		}
		return nil, fmt.Errorf("client certificate %s, %s: %w", k.certFile, k.keyFile, err)
	}
	k.last = &c
	return k.last, nil
}
