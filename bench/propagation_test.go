package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/policyd/policyd/api/discovery/v1"
	"github.com/policyd/policyd/internal/policy"
)

func TestJSONTopString(t *testing.T) {
	tests := []struct {
		name, msg, key string
		want           string
		ok             bool
	}{
		{"first field", `{"type":"init","digest":"abc"}`, "type", "init", true},
		{"last field", `{"type":"upsert","policy":{"name":"x"},"version":7,"digest":"d1"}`, "digest", "d1", true},
		{"spaces", " {\n \"type\" : \"ping\" \t}", "type", "ping", true},
		{"nested same key ignored", `{"policy":{"digest":"inner","type":"x"},"digest":"outer"}`, "digest", "outer", true},
		{"nested only", `{"policy":{"digest":"inner"}}`, "digest", "", false},
		{"array of objects", `{"policies":[{"type":"a"},{"type":"b"}],"type":"init"}`, "type", "init", true},
		{"key text inside a value", `{"reason":"\"digest\":\"fake\"","digest":"real"}`, "digest", "real", true},
		{"escaped value", `{"type":"a\"b\u0041"}`, "type", `a"bA`, true},
		{"value that is a key name", `{"a":"digest","digest":"x"}`, "digest", "x", true},
		{"number value", `{"version":12}`, "version", "", false},
		{"null value", `{"digest":null}`, "digest", "", false},
		{"missing", `{"type":"ping"}`, "digest", "", false},
		{"empty object", `{}`, "type", "", false},
		{"empty string value", `{"digest":""}`, "digest", "", true},
		{"not an object", `["type","x"]`, "type", "", false},
		{"empty input", ``, "type", "", false},
		{"truncated key", `{"typ`, "type", "", false},
		{"truncated value", `{"type":"ini`, "type", "", false},
		{"after the object", `{"a":1} {"type":"x"}`, "type", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := jsonTopString([]byte(tc.msg), tc.key)
			if got != tc.want || ok != tc.ok {
				t.Errorf("jsonTopString(%s, %q) = %q, %v; want %q, %v", tc.msg, tc.key, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPropPolicyBody(t *testing.T) {
	v, err := policy.NewValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	name := propPolicyName(3, 7)
	p, err := policy.DecodePolicy(propPolicyBody(name, orgName(3), 42, 0))
	if err != nil {
		t.Fatalf("DecodePolicy: %v", err)
	}
	if err := v.Policy(p); err != nil {
		t.Errorf("Validator.Policy: %v", err)
	}
	if p.Name != name || p.Scope.Org != orgName(3) || p.Scope.Team != "" || p.Scope.Employee != "" {
		t.Errorf("got name %q scope %+v", p.Name, p.Scope)
	}
	for _, size := range []int{0, 100, 4096, 65536} {
		body := propPolicyBody(name, orgName(3), 42, size)
		if size > 200 && len(body) != size {
			t.Errorf("size %d: body is %d bytes", size, len(body))
		}
		p, err := policy.DecodePolicy(body)
		if err != nil {
			t.Fatalf("size %d: DecodePolicy: %v", size, err)
		}
		if err := v.Policy(p); err != nil {
			t.Errorf("size %d: Validator.Policy: %v", size, err)
		}
	}
	e, err := policy.DecodeEmployee(employeeBody(sidecarID(kindWS, 5), orgName(1)))
	if err != nil {
		t.Fatalf("DecodeEmployee: %v", err)
	}
	if err := v.Employee(e); err != nil {
		t.Errorf("Validator.Employee: %v", err)
	}
	if !e.Active() || e.ID != "bench-ws-5" || e.Org != "bench-o1" {
		t.Errorf("employee = %+v", e)
	}
}

// testFleet is a fleet of unconnected sidecars: kinds[i] in org orgs[i].
func testFleet(kinds []sidecarKind, orgs []int) *fleet {
	f := &fleet{base: time.Now()}
	for i, k := range kinds {
		f.cars = append(f.cars, &sidecar{idx: i, kind: k, org: orgs[i], id: sidecarID(k, i)})
	}
	return f
}

func TestHoldWait(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	f := testFleet([]sidecarKind{kindGRPC, kindGRPC, kindWS, kindWS, kindGRPC}, []int{0, 0, 0, 1, 0})
	// Car 0 already holds v1 before the wait starts; car 4 is dead.
	f.cars[0].received("v1", ms(5))
	f.cars[4].died()
	w := f.watch(map[int]string{0: "v1"})
	if got, want := len(w.expected), 4; got != want {
		t.Fatalf("expected %d sidecars, want %d (org 1 is not watched)", got, want)
	}
	f.cars[1].received("v0", ms(6)) // an older version does not count
	f.cars[1].received("v1", ms(10))
	f.cars[3].received("v1", ms(11)) // org 1: not watched
	select {
	case <-w.done:
		t.Fatal("done before car 2 holds v1")
	default:
	}
	f.cars[2].received("v1", ms(20))
	f.cars[2].received("v2", ms(30)) // a later message does not move the time
	complete, err := f.wait(context.Background(), w, time.Second)
	if err != nil || complete {
		t.Errorf("wait = %v, %v; want incomplete (car 4 is dead), nil", complete, err)
	}
	for idx, want := range map[int]time.Duration{0: ms(5), 1: ms(10), 2: ms(20)} {
		if at, ok := w.heldAt(idx); !ok || at != want {
			t.Errorf("car %d held at %v, %v; want %v", idx, at, ok, want)
		}
	}
	for _, idx := range []int{3, 4} {
		if _, ok := w.heldAt(idx); ok {
			t.Errorf("car %d counted as holding v1", idx)
		}
	}
	if got := countMissing(w); got != 1 {
		t.Errorf("countMissing = %d, want 1", got)
	}
}

func TestHoldWaitTimeoutDetaches(t *testing.T) {
	f := testFleet([]sidecarKind{kindWS, kindWS}, []int{0, 0})
	f.cars[0].received("v1", 1)
	w := f.watch(map[int]string{0: "v1"})
	complete, err := f.wait(context.Background(), w, time.Millisecond)
	if err != nil || complete {
		t.Fatalf("wait = %v, %v; want a timeout", complete, err)
	}
	if f.cars[1].watch != nil {
		t.Error("the wait is still attached after it returned")
	}
	f.cars[1].received("v1", 2) // late: must not touch the finished wait
	if _, ok := w.heldAt(1); ok {
		t.Error("a late arrival was recorded after the wait returned")
	}
	// Dying while watched counts down.
	w2 := f.watch(map[int]string{0: "v2"})
	f.cars[0].died()
	f.cars[1].received("v2", 3)
	if complete, _ := f.wait(context.Background(), w2, time.Second); complete {
		t.Error("complete with a dead sidecar")
	}
	select {
	case <-w2.done:
	default:
		t.Error("not done after every sidecar arrived or died")
	}
}

func TestPropagationFigure(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	cfg := propagationConfig{sidecarFlags: sidecarFlags{nodes: 3, policies: 10, streamsPerConn: 100},
		orgs: 1, interval: 200 * time.Millisecond, grpcScope: "employee"}
	results := []*writeResult{
		{lat: [2][]time.Duration{ms(10, 30, 20), ms(40, 5)}, sent: ms(100)[0], ack: ms(105)[0]},
		{lat: [2][]time.Duration{ms(-2, 50, 7), ms(1, 2)}, sent: ms(200)[0], ack: ms(208)[0]},
		// Write 3: one gRPC sidecar missing: no "all hold" sample for grpc.
		{lat: [2][]time.Duration{ms(1, 2), ms(300, 3)}, missing: [2]int{1, 0}},
	}
	g := propagationFigureFor(cfg, kindGRPC, 3, results)
	if g.Writes != 3 || g.Complete != 2 || g.Missing != 1 || g.ConnSamples != 8 {
		t.Errorf("grpc counts: writes %d complete %d missing %d samples %d", g.Writes, g.Complete, g.Missing, g.ConnSamples)
	}
	if g.P50Ms != 30 || g.MaxMs != 50 || g.P99Ms != 50 {
		t.Errorf("grpc all-hold p50 %v p99 %v max %v; want 30, 50, 50", g.P50Ms, g.P99Ms, g.MaxMs)
	}
	if g.PutP50Ms != 5 || g.PutP99Ms != 8 || g.FromSendP50Ms != 35 || g.FromSendP99Ms != 58 {
		t.Errorf("grpc PUT p50 %v p99 %v, from send p50 %v p99 %v; want 5, 8, 35, 58", g.PutP50Ms, g.PutP99Ms, g.FromSendP50Ms, g.FromSendP99Ms)
	}
	if g.ConnP50Ms != 7 {
		t.Errorf("grpc conn p50 = %v, want 7", g.ConnP50Ms)
	}
	if g.TargetMet {
		t.Error("grpc target met with an incomplete write")
	}
	if g.StreamsPerConn != 100 || g.GRPCScope != "employee" || g.TargetP99Ms != 250 {
		t.Errorf("grpc figure = %+v", g)
	}
	w := propagationFigureFor(cfg, kindWS, 2, results)
	if w.Complete != 3 || w.P50Ms != 40 || w.MaxMs != 300 || w.P99Ms != 300 {
		t.Errorf("ws: complete %d p50 %v p99 %v max %v; want 3, 40, 300, 300", w.Complete, w.P50Ms, w.P99Ms, w.MaxMs)
	}
	if !w.TargetMet || w.TargetP99Ms != 500 || w.StreamsPerConn != 0 {
		t.Errorf("ws figure = %+v", w)
	}
	if len(g.row()) != len(g.columns()) {
		t.Errorf("row has %d cells, columns %d", len(g.row()), len(g.columns()))
	}
}

func TestPropagationTarget(t *testing.T) {
	cfg := func(nodes, streams, ws int) propagationConfig {
		return propagationConfig{sidecarFlags: sidecarFlags{nodes: nodes, streams: streams, ws: ws}}
	}
	tests := []struct {
		name string
		cfg  propagationConfig
		kind sidecarKind
		p99  time.Duration
	}{
		{"1k+1k on 3 nodes, grpc: 250 ms", cfg(3, 1000, 1000), kindGRPC, 250 * time.Millisecond},
		{"1k+1k on 3 nodes, ws: 500 ms", cfg(3, 1000, 1000), kindWS, 500 * time.Millisecond},
		{"10k+10k on one node, grpc: mixed 500 ms", cfg(1, 10000, 10000), kindGRPC, 500 * time.Millisecond},
		{"10k+10k on one node, ws: mixed 500 ms", cfg(1, 10000, 10000), kindWS, 500 * time.Millisecond},
		{"10k grpc alone on one node: 250 ms", cfg(1, 10000, 0), kindGRPC, 250 * time.Millisecond},
		{"10k+10k on 3 nodes, grpc: 250 ms", cfg(3, 10000, 10000), kindGRPC, 250 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p99, label := propagationTarget(tt.cfg, tt.kind)
			if p99 != tt.p99 {
				t.Errorf("p99 target = %v, want %v (%q)", p99, tt.p99, label)
			}
			if label == "" {
				t.Error("empty label")
			}
		})
	}
	_, grpc := propagationTarget(cfg(1, 10000, 10000), kindGRPC)
	_, ws := propagationTarget(cfg(1, 10000, 10000), kindWS)
	if grpc != ws {
		t.Errorf("the mixed run labels its transports differently: %q, %q", grpc, ws)
	}
}

func TestPropagationConfigValidate(t *testing.T) {
	good := propagationConfig{
		sidecarFlags: sidecarFlags{streams: 1000, ws: 1000, nodes: 3, policies: 10, streamsPerConn: 100, dialConcurrency: 1, connectTimeout: 1},
		writes:       50,
		interval:     1,
		orgs:         1,
		timeout:      1,
		grpcScope:    "employee",
	}
	if err := good.validate(); err != nil {
		t.Errorf("validate(%+v) = %v", good, err)
	}
	for _, ok := range []func(*propagationConfig){
		func(c *propagationConfig) { c.streams = 0 },
		func(c *propagationConfig) { c.ws = 0 },
		func(c *propagationConfig) { c.nodes = 1 },
		func(c *propagationConfig) { c.interval = 0 },
		func(c *propagationConfig) { c.grpcScope = "org" },
		func(c *propagationConfig) { c.sdk = true },
		func(c *propagationConfig) { c.grpcHead = true },
	} {
		c := good
		ok(&c)
		if err := c.validate(); err != nil {
			t.Errorf("validate(%+v) = %v", c, err)
		}
	}
	for name, mutate := range map[string]func(*propagationConfig){
		"no sidecars":        func(c *propagationConfig) { c.streams, c.ws = 0, 0 },
		"negative ws":        func(c *propagationConfig) { c.ws = -1 },
		"no writes":          func(c *propagationConfig) { c.writes = 0 },
		"no nodes":           func(c *propagationConfig) { c.nodes = 0 },
		"negative wait":      func(c *propagationConfig) { c.interval = -1 },
		"no orgs":            func(c *propagationConfig) { c.orgs = 0 },
		"no policies":        func(c *propagationConfig) { c.policies = 0 },
		"no timeout":         func(c *propagationConfig) { c.timeout = 0 },
		"bad scope":          func(c *propagationConfig) { c.grpcScope = "node" },
		"no streams/conn":    func(c *propagationConfig) { c.streamsPerConn = 0 },
		"no dials in flight": func(c *propagationConfig) { c.dialConcurrency = 0 },
		"sdk with grpc-head": func(c *propagationConfig) { c.sdk, c.grpcHead = true, true },
	} {
		c := good
		mutate(&c)
		if err := c.validate(); err == nil {
			t.Errorf("%s: validate(%+v) = nil, want an error", name, c)
		}
	}
}

func TestResponseHead(t *testing.T) {
	fields := (&discoveryv1.PolicyDiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
	if got := fields.ByName("version_info").Number(); got != responseVersionField {
		t.Fatalf("version_info is field %d, responseVersionField %d", got, responseVersionField)
	}
	if got := fields.ByName("nonce").Number(); got != responseNonceField {
		t.Fatalf("nonce is field %d, responseNonceField %d", got, responseNonceField)
	}
	full, err := proto.Marshal(&discoveryv1.PolicyDiscoveryResponse{
		VersionInfo: "v1", Nonce: "n1",
		Policies: []*discoveryv1.Policy{{Name: "p", Kind: "ToolPolicy", Scope: &discoveryv1.Scope{Org: "o"},
			Labels: map[string]string{"a": "b"}, Spec: []byte(`{"x":1}`), Revision: 7}},
	})
	if err != nil {
		t.Fatal(err)
	}
	unchanged, err := proto.Marshal(&discoveryv1.PolicyDiscoveryResponse{VersionInfo: "v2", Nonce: "n2", Unchanged: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		msg     []byte
		want    responseHead
		wantErr bool
	}{
		{"full", full, responseHead{version: "v1", nonce: "n1"}, false},
		{"unchanged", unchanged, responseHead{version: "v2", nonce: "n2"}, false},
		{"empty", nil, responseHead{}, false},
		{"nonce first", protowire.AppendString(protowire.AppendTag(
			protowire.AppendString(protowire.AppendTag(nil, responseNonceField, protowire.BytesType), "n3"),
			responseVersionField, protowire.BytesType), "v3"), responseHead{version: "v3", nonce: "n3"}, false},
		{"truncated", full[:len(full)-3], responseHead{}, true},
		{"bad tag", []byte{0xff}, responseHead{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := responseHead{version: "stale", nonce: "stale"}
			err := h.parse(tc.msg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parse: err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && h != tc.want {
				t.Errorf("parse = %+v, want %+v", h, tc.want)
			}
		})
	}
}

func TestCheckFileLimit(t *testing.T) {
	tests := []struct {
		name    string
		flags   sidecarFlags
		limit   uint64
		wantErr bool
	}{
		{"10k+10k, 100 per conn, under this machine's 20,000", sidecarFlags{streams: 10000, ws: 10000, streamsPerConn: 100}, 20000, false},
		{"10k+10k, 100 per conn, at 1,024", sidecarFlags{streams: 10000, ws: 10000, streamsPerConn: 100}, 1024, true},
		{"10k gRPC, one conn each, at 10,000", sidecarFlags{streams: 10000, streamsPerConn: 1}, 10000, true},
		{"1k+1k at 1,024: 1,010 conns plus margin", sidecarFlags{streams: 1000, ws: 1000, streamsPerConn: 100}, 1024, true},
		{"1k+1k at 4,096", sidecarFlags{streams: 1000, ws: 1000, streamsPerConn: 100}, 4096, false},
		{"unknown limit", sidecarFlags{streams: 10000, ws: 10000, streamsPerConn: 1}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.flags.checkFileLimit(tt.limit)
			if (err != nil) != tt.wantErr {
				t.Errorf("checkFileLimit(%d) = %v, want error %v (need %d)", tt.limit, err, tt.wantErr, tt.flags.filesNeeded())
			}
		})
	}
}
