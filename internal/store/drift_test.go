package store

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// driftStep is one command applied to the drift state at a given time
// (seconds after t0; the index is the step number).
type driftStep struct {
	at      time.Duration
	observe []DriftObservation
	deliver *deliveryStep
	done    []string
	prune   time.Duration // cutoff, seconds after t0; 0: no prune
}

type deliveryStep struct {
	id    string
	urls  []URLDelivery
	final bool
}

func detected(id, pair string, snoozed bool) DriftObservation {
	return DriftObservation{Kind: DriftDetected, ReportID: id, PairID: pair, Snoozed: snoozed, Report: []byte(`{"spec":{"id":"` + id + `"}}`)}
}

func resolved(pair string, snoozed bool) DriftObservation {
	return DriftObservation{Kind: DriftResolved, ReportID: pair, PairID: pair, Snoozed: snoozed, Report: []byte(`{"spec":{"id":"` + pair + `"}}`)}
}

func approved(id, pair string) DriftObservation {
	return DriftObservation{Kind: DriftApproved, ReportID: id, PairID: pair, Report: []byte(`{"spec":{"id":"` + pair + `"}}`)}
}

func patchTask(key string) DriftObservation {
	return DriftObservation{Kind: "RecordController", Key: key, Effect: []byte(`{"kind":"RecordController"}`)}
}

func applyDrift(t *testing.T, s *Store, steps []driftStep) {
	t.Helper()
	for i, st := range steps {
		m := Meta{Index: uint64(i + 1), ProcessedAt: t0.Add(st.at), OriginatedAt: t0.Add(st.at)}
		apply(t, s, m.Index, func(b *Batch) error {
			switch {
			case st.observe != nil:
				return b.ObserveDrift(m, st.observe)
			case st.deliver != nil:
				return b.RecordDriftDelivery(m, st.deliver.id, st.deliver.urls, st.deliver.final)
			case st.done != nil:
				return b.CompleteDriftTasks(m, st.done)
			default:
				_, err := b.PruneDrift(t0.Add(st.prune))
				return err
			}
		})
	}
}

// reportState is what a test asserts of a stored report.
type reportState struct {
	Phase        string
	Delivery     string
	Observations int
}

func TestDriftDedupAndDelivery(t *testing.T) {
	ok := []URLDelivery{{URL: "http://a", State: DeliveryDelivered, Attempts: 1}}
	tests := []struct {
		name        string
		steps       []driftStep
		wantReports map[string]reportState
		wantTasks   []string
		// wantEvents counts drift events (report created or settled).
		wantEvents int
	}{
		{
			name: "three replicas see one drift: one report, one delivery task",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 3 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
			},
			wantReports: map[string]reportState{"d1": {PhaseDetected, DeliveryPending, 3}},
			wantTasks:   []string{"report/d1"},
			wantEvents:  1,
		},
		{
			name: "delivered, then seen again within the window: deduplicated",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, deliver: &deliveryStep{id: "d1", urls: ok, final: true}},
				{at: 9 * time.Minute, observe: []DriftObservation{detected("d1", "p1", false)}},
			},
			wantReports: map[string]reportState{"d1": {PhaseDetected, DeliveryDelivered, 2}},
			wantEvents:  2,
		},
		{
			name: "seen again after the window: delivered again",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, deliver: &deliveryStep{id: "d1", urls: ok, final: true}},
				{at: 11 * time.Minute, observe: []DriftObservation{detected("d1", "p1", false)}},
			},
			wantReports: map[string]reportState{"d1": {PhaseDetected, DeliveryPending, 2}},
			wantTasks:   []string{"report/d1"},
			wantEvents:  3,
		},
		{
			name: "snoozed: recorded, not delivered, and no window once the snooze ends",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", true)}},
				{at: 2 * time.Second, observe: []DriftObservation{detected("d1", "p1", true)}},
				{at: 3 * time.Second, observe: []DriftObservation{resolved("p1", true)}},
				{at: 4 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
			},
			wantReports: map[string]reportState{"d1": {PhaseDetected, DeliveryPending, 3}},
			wantTasks:   []string{"report/d1"},
			wantEvents:  2,
		},
		{
			name: "resolved only for an open, delivered drift, once",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{resolved("p1", false)}},
				{at: 2 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 3 * time.Second, observe: []DriftObservation{resolved("p1", false)}},
				{at: 4 * time.Second, observe: []DriftObservation{resolved("p1", false)}},
			},
			wantReports: map[string]reportState{
				"d1": {PhaseDetected, DeliveryPending, 1},
				"p1": {PhaseResolved, DeliveryPending, 1},
			},
			wantTasks:  []string{"report/d1", "report/p1"},
			wantEvents: 2,
		},
		{
			name: "every approved drift is reported, with or without an open drift; each occurrence once",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{approved("a1", "p1")}},
				{at: 2 * time.Second, observe: []DriftObservation{approved("a1", "p1")}},
				{at: 3 * time.Second, observe: []DriftObservation{approved("a2", "p1")}},
			},
			wantReports: map[string]reportState{
				"a1": {PhaseResolved, DeliveryPending, 2},
				"a2": {PhaseResolved, DeliveryPending, 1},
			},
			wantTasks:  []string{"report/a1", "report/a2"},
			wantEvents: 2,
		},
		{
			name: "an approval closes the open drift: the parent's spec change then resolves nothing",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, observe: []DriftObservation{approved("a1", "p1")}},
				{at: 3 * time.Second, observe: []DriftObservation{resolved("p1", false)}},
			},
			wantReports: map[string]reportState{
				"d1": {PhaseDetected, DeliveryPending, 1},
				"a1": {PhaseResolved, DeliveryPending, 1},
			},
			wantTasks:  []string{"report/d1", "report/a1"},
			wantEvents: 2,
		},
		{
			name: "identical patch tasks collapse while pending, not after",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{patchTask("k1"), patchTask("k2")}},
				{at: 2 * time.Second, observe: []DriftObservation{patchTask("k1")}},
				{at: 3 * time.Second, done: []string{"k1", "unknown"}},
				{at: 4 * time.Second, observe: []DriftObservation{patchTask("k1")}},
			},
			wantReports: map[string]reportState{},
			wantTasks:   []string{"k2", "k1"},
		},
		{
			name: "a failing URL retries, then settles as failed",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, deliver: &deliveryStep{id: "d1", urls: []URLDelivery{{URL: "http://b", State: DeliveryRetrying, Attempts: 1}}}},
				{at: 3 * time.Second, deliver: &deliveryStep{id: "d1", urls: []URLDelivery{{URL: "http://b", State: DeliveryFailed, Attempts: 5}}, final: true}},
			},
			wantReports: map[string]reportState{"d1": {PhaseDetected, DeliveryFailed, 1}},
			wantEvents:  2,
		},
		{
			name: "prune removes settled reports only",
			steps: []driftStep{
				{at: 1 * time.Second, observe: []DriftObservation{detected("d1", "p1", false)}},
				{at: 2 * time.Second, deliver: &deliveryStep{id: "d1", urls: ok, final: true}},
				{at: 3 * time.Second, observe: []DriftObservation{detected("d2", "p2", false)}},
				{at: 4 * time.Second, prune: time.Hour},
				{at: 5 * time.Second, deliver: &deliveryStep{id: "gone", final: true}},
			},
			wantReports: map[string]reportState{"d2": {PhaseDetected, DeliveryPending, 1}},
			wantTasks:   []string{"report/d2"},
			wantEvents:  3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			applyDrift(t, s, tc.steps)
			reports, err := s.DriftReports(DriftFilter{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]reportState{}
			for _, r := range reports {
				got[r.ID] = reportState{r.Phase, r.Delivery, r.Observations}
			}
			if diff := cmp.Diff(tc.wantReports, got); diff != "" {
				t.Errorf("reports (-want +got):\n%s", diff)
			}
			tasks, err := s.DriftTasks()
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, tk := range tasks {
				keys = append(keys, tk.Key)
			}
			if diff := cmp.Diff(tc.wantTasks, keys); diff != "" {
				t.Errorf("tasks in order (-want +got):\n%s", diff)
			}
			if got, want := len(events(t, s, EventFilter{Type: EntityDrift}).Events), tc.wantEvents; got != want {
				t.Errorf("drift events = %d, want %d", got, want)
			}
		})
	}
}

func TestDriftReportsFilterAndOrder(t *testing.T) {
	s := openStore(t)
	applyDrift(t, s, []driftStep{
		{at: 1 * time.Second, observe: []DriftObservation{detected("a", "pa", false)}},
		{at: 2 * time.Second, observe: []DriftObservation{detected("b", "pb", false)}},
		{at: 3 * time.Second, observe: []DriftObservation{resolved("pa", false)}},
		{at: 4 * time.Second, deliver: &deliveryStep{id: "b", urls: []URLDelivery{{URL: "http://z", State: DeliveryDelivered}, {URL: "http://y", State: DeliveryDelivered}}, final: true}},
	})
	ids := func(f DriftFilter) []string {
		t.Helper()
		rs, err := s.DriftReports(f)
		if err != nil {
			t.Fatal(err)
		}
		out := []string{}
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    DriftFilter
		want []string
	}{
		{"all, latest first", DriftFilter{}, []string{"pa", "b", "a"}},
		{"phase", DriftFilter{Phase: PhaseDetected}, []string{"b", "a"}},
		{"delivery", DriftFilter{Delivery: DeliveryDelivered}, []string{"b"}},
		{"limit", DriftFilter{Limit: 1}, []string{"pa"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ids(tc.f)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
	b, err := s.DriftReport("b")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := []string{b.Deliveries[0].URL, b.Deliveries[1].URL}, []string{"http://y", "http://z"}; !cmp.Equal(got, want) {
		t.Errorf("deliveries sorted = %v, want %v", got, want)
	}
	if _, err := s.DriftReport("nope"); err == nil {
		t.Error("DriftReport(unknown) = nil error, want ErrNotFound")
	}
}

// The drift buckets are replicated state: they count in the digest.
func TestDriftStateInDigest(t *testing.T) {
	s := openStore(t)
	before := digest(t, s)
	applyDrift(t, s, []driftStep{{at: time.Second, observe: []DriftObservation{patchTask("k")}}})
	if digest(t, s) == before {
		t.Error("digest unchanged after a drift task was stored")
	}
}
