package raftfsm

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/command"
	"github.com/policyd/policyd/internal/store"
)

// Run longer with:
//
//	go test ./internal/raftfsm/ -run '^$' -fuzz '^FuzzDecodeDrift$' -fuzztime 60s

func driftDetected(id string) store.DriftObservation {
	return store.DriftObservation{Kind: store.DriftDetected, ReportID: id, PairID: "pair-" + id, Report: []byte(`{"kind":"DriftReport"}`)}
}

func driftPatch(key string) store.DriftObservation {
	return store.DriftObservation{Kind: "RecordController", Key: key, Effect: []byte(`{"kind":"RecordController"}`)}
}

func driftSeeds(t testing.TB) [][]byte {
	t.Helper()
	m := mustCmd(t)
	cmds := []*commandv1.Command{
		m(command.ObserveDrift("n1", []store.DriftObservation{driftDetected("d1"), driftPatch("k1")})),
		m(command.ObserveDrift("n1", []store.DriftObservation{{Kind: store.DriftResolved, ReportID: "p", PairID: "p", Report: []byte(`{}`)}})),
		m(command.RecordDriftDelivery("d1", []store.URLDelivery{{URL: "http://r", State: store.DeliveryDelivered, Attempts: 1}}, true)),
		m(command.RecordDriftDelivery("missing", nil, true)),
		m(command.CompleteDriftTasks([]string{"k1", "absent"})),
		m(command.PruneDrift(t0.Add(time.Hour))),
		{Type: uint32(command.TypeObserveDrift)},
		{Type: uint32(command.TypeObserveDrift), Payload: []byte{0x12, 0x03, 0x0a, 0x01, 'x'}},
		{Type: uint32(command.TypeRecordDriftDelivery), Payload: []byte{0xff}},
		{Type: uint32(command.TypeCompleteDriftTasks), Payload: []byte{0x0a, 0x00}},
	}
	var out [][]byte
	for i, c := range cmds {
		out = append(out, stamp(t, uint64(i+100), c))
	}
	return out
}

func FuzzDecodeDrift(f *testing.F) {
	for _, s := range driftSeeds(f) {
		f.Add(s)
	}
	st := fuzzStore(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkApply(t, st, data)
	})
}

// TestDriftCommandsRefuseBadInput: the builders and the decoder share one
// validation, so what a proposer cannot build never enters the log.
func TestDriftCommandsRefuseBadInput(t *testing.T) {
	big := strings.Repeat("k", command.MaxKeyLen+1)
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"no effects", func() error { _, err := command.ObserveDrift("n1", nil); return err }, "0 effects"},
		{"no node", func() error {
			_, err := command.ObserveDrift("", []store.DriftObservation{driftPatch("k")})
			return err
		}, "node_id"},
		{"two reports", func() error {
			_, err := command.ObserveDrift("n1", []store.DriftObservation{driftDetected("a"), driftDetected("b")})
			return err
		}, "more than one report"},
		{"report without id", func() error {
			o := driftDetected("")
			_, err := command.ObserveDrift("n1", []store.DriftObservation{o})
			return err
		}, "report_id"},
		{"report not JSON", func() error {
			o := driftDetected("a")
			o.Report = []byte("{")
			_, err := command.ObserveDrift("n1", []store.DriftObservation{o})
			return err
		}, "not JSON"},
		{"effect not JSON", func() error {
			o := driftPatch("k")
			o.Effect = []byte("nope")
			_, err := command.ObserveDrift("n1", []store.DriftObservation{o})
			return err
		}, "not JSON"},
		{"patch without key", func() error {
			_, err := command.ObserveDrift("n1", []store.DriftObservation{driftPatch("")})
			return err
		}, "key"},
		{"oversize key", func() error {
			_, err := command.ObserveDrift("n1", []store.DriftObservation{driftPatch(big)})
			return err
		}, "key"},
		{"empty kind", func() error {
			_, err := command.ObserveDrift("n1", []store.DriftObservation{{Key: "k"}})
			return err
		}, "kind"},
		{"delivery state unknown", func() error {
			_, err := command.RecordDriftDelivery("d", []store.URLDelivery{{URL: "http://x", State: "lost"}}, false)
			return err
		}, "unknown state"},
		{"delivery without url", func() error {
			_, err := command.RecordDriftDelivery("d", []store.URLDelivery{{State: store.DeliveryDelivered}}, false)
			return err
		}, "url"},
		{"delivery without report", func() error { _, err := command.RecordDriftDelivery("", nil, true); return err }, "report_id"},
		{"complete nothing", func() error { _, err := command.CompleteDriftTasks(nil); return err }, "0 keys"},
		{"complete empty key", func() error { _, err := command.CompleteDriftTasks([]string{""}); return err }, "key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	// The decoder refuses the same payload sent without the builder.
	payload, err := proto.Marshal(&commandv1.ObserveDrift{NodeId: "n1", Effects: []*commandv1.DriftEffect{{Kind: "RecordController"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeEntry(1, stamp(t, 1, &commandv1.Command{Type: uint32(command.TypeObserveDrift), Payload: payload})); err == nil {
		t.Error("DecodeEntry accepted a patch effect without a key")
	}
}

// TestDriftThroughFSM applies drift commands through the FSM as replicas
// do: three observations of one drift make one task, the leader's records
// settle it, and replicas end with equal digests.
func TestDriftThroughFSM(t *testing.T) {
	m := mustCmd(t)
	cmds := []*commandv1.Command{
		m(command.ObserveDrift("n1", []store.DriftObservation{driftDetected("d1"), driftPatch("k1")})),
		m(command.ObserveDrift("n2", []store.DriftObservation{driftDetected("d1"), driftPatch("k1")})),
		m(command.ObserveDrift("n3", []store.DriftObservation{driftDetected("d1"), driftPatch("k1")})),
		m(command.CompleteDriftTasks([]string{"k1"})),
		m(command.RecordDriftDelivery("d1", []store.URLDelivery{{URL: "http://r", State: store.DeliveryDelivered, Attempts: 1}}, true)),
	}
	var digests []string
	for range 2 {
		st := openStoreAt(t, filepath.Join(t.TempDir(), "state.db"))
		f := New(st, testLogger())
		for i, c := range cmds {
			if err := command.ResultErr(asResult(t, f.Apply(entry(t, uint64(i+1), c)))); err != nil {
				t.Fatalf("apply %d: %v", i+1, err)
			}
		}
		tasks, err := st.DriftTasks()
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) != 0 {
			t.Errorf("tasks left: %+v", tasks)
		}
		rec, err := st.DriftReport("d1")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Observations != 3 || rec.Delivery != store.DeliveryDelivered {
			t.Errorf("report: %d observations, delivery %s; want 3, delivered", rec.Observations, rec.Delivery)
		}
		digests = append(digests, digest(t, st))
	}
	if digests[0] != digests[1] {
		t.Error("two replicas applying the same drift commands differ")
	}
}
