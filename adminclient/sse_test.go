package adminclient

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReadEvents(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		want         []StreamEvent
	}{
		{"empty", "", nil},
		{"two events", "id: 7\nevent: policy\ndata: {\"id\":7}\n\nid: 8\nevent: rollout\ndata: {\"id\":8}\n\n",
			[]StreamEvent{{"7", "policy", `{"id":7}`}, {"8", "rollout", `{"id":8}`}}},
		{"a reset, then an event without id", "event: reset\ndata: {\"pruned_through\":3}\n\nevent: policy\ndata: {}\n\n",
			[]StreamEvent{{"", "reset", `{"pruned_through":3}`}, {"", "policy", "{}"}}},
		{"keep-alive comments are skipped", ": keep-alive\n\nid: 1\nevent: policy\ndata: x\n\n", []StreamEvent{{"1", "policy", "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []StreamEvent
			err := ReadEvents(strings.NewReader(tc.stream), func(ev StreamEvent) error {
				got = append(got, ev)
				return nil
			})
			if !errors.Is(err, io.EOF) {
				t.Fatalf("ReadEvents: %v, want io.EOF at the end", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
	stop := errors.New("stop")
	if err := ReadEvents(strings.NewReader("event: policy\ndata: 1\n\nevent: policy\ndata: 2\n\n"), func(StreamEvent) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v", err)
	}
}
