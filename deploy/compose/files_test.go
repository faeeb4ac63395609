package compose_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/policyd/policyd/internal/auth"
	"github.com/policyd/policyd/internal/config"
	"github.com/policyd/policyd/internal/policy"
)

// composeFile is the part of docker-compose.yml the tests read.
type composeFile struct {
	Services map[string]struct {
		Command []string `json:"command"`
		Volumes []string `json:"volumes"`
		Secrets []string `json:"secrets"`
	} `json:"services"`
	Secrets map[string]struct {
		File string `json:"file"`
	} `json:"secrets"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// hostFile is the file of this directory that service sees at container
// path p, through a secret or a bind mount.
func (c composeFile) hostFile(t *testing.T, service, p string) string {
	t.Helper()
	svc := c.Services[service]
	if name, ok := strings.CutPrefix(p, "/run/secrets/"); ok && slices.Contains(svc.Secrets, name) {
		if f := c.Secrets[name].File; f != "" {
			return f
		}
	}
	for _, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == p && strings.HasPrefix(parts[0], "./") {
			return parts[0]
		}
	}
	t.Fatalf("service %s does not mount %s from a file of deploy/compose", service, p)
	return ""
}

func demoEmployee(t *testing.T) policy.Employee {
	t.Helper()
	raw, err := os.ReadFile("demo-employee.json")
	if err != nil {
		t.Fatal(err)
	}
	var e policy.Employee
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("demo-employee.json: %v", err)
	}
	return e
}

// nodeConfig loads node<n>.yaml as the node's container does, with the
// files it names replaced by the demo files they are mounted from, so that
// they can be opened.
func nodeConfig(t *testing.T, c composeFile, service string) config.Config {
	t.Helper()
	cfg, err := config.Load(service+".yaml", nil, nil)
	if err != nil {
		t.Fatalf("%s.yaml does not load: %v", service, err)
	}
	cfg.Cluster.SecretFile = c.hostFile(t, service, cfg.Cluster.SecretFile)
	cfg.Auth.JWT.HMACSecretFile = c.hostFile(t, service, cfg.Auth.JWT.HMACSecretFile)
	return cfg
}

// TestComposeSecureByDefault checks, without Docker, that every node of the
// compose file authenticates its peers with the cluster secret and its
// sidecars with JWTs, that the demo files it mounts are what it reads, and
// that the watch sidecar's demo token verifies against the nodes' key as the
// employee seed creates. The scenario (TestComposeCluster) shows the same
// working on real containers.
func TestComposeSecureByDefault(t *testing.T) {
	c := readCompose(t)
	emp := demoEmployee(t)
	var nodes []string
	for name, svc := range c.Services {
		if slices.Contains(svc.Command, "serve") {
			nodes = append(nodes, name)
		}
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"node1", "node2", "node3"}) {
		t.Fatalf("services running serve: %v, want node1..3", nodes)
	}
	watch := c.Services["watch"]
	i := slices.Index(watch.Command, "--token-file")
	if i < 0 || i+1 >= len(watch.Command) {
		t.Fatalf("watch %v: no --token-file", watch.Command)
	}
	token, err := os.ReadFile(c.hostFile(t, "watch", watch.Command[i+1]))
	if err != nil {
		t.Fatal(err)
	}
	if seed := c.Services["seed"].Command; !slices.Contains(seed, "employee") ||
		c.hostFile(t, "seed", seed[len(seed)-1]) != "./demo-employee.json" {
		t.Errorf("seed %v does not apply demo-employee.json", seed)
	}

	for _, node := range nodes {
		t.Run(node, func(t *testing.T) {
			cfg := nodeConfig(t, c, node)
			if cfg.Cluster.SecretFile == "" || cfg.Cluster.AllowInsecurePeers {
				t.Errorf("cluster.secret_file %q, allow_insecure_peers %v: want the secret and no opt-out", cfg.Cluster.SecretFile, cfg.Cluster.AllowInsecurePeers)
			}
			if cfg.Auth.Mode != "jwt" || cfg.Auth.AllowInsecureSidecars {
				t.Errorf("auth.mode %q, allow_insecure_sidecars %v: want jwt and no opt-out", cfg.Auth.Mode, cfg.Auth.AllowInsecureSidecars)
			}
			if filepath.Dir(cfg.Cluster.SecretFile) != "demo-secrets" || filepath.Dir(cfg.Auth.JWT.HMACSecretFile) != "demo-secrets" {
				t.Errorf("secrets from %s and %s: want the marked demo files in demo-secrets/", cfg.Cluster.SecretFile, cfg.Auth.JWT.HMACSecretFile)
			}
			v, err := auth.NewJWTVerifier(cfg.Auth.JWT, nil)
			if err != nil {
				t.Fatal(err)
			}
			claims, err := v.Verify(strings.TrimSpace(string(token)))
			if err != nil {
				t.Fatalf("the watch sidecar's token does not verify: %v", err)
			}
			if claims.Subject != emp.ID || claims.Org != emp.Org {
				t.Errorf("token for %s of org %s; seed creates %s of org %s", claims.Subject, claims.Org, emp.ID, emp.Org)
			}
			if _, err := auth.Identify(claims, func(id string) (*policy.Employee, error) {
				if id == emp.ID {
					return &emp, nil
				}
				return nil, nil
			}); err != nil {
				t.Errorf("the token does not identify the demo employee: %v", err)
			}
		})
	}

	// mint-token.sh makes tokens the nodes accept, as its README says.
	t.Run("mint-token.sh", func(t *testing.T) {
		for _, tool := range []string{"bash", "openssl"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("%s is not installed", tool)
			}
		}
		cfg := nodeConfig(t, c, "node1")
		v, err := auth.NewJWTVerifier(cfg.Auth.JWT, nil)
		if err != nil {
			t.Fatal(err)
		}
		exp := time.Now().Add(time.Hour).Unix()
		out, err := exec.CommandContext(t.Context(), "./mint-token.sh", "alice", "acme", "red", fmt.Sprint(exp)).Output()
		if err != nil {
			t.Fatalf("mint-token.sh: %v", err)
		}
		claims, err := v.Verify(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("a minted token does not verify: %v", err)
		}
		want := auth.Claims{Subject: "alice", Org: "acme", Team: "red", Expiry: time.Unix(exp, 0)}
		if !claims.Expiry.Equal(want.Expiry) || claims.Subject != want.Subject || claims.Org != want.Org || claims.Team != want.Team {
			t.Errorf("claims %+v, want %+v", claims, want)
		}
	})
}

// TestDemoSecretsAreMarked: every demo secret file is in demo-secrets/,
// whose README says they are public and how to replace each one.
func TestDemoSecretsAreMarked(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("demo-secrets", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range readCompose(t).Secrets {
		if filepath.Dir(s.File) != "demo-secrets" {
			t.Errorf("secret %s comes from %s, outside demo-secrets/", name, s.File)
		}
		if !bytes.Contains(readme, []byte("`"+filepath.Base(s.File)+"`")) {
			t.Errorf("demo-secrets/README.md does not describe %s", s.File)
		}
	}
}
