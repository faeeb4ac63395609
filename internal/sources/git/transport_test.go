package git

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/policyd/policyd/internal/poll"
)

// sshServer serves git-upload-pack over ssh on loopback for one client key.
type sshServer struct {
	addr    string
	hostPub ssh.PublicKey
}

func newSSHServer(t *testing.T, root string, client ssh.PublicKey) *sshServer {
	t.Helper()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	host, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(key.Marshal(), client.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(host)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { serveSSH(conn, cfg, root) })
		}
	})
	return &sshServer{addr: ln.Addr().String(), hostPub: host.PublicKey()}
}

// serveSSH runs the git-upload-pack one session asks for.
func serveSSH(conn net.Conn, cfg *ssh.ServerConfig, root string) {
	defer func() { _ = conn.Close() }()
	sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	defer func() { _ = sc.Close() }()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			return
		}
		for req := range chReqs {
			if req.Type != "exec" {
				_ = req.Reply(false, nil)
				continue
			}
			var cmd struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &cmd); err != nil {
				_ = req.Reply(false, nil)
				continue
			}
			prog, arg, _ := strings.Cut(cmd.Command, " ")
			if prog != "git-upload-pack" {
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, nil)
			c := exec.Command("git-upload-pack", filepath.Join(root, filepath.Clean("/"+strings.Trim(arg, "'"))))
			c.Stdin, c.Stdout, c.Stderr = ch, ch, ch.Stderr()
			status := uint32(0)
			if err := c.Run(); err != nil {
				status = 1
			}
			b := make([]byte, 4)
			binary.BigEndian.PutUint32(b, status)
			_, _ = ch.SendRequest("exit-status", false, b)
			_ = ch.Close()
			break
		}
	}
}

// sshKey writes a new client key in OpenSSH form.
func sshKey(t *testing.T) (path string, pub ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "id_ed25519", string(pem.EncodeToMemory(block))), signer.PublicKey()
}

// TestObserveSSH: a key and a known_hosts file fetch over ssh; a host key
// that is not the known one, or a key the server does not take, fails the
// fetch with one line.
func TestObserveSSH(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "overssh")
	r.Write("a.yaml", toolPolicy("acme.ssh", "ssh"))
	rev := r.Commit("one")
	key, pub := sshKey(t)
	srv := newSSHServer(t, s.Root, pub)
	url := fmt.Sprintf("ssh://git@%s/overssh.git", srv.addr)
	known := writeFile(t, "known_hosts", knownhosts.Line([]string{knownhosts.Normalize(srv.addr)}, srv.hostPub)+"\n")

	d, _ := newDriver(t, nil, Config{URL: url, SSHKeyFile: key, KnownHostsFile: known})
	if got := observe(t, d).Revision; got != rev {
		t.Errorf("revision %s, want %s", got, rev)
	}

	otherKey, _ := sshKey(t)
	_, otherHost, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherSigner, err := ssh.NewSignerFromKey(otherHost)
	if err != nil {
		t.Fatal(err)
	}
	wrongHosts := writeFile(t, "wrong_hosts", knownhosts.Line([]string{knownhosts.Normalize(srv.addr)}, otherSigner.PublicKey())+"\n")
	unknownHosts := writeFile(t, "unknown_hosts", knownhosts.Line([]string{"[127.0.0.2]:22"}, srv.hostPub)+"\n")
	tests := []struct {
		name       string
		key, hosts string
		want       string
	}{
		{"host key mismatch", key, wrongHosts, "key mismatch"},
		{"unknown host", key, unknownHosts, "key is unknown"},
		{"key refused", otherKey, known, "unable to authenticate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := newDriver(t, nil, Config{URL: url, SSHKeyFile: tc.key, KnownHostsFile: tc.hosts})
			obs, err := d.Observe(t.Context())
			if obs != nil || err == nil {
				t.Fatalf("observed %+v, %v; want a failure", obs, err)
			}
			t.Log(err)
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, url) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line naming %s and %q", msg, url, tc.want)
			}
		})
	}
}

// TestObserveGitDaemon: git:// remotes need no auth; a daemon that does
// not export the repository fails the fetch.
func TestObserveGitDaemon(t *testing.T) {
	s := newServer(t, "")
	r := s.Repo(t, "daemon")
	r.Write("a.yaml", toolPolicy("acme.daemon", "d"))
	rev := r.Commit("one")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command("git", "daemon", "--reuseaddr", "--export-all", "--base-path="+s.Root,
		"--listen=127.0.0.1", fmt.Sprintf("--port=%d", addr.Port), s.Root)
	daemon.Env = s.Env
	if err := daemon.Start(); err != nil {
		t.Skipf("no git daemon: %v", err)
	}
	t.Cleanup(func() {
		_ = daemon.Process.Kill()
		_ = daemon.Wait()
	})
	poll.Eventually(t, "git daemon listening", func() error {
		c, err := net.Dial("tcp", addr.String())
		if err == nil {
			_ = c.Close()
		}
		return err
	})

	d, _ := newDriver(t, nil, Config{URL: fmt.Sprintf("git://%s/daemon.git", addr)})
	if got := observe(t, d).Revision; got != rev {
		t.Errorf("revision %s, want %s", got, rev)
	}
	missing, _ := newDriver(t, nil, Config{URL: fmt.Sprintf("git://%s/absent.git", addr)})
	if _, err := missing.Observe(t.Context()); err == nil || !strings.Contains(err.Error(), "git:policies: fetch git://") {
		t.Errorf("absent repository: %v, want a fetch error", err)
	} else {
		t.Log(err)
	}
}
