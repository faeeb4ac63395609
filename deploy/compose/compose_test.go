package compose_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/poll"
)

// budget bounds the scenario; buildBudget the image build before it, which
// is seconds with a warm Go build cache but minutes on a cold one on a
// loaded 2-core machine.
const (
	budget      = 3 * time.Minute
	buildBudget = 5 * time.Minute
)

// stack is one compose project of the test.
type stack struct {
	t       *testing.T
	ctx     context.Context
	compose []string // "docker-compose" or "docker compose"
	project string
	env     []string
	http    map[string]string // service → base URL of its published admin API
	hc      *http.Client
}

// findCompose returns the compose command that works here.
func findCompose() ([]string, error) {
	for _, c := range [][]string{{"docker", "compose"}, {"docker-compose"}} {
		if err := exec.Command(c[0], append(c[1:], "version")...).Run(); err == nil {
			return c, nil
		}
	}
	return nil, errors.New("neither `docker compose` nor `docker-compose` runs")
}

// run runs a command and returns its stdout; errors include stderr.
func run(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (s *stack) composeArgs(args ...string) (string, []string) {
	full := append(append([]string{}, s.compose[1:]...), "-p", s.project, "-f", "docker-compose.yml")
	return s.compose[0], append(full, args...)
}

// do runs a compose subcommand, failing the test on error.
func (s *stack) do(args ...string) string {
	s.t.Helper()
	out, err := s.try(s.ctx, args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

func (s *stack) try(ctx context.Context, args ...string) (string, error) {
	name, full := s.composeArgs(args...)
	return run(ctx, ".", s.env, name, full...)
}

func (s *stack) docker(args ...string) string {
	s.t.Helper()
	out, err := run(s.ctx, ".", nil, "docker", args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

func (s *stack) container(service string) string {
	s.t.Helper()
	id := strings.TrimSpace(s.do("ps", "-q", service))
	if id == "" {
		s.t.Fatalf("no container for service %s", service)
	}
	return id
}

// published records where service's admin API is published on the host.
func (s *stack) published(service string) {
	s.t.Helper()
	hostPort := strings.TrimSpace(s.do("port", service, "8080"))
	if !strings.HasPrefix(hostPort, "127.0.0.1:") {
		s.t.Fatalf("%s's admin API is published on %q, want 127.0.0.1 only", service, hostPort)
	}
	s.http[service] = "http://" + hostPort
}

// waitFor polls cond until it returns nil, the timeout passes or the
// scenario's budget runs out, and logs how long it took.
func (s *stack) waitFor(what string, timeout time.Duration, cond func() error) {
	s.t.Helper()
	start := time.Now()
	if err := poll.Until(s.ctx, timeout, cond); err != nil {
		s.t.Fatalf("%s: %v", what, err)
	}
	s.t.Logf("%s: after %v", what, time.Since(start).Round(time.Millisecond))
}

func (s *stack) request(method, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(s.ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (s *stack) get(service, path string, v any) error {
	status, b, err := s.request(http.MethodGet, s.http[service]+path, nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s on %s: %d %s", path, service, status, b)
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}

func (s *stack) putPolicy(service, name string) error {
	body, _ := json.Marshal(map[string]any{
		"name": name, "kind": "ToolPolicy", "scope": map[string]string{"org": "acme"},
		"spec": map[string]any{"tool_name": "Bash", "action": "deny", "reason": "compose test"},
	})
	status, b, err := s.request(http.MethodPut, s.http[service]+"/v1/policies/"+name, body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("PUT %s through %s: %d %s", name, service, status, b)
	}
	return nil
}

type clusterStatus struct {
	LeaderID     string `json:"leader_id"`
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
}

// sidecarHas reports whether the watch container printed an update holding
// the policy.
func (s *stack) sidecarHas(watch, policy string) error {
	out, err := run(s.ctx, ".", nil, "docker", "logs", watch)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	updates := 0
	for sc.Scan() {
		var ev struct {
			Event    string   `json:"event"`
			Policies []string `json:"policies"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "update" {
			continue
		}
		updates++
		if slices.Contains(ev.Policies, policy) {
			return nil
		}
	}
	return fmt.Errorf("%d updates printed, none with %s", updates, policy)
}

// converged reports nil when the services report one digest.
func (s *stack) converged(services ...string) error {
	var first string
	for _, svc := range services {
		var st clusterStatus
		if err := s.get(svc, "/v1/cluster", &st); err != nil {
			return err
		}
		if first != "" && st.Digest != first {
			return fmt.Errorf("%s has digest %.12s, another %.12s", svc, st.Digest, first)
		}
		first = st.Digest
	}
	return nil
}

// TestComposeCluster runs the compose file with the real image: a write
// reaches the sidecar, which authenticates with its JWT, and a sidecar
// without one is refused; the leader's container is killed and a write through
// another node reaches the sidecar too; one container is cut off from the
// network and the other two keep taking writes; reconnected, it catches up.
func TestComposeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and runs three containers: not in -short (make check)")
	}
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("docker info failed, so the compose scenario cannot run here: %v\n%s", err, out)
	}
	composeCmd, err := findCompose()
	if err != nil {
		t.Skipf("Docker works but compose does not: %v", err)
	}

	tag := "compose-test"
	start := time.Now()
	bctx, bcancel := context.WithTimeout(t.Context(), buildBudget)
	out, err := run(bctx, filepath.Join("..", ".."), nil, "make", "image", "VERSION="+tag)
	bcancel()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("image built in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()

	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	s := &stack{
		t: t, ctx: ctx, compose: composeCmd,
		project: "policydtest" + hex.EncodeToString(suffix),
		// Empty port variables publish on free ports of 127.0.0.1.
		env: []string{"POLICYD_IMAGE=policyd:" + tag,
			"POLICYD_NODE1_HTTP=", "POLICYD_NODE2_HTTP=", "POLICYD_NODE3_HTTP=",
			"POLICYD_NODE1_GRPC=", "POLICYD_NODE2_GRPC=", "POLICYD_NODE3_GRPC="},
		http: map[string]string{},
		hc:   &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
	t.Cleanup(func() {
		// Its own deadline: the scenario's may be spent.
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if t.Failed() {
			logs, _ := s.try(cctx, "logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", logs)
		}
		if _, err := s.try(cctx, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("compose down: %v", err)
		}
	})
	s.do("up", "-d")

	services := []string{"node1", "node2", "node3"}
	for _, svc := range services {
		s.published(svc)
	}
	s.waitFor("every node ready", time.Minute, func() error {
		for _, svc := range services {
			if err := s.get(svc, "/readyz", nil); err != nil {
				return err
			}
		}
		return nil
	})
	watch := s.container("watch")
	// The sidecar's token names the employee seed creates; until then the
	// nodes refuse it and Docker restarts it.
	s.waitFor("seed to create the demo employee", 45*time.Second, func() error {
		return s.get("node1", "/v1/employees/"+demoEmployee(t).ID, nil)
	})

	// 1. A write reaches the sidecar, which presents its JWT.
	if err := s.putPolicy("node1", "acme.first"); err != nil {
		t.Fatal(err)
	}
	s.waitFor("the sidecar to receive acme.first", time.Minute, func() error { return s.sidecarHas(watch, "acme.first") })

	// A sidecar without a token is refused (auth.mode: jwt): it ends
	// revoked, having received nothing.
	network := s.docker("inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}", watch)
	out, err = run(s.ctx, ".", nil, "docker", "run", "--rm", "--network", network, "policyd:"+tag,
		"watch", "--servers", "node1:9090", "--org", "acme", "--output", "json")
	if err == nil || !strings.Contains(out, `"to":"revoked"`) || strings.Contains(out, `"event":"update"`) {
		t.Fatalf("a sidecar without a token: err %v, output:\n%s\nwant it refused (revoked, no update)", err, out)
	}

	// 2. The leader's container dies; another node takes a write, which
	// reaches the sidecar.
	var st clusterStatus
	if err := s.get("node1", "/v1/cluster", &st); err != nil {
		t.Fatal(err)
	}
	leader := st.LeaderID
	if !slices.Contains(services, leader) {
		t.Fatalf("leader %q is not a service", leader)
	}
	rest := slices.DeleteFunc(slices.Clone(services), func(s string) bool { return s == leader })
	s.do("kill", leader)
	s.waitFor("a write through "+rest[0]+" after the leader was killed", 45*time.Second, func() error {
		return s.putPolicy(rest[0], "acme.after-failover")
	})
	s.waitFor("the sidecar to receive acme.after-failover", 45*time.Second, func() error { return s.sidecarHas(watch, "acme.after-failover") })

	// The old leader comes back and catches up.
	s.do("start", leader)
	s.published(leader) // a free port is picked again
	s.waitFor(leader+" back and caught up", time.Minute, func() error {
		if err := s.get(leader, "/v1/policies/acme.after-failover", nil); err != nil {
			return err
		}
		return s.converged(services...)
	})

	// 3. The current leader is cut off from the network: the other two
	// elect a leader and keep taking writes.
	if err := s.get(rest[0], "/v1/cluster", &st); err != nil {
		t.Fatal(err)
	}
	isolated := st.LeaderID
	others := slices.DeleteFunc(slices.Clone(services), func(s string) bool { return s == isolated })
	cid := s.container(isolated)
	s.docker("network", "disconnect", network, cid)
	s.waitFor("a write through "+others[0]+" with "+isolated+" cut off", 45*time.Second, func() error {
		return s.putPolicy(others[0], "acme.while-isolated")
	})
	if err := s.putPolicy(others[1], "acme.while-isolated-2"); err != nil {
		t.Fatalf("the second remaining node does not take writes: %v", err)
	}
	s.waitFor("both remaining nodes to serve both writes", 30*time.Second, func() error {
		for _, svc := range others {
			for _, p := range []string{"acme.while-isolated", "acme.while-isolated-2"} {
				if err := s.get(svc, "/v1/policies/"+p, nil); err != nil {
					return err
				}
			}
		}
		return nil
	})

	// The cut-off node really is cut off: it knows no leader and lacks the
	// writes (asked from inside its container; its published port is gone).
	s.waitFor(isolated+" to know it has no leader", 30*time.Second, func() error {
		out, err := run(s.ctx, ".", nil, "docker", "exec", cid, "/policyd", "--server", "http://127.0.0.1:8080", "-o", "json", "cluster", "status")
		if err != nil {
			return err
		}
		var st clusterStatus
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return err
		}
		if st.LeaderID != "" {
			return fmt.Errorf("%s still sees leader %q", isolated, st.LeaderID)
		}
		return nil
	})
	if out, err := run(s.ctx, ".", nil, "docker", "exec", cid, "/policyd", "--server", "http://127.0.0.1:8080", "policy", "get", "acme.while-isolated"); err == nil {
		t.Fatalf("%s holds a write made while it was cut off: %s", isolated, out)
	}

	// 4. Reconnected (under its service name again), it catches up.
	s.docker("network", "connect", "--alias", isolated, network, cid)
	s.published(isolated)
	s.waitFor(isolated+" to catch up after reconnecting", time.Minute, func() error {
		if err := s.get(isolated, "/v1/policies/acme.while-isolated-2", nil); err != nil {
			return err
		}
		return s.converged(services...)
	})
	s.waitFor("the sidecar to receive the writes made during the partition", 45*time.Second, func() error {
		return s.sidecarHas(watch, "acme.while-isolated-2")
	})
	t.Logf("scenario done in %v", time.Since(start).Round(time.Millisecond))
}
