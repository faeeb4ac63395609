package config

// validateTLS checks that every TLS block names both halves of its key pair.
func (c *Config) validateTLS(p *problems) {
	for _, t := range []struct {
		key string
		tls TLS
	}{
		{"http.tls", c.HTTP.TLS},
		{"grpc.tls", c.GRPC.TLS},
		{"raft.tls", c.Raft.TLS},
		{"drift.tls", c.Drift.TLS},
	} {
		if (t.tls.CertFile == "") != (t.tls.KeyFile == "") {
			p.add(t.key, "cert_file and key_file must be set together")
		}
		if t.tls.ClientCAFile != "" && !t.tls.Enabled() {
			p.add(t.key+".client_ca_file", "needs cert_file and key_file: client certificates are only asked for over TLS")
		}
	}
}
