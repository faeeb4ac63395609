package adminclient

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// StreamEvent is one Server-Sent Event of GET /v1/events/watch: Event is
// the entity type ("policy", …) or "reset" (Data: {"pruned_through": N}),
// Data is the event's JSON.
type StreamEvent struct {
	ID, Event, Data string
}

// ReadEvents calls fn with each event of an event watch's body, in order,
// until fn fails, the body ends (io.EOF) or it cannot be read.
func ReadEvents(r io.Reader, fn func(StreamEvent) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ev StreamEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.Event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = strings.TrimPrefix(line, "data: ")
			if err := fn(ev); err != nil {
				return err
			}
		case line == "":
			ev = StreamEvent{}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("event stream: %w", err)
	}
	return io.EOF
}
