package decisionlog

import (
	"context"
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzIngest feeds a record of any bytes through Ingest: it never panics,
// and whatever it keeps is valid UTF-8 JSON stamped with the sidecar's
// identity.
func FuzzIngest(f *testing.F) {
	f.Add(rec(0, true, "ls"))
	f.Add([]byte(`{"time":"2026-12-04T10:00:00Z","request":{"input":{"a":[[[[{}]]]]}}}`))
	f.Add([]byte("{\"time\":\"2026-12-04T10:00:00Z\",\"reason\":\"\xff\"}"))
	f.Add([]byte(`{"time":"9999-12-31T23:59:59Z","employee":"alice"}`))
	f.Add([]byte(`{"time":"2026-12-04T10:00:00Z","unrecorded":{"buffer_full":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, _ := newLog(t, Config{})
		if _, err := l.Ingest(batch(data)); err != nil {
			return
		}
		_ = l.Scan(context.Background(), time.Time{}, func(d []byte) bool {
			var r struct {
				Employee   string    `json:"employee"`
				Unrecorded *struct{} `json:"unrecorded"`
			}
			if !utf8.Valid(d) || json.Unmarshal(d, &r) != nil {
				t.Fatalf("kept %q: not valid UTF-8 JSON", d)
			}
			if r.Employee != "alice" || r.Unrecorded != nil {
				t.Fatalf("kept %s for alice", d)
			}
			return true
		})
	})
}
