package client

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestConfigValidation(t *testing.T) {
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	tests := []struct {
		name    string
		cfg     Config
		mention string // "" = valid
	}{
		{"minimal grpc", Config{Servers: []string{"127.0.0.1:9090"}}, ""},
		{"no servers", Config{}, "at least one node"},
		{"empty server", Config{Servers: []string{"a:1", " "}}, "servers[1]: empty"},
		{"unknown transport", Config{Servers: []string{"a:1"}, Transport: "http"}, `transport "http"`},
		{"ws without identity", Config{Servers: []string{"a:1"}, Transport: TransportWS}, "needs a token"},
		{"ws with employee", Config{Servers: []string{"a:1", "http://b:2", "wss://c/feed"}, Transport: TransportWS, Employee: "alice"}, ""},
		{"ws bad scheme", Config{Servers: []string{"ftp://a:1"}, Transport: TransportWS, Token: "t"}, `scheme "ftp"`},
		{"team scope without org", Config{Servers: []string{"a:1"}, Scope: Scope{Team: "red"}}, "needs an org"},
		{"ws ignores the scope", Config{Servers: []string{"a:1"}, Transport: TransportWS, Employee: "e", Scope: Scope{Employee: "e"}}, ""},
		{"negative grace", Config{Servers: []string{"a:1"}, Grace: -time.Second}, "grace"},
		{"negative unknown identity grace", Config{Servers: []string{"a:1"}, UnknownIdentityGrace: -time.Second}, "unknown identity grace"},
		{"backoff max below min", Config{Servers: []string{"a:1"}, BackoffMin: time.Second, BackoffMax: time.Millisecond}, "backoff max"},
		{"shadow report interval too short", Config{Servers: []string{"a:1"}, ShadowReportInterval: 500 * time.Millisecond}, "shadow report interval"},
		{"shadow report interval of 1s", Config{Servers: []string{"a:1"}, ShadowReportInterval: time.Second}, ""},
		{"negative message size", Config{Servers: []string{"a:1"}, MaxMessageBytes: -1}, "max message bytes"},
		{"grpc conn without servers", Config{GRPCConn: conn}, ""},
		{"grpc conn naming its node", Config{GRPCConn: conn, Servers: []string{"n1"}}, ""},
		{"grpc conn with two servers", Config{GRPCConn: conn, Servers: []string{"n1", "n2"}}, "one node"},
		{"grpc conn with TLS", Config{GRPCConn: conn, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}, "TLS must be nil"},
		{"grpc conn over ws", Config{GRPCConn: conn, Transport: TransportWS, Employee: "e", Servers: []string{"a:1"}}, "transport \"ws\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, nil)
			switch {
			case tc.mention == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.mention != "" && (err == nil || !strings.Contains(err.Error(), tc.mention)):
				t.Fatalf("New = %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := Config{Servers: []string{"a:1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.UnknownIdentityGrace != DefaultUnknownIdentityGrace {
		t.Errorf("unknown identity grace %v, want %v", cfg.UnknownIdentityGrace, DefaultUnknownIdentityGrace)
	}
	if cfg.ShadowReportInterval != DefaultShadowReportInterval {
		t.Errorf("shadow report interval %v, want %v", cfg.ShadowReportInterval, DefaultShadowReportInterval)
	}
	if cfg.Transport != TransportGRPC || cfg.Grace != DefaultGrace || cfg.HealthInterval != DefaultHealthInterval ||
		cfg.BackoffMin != DefaultBackoffMin || cfg.BackoffMax != DefaultBackoffMax || cfg.MaxMessageBytes != DefaultMaxMessageBytes || cfg.Clock == nil {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
	other, _ := Config{Servers: []string{"a:1"}}.withDefaults()
	if cfg.ClientAddress == "" || cfg.ClientAddress == other.ClientAddress {
		t.Fatalf("client addresses %q and %q are not unique", cfg.ClientAddress, other.ClientAddress)
	}
}

func TestFeedURL(t *testing.T) {
	tests := []struct {
		in   string
		tls  bool
		want string
	}{
		{"127.0.0.1:8080", false, "ws://127.0.0.1:8080/ws/policies"},
		{"127.0.0.1:8080", true, "wss://127.0.0.1:8080/ws/policies"},
		{"http://n1:8080", false, "ws://n1:8080/ws/policies"},
		{"https://n1/", false, "wss://n1/ws/policies"},
		{"ws://n1:1/custom/feed?x=1", false, "ws://n1:1/custom/feed"},
	}
	for _, tc := range tests {
		u, err := feedURL(tc.in, tc.tls)
		if err != nil || u.String() != tc.want {
			t.Errorf("feedURL(%q, %v) = %v, %v; want %s", tc.in, tc.tls, u, err, tc.want)
		}
	}
}

// TestBackoffFullJitterBounded: every wait is within [0, min(max, min·2^n)],
// the waits vary, and the ceiling grows until it reaches max.
func TestBackoffFullJitterBounded(t *testing.T) {
	lo, hi := 100*time.Millisecond, 10*time.Second
	for n := range 70 {
		ceil := hi
		if n < 7 { // 100ms·2^7 = 12.8s > 10s
			ceil = lo << n
		}
		var maxSeen time.Duration
		seen := map[time.Duration]bool{}
		for range 200 {
			d := backoff(n, lo, hi)
			if d < 0 || d > ceil {
				t.Fatalf("backoff(%d) = %v, outside [0, %v]", n, d, ceil)
			}
			maxSeen = max(maxSeen, d)
			seen[d] = true
		}
		if len(seen) < 100 {
			t.Fatalf("backoff(%d): only %d distinct waits in 200: not jittered", n, len(seen))
		}
		if maxSeen < ceil/2 {
			t.Fatalf("backoff(%d): largest of 200 waits %v, expected some near the ceiling %v", n, maxSeen, ceil)
		}
	}
}
