package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	// idPattern bounds node and peer IDs to what is safe in a file name, a
	// URL path and a log line.
	idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	// kindPattern is a Kubernetes-style kind name.
	kindPattern = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,62}$`)
	// hostnamePattern is an RFC 1123 host name (labels of letters, digits and
	// inner hyphens), optionally fully qualified.
	hostnamePattern = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$`)
)

// ValidNodeID reports whether id is a valid node ID (node_id, raft.peers,
// a join, a node certificate's URI): every package checks IDs with this.
func ValidNodeID(id string) bool { return idPattern.MatchString(id) }

// builtinKinds are validated by policyd itself, so listing them as extra
// kinds would silently turn their validation off.
var builtinKinds = []string{"ToolPolicy", "ValidatingPolicy"}

// maxAppendEntries is hashicorp/raft's upper bound for MaxAppendEntries.
const maxAppendEntries = 1024

// Validate checks every key. Each problem is reported as "key: reason", and
// all of them are returned at once (errors.Join) so that an operator fixes a
// config file in one pass.
func (c *Config) Validate() error {
	var p problems

	if c.NodeID != "" && !idPattern.MatchString(c.NodeID) {
		p.add("node_id", "%q must match %s", c.NodeID, idPattern)
	}
	if strings.TrimSpace(c.DataDir) == "" {
		p.add("data_dir", "must not be empty")
	}
	p.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	p.oneOf("log.format", c.Log.Format, "text", "json")

	c.validateAddrs(&p)
	c.validateRaft(&p)

	p.oneOf("auth.mode", c.Auth.Mode, "none", "jwt")
	p.oneOf("raft.log_store", c.Raft.LogStore, "boltdb", "wal")
	// Mutual TLS on the HTTP listener authenticates admin clients too
	// (docs/security.md): only holders of a certificate from client_ca_file
	// reach the API, so no token file is needed then.
	if c.Auth.AdminTokensFile == "" && !c.Auth.AllowOpenAdmin && c.HTTP.TLS.ClientCAFile == "" {
		// An unparsable http.addr is reported on its own key already.
		if host, _, err := splitHostPort(c.HTTP.Addr); err == nil && !IsLoopback(host) {
			p.add("auth.admin_tokens_file", "required because http.addr %q is reachable from other hosts; "+
				"set auth.admin_tokens_file, require client certificates with http.tls.client_ca_file, "+
				"or set auth.allow_open_admin: true to serve the admin API without authentication",
				c.HTTP.Addr)
		}
	}

	c.validatePlanes(&p)
	c.validateJWT(&p)
	c.validateTLS(&p)
	c.validateReload(&p)
	c.validateSources(&p)
	c.validateDecisions(&p)
	c.validateDrift(&p)

	seenKinds := map[string]int{}
	for i, k := range c.Policy.ExtraKinds {
		key := fmt.Sprintf("policies.extra_kinds[%d]", i)
		switch {
		case !kindPattern.MatchString(k):
			p.add(key, "%q must match %s", k, kindPattern)
		case slices.Contains(builtinKinds, k):
			p.add(key, "%q is a built-in kind with its own validation", k)
		}
		if j, dup := seenKinds[k]; dup {
			p.add(key, "%q duplicates policies.extra_kinds[%d]", k, j)
		} else {
			seenKinds[k] = i
		}
	}

	p.positive("events.retention", c.Events.Retention)
	p.positive("events.cleanup_interval", c.Events.CleanupInterval)
	p.positive("forward.timeout", c.Forward.Timeout)
	p.positive("discovery.flush_interval", c.Discovery.FlushInterval)
	p.positive("discovery.max_client_inactive", c.Discovery.MaxClientInactive)
	p.positive("discovery.send_timeout", c.Discovery.SendTimeout)
	p.positive("feed.ping_interval", c.Feed.PingInterval)
	p.positive("feed.write_timeout", c.Feed.WriteTimeout)
	if c.Feed.SendBuffer < 1 {
		p.add("feed.send_buffer", "%d must be >= 1", c.Feed.SendBuffer)
	}
	if c.Feed.MaxMessageBytes < 64 {
		p.add("feed.max_message_bytes", "%d must be >= 64", c.Feed.MaxMessageBytes)
	}
	c.validateLimits(&p)

	return p.err()
}

// trustDomainPattern is a SPIFFE trust domain: lowercase letters, digits,
// dots, hyphens and underscores.
var trustDomainPattern = regexp.MustCompile(`^[a-z0-9._-]{1,255}$`)

// validatePlanes refuses a sidecar or peer door that is reachable from
// other hosts without authentication (docs/security.md), unless the opt-out
// key says so.
func (c *Config) validatePlanes(p *problems) {
	if !trustDomainPattern.MatchString(c.Cluster.TrustDomain) {
		p.add("cluster.trust_domain", "%q must match %s", c.Cluster.TrustDomain, trustDomainPattern)
	}
	peerAuth := c.Cluster.SecretFile != "" || c.Raft.TLS.Enabled() && c.Raft.TLS.ClientCAFile != ""
	if host, _, err := splitHostPort(c.Raft.Addr); err == nil && !IsLoopback(host) && !peerAuth && !c.Cluster.AllowInsecurePeers {
		p.add("cluster.secret_file", "required because raft.addr %q is reachable from other hosts and carries Raft and the "+
			"node-to-node API; set cluster.secret_file, or raft.tls.cert_file, key_file and client_ca_file with node "+
			"certificates, or set cluster.allow_insecure_peers: true to let anyone who reaches it join the cluster",
			c.Raft.Addr)
	}
	if c.Auth.Mode != "none" || c.Auth.AllowInsecureSidecars {
		return
	}
	// Client certificates from a CA authenticate sidecars too.
	for _, l := range []struct {
		key, addr string
		tls       TLS
	}{{"grpc.addr", c.GRPC.Addr, c.GRPC.TLS}, {"http.addr", c.HTTP.Addr, c.HTTP.TLS}} {
		if host, _, err := splitHostPort(l.addr); err == nil && !IsLoopback(host) && l.tls.ClientCAFile == "" {
			p.add("auth.mode", "none is refused because %s %q is reachable from other hosts and serves sidecars; "+
				"set auth.mode: jwt, require client certificates with its tls.client_ca_file, or auth.allow_insecure_sidecars: true to serve every tenant's policies to anyone",
				l.key, l.addr)
		}
	}
}

// validateLimits checks the resource limits (internal/server/limits).
func (c *Config) validateLimits(p *problems) {
	for _, l := range []struct {
		key string
		v   int
	}{
		{"http.max_connections", c.HTTP.MaxConnections},
		{"http.max_connections_per_ip", c.HTTP.MaxConnectionsPerIP},
		{"grpc.max_connections", c.GRPC.MaxConnections},
		{"grpc.max_connections_per_ip", c.GRPC.MaxConnectionsPerIP},
		{"raft.max_connections", c.Raft.MaxConnections},
		{"drift.max_connections", c.Drift.MaxConnections},
	} {
		if l.v < 0 {
			p.add(l.key, "%d must be >= 0 (0 = no cap)", l.v)
		}
	}
	// A JWT in an Authorization header or a subprotocol needs a few KiB.
	if con := c.HTTP.Console; con.Enabled && (con.SessionTTL < time.Minute || con.IdleTimeout <= 0 || con.IdleTimeout > con.SessionTTL) {
		p.add("http.console", "session_ttl %s must be >= 1m and idle_timeout %s > 0 and <= session_ttl", con.SessionTTL, con.IdleTimeout)
	}
	if c.HTTP.MaxHeaderBytes < 4<<10 {
		p.add("http.max_header_bytes", "%d must be >= 4096", c.HTTP.MaxHeaderBytes)
	}
	if c.GRPC.MaxConcurrentStreams < 1 {
		p.add("grpc.max_concurrent_streams", "%d must be >= 1", c.GRPC.MaxConcurrentStreams)
	}
	p.positive("grpc.keepalive_min_time", c.GRPC.KeepaliveMinTime)
	if c.Setup.MaxConcurrent < 1 {
		p.add("setup.max_concurrent", "%d must be >= 1", c.Setup.MaxConcurrent)
	}
	p.positive("setup.max_wait", c.Setup.MaxWait)
	// Every node is without a leader during an ordinary election, which
	// takes up to about two election timeouts after a heartbeat timeout;
	// a shorter bound would close every sidecar stream of the cluster at
	// each failover.
	if minStale := 2 * max(c.Raft.HeartbeatTimeout, c.Raft.ElectionTimeout); c.Setup.MaxStaleness != 0 && c.Setup.MaxStaleness < minStale {
		p.add("setup.max_staleness", "%v must be 0 (off) or >= 2 x max(raft.heartbeat_timeout, raft.election_timeout) = %v",
			c.Setup.MaxStaleness, minStale)
	}
}

func (c *Config) validateJWT(p *problems) {
	j := &c.Auth.JWT
	if j.Leeway < 0 {
		p.add("auth.jwt.leeway", "%v must not be negative", j.Leeway)
	}
	if j.Leeway > 5*time.Minute {
		p.add("auth.jwt.leeway", "%v is more than 5m: it would keep expired tokens valid", j.Leeway)
	}
	if c.Auth.Mode != "jwt" {
		return
	}
	public := j.PublicKeysFile != "" || j.JWKSFile != ""
	switch {
	case j.HMACSecretFile == "" && !public:
		p.add("auth.jwt", "auth.mode jwt needs a key source: hmac_secret_file, or public_keys_file and/or jwks_file")
	case j.HMACSecretFile != "" && public:
		p.add("auth.jwt.hmac_secret_file", "cannot be combined with public_keys_file or jwks_file: "+
			"one deployment signs with either a shared secret or key pairs")
	}
}

func (c *Config) validateAddrs(p *problems) {
	type listener struct {
		key, addr, advKey, adv string
		host                   string
		port                   int
		ok                     bool
	}
	ls := []*listener{
		{key: "http.addr", addr: c.HTTP.Addr, advKey: "http.advertise", adv: c.HTTP.Advertise},
		{key: "grpc.addr", addr: c.GRPC.Addr, advKey: "grpc.advertise", adv: c.GRPC.Advertise},
		{key: "raft.addr", addr: c.Raft.Addr, advKey: "raft.advertise", adv: c.Raft.Advertise},
	}
	for _, l := range ls {
		host, port, err := splitHostPort(l.addr)
		if err != nil {
			p.add(l.key, "%q is not host:port (%v)", l.addr, err)
		} else {
			l.host, l.port, l.ok = host, port, true
		}
		if l.adv != "" {
			if err := checkDialAddr(l.adv); err != nil {
				p.add(l.advKey, "%v", err)
			}
		}
	}

	// Every advertised address is stored in the replicated state (member
	// records, Raft configuration) and dialled by other nodes; "0.0.0.0"
	// would make them dial themselves.
	for _, l := range ls {
		if l.ok && isUnspecified(l.host) && l.adv == "" {
			p.add(l.advKey, "required because %s %q listens on all interfaces; set the address other nodes should dial", l.key, l.addr)
		}
	}

	for i, a := range ls {
		for _, b := range ls[i+1:] {
			if !a.ok || !b.ok || a.port == 0 || a.port != b.port {
				continue // port 0 picks a free port, so it never collides
			}
			if strings.EqualFold(a.host, b.host) || isUnspecified(a.host) || isUnspecified(b.host) {
				p.add(b.key, "%q conflicts with %s %q: the listen addresses must be distinct", b.addr, a.key, a.addr)
			}
		}
	}
}

func (c *Config) validateRaft(p *problems) {
	r := &c.Raft
	durations := []struct {
		key string
		d   time.Duration
	}{
		{"raft.heartbeat_timeout", r.HeartbeatTimeout},
		{"raft.election_timeout", r.ElectionTimeout},
		{"raft.leader_lease_timeout", r.LeaderLeaseTimeout},
		{"raft.commit_timeout", r.CommitTimeout},
		{"raft.snapshot_interval", r.SnapshotInterval},
		{"raft.apply_timeout", r.ApplyTimeout},
	}
	for _, d := range durations {
		p.positive(d.key, d.d)
	}
	// hashicorp/raft refuses to start with either ordering reversed; saying so
	// here names the keys instead of failing deep inside raft.NewRaft.
	if r.HeartbeatTimeout > 0 && r.ElectionTimeout > 0 && r.ElectionTimeout < r.HeartbeatTimeout {
		p.add("raft.election_timeout", "%v must be >= raft.heartbeat_timeout (%v)", r.ElectionTimeout, r.HeartbeatTimeout)
	}
	if r.HeartbeatTimeout > 0 && r.LeaderLeaseTimeout > r.HeartbeatTimeout {
		p.add("raft.leader_lease_timeout", "%v must be <= raft.heartbeat_timeout (%v)", r.LeaderLeaseTimeout, r.HeartbeatTimeout)
	}
	if r.MaxAppendEntries < 1 || r.MaxAppendEntries > maxAppendEntries {
		p.add("raft.max_append_entries", "%d must be between 1 and %d", r.MaxAppendEntries, maxAppendEntries)
	}
	if r.SnapshotRetain < 1 {
		p.add("raft.snapshot_retain", "%d must be >= 1", r.SnapshotRetain)
	}
	if r.SnapshotThreshold < 1 {
		p.add("raft.snapshot_threshold", "must be >= 1")
	}

	ids := map[string]int{}
	addrs := map[string]int{}
	self := false
	for i, peer := range r.Peers {
		key := fmt.Sprintf("raft.peers[%d]", i)
		switch {
		case peer.ID == "":
			p.add(key+".id", "must not be empty")
		case !idPattern.MatchString(peer.ID):
			p.add(key+".id", "%q must match %s", peer.ID, idPattern)
		}
		if j, dup := ids[peer.ID]; dup && peer.ID != "" {
			p.add(key+".id", "%q duplicates raft.peers[%d].id", peer.ID, j)
		} else {
			ids[peer.ID] = i
		}
		if err := checkDialAddr(peer.Address); err != nil {
			p.add(key+".address", "%v", err)
		}
		norm := strings.ToLower(peer.Address)
		if j, dup := addrs[norm]; dup && peer.Address != "" {
			p.add(key+".address", "%q duplicates raft.peers[%d].address", peer.Address, j)
		} else {
			addrs[norm] = i
		}
		if peer.ID == c.NodeID {
			self = true
		}
	}
	if len(r.Peers) > 0 {
		switch {
		case c.NodeID == "":
			// A generated ID could never be in the list, and a bootstrapping
			// node must find itself in it.
			p.add("node_id", "required when raft.peers is set")
		case r.Bootstrap && !self:
			p.add("raft.peers", "must include this node (node_id %q) to bootstrap", c.NodeID)
		}
	}
}

// HTTPAdvertise is the address others use to reach the HTTP listener.
func (c *Config) HTTPAdvertise() string { return advertise(c.HTTP.Advertise, c.HTTP.Addr) }

// GRPCAdvertise is the address others use to reach the gRPC listener.
func (c *Config) GRPCAdvertise() string { return advertise(c.GRPC.Advertise, c.GRPC.Addr) }

// RaftAdvertise is the address peers dial for Raft.
func (c *Config) RaftAdvertise() string { return advertise(c.Raft.Advertise, c.Raft.Addr) }

func advertise(adv, addr string) string {
	if adv != "" {
		return adv
	}
	return addr
}

// splitHostPort parses a listen address: host may be empty (all
// interfaces), an IP or a host name, and port is numeric, 0 included.
func splitHostPort(addr string) (host string, port int, err error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return "", 0, errors.New(ae.Err) // the address is quoted by the caller
		}
		return "", 0, err
	}
	p, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number from 0 to 65535", portStr)
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil && !hostnamePattern.MatchString(host) {
			return "", 0, fmt.Errorf("host %q is neither an IP address nor a host name", host)
		}
	}
	return host, int(p), nil
}

// checkDialAddr checks an address that other nodes dial: it needs a real
// port and a host that means this machine from elsewhere.
func checkDialAddr(addr string) error {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (%w)", addr, err)
	}
	if port == 0 {
		return fmt.Errorf("%q needs a non-zero port", addr)
	}
	if isUnspecified(host) {
		return fmt.Errorf("%q needs a host that others can dial, not an unspecified address", addr)
	}
	return nil
}

func isUnspecified(host string) bool {
	if host == "" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}

// IsLoopback reports whether host (from a listen address) is a loopback
// address or localhost; an empty or unspecified host is not.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// problems collects validation errors in the "key: reason" form.
type problems struct{ errs []error }

func (p *problems) add(key, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

func (p *problems) oneOf(key, val string, allowed ...string) {
	if slices.Contains(allowed, val) {
		return
	}
	p.add(key, "%q must be one of %s", val, strings.Join(allowed, ", "))
}

func (p *problems) positive(key string, d time.Duration) {
	if d <= 0 {
		p.add(key, "must be > 0 (got %v)", d)
	}
}

func (p *problems) err() error { return errors.Join(p.errs...) }
