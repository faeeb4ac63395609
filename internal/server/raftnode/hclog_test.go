package raftnode

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestHCLogRendersFormats(t *testing.T) {
	var buf bytes.Buffer
	l := NewHCLog(slog.New(slog.NewTextHandler(&buf, nil)), "raft")
	args := []any{"servers", hclog.Fmt("%+v", []string{"a", "b"}), "n", 1}
	l.Info("initial configuration", args...)
	if got := buf.String(); !strings.Contains(got, "servers=\"[a b]\"") || strings.Contains(got, "%+v") {
		t.Fatalf("logged %q", got)
	}
	if _, ok := args[1].(hclog.Format); !ok {
		t.Fatal("the caller's arguments were modified")
	}
}
