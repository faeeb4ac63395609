package config

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	threePeers := []Peer{
		{ID: "node1", Address: "127.0.0.1:7001"},
		{ID: "node2", Address: "127.0.0.1:7002"},
		{ID: "node3", Address: "127.0.0.1:7003"},
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string // fragments of the error; none means valid
	}{
		// Valid configurations, so that each rule is shown not to over-reach.
		{name: "default", mutate: func(c *Config) {}},
		{name: "node_id at the pattern's limits", mutate: func(c *Config) { c.NodeID = "a" + strings.Repeat("b._-", 15) + "cd" }},
		{name: "port 0 everywhere", mutate: func(c *Config) {
			c.HTTP.Addr, c.GRPC.Addr, c.Raft.Addr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		}},
		{name: "IPv6 loopback and localhost", mutate: func(c *Config) {
			c.HTTP.Addr, c.GRPC.Addr, c.Raft.Addr = "[::1]:8080", "localhost:9090", "[::1]:7000"
		}},
		{name: "all interfaces with advertise and tokens", mutate: func(c *Config) {
			c.HTTP.Addr, c.GRPC.Addr, c.Raft.Addr = "0.0.0.0:8080", ":9090", "[::]:7000"
			c.HTTP.Advertise, c.GRPC.Advertise, c.Raft.Advertise = "10.0.0.1:8080", "node1.policyd.svc:9090", "[2001:db8::1]:7000"
			c.Auth.AdminTokensFile = "/etc/policyd/tokens"
			c.Auth.Mode, c.Auth.JWT.HMACSecretFile = "jwt", "/etc/policyd/jwt"
			c.Cluster.SecretFile = "/etc/policyd/cluster-secret"
		}},
		{name: "open admin allowed explicitly", mutate: func(c *Config) {
			c.HTTP.Addr = "10.0.0.1:8080"
			c.Auth.AllowOpenAdmin, c.Auth.AllowInsecureSidecars = true, true
		}},
		{name: "peer plane off loopback with node certificates", mutate: func(c *Config) {
			c.Raft.Addr = "10.0.0.1:7000"
			c.Raft.TLS = TLS{CertFile: "/c.pem", KeyFile: "/k.pem", ClientCAFile: "/ca.pem"}
		}},
		{name: "peer plane off loopback, opted out", mutate: func(c *Config) {
			c.Raft.Addr, c.Cluster.AllowInsecurePeers = "10.0.0.1:7000", true
		}},
		{name: "sidecar plane off loopback with client certificates", mutate: func(c *Config) {
			c.GRPC.Addr = "10.0.0.1:9090"
			c.GRPC.TLS = TLS{CertFile: "/c.pem", KeyFile: "/k.pem", ClientCAFile: "/ca.pem"}
		}},
		{name: "election equals heartbeat, lease equals heartbeat", mutate: func(c *Config) {
			c.Raft.HeartbeatTimeout, c.Raft.ElectionTimeout, c.Raft.LeaderLeaseTimeout = time.Second, time.Second, time.Second
		}},
		{name: "max_append_entries bounds", mutate: func(c *Config) { c.Raft.MaxAppendEntries = 1024 }},
		{name: "bootstrap with self among peers", mutate: func(c *Config) { c.NodeID, c.Raft.Peers = "node2", threePeers }},
		{name: "joining node need not be among peers", mutate: func(c *Config) {
			c.NodeID, c.Raft.Bootstrap, c.Raft.Peers = "node4", false, threePeers
		}},
		{name: "extra kinds", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{"RateLimitPolicy", "X"} }},
		{name: "no connection caps", mutate: func(c *Config) {
			c.HTTP.MaxConnections, c.GRPC.MaxConnections, c.Raft.MaxConnections, c.Drift.MaxConnections = 0, 0, 0, 0
		}},
		{name: "per-IP connection caps", mutate: func(c *Config) {
			c.HTTP.MaxConnectionsPerIP, c.GRPC.MaxConnectionsPerIP = 256, 1
		}},
		{name: "bad limits", mutate: func(c *Config) {
			c.HTTP.MaxConnections, c.GRPC.MaxConnections, c.HTTP.MaxHeaderBytes = -1, -1, 1024
			c.HTTP.MaxConnectionsPerIP, c.GRPC.MaxConnectionsPerIP = -1, -1
			c.Raft.MaxConnections, c.Drift.MaxConnections = -1, -1
			c.GRPC.MaxConcurrentStreams, c.GRPC.KeepaliveMinTime = 0, 0
			c.Setup.MaxConcurrent, c.Setup.MaxWait, c.Setup.MaxStaleness = 0, 0, time.Second
		}, want: []string{"http.max_connections: -1 must be >= 0", "grpc.max_connections: -1 must be >= 0",
			"http.max_connections_per_ip: -1 must be >= 0", "grpc.max_connections_per_ip: -1 must be >= 0",
			"raft.max_connections: -1 must be >= 0", "drift.max_connections: -1 must be >= 0",
			"http.max_header_bytes: 1024 must be >= 4096",
			"grpc.max_concurrent_streams", "grpc.keepalive_min_time", "setup.max_concurrent", "setup.max_wait",
			"setup.max_staleness: 1s must be 0 (off) or >= 2 x max(raft.heartbeat_timeout, raft.election_timeout) = 2s"}},
		{name: "staleness bound off", mutate: func(c *Config) { c.Setup.MaxStaleness = 0 }},
		{name: "jwt mode with hmac", mutate: func(c *Config) { c.Auth.Mode, c.Auth.JWT.HMACSecretFile = "jwt", "/s" }},
		{name: "jwt mode with pem and jwks", mutate: func(c *Config) {
			c.Auth.Mode, c.Auth.JWT.PublicKeysFile, c.Auth.JWT.JWKSFile = "jwt", "/k.pem", "/k.json"
		}},

		// One rule each.
		{name: "bad node_id", mutate: func(c *Config) { c.NodeID = "-node" }, want: []string{`node_id: "-node" must match`}},
		{name: "node_id too long", mutate: func(c *Config) { c.NodeID = strings.Repeat("a", 64) }, want: []string{"node_id:"}},
		{name: "empty data_dir", mutate: func(c *Config) { c.DataDir = " " }, want: []string{"data_dir: must not be empty"}},
		{name: "log.level", mutate: func(c *Config) { c.Log.Level = "INFO" }, want: []string{`log.level: "INFO" must be one of debug, info, warn, error`}},
		{name: "log.format", mutate: func(c *Config) { c.Log.Format = "xml" }, want: []string{`log.format: "xml" must be one of text, json`}},
		{name: "http.addr without port", mutate: func(c *Config) { c.HTTP.Addr = "foo" }, want: []string{`http.addr: "foo" is not host:port`}},
		{name: "grpc.addr port out of range", mutate: func(c *Config) { c.GRPC.Addr = "127.0.0.1:70000" }, want: []string{`grpc.addr: "127.0.0.1:70000" is not host:port`}},
		{name: "raft.addr named port", mutate: func(c *Config) { c.Raft.Addr = "127.0.0.1:raft" }, want: []string{`raft.addr: "127.0.0.1:raft" is not host:port`}},
		{name: "bad host", mutate: func(c *Config) { c.HTTP.Addr = "bad_host!:80" }, want: []string{`http.addr: "bad_host!:80" is not host:port`}},
		{name: "http.advertise port 0", mutate: func(c *Config) { c.HTTP.Advertise = "10.0.0.1:0" }, want: []string{`http.advertise: "10.0.0.1:0" needs a non-zero port`}},
		{name: "grpc.advertise unspecified", mutate: func(c *Config) { c.GRPC.Advertise = "0.0.0.0:9090" }, want: []string{"grpc.advertise:", "unspecified"}},
		{name: "raft.advertise IPv6 unspecified", mutate: func(c *Config) { c.Raft.Advertise = "[::]:7000" }, want: []string{"raft.advertise:", "unspecified"}},
		{name: "raft.advertise empty host", mutate: func(c *Config) { c.Raft.Advertise = ":7000" }, want: []string{"raft.advertise:", "unspecified"}},
		{name: "raft.advertise not host:port", mutate: func(c *Config) { c.Raft.Advertise = "10.0.0.1" }, want: []string{`raft.advertise: "10.0.0.1" is not host:port`}},
		{name: "raft.addr on all interfaces needs advertise", mutate: func(c *Config) { c.Raft.Addr = "0.0.0.0:7000" }, want: []string{"raft.advertise: required because raft.addr"}},
		{name: "grpc.addr on all interfaces needs advertise", mutate: func(c *Config) { c.GRPC.Addr = "0.0.0.0:9090" }, want: []string{"grpc.advertise: required because grpc.addr"}},
		{name: "http.addr on all interfaces needs advertise", mutate: func(c *Config) {
			c.HTTP.Addr, c.Auth.AllowOpenAdmin = "[::]:8080", true
		}, want: []string{"http.advertise: required because http.addr"}},
		{name: "raft.addr empty host needs advertise", mutate: func(c *Config) { c.Raft.Addr = ":7000" }, want: []string{"raft.advertise: required"}},
		{name: "same listen address", mutate: func(c *Config) { c.GRPC.Addr = c.HTTP.Addr }, want: []string{`grpc.addr: "127.0.0.1:8080" conflicts with http.addr`}},
		{name: "same port, one on all interfaces", mutate: func(c *Config) {
			c.Raft.Addr, c.Raft.Advertise = "0.0.0.0:9090", "10.0.0.1:9090"
		}, want: []string{`raft.addr: "0.0.0.0:9090" conflicts with grpc.addr`}},
		{name: "heartbeat 0", mutate: func(c *Config) { c.Raft.HeartbeatTimeout = 0 }, want: []string{"raft.heartbeat_timeout: must be > 0"}},
		{name: "election negative", mutate: func(c *Config) { c.Raft.ElectionTimeout = -time.Second }, want: []string{"raft.election_timeout: must be > 0"}},
		{name: "lease 0", mutate: func(c *Config) { c.Raft.LeaderLeaseTimeout = 0 }, want: []string{"raft.leader_lease_timeout: must be > 0"}},
		{name: "commit 0", mutate: func(c *Config) { c.Raft.CommitTimeout = 0 }, want: []string{"raft.commit_timeout: must be > 0"}},
		{name: "snapshot interval 0", mutate: func(c *Config) { c.Raft.SnapshotInterval = 0 }, want: []string{"raft.snapshot_interval: must be > 0"}},
		{name: "apply timeout 0", mutate: func(c *Config) { c.Raft.ApplyTimeout = 0 }, want: []string{"raft.apply_timeout: must be > 0"}},
		{name: "election below heartbeat", mutate: func(c *Config) { c.Raft.ElectionTimeout = 900 * time.Millisecond }, want: []string{"raft.election_timeout: 900ms must be >= raft.heartbeat_timeout (1s)"}},
		{name: "lease above heartbeat", mutate: func(c *Config) { c.Raft.LeaderLeaseTimeout = 2 * time.Second }, want: []string{"raft.leader_lease_timeout: 2s must be <= raft.heartbeat_timeout (1s)"}},
		{name: "max_append_entries 0", mutate: func(c *Config) { c.Raft.MaxAppendEntries = 0 }, want: []string{"raft.max_append_entries: 0 must be between 1 and 1024"}},
		{name: "max_append_entries 1025", mutate: func(c *Config) { c.Raft.MaxAppendEntries = 1025 }, want: []string{"raft.max_append_entries: 1025"}},
		{name: "snapshot_retain 0", mutate: func(c *Config) { c.Raft.SnapshotRetain = 0 }, want: []string{"raft.snapshot_retain: 0 must be >= 1"}},
		{name: "snapshot_threshold 0", mutate: func(c *Config) { c.Raft.SnapshotThreshold = 0 }, want: []string{"raft.snapshot_threshold: must be >= 1"}},
		{name: "peer without id", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{Address: "127.0.0.1:7004"})
		}, want: []string{"raft.peers[3].id: must not be empty"}},
		{name: "peer with bad id", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{ID: "no/slash", Address: "127.0.0.1:7004"})
		}, want: []string{`raft.peers[3].id: "no/slash" must match`}},
		{name: "peer without address", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{ID: "node4"})
		}, want: []string{`raft.peers[3].address: "" is not host:port`}},
		{name: "peer address port 0", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{ID: "node4", Address: "127.0.0.1:0"})
		}, want: []string{`raft.peers[3].address: "127.0.0.1:0" needs a non-zero port`}},
		{name: "duplicate peer id", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{ID: "node2", Address: "127.0.0.1:7004"})
		}, want: []string{`raft.peers[3].id: "node2" duplicates raft.peers[1].id`}},
		{name: "duplicate peer address", mutate: func(c *Config) {
			c.NodeID = "node1"
			c.Raft.Peers = append(threePeers[:3:3], Peer{ID: "node4", Address: "127.0.0.1:7003"})
		}, want: []string{`raft.peers[3].address: "127.0.0.1:7003" duplicates raft.peers[2].address`}},
		{name: "peers without node_id", mutate: func(c *Config) { c.Raft.Peers = threePeers }, want: []string{"node_id: required when raft.peers is set"}},
		{name: "bootstrap without self among peers", mutate: func(c *Config) { c.NodeID, c.Raft.Peers = "node4", threePeers }, want: []string{`raft.peers: must include this node (node_id "node4")`}},
		{name: "auth.mode", mutate: func(c *Config) { c.Auth.Mode = "mtls" }, want: []string{`auth.mode: "mtls" must be one of none, jwt`}},
		{name: "open admin on a routable address", mutate: func(c *Config) { c.HTTP.Addr = "10.0.0.1:8080" }, want: []string{"auth.admin_tokens_file: required", "auth.allow_open_admin"}},
		{name: "open admin on all interfaces", mutate: func(c *Config) { c.HTTP.Addr = ":8080" }, want: []string{"auth.admin_tokens_file: required"}},
		{name: "open admin on a host name", mutate: func(c *Config) { c.HTTP.Addr = "policyd.example.com:8080" }, want: []string{"auth.admin_tokens_file: required"}},
		{name: "mutual TLS stands in for admin tokens", mutate: func(c *Config) {
			c.HTTP.Addr = "10.0.0.1:8080"
			c.HTTP.TLS = TLS{CertFile: "/c.pem", KeyFile: "/k.pem", ClientCAFile: "/ca.pem"}
		}},
		{name: "peer plane off loopback without authentication", mutate: func(c *Config) { c.Raft.Addr = "10.0.0.1:7000" },
			want: []string{`cluster.secret_file: required because raft.addr "10.0.0.1:7000" is reachable from other hosts`, "cluster.allow_insecure_peers"}},
		{name: "peer plane TLS without client CA is no authentication", mutate: func(c *Config) {
			c.Raft.Addr = "10.0.0.1:7000"
			c.Raft.TLS = TLS{CertFile: "/c.pem", KeyFile: "/k.pem"}
		}, want: []string{"cluster.secret_file: required because raft.addr"}},
		{name: "sidecar gRPC off loopback without authentication", mutate: func(c *Config) { c.GRPC.Addr = "0.0.0.0:9090"; c.GRPC.Advertise = "10.0.0.1:9090" },
			want: []string{`auth.mode: none is refused because grpc.addr "0.0.0.0:9090"`, "auth.allow_insecure_sidecars"}},
		{name: "sidecar feed off loopback without authentication", mutate: func(c *Config) {
			c.HTTP.Addr, c.Auth.AdminTokensFile = "10.0.0.1:8080", "/t"
		}, want: []string{`auth.mode: none is refused because http.addr "10.0.0.1:8080"`}},
		{name: "trust domain", mutate: func(c *Config) { c.Cluster.TrustDomain = "Bad Domain" }, want: []string{`cluster.trust_domain: "Bad Domain" must match`}},
		{name: "tls cert without key", mutate: func(c *Config) { c.GRPC.TLS.CertFile = "/c.pem" }, want: []string{"grpc.tls: cert_file and key_file must be set together"}},
		{name: "tls client CA without TLS", mutate: func(c *Config) { c.Raft.TLS.ClientCAFile = "/ca.pem" }, want: []string{"raft.tls.client_ca_file: needs cert_file and key_file"}},
		{name: "reload selector not key=value", mutate: func(c *Config) { c.Reload.Enabled, c.Reload.Selector = true, "app" }, want: []string{`reload.selector: "app" must be key=value`}},
		{name: "reload selector empty value", mutate: func(c *Config) { c.Reload.Enabled, c.Reload.Selector = true, "app=" }, want: []string{`reload.selector: "app=" must be key=value`}},
		{name: "sources debounce above 1s", mutate: func(c *Config) { c.Sources.Debounce = 2 * time.Second }, want: []string{"sources.debounce: 2s must be within 0s..1s"}},
		{name: "sources prune ratio above 1", mutate: func(c *Config) { c.Sources.MaxPruneRatio = 1.5 }, want: []string{"sources.max_prune_ratio: 1.5 must be within 0..1"}},
		{name: "git source bad name", mutate: func(c *Config) {
			c.Sources.Git = []SourceGit{{Name: "Bad_Name", URL: "https://x/y.git", Ref: "main"}}
		}, want: []string{`sources.git[0].name: "Bad_Name" must be lowercase letters`}},
		{name: "git source twice", mutate: func(c *Config) {
			c.Sources.Git = []SourceGit{{Name: "p", URL: "https://x/y.git", Ref: "main"}, {Name: "p", URL: "https://x/z.git", Ref: "main"}}
		}, want: []string{`sources.git[1].name: "p" is configured twice`}},
		{name: "git source without url and ref", mutate: func(c *Config) { c.Sources.Git = []SourceGit{{Name: "p"}} },
			want: []string{"sources.git[0].url: must not be empty", "sources.git[0].ref: must name a branch or a tag"}},
		{name: "git ssh key without known hosts", mutate: func(c *Config) {
			c.Sources.Git = []SourceGit{{Name: "p", URL: "ssh://git@x/y.git", Ref: "main", Auth: GitAuth{SSHKeyFile: "/k"}}}
		}, want: []string{"sources.git[0].auth.known_hosts_file: required with auth.ssh_key_file"}},
		{name: "git interval below 1s", mutate: func(c *Config) {
			c.Sources.Git = []SourceGit{{Name: "p", URL: "https://x/y.git", Ref: "main", Interval: time.Millisecond}}
		}, want: []string{"sources.git[0].interval: 1ms must be at least 1s"}},
		{name: "reload empty namespace", mutate: func(c *Config) { c.Reload.Enabled, c.Reload.Namespace = true, " " }, want: []string{"reload.namespace: must not be empty"}},
		{name: "reload disabled is not checked", mutate: func(c *Config) { c.Reload.Selector, c.Reload.Namespace = "bad", "" }},
		{name: "drift mode", mutate: func(c *Config) { c.Drift.Mode = "block" }, want: []string{`drift.mode: "block" must be one of enforce, log`}},
		{name: "drift addr without tls", mutate: func(c *Config) { c.Drift.Addr = "127.0.0.1:8443" }, want: []string{"drift.tls: cert_file and key_file are required"}},
		{name: "drift callback not a URL", mutate: func(c *Config) { c.Drift.Callbacks = []string{"ftp://x"} }, want: []string{`drift.callbacks: [0] "ftp://x" must be an http:// or https:// URL`}},
		{name: "drift initialization rules", mutate: func(c *Config) {
			c.Drift.Initialization = []string{"apps/Deployment=default", "apps/Deployment=Ready+observedGeneration", "apps/Deployment=ready", "apps/StatefulSet=default+Ready"}
		}, want: []string{`drift.initialization: [2] initialization rule "apps/Deployment=ready": unknown signal "ready"`, `drift.initialization: [3] initialization rule "apps/StatefulSet=default+Ready": default is the seed's whole detection order and stands alone`}},
		{name: "extra kind pattern", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{"lowerKind"} }, want: []string{`policies.extra_kinds[0]: "lowerKind" must match`}},
		{name: "extra kind empty", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{""} }, want: []string{`policies.extra_kinds[0]: "" must match`}},
		{name: "extra kind duplicate", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{"A", "B", "A"} }, want: []string{`policies.extra_kinds[2]: "A" duplicates policies.extra_kinds[0]`}},
		{name: "extra kind ToolPolicy", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{"ToolPolicy"} }, want: []string{`policies.extra_kinds[0]: "ToolPolicy" is a built-in kind`}},
		{name: "extra kind ValidatingPolicy", mutate: func(c *Config) { c.Policy.ExtraKinds = []string{"ValidatingPolicy"} }, want: []string{`policies.extra_kinds[0]: "ValidatingPolicy" is a built-in kind`}},
		{name: "events.retention", mutate: func(c *Config) { c.Events.Retention = 0 }, want: []string{"events.retention: must be > 0"}},
		{name: "events.cleanup_interval", mutate: func(c *Config) { c.Events.CleanupInterval = -1 }, want: []string{"events.cleanup_interval: must be > 0"}},
		{name: "forward.timeout", mutate: func(c *Config) { c.Forward.Timeout = 0 }, want: []string{"forward.timeout: must be > 0"}},
		{name: "jwt mode without keys", mutate: func(c *Config) { c.Auth.Mode = "jwt" }, want: []string{"auth.jwt: auth.mode jwt needs a key source"}},
		{name: "jwt hmac mixed with public keys", mutate: func(c *Config) {
			c.Auth.Mode, c.Auth.JWT.HMACSecretFile, c.Auth.JWT.JWKSFile = "jwt", "/s", "/k.json"
		}, want: []string{"auth.jwt.hmac_secret_file: cannot be combined"}},
		{name: "jwt leeway negative", mutate: func(c *Config) { c.Auth.JWT.Leeway = -time.Second }, want: []string{"auth.jwt.leeway: -1s must not be negative"}},
		{name: "jwt leeway huge", mutate: func(c *Config) { c.Auth.JWT.Leeway = time.Hour }, want: []string{"auth.jwt.leeway: 1h0m0s is more than 5m"}},
		{name: "discovery durations", mutate: func(c *Config) {
			c.Discovery.FlushInterval, c.Discovery.MaxClientInactive, c.Discovery.SendTimeout = 0, 0, 0
		}, want: []string{"discovery.flush_interval: must be > 0", "discovery.max_client_inactive: must be > 0", "discovery.send_timeout: must be > 0"}},
		{name: "feed limits", mutate: func(c *Config) {
			c.Feed.PingInterval, c.Feed.WriteTimeout, c.Feed.SendBuffer, c.Feed.MaxMessageBytes = 0, 0, 0, 10
		}, want: []string{"feed.ping_interval: must be > 0", "feed.write_timeout: must be > 0", "feed.send_buffer: 0 must be >= 1", "feed.max_message_bytes: 10 must be >= 64"}},
		{name: "every problem is reported", mutate: func(c *Config) {
			c.DataDir, c.Log.Level, c.Auth.Mode, c.Forward.Timeout = "", "loud", "magic", 0
		}, want: []string{"data_dir:", "log.level:", "auth.mode:", "forward.timeout:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantErrContaining(t, err, tc.want...)
		})
	}
}

func TestAdvertise(t *testing.T) {
	c := Default()
	c.HTTP.Advertise = "10.0.0.1:8080"
	c.GRPC.Addr = "0.0.0.0:9090"
	c.Raft.Advertise = "node1.policyd:7000"
	for _, tc := range []struct{ name, got, want string }{
		{"http advertise set", c.HTTPAdvertise(), "10.0.0.1:8080"},
		{"grpc falls back to addr", c.GRPCAdvertise(), "0.0.0.0:9090"},
		{"raft advertise set", c.RaftAdvertise(), "node1.policyd:7000"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}
