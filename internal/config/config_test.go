package config

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const examplePath = "../../config.example.yaml"

// TestExampleIsDefault keeps config.example.yaml from drifting: it must list
// every key, each with a comment, and load to exactly Default().
func TestExampleIsDefault(t *testing.T) {
	got, err := Load(examplePath, nil, nil)
	if err != nil {
		t.Fatalf("Load(%s): %v", examplePath, err)
	}
	if diff := cmp.Diff(Default(), got); diff != "" {
		t.Errorf("%s differs from Default() (-Default +file):\n%s", examplePath, diff)
	}

	raw, err := readFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var fileKeys []string
	flattenKeys(raw, "", &fileKeys)
	sort.Strings(fileKeys)
	if diff := cmp.Diff(knownKeys(), fileKeys); diff != "" {
		t.Errorf("keys of %s differ from Config's (-Config +file):\n%s", examplePath, diff)
	}
}

func flattenKeys(m map[string]any, prefix string, out *[]string) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			flattenKeys(sub, joinKey(prefix, k), out)
			continue
		}
		*out = append(*out, joinKey(prefix, k))
	}
}

func TestExampleCommentsEveryKey(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	valueLine := regexp.MustCompile(`^\s*[a-z_]+:\s*\S`)
	prev := ""
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if valueLine.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(prev), "#") {
			t.Errorf("%s:%d: %q has no comment on the line above", examplePath, i+1, strings.TrimSpace(line))
		}
		prev = line
	}
}

// TestExamplePeersComment loads the commented-out peers example, so that
// copying it into a config works.
func TestExamplePeersComment(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var block []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "# peers:" {
			in = true
		} else if in && !strings.HasPrefix(trimmed, "#   ") {
			break
		}
		if in {
			block = append(block, "  "+strings.TrimPrefix(trimmed, "# "))
		}
	}
	if len(block) < 2 {
		t.Fatalf("no commented peers example in %s", examplePath)
	}
	content := "node_id: node1\nraft:\n" + strings.Join(block, "\n") + "\n"
	got, err := Load(writeConfig(t, content), nil, nil)
	if err != nil {
		t.Fatalf("Load(commented example):\n%s\nerr: %v", content, err)
	}
	if got, want := len(got.Raft.Peers), 3; got != want {
		t.Errorf("commented example has %d peers, want %d", got, want)
	}
}

func TestClusterExamples(t *testing.T) {
	var first *Config
	seen := map[string]string{}
	for i := 1; i <= 3; i++ {
		path := fmt.Sprintf("../../examples/cluster/node%d.yaml", i)
		t.Run(path, func(t *testing.T) {
			c, err := Load(path, nil, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got, want := c.NodeID, fmt.Sprintf("node%d", i); got != want {
				t.Errorf("node_id = %q, want %q", got, want)
			}
			if !c.Raft.Bootstrap {
				t.Error("raft.bootstrap = false, want true")
			}
			if first == nil {
				first = &c
			} else if diff := cmp.Diff(first.Raft.Peers, c.Raft.Peers); diff != "" {
				t.Errorf("raft.peers differ from node1's (-node1 +this):\n%s", diff)
			}
			for _, p := range c.Raft.Peers {
				if p.ID == c.NodeID && p.Address != c.RaftAdvertise() {
					t.Errorf("own peer entry has address %q, but raft advertises %q", p.Address, c.RaftAdvertise())
				}
			}
			// The three nodes share one machine, so nothing may be shared.
			for _, v := range []string{c.DataDir, c.HTTP.Addr, c.GRPC.Addr, c.Raft.Addr} {
				if other, dup := seen[v]; dup {
					t.Errorf("%q is used by %s too", v, other)
				}
				seen[v] = c.NodeID
			}
		})
	}
	if first == nil || len(first.Raft.Peers) != 3 {
		t.Fatalf("want 3 peers in the examples, got %+v", first)
	}
}
