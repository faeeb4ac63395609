package peer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/server/servertest"
)

func serveMux(t *testing.T, cfg *Config) (*Mux, *servertest.LogBuffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs servertest.LogBuffer
	m := NewMux(ln, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	done := make(chan struct{})
	go func() { defer close(done); m.Serve() }()
	t.Cleanup(func() { _ = m.Close(); <-done })
	return m, &logs
}

// TestMuxRoutesByKind: authenticated connections reach the sub-listener of
// their kind, with the bytes after the handshake intact.
func TestMuxRoutesByKind(t *testing.T) {
	m, _ := serveMux(t, &Config{NodeID: "n2", Keys: keyring(t, secretA)})
	client := &Config{NodeID: "n1", Keys: keyring(t, secretA)}
	for _, kind := range []Kind{KindRaft, KindAPI} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			c, info, err := client.Dial(ctx, m.Addr().String(), kind)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if info.NodeID != "n2" {
				t.Errorf("answered by %q, want n2", info.NodeID)
			}
			if _, err := c.Write([]byte("payload")); err != nil {
				t.Fatal(err)
			}
			s, err := m.Listener(kind).Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			buf := make([]byte, 7)
			if _, err := s.Read(buf); err != nil || string(buf) != "payload" {
				t.Fatalf("read %q, %v", buf, err)
			}
		})
	}
	t.Run("probe", func(t *testing.T) {
		c, info, err := client.Dial(t.Context(), m.Addr().String(), KindProbe)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		if info.NodeID != "n2" {
			t.Errorf("probe answered by %q", info.NodeID)
		}
	})
}

// TestMuxWrongSecretFlood: 10,000 connections with a wrong secret get
// nothing through, leave no goroutine behind and are logged at a bounded
// rate.
func TestMuxWrongSecretFlood(t *testing.T) {
	m, logs := serveMux(t, &Config{NodeID: "n2", Keys: keyring(t, secretA)})
	client := &Config{NodeID: "n1", Keys: keyring(t, secretB)}
	const attempts = 10000
	before := runtime.NumGoroutine()
	for i := range attempts {
		c, _, err := client.Dial(t.Context(), m.Addr().String(), KindRaft)
		if err == nil {
			_ = c.Close()
			t.Fatalf("attempt %d: handshake with a wrong secret succeeded", i)
		}
		if !strings.Contains(err.Error(), "secret does not match") {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	select {
	case c := <-m.subs[KindRaft].conns:
		t.Fatalf("a connection reached raft: %v", c.RemoteAddr())
	default:
	}
	if lines := strings.Count(logs.String(), "peer connection refused"); lines < 1 || lines > 3 {
		t.Errorf("%d refusal lines logged for %d attempts, want 1 to 3", lines, attempts)
	}
	// Handshake goroutines end with their connection.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the flood", runtime.NumGoroutine(), before)
		}
		runtime.Gosched()
	}
}

// TestMuxHalfwayHandshake: a dialler that stops half-way is cut at the
// handshake timeout and holds up no other connection.
func TestMuxHalfwayHandshake(t *testing.T) {
	m, _ := serveMux(t, &Config{NodeID: "n2", Keys: keyring(t, secretA), HandshakeTimeout: 300 * time.Millisecond})
	stalled, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := stalled.Write([]byte(magic)); err != nil {
		t.Fatal(err)
	}
	client := &Config{NodeID: "n1", Keys: keyring(t, secretA)}
	c, _, err := client.Dial(t.Context(), m.Addr().String(), KindAPI)
	if err != nil {
		t.Fatalf("a stalled handshake held up another: %v", err)
	}
	_ = c.Close()
	_ = stalled.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := stalled.Read(make([]byte, 1)); err == nil {
		t.Fatal("stalled connection got an answer")
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("stalled connection was not closed within the handshake timeout")
	}
}

// TestMuxBoundsPendingHandshakes: one source holding handshakes open gets
// at most maxPendingPerSource of them; a member from elsewhere still gets
// through.
func TestMuxBoundsPendingHandshakes(t *testing.T) {
	m, _ := serveMux(t, &Config{NodeID: "n2", Keys: keyring(t, secretA)})
	stranger := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range maxPendingPerSource + 8 {
		c, err := stranger.Dial("tcp", m.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The connections past the bound are closed at once: a read ends.
	over := held[len(held)-1]
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection over the bound got data")
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the connection over the bound was left open")
	}
	client := &Config{NodeID: "n1", Keys: keyring(t, secretA)}
	c, _, err := client.Dial(t.Context(), m.Addr().String(), KindAPI)
	if err != nil {
		t.Fatalf("a member was refused while a stranger held handshakes: %v", err)
	}
	_ = c.Close()
}

// TestMuxMismatchReported: a connection refused for a cluster-ID mismatch
// is handed to Config.Mismatch with both IDs, and logged at ERROR only
// when the node does not report it itself.
func TestMuxMismatchReported(t *testing.T) {
	for _, reported := range []bool{false, true} {
		t.Run(map[bool]string{false: "mux logs", true: "node reports"}[reported], func(t *testing.T) {
			heard := make(chan ClusterMismatchError, 1)
			m, logs := serveMux(t, &Config{NodeID: "n2", Keys: keyring(t, secretA), ClusterID: fixedID("c1"),
				Mismatch: func(mm *ClusterMismatchError) bool {
					select {
					case heard <- *mm:
					default:
					}
					return reported
				}})
			client := &Config{NodeID: "n1", Keys: keyring(t, secretA), ClusterID: fixedID("c2")}
			_, _, err := client.Dial(t.Context(), m.Addr().String(), KindProbe)
			var mm *ClusterMismatchError
			if !errors.As(err, &mm) || mm.Remote != "c1" || mm.RemoteNode != "n2" || mm.Local != "c2" {
				t.Fatalf("dial = %v, want a mismatch naming n2 of cluster c1", err)
			}
			select {
			case got := <-heard:
				if want := (ClusterMismatchError{Local: "c1", Remote: "c2", RemoteNode: "n1"}); got != want {
					t.Errorf("Mismatch heard %+v, want %+v", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Mismatch not called")
			}
			// The mux logs after it calls Mismatch; Close waits for it.
			_ = m.Close()
			if got := strings.Contains(logs.String(), "level=ERROR"); got == reported {
				t.Errorf("ERROR logged %v with the node reporting %v:\n%s", got, reported, logs.String())
			}
		})
	}
}
