package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/third_party/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/client"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/server/peer"
	"github.com/policyd/policyd/internal/server/raftnode"
	"github.com/policyd/policyd/internal/tlsfiles"
	"github.com/policyd/policyd/internal/tlsfiles/testca"
)

// pki is a test cluster CA and the directory its files go to.
type pki struct {
	ca  *testca.CA
	dir string
}

func newPKI(t *testing.T) *pki {
	return &pki{ca: testca.New(t, "policyd-cluster-ca"), dir: t.TempDir()}
}

// issue writes a key pair for name, valid on loopback, and returns the TLS
// block that uses it with the cluster CA as client CA.
func (p *pki) issue(t *testing.T, name string, sans ...string) config.TLS {
	f := p.ca.WriteFiles(t, p.dir, name, name, append([]string{"127.0.0.1", "localhost"}, sans...)...)
	return config.TLS{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA}
}

// node issues the certificate of node id: it names the node identity
// (docs/security.md), as the peer plane requires.
func (p *pki) node(t *testing.T, id string) config.TLS {
	return p.issue(t, id, tlsfiles.NodeURI("policyd", id))
}

// mutualTLS turns on mutual TLS on all three listeners of cfg, with one
// certificate for the node.
func (p *pki) mutualTLS(t *testing.T) func(*config.Config) {
	return func(cfg *config.Config) {
		tc := p.node(t, cfg.NodeID)
		cfg.HTTP.TLS, cfg.GRPC.TLS, cfg.Raft.TLS = tc, tc, tc
	}
}

// clientTLS is what a sidecar or admin client with a certificate from the
// cluster CA uses.
func (p *pki) clientTLS(t *testing.T, name string) *tls.Config {
	tc := p.issue(t, name)
	c, err := client.TLSFiles(tc.ClientCAFile, tc.CertFile, tc.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// httpsAPI is apiFor over TLS with cfg.
func httpsAPI(t *testing.T, n *Node, cfg *tls.Config) *api {
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	t.Cleanup(hc.CloseIdleConnections)
	return newAPI(t, "https://"+n.HTTPAddr(), hc)
}

// peerCert handshakes with addr and returns the certificate it presents.
func peerCert(t *testing.T, addr string, cfg *tls.Config) *x509.Certificate {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS handshake with %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// discover opens a discovery stream with creds and returns the first
// response, or the error that ended it.
func discover(addr string, creds credentials.TransportCredentials) (*discoveryv1.PolicyDiscoveryResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discoveryv1.NewPolicyDiscoveryServiceClient(conn).StreamPolicies(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&discoveryv1.PolicyDiscoveryRequest{ClientAddress: "tls-probe", Scope: &discoveryv1.Scope{Org: "acme"}}); err != nil {
		if _, rerr := stream.Recv(); rerr != nil {
			return nil, rerr
		}
		return nil, err
	}
	return stream.Recv()
}

// TestMutualTLSCluster runs a 3-node cluster with mutual TLS on Raft, gRPC
// and HTTP: writes forwarded between nodes replicate, sidecars and admin
// clients with a certificate from the cluster CA are served, and whoever
// lacks one can neither read nor take part in Raft.
func TestMutualTLSCluster(t *testing.T) {
	p := newPKI(t)
	c := newCluster(t, 3, p.mutualTLS(t))
	admin := p.clientTLS(t, "admin")
	follower := c.follower()

	// A sidecar with a client certificate, over gRPC, on one follower; a
	// policy written through the other node, forwarded to the leader over
	// the TLS cluster API, reaches it.
	var other *Node
	for _, n := range c.nodes {
		if n != follower && !n.IsLeader() {
			other = n
		}
	}
	s := startSDK(t, client.Config{
		Servers: []string{follower.GRPCAddr()}, Scope: client.Scope{Org: "acme"},
		ClientAddress: "tls-sidecar", TLS: p.clientTLS(t, "sidecar"),
	})
	httpsAPI(t, other, admin).putPolicy("acme.deny-shell", "acme", "no shell")
	s.hasPolicy(t, "acme.deny-shell")
	c.waitConverged()

	t.Run("WebSocket feed over TLS", func(t *testing.T) {
		if r := httpsAPI(t, c.leader(), admin).do(http.MethodPut, "/v1/employees/alice", []byte(`{"id":"alice","org":"acme","team":"red"}`), nil); r.status != http.StatusOK {
			t.Fatalf("PUT employee: %d %s", r.status, r.body)
		}
		c.waitConverged()
		ws := startSDK(t, client.Config{Servers: []string{other.HTTPAddr()}, Transport: client.TransportWS, Employee: "alice", TLS: p.clientTLS(t, "ws-sidecar")})
		ws.hasPolicy(t, "acme.deny-shell")
	})

	t.Run("cluster-wide client list over the TLS cluster API", func(t *testing.T) {
		var list struct {
			Clients []struct {
				ClientAddress string `json:"client_address"`
				Node          string `json:"node"`
			} `json:"clients"`
			Unreachable []string `json:"unreachable_nodes"`
		}
		r := httpsAPI(t, other, admin).do(http.MethodGet, "/v1/clients", nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET /v1/clients: %d %s", r.status, r.body)
		}
		r.decode(t, &list)
		if len(list.Unreachable) > 0 {
			t.Fatalf("members unreachable over TLS: %v", list.Unreachable)
		}
		found := false
		for _, cl := range list.Clients {
			found = found || cl.ClientAddress == "tls-sidecar" && cl.Node == follower.ID()
		}
		if !found {
			t.Fatalf("the sidecar on %s is not listed by %s: %s", follower.ID(), other.ID(), r.body)
		}
	})

	rogueCA := testca.New(t, "rogue-ca")
	rogueFiles := rogueCA.WriteFiles(t, t.TempDir(), "rogue", "rogue", "127.0.0.1", "localhost", tlsfiles.NodeURI("policyd", "rogue"))
	// The rogue trusts the cluster CA, so its own side of the handshake
	// goes through: only the members' check of its certificate stops it.
	clusterCA := p.issue(t, "unused").ClientCAFile
	rogueTLS := config.TLS{CertFile: rogueFiles.Cert, KeyFile: rogueFiles.Key, ClientCAFile: clusterCA}
	rogueClient, err := client.TLSFiles(clusterCA, rogueFiles.Cert, rogueFiles.Key)
	if err != nil {
		t.Fatal(err)
	}
	noCert, err := client.TLSFiles(clusterCA, "", "")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("HTTP read refused without a valid client certificate", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			cfg  *tls.Config
			want string
		}{
			{"no certificate", noCert, "certificate required"},
			{"certificate of another CA", rogueClient, "unknown certificate authority"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc.cfg}}
				defer hc.CloseIdleConnections()
				resp, err := hc.Get("https://" + follower.HTTPAddr() + "/v1/policies")
				if err == nil {
					resp.Body.Close()
					t.Fatalf("GET /v1/policies answered %d", resp.StatusCode)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("GET /v1/policies: %v, want a TLS error containing %q", err, tc.want)
				}
			})
		}
		t.Run("plaintext", func(t *testing.T) {
			resp, err := http.Get("http://" + follower.HTTPAddr() + "/v1/policies")
			if err != nil {
				return // refused outright
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("plain HTTP to the TLS listener answered %d", resp.StatusCode)
			}
		})
		if r := httpsAPI(t, follower, admin).do(http.MethodGet, "/v1/policies", nil, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), "acme.deny-shell") {
			t.Fatalf("control: with the admin certificate GET /v1/policies = %d %s", r.status, r.body)
		}
	})

	t.Run("a node certificate gets no admin rights", func(t *testing.T) {
		tc := p.node(t, follower.ID())
		nodeClient, err := client.TLSFiles(tc.ClientCAFile, tc.CertFile, tc.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/v1/policies", "/v1/cluster"} {
			if r := httpsAPI(t, follower, nodeClient).do(http.MethodGet, path, nil, nil); r.status != http.StatusForbidden {
				t.Fatalf("GET %s with a node certificate = %d %s, want 403", path, r.status, r.body)
			}
		}
	})

	t.Run("gRPC discovery refused without a valid client certificate", func(t *testing.T) {
		// Under TLS 1.3 the client's handshake ends before the server has
		// checked its certificate, so the client sees the refusal as a
		// broken connection (or the alert, depending on timing): what
		// matters is that no response comes.
		for _, tc := range []struct {
			name  string
			creds credentials.TransportCredentials
		}{
			{"no certificate", credentials.NewTLS(noCert)},
			{"certificate of another CA", credentials.NewTLS(rogueClient)},
			{"plaintext", insecure.NewCredentials()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := discover(follower.GRPCAddr(), tc.creds)
				if err == nil {
					t.Fatalf("discovery answered %d policies", len(resp.GetPolicies()))
				}
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("discovery: %v, want Unavailable (connection refused by TLS)", err)
				}
			})
		}
		resp, err := discover(follower.GRPCAddr(), credentials.NewTLS(p.clientTLS(t, "probe")))
		if err != nil || len(resp.GetPolicies()) != 1 {
			t.Fatalf("control: with a cluster certificate discovery = %v, %v", resp, err)
		}
	})

	t.Run("Raft RPCs refused without a valid client certificate", func(t *testing.T) {
		// A stale AppendEntries (term 0) is refused by any member without
		// side effects; what matters is whether it is answered at all.
		send := func(tr *raft.NetworkTransport) (*raft.AppendEntriesResponse, error) {
			var resp raft.AppendEntriesResponse
			err := tr.AppendEntries(raft.ServerID(follower.ID()), raft.ServerAddress(follower.RaftAddr()),
				&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("probe"), Addr: []byte("127.0.0.1:1")}}, &resp)
			return &resp, err
		}
		transport := func(id string, tc config.TLS) *raft.NetworkTransport {
			var tr *raft.NetworkTransport
			cfg := &raft.NetworkTransportConfig{MaxPool: 1, Timeout: 5 * time.Second, Logger: raftnode.NewHCLog(testLogger(t), "probe")}
			if tc.Enabled() {
				r, err := tlsfiles.New(tc, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				pc := &peer.Config{NodeID: id, TrustDomain: "policyd", TLS: r}
				sl, err := raftnode.NewStreamLayer("127.0.0.1:0", nil, nil, pc, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				cfg.Stream = sl
				tr = raft.NewNetworkTransportWithConfig(cfg)
			} else {
				var err error
				if tr, err = raft.NewTCPTransportWithConfig("127.0.0.1:0", nil, cfg); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { tr.CloseStreams(); _ = tr.Close() })
			return tr
		}
		for _, tc := range []struct {
			name string
			tls  config.TLS
		}{
			{"certificate of another CA", rogueTLS},
			{"sidecar certificate of the cluster CA", p.issue(t, "raft-probe")},
			{"plain TCP", config.TLS{}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if resp, err := send(transport("raft-probe", tc.tls)); err == nil {
					t.Fatalf("a member answered AppendEntries: %+v", resp)
				}
			})
		}
		// Only a member's identity is heard (a stale term 0 changes nothing).
		resp, err := send(transport(c.leader().ID(), p.node(t, c.leader().ID())))
		if err != nil || resp.Term == 0 {
			t.Fatalf("control: with a cluster certificate AppendEntries = %+v, %v", resp, err)
		}
	})

	t.Run("a node with a foreign certificate cannot join and is never replicated to", func(t *testing.T) {
		cfg := testConfig(t, "rogue")
		cfg.HTTP.TLS, cfg.GRPC.TLS, cfg.Raft.TLS = rogueTLS, rogueTLS, rogueTLS
		rogue := startNode(t, cfg)
		leader := c.leader()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// An admin tries to add it: the join's probe of its Raft address
		// fails the TLS check, so it never becomes a voter.
		if _, err := leader.Join(ctx, "rogue", rogue.RaftAddr()); !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), "does not answer as a member") {
			t.Fatalf("join = %v, want a refusal naming the failed probe", err)
		}
		if leader.inConfiguration("rogue") {
			t.Fatal("the rogue node is in the configuration")
		}
		httpsAPI(t, leader, admin).putPolicy("acme.after-rogue", "acme", "x")
		c.waitConverged()
		if li, ai := rogue.consensus.Raft().LastIndex(), rogue.store.AppliedIndex(); li != 0 || ai != 0 {
			t.Fatalf("the rogue node has raft log index %d and applied index %d: it was replicated to", li, ai)
		}
	})

	t.Run("certificate reload", func(t *testing.T) {
		n := follower
		cfg := n.cfg // as started (the harness records the bound Raft address in c.cfgs)
		old := peerCert(t, n.HTTPAddr(), p.clientTLS(t, "probe")).SerialNumber
		// Rotate the node's key pair in place (same paths, new serial).
		certPEM, keyPEM := p.ca.Issue(t, n.ID()+"-rotated", "127.0.0.1", "localhost", tlsfiles.NodeURI("policyd", n.ID()))
		for path, data := range map[string][]byte{cfg.HTTP.TLS.CertFile: certPEM, cfg.HTTP.TLS.KeyFile: keyPEM} {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		applied, needRestart, err := n.ApplySettings(cfg)
		if err != nil {
			t.Fatalf("Reload: %v", err)
		}
		for _, k := range []string{"http.tls", "grpc.tls", "raft.tls"} {
			if !slices.Contains(applied, k) {
				t.Errorf("Reload applied %v, missing %s", applied, k)
			}
		}
		if len(needRestart) > 0 {
			t.Errorf("Reload of an unchanged configuration reports %v as needing a restart", needRestart)
		}
		for name, addr := range map[string]string{"http": n.HTTPAddr(), "grpc": n.GRPCAddr(), "raft": n.RaftAddr()} {
			got := peerCert(t, addr, p.clientTLS(t, "probe"))
			if got.SerialNumber.Cmp(old) == 0 || got.Subject.CommonName != n.ID()+"-rotated" {
				t.Errorf("%s listener presents %s (serial %s) after the reload, want the rotated certificate", name, got.Subject.CommonName, got.SerialNumber)
			}
		}
		// The rotated node still takes part: a write through it replicates.
		httpsAPI(t, n, admin).putPolicy("acme.after-rotation", "acme", "y")
		s.hasPolicy(t, "acme.after-rotation")
		c.waitConverged()
	})
}

// TestTLSStartupErrors shows a bad certificate set fails start-up, with the
// key named.
func TestTLSStartupErrors(t *testing.T) {
	p := newPKI(t)
	good := p.issue(t, "node1")
	for _, tc := range []struct {
		name   string
		mutate func(*config.Config)
		want   string
	}{
		{"missing raft cert", func(c *config.Config) {
			c.Raft.TLS = good
			c.Raft.TLS.CertFile = filepath.Join(p.dir, "nope.crt")
		}, "raft.tls"},
		{"grpc key of another pair", func(c *config.Config) {
			c.GRPC.TLS = good
			c.GRPC.TLS.KeyFile = p.ca.WriteFiles(t, t.TempDir(), "x", "x").Key
		}, "grpc.tls"},
		{"http CA not PEM", func(c *config.Config) {
			c.HTTP.TLS = good
			c.HTTP.TLS.ClientCAFile = good.KeyFile
		}, "http.tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "node1")
			cfg.Raft.Bootstrap = true
			tc.mutate(&cfg)
			n, err := New(cfg, testLogger(t), nil)
			if err == nil {
				closeNode(t, n)
				t.Fatal("New succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
