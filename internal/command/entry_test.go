package command

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	commandv1 "github.com/policyd/policyd/api/command/v1"
	"github.com/policyd/policyd/internal/policy"
)

// TestTypesAreBodyFields: every named type is the field number of its
// payload in commandv1.Body, and every Body field has a name here; it fails
// when the schema changes under the constants.
func TestTypesAreBodyFields(t *testing.T) {
	tests := []struct {
		typ Type
		msg proto.Message
	}{
		{TypePutPolicy, &commandv1.PutPolicy{}},
		{TypeDeletePolicy, &commandv1.DeletePolicy{}},
		{TypePutEmployee, &commandv1.PutEmployee{}},
		{TypeDeleteEmployee, &commandv1.DeleteEmployee{}},
		{TypeRegisterMember, &commandv1.RegisterMember{}},
		{TypeRemoveMember, &commandv1.RemoveMember{}},
		{TypePruneEvents, &commandv1.PruneEvents{}},
		{TypeReloadObserve, &commandv1.ReloadObserve{}},
		{TypeReloadRestarted, &commandv1.ReloadRestarted{}},
		{TypeReloadRestartFailed, &commandv1.ReloadRestartFailed{}},
		{TypeObserveDrift, &commandv1.ObserveDrift{}},
		{TypeRecordDriftDelivery, &commandv1.RecordDriftDelivery{}},
		{TypeCompleteDriftTasks, &commandv1.CompleteDriftTasks{}},
		{TypePruneDrift, &commandv1.PruneDrift{}},
		{TypeSetClusterID, &commandv1.SetClusterID{}},
		{TypeRolloutStart, &commandv1.RolloutStart{}},
		{TypeRolloutTransition, &commandv1.RolloutTransition{}},
		{TypeSyncSource, &commandv1.SyncSource{}},
		{TypeRequestSourceSync, &commandv1.RequestSourceSync{}},
	}
	if got, want := len(tests), kindOneof.Fields().Len(); got != want {
		t.Errorf("%d named types, commandv1.Body has %d fields", got, want)
	}
	seen := map[Type]Type{}
	for _, tc := range tests {
		t.Run(string(tc.msg.ProtoReflect().Descriptor().Name()), func(t *testing.T) {
			c, err := New(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Type(); got != tc.typ {
				t.Errorf("Type = 0x%02x, want 0x%02x", uint8(got), uint8(tc.typ))
			}
			// Unique with the IgnoreUnknown bit masked, so that no entry
			// means one command to a node that knows it and another to a
			// node that does not; and never 0, an empty entry's type.
			n := tc.typ &^ IgnoreUnknown
			if other, ok := seen[n]; ok {
				t.Errorf("types 0x%02x and 0x%02x share number %d", uint8(tc.typ), uint8(other), n)
			}
			seen[n] = tc.typ
			if n == 0 {
				t.Errorf("type 0x%02x has number 0", uint8(tc.typ))
			}
		})
	}
	if _, err := New(&commandv1.Result{}); err == nil {
		t.Error("New(Result) succeeded: it is not a payload")
	}
}

// TestEncodeDecode: a command survives the envelope, its metadata and its
// payload alike; an unknown ignorable type keeps its payload as it came.
func TestEncodeDecode(t *testing.T) {
	c, err := PutPolicy(testPolicy(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.OriginatedAtUnixNano, c.ProcessedAtUnixNano, c.Actor, c.RequestID, c.RevertedTo = 1, 2, "token:ops", "r1", 3
	data, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got, protocmp.Transform(), cmp.AllowUnexported(Command{})); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}

	unknown := &commandv1.Command{Type: uint32(IgnoreUnknown | 0x7f), Payload: []byte("opaque"), Actor: "token:x"}
	u, err := Decode(unknown)
	if err != nil {
		t.Fatal(err)
	}
	if u.Body != nil || u.Type() != IgnoreUnknown|0x7f {
		t.Errorf("unknown ignorable: body %v, type 0x%02x", u.Body, uint8(u.Type()))
	}
	back, err := Encode(u)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(unknown, back, protocmp.Transform()); diff != "" {
		t.Errorf("unknown ignorable re-encoded (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		env  *commandv1.Command
		want string
	}{
		{"unknown without the flag", &commandv1.Command{Type: 0x7e}, "unknown command type 126"},
		{"type zero", &commandv1.Command{}, "unknown command type 0"},
		{"not a byte", &commandv1.Command{Type: 0x100}, "not a byte"},
		{"bad payload", &commandv1.Command{Type: uint32(TypePutPolicy), Payload: []byte{0xff}}, "decode *commandv1.PutPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func testPolicy() *policy.Policy {
	return &policy.Policy{Name: "acme.p", Kind: policy.KindToolPolicy, Scope: policy.Scope{Org: "acme"},
		Labels: map[string]string{"tier": "prod"}, Spec: []byte(`{"tool_name":"Bash","action":"deny"}`)}
}
