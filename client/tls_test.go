package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	f := ca.WriteFiles(t, dir, "sidecar", "sidecar")
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		ca, cert, key  string
		want           string // error substring; "" = success
		wantClientCert bool
	}{
		{"CA only", f.CA, "", "", "", false},
		{"CA and key pair", f.CA, f.Cert, f.Key, "", true},
		{"system roots with a key pair", "", f.Cert, f.Key, "", true},
		{"cert without key", f.CA, f.Cert, "", "must be given together", false},
		{"CA not PEM", junk, "", "", "holds no PEM certificate", false},
		{"missing CA", filepath.Join(dir, "nope"), "", "", "no such file", false},
		{"key of no pair", f.CA, f.Cert, junk, "client certificate", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := TLSFiles(tc.ca, tc.cert, tc.key)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("TLSFiles = %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (cfg.GetClientCertificate != nil) != tc.wantClientCert {
				t.Fatalf("client certificate configured: %v, want %v", cfg.GetClientCertificate != nil, tc.wantClientCert)
			}
			if (cfg.RootCAs != nil) != (tc.ca != "") {
				t.Fatalf("RootCAs set: %v with CA file %q", cfg.RootCAs != nil, tc.ca)
			}
		})
	}
}

// TestTLSFilesRotation: the key pair is read at every connection, and a
// half-written rotation falls back to the last good pair.
func TestTLSFilesRotation(t *testing.T) {
	dir := t.TempDir()
	ca := testca.New(t, "ca")
	f := ca.WriteFiles(t, dir, "sidecar", "v1")
	cfg, err := TLSFiles(f.CA, f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string {
		t.Helper()
		c, err := cfg.GetClientCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	if got := cn(); got != "v1" {
		t.Fatalf("presents %q", got)
	}
	certPEM, keyPEM := ca.Issue(t, "v2")
	if err := os.WriteFile(f.Cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := cn(); got != "v1" {
		t.Fatalf("with the new certificate but the old key, presents %q; want the last good pair v1", got)
	}
	if err := os.WriteFile(f.Key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := cn(); got != "v2" {
		t.Fatalf("after the rotation, presents %q, want v2", got)
	}
}
