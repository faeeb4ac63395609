package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/policyd/policyd/client"
)

// TestSidecarFlagsUnknownIdentityGrace: watch and authz share
// --unknown-identity-grace, which sets the SDK's bound; its zero means no
// retry, not the SDK's default.
func TestSidecarFlagsUnknownIdentityGrace(t *testing.T) {
	for _, cmd := range []*cobra.Command{watchCommand(), authzCommand()} {
		f := cmd.Flags().Lookup("unknown-identity-grace")
		if f == nil {
			t.Fatalf("%s has no --unknown-identity-grace", cmd.Name())
		}
		if got, want := f.DefValue, client.DefaultUnknownIdentityGrace.String(); got != want {
			t.Errorf("%s: default %s, want %s", cmd.Name(), got, want)
		}
	}
	tests := []struct {
		args []string
		want time.Duration
	}{
		{nil, client.DefaultUnknownIdentityGrace},
		{[]string{"--unknown-identity-grace", "2m"}, 2 * time.Minute},
		{[]string{"--unknown-identity-grace", "0"}, time.Nanosecond},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			sf := sidecarFlags{env: "POLICYD_TEST", cmd: "watch"}
			fs := pflag.NewFlagSet("watch", pflag.ContinueOnError)
			sf.register(fs)
			if err := fs.Parse(append([]string{"--servers", "a:1"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			cfg, err := sf.config(&cobra.Command{})
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.UnknownIdentityGrace; got != tc.want {
				t.Errorf("UnknownIdentityGrace = %v, want %v", got, tc.want)
			}
		})
	}
}
