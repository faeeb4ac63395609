package peer

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzReadHello: any bytes decode to a hello or an error, never a panic,
// and a decoded hello re-encodes to the bytes it was read from.
func FuzzReadHello(f *testing.F) {
	f.Add((&hello{kind: KindRaft, secret: true, nodeID: "n1", clusterID: "c1"}).marshal())
	f.Add((&hello{kind: KindProbe, nodeID: "node-3"}).marshal())
	f.Add([]byte(magic + "\x02\x00"))
	f.Add([]byte{0, 1, 2})
	f.Add(append([]byte(magic+"\x01\x01"), make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, raw, err := readHello(bytes.NewReader(data))
		if err != nil {
			return
		}
		if got := h.marshal(); !bytes.Equal(got, raw) {
			t.Fatalf("re-encoded %x, read %x", got, raw)
		}
	})
}

// FuzzServerHandshake feeds the answering side arbitrary bytes: it must
// refuse (or, for a well-formed hello without a secret, accept) and never
// panic or hang past its timeout.
func FuzzServerHandshake(f *testing.F) {
	f.Add((&hello{kind: KindAPI, secret: true, nodeID: "n1"}).marshal(), false)
	f.Add(append((&hello{kind: KindRaft, secret: true, nodeID: "n1", clusterID: "c"}).marshal(), make([]byte, macSize)...), true)
	f.Add((&hello{kind: KindRaft, nodeID: "n1"}).marshal(), false)
	f.Add([]byte("\x16\x03\x01\x00"), true)
	f.Fuzz(func(t *testing.T, data []byte, secret bool) {
		cfg := &Config{NodeID: "n2", ClusterID: fixedID("c"), HandshakeTimeout: 50 * time.Millisecond}
		if secret {
			cfg.Keys = keyring(t, secretA)
		}
		client, server := net.Pipe()
		go func() {
			_, _ = client.Write(data)
			_, _ = io.Copy(io.Discard, client)
		}()
		_, _, _ = cfg.Server(server)
		_ = server.Close()
		_ = client.Close()
	})
}

// FuzzReadChallenge: whatever an answering side sends back, the dialling
// side decodes a challenge or an error, never a panic.
func FuzzReadChallenge(f *testing.F) {
	f.Add((&challenge{nodeID: "n2", clusterID: "c"}).marshal())
	f.Add(refusal("the cluster secret does not match"))
	f.Add(appendString(appendString([]byte{statusMismatch}, "n2"), "c2"))
	f.Add([]byte{statusRefused, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, raw, err := readChallenge(bytes.NewReader(data), &hello{clusterID: "c1"})
		if err == nil && !bytes.Equal(c.marshal(), raw) {
			t.Fatalf("re-encoded %x, read %x", c.marshal(), raw)
		}
	})
}
