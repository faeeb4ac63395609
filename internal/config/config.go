// Package config is policyd's typed configuration: defaults, loading and
// validation. It is the only package that imports viper, so the rest of the
// code sees a plain Config value. Load layers Default(), the YAML file,
// POLICYD_* environment variables and explicit flags; keys are derived from
// the struct by reflection, so a new field is known (and has a variable)
// automatically, and a key in the file that Config does not define is an
// error. It does not apply settings; the server does. See
// docs/configuration.md.
package config

import "time"

// Config is the whole daemon configuration. Keys are the mapstructure tags,
// joined with dots (raft.heartbeat_timeout); the environment form is
// POLICYD_ plus the key upper-cased with dots as underscores
// (POLICYD_RAFT_HEARTBEAT_TIMEOUT).
type Config struct {
	// NodeID is this node's Raft server ID. Empty: the ID persisted in
	// data_dir/node-id, or on first start the host name (then persisted).
	NodeID string `mapstructure:"node_id"`
	// DataDir holds state.db (the FSM), raft/ (log, stable store, snapshots)
	// and node-id.
	DataDir   string    `mapstructure:"data_dir"`
	Log       Log       `mapstructure:"log"`
	HTTP      HTTP      `mapstructure:"http"`
	GRPC      GRPC      `mapstructure:"grpc"`
	Raft      Raft      `mapstructure:"raft"`
	Auth      Auth      `mapstructure:"auth"`
	Cluster   Cluster   `mapstructure:"cluster"`
	Policy    Policies  `mapstructure:"policies"`
	Events    Events    `mapstructure:"events"`
	Forward   Forwarder `mapstructure:"forward"`
	Discovery Discovery `mapstructure:"discovery"`
	Feed      Feed      `mapstructure:"feed"`
	Setup     Setup     `mapstructure:"setup"`
	// Kubernetes is the API server connection shared by reload and drift.
	Kubernetes Kubernetes `mapstructure:"kubernetes"`
	Reload     Reload     `mapstructure:"reload"`
	Drift      Drift      `mapstructure:"drift"`
	Sources    Sources    `mapstructure:"sources"`
	Decisions  Decisions  `mapstructure:"decisions"`
}

// TLS is one listener's (or the Raft transport's) certificate set. Empty
// CertFile and KeyFile: plain TCP. ClientCAFile set: clients must present a
// certificate signed by one of its CAs (mutual TLS). The files are re-read on
// SIGHUP and when they change.
type TLS struct {
	CertFile     string `mapstructure:"cert_file"`
	KeyFile      string `mapstructure:"key_file"`
	ClientCAFile string `mapstructure:"client_ca_file"`
}

// Enabled reports whether the listener serves TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Kubernetes is how the reload controller and the drift webhook reach the
// API server.
type Kubernetes struct {
	// Kubeconfig is a kubeconfig file; empty = in-cluster configuration.
	Kubeconfig string `mapstructure:"kubeconfig"`
}

// Log configures the process logger.
type Log struct {
	Level  string `mapstructure:"level"`  // debug|info|warn|error
	Format string `mapstructure:"format"` // text|json
}

// HTTP is the admin REST API (and, later, the WebSocket feed and metrics).
type HTTP struct {
	Addr      string `mapstructure:"addr"`
	Advertise string `mapstructure:"advertise"` // what peers and clients dial; empty = addr
	TLS       TLS    `mapstructure:"tls"`
	// MaxConnections caps the connections the HTTP server serves at once,
	// feed connections included until they close; a new one over the cap
	// is closed at once. 0 = no cap.
	MaxConnections int `mapstructure:"max_connections"`
	// MaxConnectionsPerIP caps the open connections from one source IP
	// address, the same way. 0 = no cap (clients behind NAT share one).
	MaxConnectionsPerIP int `mapstructure:"max_connections_per_ip"`
	// MaxHeaderBytes bounds a request's header block.
	MaxHeaderBytes int `mapstructure:"max_header_bytes"`
	// Console is the web console at /ui/ (docs/console.md).
	Console Console `mapstructure:"console"`
}

// Console configures the web console on the HTTP listener.
type Console struct {
	Enabled bool `mapstructure:"enabled"`
	// SessionTTL ends a session this long after sign-in.
	SessionTTL time.Duration `mapstructure:"session_ttl"`
	// IdleTimeout ends a session unused for this long.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
}

// GRPC is the sidecar listener: policy discovery (and health, reflection).
type GRPC struct {
	Addr      string `mapstructure:"addr"`
	Advertise string `mapstructure:"advertise"` // empty = addr
	TLS       TLS    `mapstructure:"tls"`
	// MaxConnections caps open connections; a new one over the cap is
	// closed at once. 0 = no cap.
	MaxConnections int `mapstructure:"max_connections"`
	// MaxConnectionsPerIP caps the open connections from one source IP
	// address, the same way. 0 = no cap (clients behind NAT share one).
	MaxConnectionsPerIP int `mapstructure:"max_connections_per_ip"`
	// MaxConcurrentStreams caps the streams (RPCs) one connection may have
	// open; a client over it queues its new streams.
	MaxConcurrentStreams int `mapstructure:"max_concurrent_streams"`
	// KeepaliveMinTime is the shortest interval between client keepalive
	// pings that is tolerated; a client pinging more often is disconnected
	// (GOAWAY too_many_pings).
	KeepaliveMinTime time.Duration `mapstructure:"keepalive_min_time"`
}

// Setup governs sidecar connections over both transports: it bounds
// concurrent set-ups (authentication, the read-index wait, the first
// snapshot), so that a reconnect storm queues instead of running all at
// once, and it bounds how long a node that has lost the cluster keeps its
// sidecars.
type Setup struct {
	// MaxConcurrent set-ups run at once on a node.
	MaxConcurrent int `mapstructure:"max_concurrent"`
	// MaxWait is how long a set-up waits for a slot before it is refused
	// as retryable (gRPC Unavailable, HTTP 503 with Retry-After).
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxStaleness: a node that is not the leader and has not heard from
	// one for longer than this closes its sidecar streams and connections
	// and refuses new ones until it hears from a leader again, so that
	// sidecars move to a node that still receives changes (revocations
	// included), or fail closed after their grace period when none does.
	// 0 keeps them forever on the last state the node received.
	MaxStaleness time.Duration `mapstructure:"max_staleness"`
}

// Peer is one member of the initial cluster.
type Peer struct {
	ID      string `mapstructure:"id"`
	Address string `mapstructure:"address"` // Raft address
}

// Raft configures consensus.
type Raft struct {
	Addr      string `mapstructure:"addr"`
	Advertise string `mapstructure:"advertise"` // empty = addr
	// TLS secures the Raft transport; with ClientCAFile, peers authenticate
	// each other (mutual TLS) and a node without a valid certificate can
	// neither join nor replicate.
	TLS TLS `mapstructure:"tls"`
	// MaxConnections caps the Raft listener's open connections (peers hold
	// a few each); a new one over the cap is closed at once. 0 = no cap.
	MaxConnections int `mapstructure:"max_connections"`
	// Bootstrap forms the initial cluster from Peers when the node has no
	// Raft state yet. With no peers, the node bootstraps a single-node
	// cluster of itself. A node meant to join an existing cluster sets
	// Bootstrap to false and is added with `policyd cluster join`.
	Bootstrap          bool          `mapstructure:"bootstrap"`
	Peers              []Peer        `mapstructure:"peers"`
	HeartbeatTimeout   time.Duration `mapstructure:"heartbeat_timeout"`
	ElectionTimeout    time.Duration `mapstructure:"election_timeout"`
	LeaderLeaseTimeout time.Duration `mapstructure:"leader_lease_timeout"`
	CommitTimeout      time.Duration `mapstructure:"commit_timeout"`
	MaxAppendEntries   int           `mapstructure:"max_append_entries"`
	SnapshotInterval   time.Duration `mapstructure:"snapshot_interval"`
	SnapshotThreshold  uint64        `mapstructure:"snapshot_threshold"`
	SnapshotRetain     int           `mapstructure:"snapshot_retain"`
	TrailingLogs       uint64        `mapstructure:"trailing_logs"`
	ApplyTimeout       time.Duration `mapstructure:"apply_timeout"`
	// StateFsync fsyncs state.db on every applied batch. Off, the Raft log
	// is the only durable copy of recent entries: a node that did not shut
	// down cleanly discards state.db and rebuilds it from the latest Raft
	// snapshot and the log (store.Options.NoSync), much as etcd replays its
	// WAL over a backend it does not fsync on each write. That takes two
	// fsyncs off every write's path.
	StateFsync bool `mapstructure:"state_fsync"`
	// LogStore is the Raft log's format for a node created from now on:
	// wal (hashicorp/raft-wal, the default) or boltdb
	// (hashicorp/raft-boltdb). A node keeps the format its log already has.
	LogStore string `mapstructure:"log_store"`
	// LeaderProbe lets a follower that has not heard from its leader for
	// LeaderLeaseTimeout dial the leader's Raft address, and campaign at
	// once (with its heartbeat and election timeouts shortened to
	// LeaderLeaseTimeout until a leader is heard from again) if the
	// connection is refused: the leader process is gone. See
	// internal/server/raftnode/leaderprobe.go.
	LeaderProbe bool `mapstructure:"leader_probe"`
}

// Auth configures authentication of every listener.
type Auth struct {
	Mode string `mapstructure:"mode"` // none|jwt (sidecar-facing listeners)
	// AdminTokensFile lists admin API bearer tokens with their roles. Empty:
	// the admin API is open, which is only accepted on a loopback http.addr
	// unless AllowOpenAdmin is set.
	AdminTokensFile string `mapstructure:"admin_tokens_file"`
	AllowOpenAdmin  bool   `mapstructure:"allow_open_admin"`
	// AllowInsecureSidecars lets grpc.addr or http.addr listen off loopback
	// with auth.mode none, where anyone who reaches them reads any tenant's
	// policies.
	AllowInsecureSidecars bool `mapstructure:"allow_insecure_sidecars"`
	JWT                   JWT  `mapstructure:"jwt"`
}

// Cluster configures how nodes authenticate each other on the peer plane
// (raft.addr: Raft and the node-to-node API).
type Cluster struct {
	// SecretFile holds the shared cluster secret, one per line: the first
	// is used to dial, every one is accepted, so a secret rotates without
	// downtime. Empty: no secret (raft.tls must authenticate peers).
	SecretFile string `mapstructure:"secret_file"`
	// TrustDomain is the SPIFFE trust domain of node certificates: with
	// raft.tls, a peer's certificate must carry the URI SAN
	// spiffe://<trust_domain>/node/<node_id>.
	TrustDomain string `mapstructure:"trust_domain"`
	// AllowInsecurePeers lets raft.addr listen off loopback with neither
	// a secret nor mutual TLS, so that anyone who reaches it can join the
	// cluster and rewrite its state.
	AllowInsecurePeers bool `mapstructure:"allow_insecure_peers"`
}

// JWT configures verification of sidecar tokens (auth.mode: jwt). Exactly
// one key source is used: an HMAC secret, or PEM public keys and/or a JWKS
// file. Mixing HMAC with public keys is refused, so a token can never be
// verified with a public key used as an HMAC secret.
type JWT struct {
	HMACSecretFile string        `mapstructure:"hmac_secret_file"` // HS256 shared secret
	PublicKeysFile string        `mapstructure:"public_keys_file"` // PEM RSA/EC public keys (RS256/ES256)
	JWKSFile       string        `mapstructure:"jwks_file"`        // JSON Web Key Set (RS256/ES256)
	Issuer         string        `mapstructure:"issuer"`           // required iss; empty = not checked
	Audience       string        `mapstructure:"audience"`         // required in aud; empty = not checked
	Leeway         time.Duration `mapstructure:"leeway"`           // clock skew allowed on exp/nbf/iat
}

// Discovery configures the sidecar discovery stream (gRPC).
type Discovery struct {
	// FlushInterval is how often streams inactive for longer than
	// MaxClientInactive are closed.
	FlushInterval     time.Duration `mapstructure:"flush_interval"`
	MaxClientInactive time.Duration `mapstructure:"max_client_inactive"`
	// SendTimeout bounds one write to a stream; a client that does not read
	// for this long is disconnected so it cannot pin memory.
	SendTimeout time.Duration `mapstructure:"send_timeout"`
}

// Feed configures the WebSocket policy feed.
type Feed struct {
	// PingInterval: a ping is sent every interval; a connection with no pong
	// for two intervals is closed.
	PingInterval time.Duration `mapstructure:"ping_interval"`
	// SendBuffer is the number of messages queued per connection; a
	// connection whose buffer is full is closed (it reconnects and gets init).
	SendBuffer int `mapstructure:"send_buffer"`
	// WriteTimeout bounds one write to a connection.
	WriteTimeout time.Duration `mapstructure:"write_timeout"`
	// MaxMessageBytes is the read limit for client frames.
	MaxMessageBytes int64 `mapstructure:"max_message_bytes"`
}

// Policies configures policy validation.
type Policies struct {
	// ExtraKinds are accepted in addition to ToolPolicy and
	// ValidatingPolicy, with any JSON object as spec.
	ExtraKinds []string `mapstructure:"extra_kinds"`
}

// Events configures the event log.
type Events struct {
	Retention       time.Duration `mapstructure:"retention"`
	CleanupInterval time.Duration `mapstructure:"cleanup_interval"`
}

// Forwarder configures how followers forward writes to the leader.
type Forwarder struct {
	Timeout time.Duration `mapstructure:"timeout"`
}

// Default returns the embedded default: a single node bootstrapping itself in
// ./data, listening on loopback only.
func Default() Config {
	return Config{
		DataDir: "./data",
		Log:     Log{Level: "info", Format: "text"},
		HTTP: HTTP{Addr: "127.0.0.1:8080", MaxConnections: 20000, MaxHeaderBytes: 64 << 10,
			Console: Console{Enabled: true, SessionTTL: 8 * time.Hour, IdleTimeout: time.Hour}},
		GRPC: GRPC{
			Addr:                 "127.0.0.1:9090",
			MaxConnections:       10000,
			MaxConcurrentStreams: 1000,
			KeepaliveMinTime:     5 * time.Minute,
		},
		Raft: Raft{
			Addr:               "127.0.0.1:7000",
			MaxConnections:     1024,
			Bootstrap:          true,
			HeartbeatTimeout:   1000 * time.Millisecond,
			ElectionTimeout:    1000 * time.Millisecond,
			LeaderLeaseTimeout: 500 * time.Millisecond,
			LeaderProbe:        true,
			CommitTimeout:      10 * time.Millisecond,
			MaxAppendEntries:   512,
			SnapshotInterval:   120 * time.Second,
			SnapshotThreshold:  8192,
			SnapshotRetain:     2,
			TrailingLogs:       10240,
			ApplyTimeout:       10 * time.Second,
			LogStore:           "wal",
		},
		Auth:    Auth{Mode: "none", JWT: JWT{Leeway: 30 * time.Second}},
		Cluster: Cluster{TrustDomain: "policyd"},
		Events:  Events{Retention: 24 * time.Hour, CleanupInterval: time.Hour},
		Forward: Forwarder{Timeout: 10 * time.Second},
		Discovery: Discovery{
			FlushInterval:     30 * time.Second,
			MaxClientInactive: 2 * time.Minute,
			SendTimeout:       30 * time.Second,
		},
		Feed: Feed{
			PingInterval:    30 * time.Second,
			SendBuffer:      64,
			WriteTimeout:    10 * time.Second,
			MaxMessageBytes: 4096,
		},
		Setup: Setup{MaxConcurrent: 64, MaxWait: 5 * time.Second, MaxStaleness: 10 * time.Second},
		Reload: Reload{
			Namespace:        "default",
			Selector:         "app=helloworld",
			ScopeLabel:       "env",
			Debounce:         5 * time.Second,
			AnnotationPrefix: "policyd.io",
		},
		Sources: Sources{Debounce: 100 * time.Millisecond, MaxPruneRatio: 0.5},
		Decisions: Decisions{Enabled: true, Retention: 24 * time.Hour, MaxBytes: 1 << 30,
			ExportMaxBytes: 100 << 20, MaxRecordsPerSecond: 2000},
		Drift: Drift{
			MaxConnections:   1024,
			AnnotationPrefix: "policyd.io",
			Mode:             "log",
		},
	}
}
