package adminapi

import (
	"errors"
	"testing"

	"github.com/policyd/policyd/internal/command"

	"github.com/policyd/policyd/internal/policy"
	"github.com/policyd/policyd/internal/raftfsm"
)

// FuzzDecodeRolloutRequest: whatever the body, the decoder either refuses
// it as invalid (a 400) or returns a rollout whose command every replica
// can decode, so that no body can put an entry in the log that stops the
// FSM. Run longer with
// go test -run '^$' -fuzz FuzzDecodeRolloutRequest ./internal/server/adminapi/.
func FuzzDecodeRolloutRequest(f *testing.F) {
	put := `{"op":"put","policy":{"name":"acme.p","kind":"ToolPolicy","scope":{"org":"acme"},"spec":{"action":"deny","tool_name":"Bash"}}}`
	for _, seed := range []string{
		`{"changes":[` + put + `],"stages":[{"percent":5,"bake":"2m"},{"percent":100,"bake":"1h"}],"max_nack_ratio":0.01}`,
		`{"changes":[{"op":"delete","name":"acme.old"}],"stages":[{"percent":100,"bake":"1s"}],"min_ack_coverage":0.5,"on_halt":"stay"}`,
		`{"changes":[` + put + `,` + put + `],"stages":[{"percent":100,"bake":"1m"}]}`,
		`{"changes":[],"stages":[]}`,
		`{"changes":[{"op":"put"}],"stages":[{"percent":101,"bake":"0s"}]}`,
		`{"changes":[{"op":"put","policy":{}}],"stages":[{"percent":-1,"bake":"-5m"}],"max_nack_ratio":2}`,
		`{"changes":[{"op":"delete","name":"acme.x","policy":{"name":"y"}}],"stages":[{"percent":100,"bake":"24h0m0.001s"}]}`,
		`{"changes":null,"stages":null,"on_halt":"later"}`,
		`{"stages":[{"percent":100,"bake":"1ns"}]}`,
		`[]`, `null`, `{`, `{"changes":[{"op":"put","policy":"x"}]}`,
	} {
		f.Add([]byte(seed))
	}
	v, err := policy.NewValidator(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRolloutRequest(body, v)
		if err != nil {
			if !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("error %v does not wrap policy.ErrInvalid (not a 400)", err)
			}
			return
		}
		cmd, err := command.RolloutStart(r)
		if err != nil {
			t.Fatalf("accepted rollout does not build a command: %v", err)
		}
		data, err := command.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raftfsm.DecodeEntry(1, data); err != nil {
			t.Fatalf("accepted rollout makes an entry the FSM refuses: %v", err)
		}
	})
}
