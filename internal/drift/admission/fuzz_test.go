package admission

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Longer runs: go test ./internal/drift/admission -run '^$' -fuzz FuzzHandler -fuzztime 5m
// (likewise FuzzAnnotationParsers, FuzzDecideObjects).

// FuzzHandler feeds arbitrary bodies to the handler: the answer is an HTTP
// 4xx or an AdmissionReview for the same uid, never a panic.
func FuzzHandler(f *testing.F) {
	parent := steadyParent()
	child := childOf(parent)
	drift := with(child, specField("replicas", int64(2)))
	status := request(admissionv1.Update, ctrlUser, parent, parent)
	status.SubResource = "status"
	for _, req := range []*admissionv1.AdmissionRequest{
		request(admissionv1.Update, ctrlUser, child, drift),
		request(admissionv1.Create, ctrlUser, nil, drift),
		request(admissionv1.Delete, human, child, nil),
		status,
	} {
		f.Add(reviewBody(f, req))
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"UPDATE","object":{"metadata":{"ownerReferences":[{"controller":true,"kind":"Widget","name":"w"}]}},"oldObject":7}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":{"metadata":{"ownerReferences":"x","annotations":{"policyd.io/updaters":"a,b"}}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"UPDATE","subResource":"status","object":{"metadata":null},"oldObject":{"status":{"conditions":[1]}}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))

	h := NewHandler(logMode(), nil, newFakeObjects(parent), &recordingSink{}, nil)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, r)
		switch rec.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
		}
		var in, out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("accepted a body that does not decode: %v", err)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("answer is not a review: %v: %s", err, rec.Body)
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("answer uid %q, want %q", out.Response.UID, in.Request.UID)
		}
		if !out.Response.Allowed && (out.Response.Result == nil || out.Response.Result.Code == 0 || out.Response.Result.Message == "") {
			t.Fatalf("denial without a code and message: %s", rec.Body)
		}
		if len(out.Response.Patch) > 0 {
			if _, err := jsonpatch.DecodePatch(out.Response.Patch); err != nil {
				t.Fatalf("patch does not decode: %v", err)
			}
		}
	})
}

// FuzzAnnotationParsers feeds one string to every annotation parser and,
// as every drift annotation of a parent, through Decide.
func FuzzAnnotationParsers(f *testing.F) {
	for _, s := range []string{
		`[{"apiVersion":"example.com/v1","kind":"Gadget","name":"g","generation":3,"mode":"once"}]`,
		`[{"kind":"Gadget","name":"*","mode":"always"},{"kind":"Gadget","name":"g","reason":"no"}]`,
		`[{"kind":"Gadget","name":"g","generation":1e400}]`,
		`[{"kind":"Gadget","name":"g","generation":-1,"mode":"generation"}, 3, null, "x"]`,
		`{"user":"bob","message":"m","at":"2026-01-01T00:00:00Z"}`,
		`{"expiry":"2026-03-02T00:00:00Z"}`, "2026-03-02T00:00:00Z", "true", "false", "",
		`[{"apiVersion":"v1","kind":"K","name":"n","generation":1,"user":"u","timestamp":"t"}]`,
		"aaaaa,bbbbb,ccccc,ddddd,eeeee,fffff", hCtrl, "enforce", "apps/Deployment=Available+observedGeneration",
		"\x00\xff[", strings.Repeat("[", 10000),
		`[{"apiVersion":"*","kind":"*","name":"*","mode":"always"},{"kind":"Gad*","name":"g*"}]`,
		`[{"apiVersion":"v1","kind":"K","name":"n","labels":{"ticket":"T-1"},"requestUID":"u"},{"kind":"K","labels":null}]`,
		`[{"kind":"K","labels":{"a":1}}]`, `[{"kind":"K"},7]`, strings.Repeat("x", 1025),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseApprovals(s)
		_, _ = ParseRejections(s)
		f, frozen := ParseFreeze(s)
		if frozen && f.String() == "" {
			t.Fatal("frozen without a message")
		}
		_, _ = ParseSnooze(s)
		_, _ = ParseTrace(s)
		if raw, err := rawTrace(s); err == nil {
			// A parent's hops copied whole stay a trace a child can parse.
			if _, err := ParseTrace(formatTrace(extendTrace(raw, Hop{Kind: "Child"}))); err != nil {
				t.Fatalf("trace built on %q does not parse: %v", s, err)
			}
		}
		_, _ = (Config{}).traceLabels(map[string]string{"policyd.io/trace-" + s: s, "policyd.io/trace-k": s})
		hs := ParseHashes(s)
		if len(hs) > maxHashes {
			t.Fatalf("%d hashes", len(hs))
		}
		for _, h := range hs {
			if !validHash(h) {
				t.Fatalf("invalid hash %q kept", h)
			}
		}
		if !slices.Equal(ParseHashes(FormatHashes(hs)), hs) {
			t.Fatalf("hash list does not round-trip: %q", hs)
		}
		_, _ = pruneApprovals(s, 3)
		_, _ = removeApproval(s, Approval{Kind: "Gadget", Name: "g", Generation: 3, Mode: ApprovalOnce})
		if v, ok := moveApprovals(s, 3, 4); ok && !json.Valid([]byte(v)) {
			t.Fatalf("moveApprovals produced invalid JSON %q", v)
		}
		_ = isOneHashAppend(s, s+","+hCtrl)

		var opts []objOpt
		for _, k := range []string{"approvals", "rejections", "freeze", "snooze", "controllers", "mode", "trace", "phase"} {
			opts = append(opts, ann(k, s))
		}
		for _, p := range []*unstructured.Unstructured{steadyParent(opts...), steadyParent(append(opts, noAnn("freeze"))...)} {
			old := childOf(p, ann("updaters", s), ann("trace", s), ann("trace-k", s))
			nw := with(old, specField("replicas", int64(2)), ann("approvals", s), ann("trace-"+s, s), ann("trace-x", s))
			for _, op := range []admissionv1.Operation{admissionv1.Update, admissionv1.Create} {
				o := old
				if op == admissionv1.Create {
					o = nil
				}
				d := Decide(Input{Request: request(op, ctrlUser, o, nw), Old: o, New: nw, Parent: p, Now: now, Config: logMode()})
				if d.Allowed && len(d.Patch) > 0 {
					if _, err := jsonpatch.DecodePatch(d.Patch); err != nil {
						t.Fatalf("bad patch %s: %v", d.Patch, err)
					}
				}
				for _, e := range d.Effects {
					if _, err := json.Marshal(e); err != nil {
						t.Fatalf("effect does not marshal: %v", err)
					}
					if _, ok := e.Annotate("policyd.io", p); ok && e.Kind == EffectDriftDetected {
						t.Fatal("a drift effect changed annotations")
					}
				}
			}
		}
	})
}

// FuzzDecideObjects feeds arbitrary JSON as the old, new and parent objects.
func FuzzDecideObjects(f *testing.F) {
	p := steadyParent()
	c := childOf(p)
	f.Add(mustJSON(c.Object), mustJSON(with(c, specField("replicas", int64(2))).Object), mustJSON(p.Object))
	f.Add([]byte(`{"metadata":{"generation":"x","ownerReferences":[{"controller":true,"uid":5}]}}`), []byte(`{"spec":[1],"metadata":{"annotations":{}}}`), []byte(`{"status":{"conditions":{"type":"Ready"}},"metadata":{"deletionTimestamp":7}}`))
	f.Add([]byte(`{"metadata":{"generation":1e300}}`), []byte(`{"metadata":{"generation":-5}}`), []byte(`{"metadata":{"generation":9007199254740993},"status":{"observedGeneration":9007199254740993}}`))
	f.Add(mustJSON(with(c, ann("mode", "log"), ann("trace-ok", "v")).Object),
		mustJSON(with(c, specField("replicas", int64(2)), ann("trace--bad", "v"), ann("trace-", "e"), ann("trace-big", strings.Repeat("b", 1025))).Object),
		mustJSON(with(p, ann("trace", `[{"apiVersion":"v1","kind":"W","name":"w","labels":{"t":"1"},"extra":[1]}]`), ann("approvals", `[{"apiVersion":"*","kind":"*","name":"*","mode":"always"}]`)).Object))
	f.Fuzz(func(t *testing.T, oldJSON, newJSON, parentJSON []byte) {
		old, err1 := decodeObject(oldJSON)
		nw, err2 := decodeObject(newJSON)
		parent, err3 := decodeObject(parentJSON)
		if err1 != nil || err2 != nil || err3 != nil {
			return
		}
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update, admissionv1.Delete} {
			req := &admissionv1.AdmissionRequest{UID: "u", Operation: op}
			req.UserInfo.Username = ctrlUser
			d := Decide(Input{Request: req, Old: old, New: nw, Parent: parent, Now: now, Config: enforce()})
			if !d.Allowed && d.Code == 0 {
				t.Fatalf("denied without a code: %+v", d)
			}
			if d.Allowed && len(d.Patch) > 0 && nw != nil {
				p, err := jsonpatch.DecodePatch(d.Patch)
				if err != nil {
					t.Fatalf("bad patch %s: %v", d.Patch, err)
				}
				if _, err := p.Apply(mustJSON(nw.Object)); err != nil {
					t.Fatalf("patch %s does not apply: %v", d.Patch, err)
				}
			}
			if parent != nil {
				switch ph := (Config{}).Phase(parent); ph {
				case PhaseInitializing, PhaseInitialized, PhaseDeleting:
				default:
					t.Fatalf("phase %q", ph)
				}
			}
		}
	})
}
